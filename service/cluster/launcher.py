"""Sweep drivers on the Ray cluster, as the service sees them.

A sweep's driver is a detached, named Ray actor (`service.cluster.remote.SweepActor`): it outlives the service,
and a restarted service finds it again by name. `RayLauncher` starts, queries, cancels and kills them.
Every method blocks (Ray's client is synchronous): the web layer calls them in worker threads.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Protocol

import ray
from ray.exceptions import GetTimeoutError, RayActorError

from service.cluster import remote
from service.cluster.ray_head import LocalRayHead
from service.settings import Settings
from sweeps.admission import ClusterCapacity, capacity_from_ray
from sweeps.runtime import alive_nodes, check_storage
from sweeps.stores import prepare_storage

log = logging.getLogger(__name__)


class DriverBusy(Exception):
    """The driver did not answer in time; ask again on the next poll."""


class DriverLost(Exception):
    """The driver's actor died while it was being started (killed, its node lost): the cluster failed,
    not the sweep; a relaunch resumes it."""


class Launcher(Protocol):
    """What the service needs from wherever sweep drivers run (a fake in tests without Ray)."""

    def connect(self) -> None: ...

    def start(self, sweep_id: str, spec: dict[str, Any]) -> None:
        """Start the sweep's driver; DriverLost when it died while starting."""
        ...

    def state(self, sweep_id: str) -> dict[str, Any] | None:
        """The driver's state (`SweepActor.state()`), None when no driver exists. May raise DriverBusy."""
        ...

    def cancel(self, sweep_id: str) -> bool:
        """Ask the driver to stop; False when no driver exists."""
        ...

    def kill(self, sweep_id: str) -> None: ...

    def driver_ids(self) -> list[str]:
        """Sweep ids of every driver actor alive on the cluster."""
        ...

    def check(self) -> dict[str, Any]:
        """Raises when the cluster cannot be reached; else a short description of it."""
        ...

    def capacity(self) -> ClusterCapacity | None:
        """The nodes the cluster has and its autoscaler can add (sweeps.admission); None: not known."""
        ...

    def close(self) -> None: ...


def prepare_optuna(url: str) -> None:
    """`sweeps.stores.prepare_storage` by the service before it starts any driver (drivers that open a
    fresh storage together race to create its tables and fail their sweeps). Not fatal: a driver creates
    them when this fails."""
    try:
        prepare_storage(url)
    except Exception as exc:  # the URL may hold a password: its type only
        log.warning("could not prepare the Optuna storage (%s); the first drivers create it", type(exc).__name__)


CAPACITY_TTL_S = 10.0  # a submit reads the cluster's nodes at most this often (a GCS round trip each)


