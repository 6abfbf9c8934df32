"""A sweep driver that lives on the Ray cluster as a detached, named actor.

The service never runs a sweep in its own process: it creates `SweepActor` (name `sweep:<id>` in
namespace `batchsweep`, lifetime detached), asks it for its state, and cancels it. A restarted
service finds running drivers again by name. Importing this module does not import torch: the actor's
methods import the driver inside the actor process.
"""

from __future__ import annotations

import logging
import threading
import time
import traceback
from typing import Any

import ray

from sweeps.runtime import SweepRuntime
from sweeps.status import SweepStatus

log = logging.getLogger(__name__)

NAMESPACE = "batchsweep"


def actor_name(sweep_id: str) -> str:
    return f"sweep:{sweep_id}"


@ray.remote(num_cpus=0, max_concurrency=16, max_restarts=0)
class SweepActor:
    """Runs `sweeps.driver.run_sweep` on a thread; `state()` answers while it runs."""

    def __init__(self, sweep_id: str, spec: dict[str, Any], runtime: SweepRuntime) -> None:
        import os

        # the stores of the service that launched it, as one typed object (never through os.environ)
        self.sweep_id, self.spec, self.runtime = sweep_id, spec, runtime
        self._state: dict[str, Any] = {
            "status": SweepStatus.queued,
            "progress": None,
            "report": None,
            "error": None,
            "experiment_id": None,
            "started_at": None,
            "finished_at": None,
            "pid": os.getpid(),  # the driver's process, for operators (and fault-injection tests)
            "node_id": ray.get_runtime_context().get_node_id(),  # the Ray node it runs on (the head)
        }
        self._cancel = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def start(self) -> bool:
        with self._lock:
            if self._thread is not None:
                return False
            self._thread = threading.Thread(target=self._run, name=f"sweep-{self.sweep_id}", daemon=True)
            self._state |= {"status": SweepStatus.running, "started_at": time.time()}
            self._thread.start()
            return True

    def state(self) -> dict[str, Any]:
        with self._lock:
            return dict(self._state)

    def cancel(self) -> None:
        self._cancel.set()

    def _update(self, **kw: Any) -> None:
        with self._lock:
            self._state |= kw

    def _run(self) -> None:
        from sweeps.logs import configure, log_context

        configure(self.runtime.log_format)  # this actor's process logs for one sweep: tag every line
        with log_context(sweep_id=self.sweep_id):
            self._run_sweep()

    def _run_sweep(self) -> None:
        from dashboards.publish import publish_figures
        from sweeps.driver import run_sweep
        from sweeps.spec import SweepSpec

        try:
            spec = SweepSpec.from_stored(self.spec)  # validated once, at submit
            outcome = run_sweep(
                spec,
                sweep_id=self.sweep_id,
                runtime=self.runtime,
                # as JSON: the service stores it as it is and reads it back through sweeps.progress's models
                on_progress=lambda p: self._update(progress=p.model_dump(mode="json")),
                on_experiment=lambda experiment_id: self._update(experiment_id=experiment_id),
                should_stop=self._cancel.is_set,
            )
            publish_figures(outcome.tracking_uri, outcome.sweep_id)  # before "final": the service kills us then
            self._update(
                status=outcome.status,
                report=outcome.report.model_dump(mode="json"),  # as report.json holds it: the store's JSON
                experiment_id=outcome.experiment_id,
                finished_at=time.time(),
            )
        except BaseException as exc:  # reported to the service as the sweep's error, never lost
            log.exception("sweep %s failed", self.sweep_id)
            self._update(
                status=SweepStatus.failed,
                error=f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=5)}",
                finished_at=time.time(),
            )


def launch(sweep_id: str, spec: dict[str, Any], runtime: SweepRuntime) -> ray.actor.ActorHandle:
    """Create (or find) the sweep's detached driver and start it. Idempotent per sweep id."""
    handle = SweepActor.options(  # type: ignore[attr-defined]
        name=actor_name(sweep_id),
        namespace=NAMESPACE,
        lifetime="detached",
        get_if_exists=True,
        scheduling_strategy=on_head(),
    ).remote(sweep_id, spec, runtime)
    ray.get(handle.start.remote())
    return handle


def on_head() -> Any:
    """Drivers on the head node: it hosts no trials (num-cpus 0 in the RayCluster), so a driver never
    competes with training and outlives any worker node. Not soft: Ray's soft affinity placed a
    0-CPU actor on a worker node 3 times in 5 (measured on a 1 + 2 node cluster), and the head lives
    as long as the cluster does."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    head = next((n["NodeID"] for n in ray.nodes() if n.get("Alive") and HEAD_RESOURCE in n.get("Resources", {})), None)
    return NodeAffinitySchedulingStrategy(head, soft=False) if head else "DEFAULT"


HEAD_RESOURCE = "node:__internal_head__"  # the resource Ray gives the head node


def find(sweep_id: str) -> ray.actor.ActorHandle | None:
    try:
        return ray.get_actor(actor_name(sweep_id), namespace=NAMESPACE)
    except ValueError:
        return None
