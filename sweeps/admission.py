"""Can this cluster run a sweep's trials at all? Admission before a sweep is accepted.

A trial is `workers_per_trial` workers, each asking Ray for `cpus_per_worker` CPUs and `gpus_per_worker`
GPUs on one node, and each needing the memory `worker.memory.estimate_memory` works out (host memory on
CPU; GPU memory, and host memory for the runtime, on a GPU). A cluster can run it when nodes it has, or
nodes its autoscaler can add, hold that many such workers. Otherwise the trial would wait for resources
forever, or start and be killed for memory again and again: the service refuses such a spec at submit
(`admission_problems`), and a dry run says so beside its price.

What the cluster holds comes from Ray (`capacity_from_ray`: every alive node's resources, and the node
groups of the autoscaler's cluster config with their largest counts, as Ray Train's own check reads
them). A node's memory is Ray's `memory` resource plus its object store (what Ray found free at the
node's start, within its cgroup's limit); a GPU's memory comes from its accelerator type through
`worker.hardware`'s table where that holds it, and is not checked where it does not.

Torch-free: the HTTP service imports it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from sweeps.spec import SweepSpec
from sweeps.spec import problem as _problem
from worker.hardware import device_accelerator
from worker.memory import MemoryEstimate, estimate_memory, gib

ACCELERATOR_PREFIX = "accelerator_type:"  # Ray's resource naming a node's GPU model


@dataclass(frozen=True)
class NodeShape:
    """Nodes of one kind: what each offers trials, and how many there are or can be."""

    name: str  # for people: "node 10.0.0.3", "autoscaler group gpu-workers"
    cpus: float
    gpus: float
    memory: int | None  # bytes of host memory for tasks; None: not reported
    gpu_memory: int | None  # bytes per GPU; None: unknown (no check)
    count: int | None  # nodes of this kind (1 for a live node); None: the autoscaler sets no limit

    def workers(self, cpus: float, gpus: float, memory: int, gpu_memory: int) -> int:
        """How many workers of the given needs one such node holds (its resources, split evenly)."""
        fits: list[float] = []
        if cpus > 0:
            fits.append(self.cpus / cpus)
        if gpus > 0:
            if self.gpus < gpus or (self.gpu_memory is not None and gpu_memory > self.gpu_memory * min(1.0, gpus)):
                return 0
            fits.append(self.gpus / gpus)
        if self.memory is not None:
            fits.append(self.memory / memory if memory > 0 else math.inf)
        return int(math.floor(min(fits) + 1e-9)) if fits else 1

    def describe(self) -> str:
        mem = f", {gib(self.memory)}" if self.memory is not None else ""
        gpu = f", {self.gpus:g} GPUs" + (f" of {gib(self.gpu_memory)}" if self.gpu_memory else "")
        many = "" if self.count == 1 else (" (any number)" if self.count is None else f" (up to {self.count})")
        return f"{self.name}: {self.cpus:g} CPUs{gpu}{mem}{many}"


@dataclass(frozen=True)
class ClusterCapacity:
    """Every kind of node the cluster has or can add."""

    nodes: tuple[NodeShape, ...]

    def describe(self) -> str:
        return "; ".join(n.describe() for n in self.nodes) or "no nodes"


def _gpu_memory(resources: Mapping[str, float]) -> int | None:
    for key in resources:
        if key.startswith(ACCELERATOR_PREFIX):
            found = device_accelerator(key[len(ACCELERATOR_PREFIX) :])
            if found is not None and found.memory_bytes:
                return found.memory_bytes
    return None


def _shape(name: str, resources: Mapping[str, float], count: int | None) -> NodeShape:
    memory = resources.get("memory")
    if memory is not None:
        memory += resources.get("object_store_memory", 0)
    return NodeShape(
        name=name,
        cpus=float(resources.get("CPU", 0)),
        gpus=float(resources.get("GPU", 0)),
        memory=int(memory) if memory is not None else None,
        gpu_memory=_gpu_memory(resources),
        count=count,
    )


def capacity_from(
    nodes: Iterable[Mapping[str, Any]], groups: Iterable[tuple[str, Mapping[str, float], int]] = ()
) -> ClusterCapacity:
    """A capacity from `ray.nodes()`'s entries (alive ones count) and the autoscaler's node groups as
    (name, resources of one node, max count; -1: no limit)."""
    shapes = [
        _shape(f"node {n.get('NodeManagerAddress', '?')}", n.get("Resources") or {}, 1) for n in nodes if n.get("Alive")
    ]
    shapes += [
        _shape(f"autoscaler group {name}", resources, None if count < 0 else count)
        for name, resources, count in groups
        if count != 0
    ]
    return ClusterCapacity(tuple(shapes))


def capacity_from_ray() -> ClusterCapacity:
    """What the connected Ray cluster holds and its autoscaler can add (call with Ray initialised)."""
    import ray
    from ray._private.state import state  # what Ray Train's resource check reads

    groups: list[tuple[str, Mapping[str, float], int]] = []
    try:
        config = state.get_cluster_config()
    except Exception:  # an older GCS without the key, or none reachable: the live nodes alone
        config = None
    if config is not None:
        for group in config.node_group_configs:
            groups.append((group.name, dict(group.resources), int(group.max_count)))
    return capacity_from(ray.nodes(), groups)


@dataclass(frozen=True)
class TrialNeeds:
    """One worker's resources, the workers a trial has, and the memory estimate behind them."""

    optimizer: str
    batch_size: int
    workers: int
    cpus: float
    gpus: float
    memory: MemoryEstimate

    @property
    def host(self) -> int:
        return self.memory.host_bytes

    @property
    def device(self) -> int:
        return self.memory.device_bytes