class RayLauncher:
    def __init__(self, settings: Settings, *, call_timeout_s: float = 10.0) -> None:
        self.settings = settings
        self.call_timeout_s = call_timeout_s
        self._capacity: tuple[float, ClusterCapacity | None] | None = None  # (monotonic time read, capacity)
        self._reading = threading.Lock()
        # handles cached: ray.get_actor is a GCS round trip, and the poller asks every second
        self._handles: dict[str, Any] = {}
        self._lock = threading.Lock()

    def connect(self) -> None:
        from worker.launch import init_ray  # torch-free (worker.config + ray)

        address = self.settings.ray_address
        if not address:
            # the service's own head, in a process group of its own (service/cluster/ray_head.py says why)
            address = LocalRayHead(self.settings.data_dir).ensure().address
        init_ray(address)
        log.info("connected to Ray at %s", ray.get_runtime_context().gcs_address)
        runtime, nodes = self.settings.runtime(), alive_nodes()
        check_storage(runtime, nodes=nodes)
        prepare_optuna(runtime.optuna_storage)
        if nodes > 1 and runtime.storage_is_local:
            log.info("trial storage %s is shared: all %d nodes read it", runtime.trial_storage, nodes)

    def start(self, sweep_id: str, spec: dict[str, Any]) -> None:
        try:
            handle = remote.launch(sweep_id, spec, self.settings.runtime())
        except RayActorError as exc:
            raise DriverLost(f"sweep {sweep_id}: its driver died while it started: {exc}") from exc
        with self._lock:
            self._handles[sweep_id] = handle

    def _handle(self, sweep_id: str, *, fresh: bool = False) -> Any | None:
        with self._lock:
            if not fresh and sweep_id in self._handles:
                return self._handles[sweep_id]
        handle = remote.find(sweep_id)
        with self._lock:
            if handle is None:
                self._handles.pop(sweep_id, None)
            else:
                self._handles[sweep_id] = handle
        return handle

    def state(self, sweep_id: str) -> dict[str, Any] | None:
        for fresh in (False, True):  # a cached handle may name an actor that died: look again once
            handle = self._handle(sweep_id, fresh=fresh)
            if handle is None:
                return None
            try:
                return dict(ray.get(handle.state.remote(), timeout=self.call_timeout_s))
            except GetTimeoutError:
                raise DriverBusy(f"sweep {sweep_id}: driver did not answer within {self.call_timeout_s} s") from None
            except RayActorError as exc:
                if getattr(exc, "preempted", False) or type(exc).__name__ == "ActorUnavailableError":
                    raise DriverBusy(f"sweep {sweep_id}: driver unavailable: {exc}") from None
                log.warning("sweep %s: driver actor died: %s", sweep_id, exc)
                with self._lock:
                    self._handles.pop(sweep_id, None)
        return None

    def cancel(self, sweep_id: str) -> bool:
        handle = self._handle(sweep_id)
        if handle is None:
            return False
        try:
            ray.get(handle.cancel.remote(), timeout=self.call_timeout_s)
        except GetTimeoutError:
            log.warning(
                "sweep %s: cancel not acknowledged in %s s; the poller repeats it", sweep_id, self.call_timeout_s
            )
        except RayActorError:
            return False
        return True

    def kill(self, sweep_id: str) -> None:
        handle = self._handle(sweep_id)
        with self._lock:
            self._handles.pop(sweep_id, None)
        if handle is not None:
            ray.kill(handle, no_restart=True)

    def driver_ids(self) -> list[str]:
        prefix = remote.actor_name("")
        out = []
        for entry in ray.util.list_named_actors(all_namespaces=True):
            name = entry.get("name", "") if isinstance(entry, dict) else str(entry)
            namespace = entry.get("namespace") if isinstance(entry, dict) else None
            if namespace == remote.NAMESPACE and name.startswith(prefix):
                out.append(name[len(prefix) :])
        return out

    def check(self) -> dict[str, Any]:
        if not ray.is_initialized():
            raise RuntimeError("not connected to Ray")
        resources = ray.cluster_resources()  # a GCS round trip: fails when the cluster is gone
        return {"cpus": resources.get("CPU", 0), "gpus": resources.get("GPU", 0)}

    def capacity(self) -> ClusterCapacity | None:
        with self._lock:
            cached = self._capacity
        if cached is not None and time.monotonic() - cached[0] < CAPACITY_TTL_S:
            return cached[1]
        # one read at a time: while the GCS is slow to answer (a cluster restarting), other submits take the
        # last reading (or none) instead of each holding a thread on the same call
        if not self._reading.acquire(blocking=False):
            return cached[1] if cached is not None else None
        try:
            capacity: ClusterCapacity | None = capacity_from_ray()
        except Exception as exc:  # the cluster unreachable: the health check says so; submits are not judged
            log.warning("could not read the cluster's nodes (%s: %s); admission not checked", type(exc).__name__, exc)
            capacity = None
        finally:
            self._reading.release()
        with self._lock:
            self._capacity = (time.monotonic(), capacity)
        return capacity

    def close(self) -> None:
        # disconnects this process only: the cluster (the service's own local head too) and its
        # detached drivers keep running
        with self._lock:
            self._handles.clear()
        if ray.is_initialized():
            ray.shutdown()
