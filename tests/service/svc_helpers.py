"""Helpers of the service tests: tokens, polling, and a launcher without Ray (the tiny spec: tests/harness.py)."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import uvicorn
from harness import LOOPBACK, RayHead, ServiceProcess, free_port

from service.app import create_app
from service.cluster.launcher import DriverBusy
from service.settings import Settings
from sweeps.admission import ClusterCapacity

ALICE, BOB = "alice-token-0123456789", "bob-token-0123456789"
TOKENS = f"alice={ALICE},bob={BOB}"


def auth(token: str = ALICE) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def wait_until(
    predicate: Callable[[], Any], timeout_s: float, interval_s: float = 0.05, what: str = "condition"
) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached within {timeout_s} s")
        time.sleep(interval_s)


class FakeLauncher:
    """A launcher without Ray: drivers are dicts the test moves along by hand."""

    def __init__(self) -> None:
        self.drivers: dict[str, dict[str, Any]] = {}
        self.started: list[str] = []
        self.cancelled: list[str] = []
        self.killed: list[str] = []
        self.busy: set[str] = set()
        self.fail_start: str | None = None  # message of the error start() raises
        self.start_delay_s = 0.0
        self.healthy = True
        self.capacity_of: ClusterCapacity | None = None  # what capacity() answers: None, not known (no check)
        self.capacity_delay_s = 0.0  # how long capacity() takes (a slow GCS)
        self._lock = threading.Lock()

    def connect(self) -> None:
        pass

    def start(self, sweep_id: str, spec: dict[str, Any]) -> None:
        if self.start_delay_s:
            time.sleep(self.start_delay_s)
        if self.fail_start:
            raise RuntimeError(self.fail_start)
        with self._lock:
            self.started.append(sweep_id)
            self.drivers.setdefault(
                sweep_id,
                {
                    "status": "running",
                    "progress": None,
                    "report": None,
                    "error": None,
                    "experiment_id": None,
                    "started_at": time.time(),
                    "finished_at": None,
                },
            )

    def state(self, sweep_id: str) -> dict[str, Any] | None:
        if sweep_id in self.busy:
            raise DriverBusy(f"{sweep_id} busy")
        with self._lock:
            d = self.drivers.get(sweep_id)
            return dict(d) if d is not None else None

    def set(self, sweep_id: str, **fields: Any) -> None:
        with self._lock:
            self.drivers[sweep_id] |= fields

    def finish(self, sweep_id: str, status: str = "succeeded", report: dict[str, Any] | None = None) -> None:
        self.set(
            sweep_id,
            status=status,
            report=report if report is not None else {"answer": 42},
            experiment_id="7",
            finished_at=time.time(),
        )

    def cancel(self, sweep_id: str) -> bool:
        with self._lock:
            if sweep_id not in self.drivers:
                return False
            self.cancelled.append(sweep_id)
            return True

    def kill(self, sweep_id: str) -> None:
        with self._lock:
            self.killed.append(sweep_id)
            self.drivers.pop(sweep_id, None)

    def driver_ids(self) -> list[str]:
        with self._lock:
            return list(self.drivers)

    def check(self) -> dict[str, Any]:
        if not self.healthy:
            raise RuntimeError("cluster gone")
        return {"cpus": 2}

    def capacity(self) -> ClusterCapacity | None:
        time.sleep(self.capacity_delay_s)
        return self.capacity_of

    def close(self) -> None:
        pass


def fast_settings(data_dir: Path, **overrides: Any) -> Settings:
    values: dict[str, Any] = {
        "data_dir": data_dir,
        "tokens": TOKENS,
        "poll_interval_s": 0.05,
        "sse_interval_s": 0.05,
        "sse_heartbeat_s": 0.2,
        "health_cache_s": 0.0,
        "mlflow_tracking_uri": f"sqlite:///{data_dir / 'mlflow.db'}",
        "ray_address": None,
        "max_concurrent_per_owner": 10,
        "submit_burst": 1000,  # tests submit in bursts; tests/service/test_bad_input.py tests the limit itself
    }
    values.update(overrides)
    return Settings(**values)


def slow_dashboard_page(tracking_uri: str, sweep_id: str, *, plotlyjs_src: str | None = None) -> str:
    """A dashboard that takes as long to draw as a small real one (0.5 s of CPU holding the GIL in slices,
    as drawing does), naming the process that drew it. A module's function, so the service's render
    process can be sent it."""
    started = time.perf_counter()
    while time.perf_counter() - started < 0.5:
        sum(range(1000))
    return f"<html><body>dashboard of {sweep_id} drawn by {os.getpid()}</body></html>"


class ThreadServer:
    """uvicorn serving the app (fake launcher) on a loopback port, in a thread of the test process."""

    def __init__(self, settings: Settings, launcher: FakeLauncher) -> None:
        self.port = free_port()
        self.url = f"http://{LOOPBACK}:{self.port}"
        self.launcher = launcher
        self.app = create_app(settings, launcher=launcher)
        config = uvicorn.Config(
            self.app,
            host=LOOPBACK,
            port=self.port,
            log_level="warning",
            timeout_graceful_shutdown=1,
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> ThreadServer:
        self.thread.start()
        wait_until(lambda: self.server.started, 60, what="uvicorn start")
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


def live_client(svc: ServiceProcess, token: str = ALICE) -> httpx.Client:
    return httpx.Client(base_url=svc.url, headers=auth(token), timeout=30)


class ExistingRay:
    """A cluster somebody else started (RAY_ADDRESS in the environment)."""

    def __init__(self) -> None:
        keys = ("RAY_ADDRESS", "RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER")
        self.client_env = {k: os.environ[k] for k in keys if k in os.environ}
        self.address = self.client_env["RAY_ADDRESS"]


def start_service(ray: RayHead | ExistingRay, root: Path, name: str, **env: str) -> ServiceProcess:
    """`python -m service` against `ray`, data under `root`; `env` overrides SWEEPS_* settings."""
    base = {
        "SWEEPS_DATA_DIR": str(root / "data"),
        "SWEEPS_TOKENS": TOKENS,
        "SWEEPS_POLL_INTERVAL_S": "0.5",
        "SWEEPS_HEALTH_CACHE_S": "0",
        "PYTHONUNBUFFERED": "1",
    }
    svc = ServiceProcess(env=ray.client_env | base | env, log_path=root / f"{name}.log")
    return svc.start()
