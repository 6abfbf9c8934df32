"""Admission against the cluster (sweeps/admission.py): what Ray reports becomes node shapes, and a spec is
refused, naming the field, where no node the cluster has or can add holds its trials."""

from __future__ import annotations

from typing import Any

from harness import tiny_spec

from sweeps.admission import ClusterCapacity, NodeShape, admission_problems, capacity_from, trial_needs
from sweeps.spec import SweepSpec

GIB = 2**30


def node(cpus: float, memory_gib: float, gpus: float = 0, accelerator: str | None = None, alive: bool = True) -> dict:
    resources: dict[str, float] = {
        "CPU": cpus,
        "memory": memory_gib * GIB * 0.7,
        "object_store_memory": memory_gib * GIB * 0.3,
    }
    if gpus:
        resources["GPU"] = gpus
    if accelerator:
        resources[f"accelerator_type:{accelerator}"] = 1
    return {"Alive": alive, "NodeManagerAddress": "10.0.0.1", "Resources": resources}


def spec(**overrides: Any) -> SweepSpec:
    return SweepSpec.model_validate(tiny_spec(**overrides))


def fields(s: SweepSpec, capacity: ClusterCapacity) -> list[str]:
    return [p["field"] for p in admission_problems(s, capacity)]


def test_ray_s_nodes_and_the_autoscaler_s_groups_become_shapes() -> None:
    cap = capacity_from(
        [node(4, 16), node(8, 64, alive=False), node(2, 8, gpus=1, accelerator="H100")],
        [("gpu-workers", {"CPU": 8, "GPU": 8, "memory": 200 * GIB, "accelerator_type:H100": 1}, 4),
         ("cpu-any", {"CPU": 16}, -1), ("off", {"CPU": 64}, 0)],
    )  # fmt: skip
    assert [(n.cpus, n.gpus, n.count) for n in cap.nodes] == [(4, 0, 1), (2, 1, 1), (8, 8, 4), (16, 0, None)]
    assert cap.nodes[0].memory == 16 * GIB  # Ray's memory resource plus the object store
    assert cap.nodes[1].gpu_memory == 80 * 10**9  # an H100's, from worker.hardware's table
    assert cap.nodes[3].memory is None  # not reported: not judged


def test_a_spec_that_fits_passes() -> None:
    assert admission_problems(spec(), capacity_from([node(2, 8)])) == []


def test_gpus_the_cluster_has_none_of_are_refused_and_an_autoscaler_that_adds_them_passes() -> None:
    gpu = spec(resources={"gpus_per_worker": 1})
    assert fields(gpu, capacity_from([node(2, 8)])) == ["resources.gpus_per_worker"]
    grows = capacity_from([node(2, 8)], [("gpu", {"CPU": 8, "GPU": 1, "memory": 64 * GIB}, 2)])
    assert admission_problems(gpu, grows) == []


def test_cpus_no_node_has_are_refused() -> None:
    problems = admission_problems(spec(resources={"cpus_per_worker": 4}), capacity_from([node(2, 8), node(1, 8)]))
    assert [p["field"] for p in problems] == ["resources.cpus_per_worker"]
    assert "4 CPUs" in problems[0]["message"] and "node 10.0.0.1: 2 CPUs" in problems[0]["message"]


def test_a_model_no_node_has_the_memory_for_is_refused_with_the_estimate() -> None:
    # gpt2-large at T=1024: ~11 GiB of weights, gradients and AdamW state alone; the node has 6 GiB
    large = spec(model={"preset": "gpt2-large", "seq_len": 1024}, token_budget=65_536)
    problems = admission_problems(large, capacity_from([node(4, 6)]))
    assert [p["field"] for p in problems] == ["model"] and problems[0]["value"] == "gpt2-large"
    message = problems[0]["message"]
    assert "GiB of host memory per worker" in message and "6.0 GiB" in message and "max_micro_batch" in message
    need = trial_needs(large)[0]
    assert need.host > 6 * GIB and need.batch_size == 8  # the largest micro-batch's cell
    assert admission_problems(large, capacity_from([node(4, need.host / GIB + 1)])) == []


def test_gpu_memory_is_judged_where_the_accelerator_is_known() -> None:
    # bf16 gpt2-large on an L4 (24 GB): over; on an H100 (80 GB): fits; on an unknown GPU: not judged
    large = spec(
        model={"preset": "gpt2-large", "seq_len": 1024}, token_budget=65_536, precision="bf16",
        batch_sizes=[32, 64], resources={"gpus_per_worker": 1, "max_micro_batch": 16},
    )  # fmt: skip
    need = trial_needs(large)[0]
    assert 24 * 10**9 < need.device < 80 * 10**9, need.device / GIB
    assert fields(large, capacity_from([node(8, 64, gpus=1, accelerator="L4")])) == ["model"]
    assert (
        "on the GPU" in admission_problems(large, capacity_from([node(8, 64, gpus=1, accelerator="L4")]))[0]["message"]
    )
    assert admission_problems(large, capacity_from([node(8, 64, gpus=1, accelerator="H100")])) == []
    assert admission_problems(large, capacity_from([node(8, 64, gpus=1, accelerator="TPU-V9")])) == []


def test_more_workers_than_the_cluster_holds_are_refused() -> None:
    ddp = spec(resources={"workers_per_trial": 4})  # 4 workers of 1 CPU
    assert fields(ddp, capacity_from([node(1, 8), node(2, 8)])) == ["resources.workers_per_trial"]
    assert admission_problems(ddp, capacity_from([node(1, 8), node(2, 8), node(1, 8)])) == []
    # memory splits a node too: 4 CPUs but room for one worker's memory
    one = trial_needs(ddp)[0].host
    assert fields(ddp, capacity_from([node(4, 1.5 * one / GIB), node(2, 8)])) == ["resources.workers_per_trial"]
    # an autoscaler group without a limit holds any number
    assert admission_problems(ddp, capacity_from([], [("any", {"CPU": 1, "memory": 8 * GIB}, -1)])) == []


def test_a_node_shape_splits_by_its_scarcest_resource() -> None:
    n = NodeShape("n", cpus=8, gpus=2, memory=10 * GIB, gpu_memory=None, count=1)
    assert n.workers(cpus=1, gpus=0, memory=3 * GIB, gpu_memory=0) == 3  # memory: 10 // 3
    assert n.workers(cpus=4, gpus=0, memory=1 * GIB, gpu_memory=0) == 2  # CPUs
    assert n.workers(cpus=1, gpus=1, memory=1 * GIB, gpu_memory=0) == 2  # GPUs
    assert n.workers(cpus=1, gpus=0.5, memory=1 * GIB, gpu_memory=0) == 4
    assert n.workers(cpus=1, gpus=4, memory=1 * GIB, gpu_memory=0) == 0
