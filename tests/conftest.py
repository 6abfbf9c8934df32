"""Shared fixtures: one real Ray cluster for the whole session (started like production, with
`ray start --head`, bound to 127.0.0.1), and one token cache for the built-in corpus."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from worker.local_ray import use_local_ray

use_local_ray()  # before anything imports ray: local Ray clusters on loopback, with token auth


@pytest.fixture(scope="session")
def token_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One cache of tokenised corpora for the session, shared with Ray workers through the env."""
    path = tmp_path_factory.mktemp("token-cache")
    os.environ["BATCHSWEEP_CACHE"] = str(path)
    return path


@pytest.fixture(scope="session")
def ray_address(token_cache: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A local Ray cluster in its own process group (`ray start --head --block`, 127.0.0.1 only), so
    services under test can restart around it; stopped by process id, never `ray stop`."""
    from harness import RayHead

    from worker.local_ray import TRAIN_ENV

    token = (Path.home() / ".ray" / "auth_token").read_text().strip()  # use_local_ray() created it
    head = RayHead(tmp_path_factory.mktemp("ray-head") / "head.log", num_cpus=4, token=token).start(timeout_s=180)
    previous = os.environ.get("RAY_ADDRESS")
    os.environ["RAY_ADDRESS"] = head.address
    for key, value in TRAIN_ENV.items():
        os.environ.setdefault(key, value)
    try:
        yield head.address
    finally:
        import ray

        ray.shutdown()
        head.stop()
        if previous is None:
            os.environ.pop("RAY_ADDRESS", None)
        else:
            os.environ["RAY_ADDRESS"] = previous


@pytest.fixture(scope="session")
def ray_session(ray_address: str) -> Iterator[str]:
    """This test process connected to the session's cluster as a driver."""
    from worker.launch import init_ray

    init_ray(ray_address)
    yield ray_address


@pytest.fixture
def data_dir(tmp_path: Path) -> Iterator[Path]:
    """A fresh sweep data directory (SQLite stores for MLflow, Optuna, the service)."""
    path = tmp_path / "sweeps-data"
    path.mkdir()
    old = {k: os.environ.get(k) for k in ("SWEEPS_DATA_DIR", "MLFLOW_TRACKING_URI", "SWEEPS_OPTUNA_STORAGE")}
    os.environ["SWEEPS_DATA_DIR"] = str(path)
    os.environ.pop("MLFLOW_TRACKING_URI", None)
    os.environ.pop("SWEEPS_OPTUNA_STORAGE", None)
    try:
        yield path
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        shutil.rmtree(path, ignore_errors=True)


TINY_SWEEP = """
name: tiny
model: {preset: gpt2-nano, seq_len: 32}
data: {source: builtin, vocab_size: 512}
optimizers: [{name: adamw}, {name: merit}]
batch_sizes: [4, 8]
token_budget: 4096
lr: {min: 1.0e-3, max: 3.0e-2, trials_per_batch_size: 2}
seeds: 2
degradation: {tolerance: 0.05, baseline: adamw}
resources: {max_concurrent_trials: 2}
eval_every_tokens: 1024
eval_tokens: 4096
"""


@pytest.fixture(scope="session")
def tiny_sweep(ray_session: str, tmp_path_factory: pytest.TempPathFactory):  # -> (SweepOutcome, SweepRuntime)
    """One real tiny sweep (2 optimizers x 2 batch sizes x 3 trials) recorded in MLflow, for the
    tests of what a sweep records and of the figures made from it."""
    from sweeps.driver import run_sweep
    from sweeps.settings import runtime_from_env
    from sweeps.spec import SweepSpec

    runtime = runtime_from_env(tmp_path_factory.mktemp("tiny-sweep"))
    outcome = run_sweep(SweepSpec.from_yaml(TINY_SWEEP), runtime=runtime)
    return outcome, runtime


# Fixtures that start something outside this process: tests using them get a marker, so that `make
# test-fast` (-m "not ray and not slow and not gpu and not browser and not server and not compile and not
# serial") leaves them out.
_MARK_BY_FIXTURE = {
    "browser": "browser",  # Chromium (tests/dashboards/conftest.py)
    "postgres": "server",  # a PostgreSQL server (tests/service/conftest.py)
    "ray_address": "ray",  # the session's Ray head (above)
    "ray_session": "ray",
}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        for fixture in getattr(item, "fixturenames", ()):
            if mark := _MARK_BY_FIXTURE.get(fixture):
                item.add_marker(getattr(pytest.mark, mark))