def trial_needs(spec: SweepSpec) -> list[TrialNeeds]:
    """Per optimizer, the needs of its largest trial (the largest micro-batch of any batch size)."""
    res = spec.resources
    out = []
    for opt in spec.optimizer_names:
        estimates = [(estimate_memory(spec.train_config(opt, b, spec.lr.min, seed=0)), b) for b in spec.lattice]
        memory, batch = max(estimates, key=lambda e: (e[0].host_bytes + e[0].device_bytes, -e[1]))
        out.append(TrialNeeds(opt, batch, res.workers_per_trial, res.cpus_per_worker, res.gpus_per_worker, memory))
    return out


def admission_problems(
    spec: SweepSpec, capacity: ClusterCapacity, needs: list[TrialNeeds] | None = None
) -> list[dict[str, Any]]:
    """Why `capacity` cannot run `spec`'s trials, as `{"field", "message", "value"}` problems (the spec's
    validation format); empty when it can. `needs`: `trial_needs(spec)`, where the caller has it already."""
    problems: list[dict[str, Any]] = []
    res = spec.resources
    has = capacity.describe()
    if res.gpus_per_worker > 0 and not any(n.gpus >= res.gpus_per_worker for n in capacity.nodes):
        most = max((n.gpus for n in capacity.nodes), default=0)
        return [
            _problem(
                "resources.gpus_per_worker",
                f"each worker asks for {res.gpus_per_worker:g} GPUs, and no node of this cluster has or can add "
                f"that many (at most {most:g}); the cluster: {has}",
                res.gpus_per_worker,
            )
        ]
    if not any(n.cpus >= res.cpus_per_worker for n in capacity.nodes):
        return [
            _problem(
                "resources.cpus_per_worker",
                f"each worker asks for {res.cpus_per_worker} CPUs, and no node of this cluster has or can add that "
                f"many; the cluster: {has}",
                res.cpus_per_worker,
            )
        ]
    for need in needs if needs is not None else trial_needs(spec):
        per_node = [(n, n.workers(need.cpus, need.gpus, need.host, need.device)) for n in capacity.nodes]
        if all(k == 0 for _, k in per_node):
            where = "GPU" if need.memory.on_gpu and _short_of_gpu_memory(capacity, need) else "node"
            problems.append(
                _problem(
                    "model",
                    f"a {need.optimizer} trial at batch size {need.batch_size} needs {need.memory.describe()}, and "
                    f"no {where} of this cluster has or can add that much (the cluster: {has}); choose a smaller "
                    f"model or seq_len, or a smaller resources.max_micro_batch",
                    spec.model.preset or spec.model.model_dump(mode="json"),
                )
            )
            continue
        total = sum(math.inf if n.count is None else k * n.count for n, k in per_node)
        if total < need.workers:
            problems.append(
                _problem(
                    "resources.workers_per_trial",
                    f"a trial has {need.workers} workers of {need.cpus:g} CPUs, {need.gpus:g} GPUs and "
                    f"{gib(need.host)}; this cluster holds at most {int(total)} at once (the cluster: {has})",
                    need.workers,
                )
            )
    return problems


def _short_of_gpu_memory(capacity: ClusterCapacity, need: TrialNeeds) -> bool:
    return any(
        n.gpus >= need.gpus and n.gpu_memory is not None and need.device > n.gpu_memory * min(1.0, need.gpus)
        for n in capacity.nodes
    )
