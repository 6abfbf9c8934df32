"""Fixtures of the service tests.

Fast tests run the app in-process with a fake launcher (no Ray): `client` (FastAPI's TestClient) and
`fake_server` (uvicorn on a loopback port in a thread, for the CLI). The live tests run the real thing:
`ray_head` (`ray start --head` on 127.0.0.1, session-scoped; reused when RAY_ADDRESS is already set),
`service_factory` (`python -m service` in a subprocess on a free port, restartable), `postgres`
(a throwaway PostgreSQL server from Debian's package, run as the `postgres` user).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from harness import PostgresServer, RayHead, ServiceProcess, postgres_server
from svc_helpers import ExistingRay, FakeLauncher, ThreadServer, fast_settings, start_service

from service.api.health import mlflow_check
from service.app import create_app
from service.settings import Settings

# --------------------------------------------------------------------------------------------------
# In-process: fake launcher
# --------------------------------------------------------------------------------------------------


@pytest.fixture
def launcher() -> FakeLauncher:
    return FakeLauncher()


@pytest.fixture(scope="session")
def mlflow_uri(tmp_path_factory: pytest.TempPathFactory) -> str:
    """One MLflow store for the in-process tests: creating one costs seconds of migrations."""
    uri = f"sqlite:///{tmp_path_factory.mktemp('mlflow') / 'mlflow.db'}"
    mlflow_check(uri)
    return uri


@pytest.fixture
def make_settings(tmp_path: Path, mlflow_uri: str) -> Callable[..., Settings]:
    return lambda **overrides: fast_settings(tmp_path / "data", mlflow_tracking_uri=mlflow_uri, **overrides)


@pytest.fixture
def settings(make_settings: Callable[..., Settings]) -> Settings:
    return make_settings()


@pytest.fixture
def client(settings: Settings, launcher: FakeLauncher) -> Iterator[TestClient]:
    with TestClient(create_app(settings, launcher=launcher)) as c:
        yield c


@pytest.fixture
def app_client(make_settings: Callable[..., Settings], launcher: FakeLauncher) -> Iterator[Callable[..., TestClient]]:
    """Apps in process with settings of the test's choosing (`app_client(max_gpu_hours_per_sweep=...)`)."""
    clients: list[TestClient] = []

    def make(**overrides: Any) -> TestClient:
        client = TestClient(create_app(make_settings(**overrides), launcher=launcher))
        clients.append(client.__enter__())
        return client

    yield make
    for client in clients:
        client.__exit__(None, None, None)


@pytest.fixture
def fake_server(settings: Settings, launcher: FakeLauncher) -> Iterator[ThreadServer]:
    with ThreadServer(settings, launcher) as server:
        yield server


# --------------------------------------------------------------------------------------------------
# Live: PostgreSQL, Ray, the service in a subprocess
# --------------------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer]:
    with postgres_server() as server:
        yield server


@pytest.fixture(scope="session")
def ray_head(ray_address: str) -> ExistingRay:
    """The session's one Ray head (tests/conftest.py), as services under test see it."""
    return ExistingRay()


@pytest.fixture
def service_factory(ray_head: RayHead | ExistingRay, tmp_path: Path) -> Iterator[Callable[..., ServiceProcess]]:
    """`service_factory(**env)` starts a service with its own data dir (restart it with `.restart()`)."""
    started: list[ServiceProcess] = []

    def make(**env: str) -> ServiceProcess:
        svc = start_service(ray_head, tmp_path, f"service-{len(started)}", **env)
        started.append(svc)
        return svc

    yield make
    for svc in started:
        svc.stop()
