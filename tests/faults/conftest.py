"""The fault-injection suite: `sweeps serve` as the README runs it (its own local Ray head), a real
MLflow and Optuna, faults injected by process id. Helpers shared by its tests."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from fault_helpers import EMBEDDED, TOKEN
from harness import ServiceProcess

from service.cluster.processes import free_port
from service.cluster.ray_head import LocalRayHead


@pytest.fixture
def serve(tmp_path: Path, token_cache: Path) -> Iterator[Callable[..., tuple[ServiceProcess, Path]]]:
    """`serve(data_dir=None, **env)`: `sweeps serve` on a free port with its own data dir (default
    <tmp_path>/data; and so its own Ray head)."""
    started: list[tuple[ServiceProcess, Path]] = []

    def make(data_dir: Path | None = None, **env: str) -> tuple[ServiceProcess, Path]:
        data_dir = data_dir or tmp_path / "data"
        port = free_port()
        full_env = {
            "SWEEPS_DATA_DIR": str(data_dir),
            "SWEEPS_TOKENS": f"ops={TOKEN}",
            "SWEEPS_DRIVER_RESTART_BACKOFF_S": "1",
            "BATCHSWEEP_CACHE": str(token_cache),
            **env,
        }
        command = [str(Path(sys.executable).parent / "sweeps"), "serve", "--host", "127.0.0.1", "--port", str(port)]
        unset = tuple(k for k in EMBEDDED if k not in env)
        svc = ServiceProcess(env=full_env, log_path=tmp_path / "api.log", port=port, command=command, unset=unset)
        started.append((svc, data_dir))
        return svc.start(timeout_s=180), data_dir

    try:
        yield make
    finally:
        for svc, data_dir in started:
            svc.stop()
            LocalRayHead(data_dir).stop()
