"""The test harness (tests and benchmarks only; nothing of the project imports it): local processes on
127.0.0.1: a Ray head, the service under uvicorn, a PostgreSQL server; a multi-node Ray cluster, an
S3-compatible server and an MLflow tracking server for the multi-node suite (tests/cluster/).

Everything binds to 127.0.0.1 on free ports and runs in its own process group, so stopping it ends
exactly the processes it started (never `ray stop`, which ends every Ray process of the machine).

A process group, not a new session: with the kernel's autogroup scheduling (on here), each session
gets an equal share of the CPU whatever its processes' nice values, so a Ray head in a session of its
own trained at full weight next to the service, and Ray's nice 15 for its workers counted for nothing
(measured with benchmarks/api_load.py: ~20% fewer requests/s). In the caller's session, as
`make demo` runs them, the workers yield to the service.
"""

from __future__ import annotations

import logging
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from service.cluster.processes import LOOPBACK, descendants, free_port, free_ports, stop_tree, wait_for_port
from service.cluster.ray_head import head_env, launch_head, stop_head_process
from worker.config import EvalConfig, ModelConfig, OptimizerConfig, ResourcesConfig, TrainConfig
from worker.local_ray import LOOPBACK_ENV, TRAIN_ENV

__all__ = [
    "AWS_ENV",
    "LOOPBACK",
    "LOOPBACK_ENV",
    "TRIAL_RESOURCE",
    "MlflowServer",
    "MotoS3",
    "MultiNodeRay",
    "PostgresServer",
    "RayHead",
    "ServiceProcess",
    "create_database",
    "free_port",
    "venv_env",
]

log = logging.getLogger(__name__)


def venv_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    # Ray workers and `python` entrypoints resolve through PATH: this interpreter's bin first
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env.update(extra or {})
    return env


# --------------------------------------------------------------------------------------------------
# Ray
# --------------------------------------------------------------------------------------------------


@dataclass
class RayHead:
    """`ray start --head --block` on loopback with token auth, in its own process group."""

    log_path: Path
    num_cpus: int = 2
    port: int = 0  # chosen by start(): free ports
    dashboard_port: int = 0
    token: str = field(default_factory=lambda: secrets.token_hex(16))
    proc: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> str:
        return f"{LOOPBACK}:{self.port}"

    @property
    def client_env(self) -> dict[str, str]:
        """What a process needs in its environment to use this cluster (before `import ray`)."""
        return {"RAY_ADDRESS": self.address, **LOOPBACK_ENV, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": self.token}

    def start(self, timeout_s: float = 90.0) -> RayHead:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        env = head_env({"RAY_AUTH_TOKEN": self.token})
        self.proc, self.port, self.dashboard_port = launch_head(
            self.log_path, env=env, num_cpus=self.num_cpus, timeout_s=timeout_s
        )
        log.info("ray head at %s (pid %s)", self.address, self.proc.pid)
        return self

    def stop(self) -> None:
        if self.proc is not None:
            stop_head_process(self.proc.pid, proc=self.proc)
            self.proc = None


# --------------------------------------------------------------------------------------------------
# The service
# --------------------------------------------------------------------------------------------------


@dataclass
class ServiceProcess:
    """The service in a subprocess on a free loopback port; `restart()` keeps the port and the environment."""

    env: dict[str, str]  # SWEEPS_* and the Ray client env
    log_path: Path
    port: int = field(default_factory=free_port)
    # None: `python -m service` with SWEEPS_HOST/SWEEPS_PORT set; else this command, as it is
    command: list[str] | None = None
    # variables of this process's environment the service must not see (RAY_ADDRESS: the embedded default)
    unset: tuple[str, ...] = ()
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    def start(self, timeout_s: float = 120.0) -> ServiceProcess:
        if self.command is None:
            env = venv_env(self.env | {"SWEEPS_HOST": LOOPBACK, "SWEEPS_PORT": str(self.port)})
            command = [sys.executable, "-m", "service", "--log-level", "info"]
        else:
            env, command = venv_env(self.env), self.command
        for key in self.unset:
            env.pop(key, None)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as out:
            self.proc = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT, process_group=0)
        deadline = time.monotonic() + timeout_s
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"service exited with {self.proc.returncode}; see {self.log_path}:\n{self.tail()}")
            try:
                # any answer means the lifespan finished: uvicorn listens only after it
                httpx.get(f"{self.url}/healthz", timeout=5)
                return self
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise TimeoutError(f"service not up within {timeout_s} s; see {self.log_path}:\n{self.tail()}")
            time.sleep(0.25)

    def stop(self, timeout_s: float = 20.0) -> None:
        if self.proc is not None:
            stop_tree(self.proc.pid, timeout_s=timeout_s, proc=self.proc)
            self.proc = None

    def restart(self) -> ServiceProcess:
        self.stop()
        return self.start()

    def tail(self, chars: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""


# --------------------------------------------------------------------------------------------------
# PostgreSQL (Debian's package: /usr/lib/postgresql/<version>/bin)
# --------------------------------------------------------------------------------------------------


def postgres_bin() -> Path:
    candidates = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"), key=lambda p: int(p.parent.parent.name))
    if not candidates:
        raise FileNotFoundError(
            "PostgreSQL server binaries not found under /usr/lib/postgresql; "
            "install them with: apt-get update && apt-get install -y postgresql"
        )
    return candidates[-1].parent


@dataclass
class PostgresServer:
    """A throwaway cluster: `initdb` + `pg_ctl start` in `root`, loopback only, as a non-root user."""

    root: Path
    port: int = field(default_factory=free_port)
    user: str = "postgres"  # the OS user that runs the server when we are root (initdb refuses root)
    db_user: str = "sweeps"
    password: str = field(default_factory=lambda: secrets.token_hex(12))
    database: str = "sweeps"

    @property
    def url(self) -> str:
        return f"postgresql+psycopg://{self.db_user}:{self.password}@{LOOPBACK}:{self.port}/{self.database}"

    def _run(self, *args: str, env: Mapping[str, str] | None = None) -> None:
        cmd = list(args)
        if os.geteuid() == 0:
            cmd = ["runuser", "-u", self.user, "--", *cmd]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
        if out.returncode != 0:
            raise RuntimeError(f"{' '.join(args[:1])} failed ({out.returncode}): {out.stderr[-2000:]}")

    def start(self) -> PostgresServer:
        bin_dir = postgres_bin()
        data = self.root / "data"
        self.root.mkdir(parents=True, exist_ok=True)
        pwfile = self.root / "pw"
        pwfile.write_text(self.password)
        if os.geteuid() == 0:
            shutil.chown(self.root, self.user)
            shutil.chown(pwfile, self.user)
        self._run(
            str(bin_dir / "initdb"),
            "-D",
            str(data),
            "-U",
            self.db_user,
            f"--pwfile={pwfile}",
            "--auth=scram-sha-256",
            "-E",
            "UTF8",
            "--no-sync",
        )
        # loopback TCP only; the socket directory is ours, not /var/run/postgresql
        options = f"-c listen_addresses={LOOPBACK} -p {self.port} -k {self.root} -c fsync=off"
        self._run(str(bin_dir / "pg_ctl"), "-D", str(data), "-l", str(self.root / "log"), "-o", options, "-w", "start")
        self._run(
            str(bin_dir / "createdb"),
            "-h",
            LOOPBACK,
            "-p",
            str(self.port),
            "-U",
            self.db_user,
            self.database,
            env=os.environ | {"PGPASSWORD": self.password},
        )
        return self

    def stop(self) -> None:
        data = self.root / "data"
        if (data / "postmaster.pid").exists():
            self._run(str(postgres_bin() / "pg_ctl"), "-D", str(data), "-m", "immediate", "-w", "stop")


@contextmanager
def postgres_server() -> Iterator[PostgresServer]:
    """A PostgresServer in a folder of its own under /tmp, removed after: not pytest's tmp_path, whose
    parents are private to root, while the server runs as `postgres`."""
    root = Path(tempfile.mkdtemp(prefix="batchsweep-pg-", dir="/tmp"))
    server = PostgresServer(root).start()
    try:
        yield server
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)


# --------------------------------------------------------------------------------------------------
# The multi-node suite: a cluster of several Ray nodes, S3, an MLflow tracking server
# --------------------------------------------------------------------------------------------------

TRIAL_RESOURCE = "trial_node"  # what worker nodes have and the head lacks: placement is asserted on it
AWS_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_EC2_METADATA_DISABLED": "true",  # no lookups of instance credentials (there is no network)
}


# --------------------------------------------------------------------------------------------------
# S3
# --------------------------------------------------------------------------------------------------


@dataclass
class MotoS3:
    log_path: Path
    bucket: str = "sweeps"
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    def uri(self, prefix: str) -> str:
        """An s3:// URI pyarrow (Ray's storage) understands, with the endpoint override in its query."""
        return f"s3://{self.bucket}/{prefix}?endpoint_override={LOOPBACK}:{self.port}&scheme=http"

    def start(self) -> MotoS3:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as out:
            self.proc = subprocess.Popen(
                [str(Path(sys.executable).parent / "moto_server"), "-H", LOOPBACK, "-p", str(self.port)],
                env=venv_env(AWS_ENV),
                stdout=out,
                stderr=subprocess.STDOUT,
                process_group=0,
            )
        wait_for_port(self.port, 60, self.proc)
        self.client().create_bucket(Bucket=self.bucket)
        return self

    def client(self) -> Any:
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint, **_boto_credentials())

    def keys(self, prefix: str = "") -> list[str]:
        out: list[str] = []
        for page in self.client().get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix):
            out += [o["Key"] for o in page.get("Contents", [])]
        return out

    def stop(self) -> None:
        if self.proc is not None:
            stop_tree(self.proc.pid, proc=self.proc)
            self.proc = None


def _boto_credentials() -> dict[str, str]:
    return {
        "aws_access_key_id": AWS_ENV["AWS_ACCESS_KEY_ID"],
        "aws_secret_access_key": AWS_ENV["AWS_SECRET_ACCESS_KEY"],
        "region_name": AWS_ENV["AWS_DEFAULT_REGION"],
    }


# --------------------------------------------------------------------------------------------------
# MLflow tracking server
# --------------------------------------------------------------------------------------------------


@dataclass
class MlflowServer:
    """`mlflow server`: runs in the metadata database `backend_uri`, artifacts proxied to `artifacts_uri`
    (a folder, or s3://bucket/prefix on the S3 server at `s3_endpoint`). `stop()` then `start()` brings it
    back on the same port (an outage)."""

    backend_uri: str
    artifacts_uri: str
    workdir: Path  # its working directory and log
    s3_endpoint: str | None = None
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    def start(self, timeout_s: float = 120.0) -> MlflowServer:
        self.workdir.mkdir(parents=True, exist_ok=True)
        cmd = [
            str(Path(sys.executable).parent / "mlflow"), "server",
            "--backend-store-uri", self.backend_uri,
            "--artifacts-destination", self.artifacts_uri,
            "--serve-artifacts",
            "--host", LOOPBACK, "--port", str(self.port), "--workers", "1",
        ]  # fmt: skip
        env = venv_env(AWS_ENV | {"MLFLOW_S3_ENDPOINT_URL": self.s3_endpoint} if self.s3_endpoint else None)
        with open(self.workdir / "server.log", "ab") as out:
            self.proc = subprocess.Popen(
                cmd, env=env, cwd=self.workdir, stdout=out, stderr=subprocess.STDOUT, process_group=0
            )
        deadline = time.monotonic() + timeout_s
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"mlflow server exited: {(self.workdir / 'server.log').read_text()[-3000:]}")
            try:
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"mlflow server not up within {timeout_s} s")
            time.sleep(0.5)

    def stop(self) -> None:
        if self.proc is not None:
            stop_tree(self.proc.pid, proc=self.proc)
            self.proc = None


def create_database(url: str, name: str) -> str:
    """A second database on the PostgreSQL server of `url` (SQLAlchemy form); its URL. MLflow and
    Optuna each keep an `alembic_version` table, so they cannot share one database."""
    import psycopg

    plain = url.replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(plain, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    return url.rsplit("/", 1)[0] + f"/{name}"


# --------------------------------------------------------------------------------------------------
# Ray
# --------------------------------------------------------------------------------------------------


@dataclass
class MultiNodeRay:
    """A Ray head that hosts drivers only (0 CPUs) and `workers` nodes of 1 CPU each."""

    env: Mapping[str, str]  # what every Ray process (drivers, trials) sees: storage credentials, caches
    workers: int = 2
    head_cpus: int = 0  # 0: the head hosts drivers only (benchmarks/cluster_overhead.py: one node with the CPUs)
    cluster: Any = None
    temp_dir: str = ""
    _saved_env: dict[str, str | None] = field(default_factory=dict)

    def start(self) -> MultiNodeRay:
        from ray.cluster_utils import Cluster

        # Unix socket paths must stay short: a folder of its own under /tmp (it must exist first)
        self.temp_dir = tempfile.mkdtemp(prefix="bsc-", dir="/tmp")
        # Cluster writes its address file into Ray's default folder (`$RAY_TMPDIR/ray`) whatever temp_dir
        # it is given, and fails where that folder does not exist yet (a machine where Ray never ran):
        # point that default into the cluster's own folder, so it exists and no other cluster sees it
        os.mkdir(os.path.join(self.temp_dir, "ray"))
        # Ray processes inherit this process's environment: set it for them, restore it at stop
        for key, value in {**TRAIN_ENV, **self.env, "RAY_TMPDIR": self.temp_dir}.items():
            self._saved_env[key] = os.environ.get(key)
            os.environ[key] = value
        dashboard_port, gcs_port = free_ports(2)  # GCS and dashboard: free ones, never the defaults
        self.cluster = Cluster(
            initialize_head=True,
            head_node_args={
                "num_cpus": self.head_cpus,
                "resources": {TRIAL_RESOURCE: self.head_cpus} if self.head_cpus else {},
                "node_ip_address": LOOPBACK,
                "temp_dir": self.temp_dir,
                "include_dashboard": True,  # Ray Train needs the State API
                "dashboard_host": LOOPBACK,
                "dashboard_port": dashboard_port,
                "gcs_server_port": gcs_port,
                "_system_config": {"health_check_period_ms": 1000, "health_check_failure_threshold": 3},
            },
        )
        for _ in range(self.workers):
            self.add_node()
        return self

    @property
    def address(self) -> str:
        return self.cluster.address

    @property
    def head_id(self) -> str:
        return self.cluster.head_node.node_id

    def add_node(self) -> Any:
        node = self.cluster.add_node(num_cpus=1, resources={TRIAL_RESOURCE: 1}, node_ip_address=LOOPBACK)
        self.cluster.wait_for_nodes()
        return node

    def worker_nodes(self) -> list[Any]:
        return list(self.cluster.worker_nodes)

    def kill_node(self, node_id: str) -> list[int]:
        """kill -9 the raylet of node `node_id` and every process under it (its workers): a lost node."""
        node = next(n for n in self.cluster.worker_nodes if n.node_id == node_id)
        raylet = node.all_processes["raylet"][0].process.pid
        pids = [raylet, *descendants(raylet)]
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.cluster.remove_node(node, allow_graceful=False)
        return pids

    def stop(self) -> None:
        if self.cluster is not None:
            self.cluster.shutdown()  # kills the processes of its own nodes, by process id
            self.cluster = None
            shutil.rmtree(self.temp_dir, ignore_errors=True)
        for key, value in self._saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


# ---- one tiny DDP run, and what makes it equal to one worker ------------------------------------------

# gpt2-nano, 16 steps of 16 sequences in micro-batches of 4, 4 evaluations: seconds on one CPU per worker.
# tests/integration/test_worker_on_ray.py runs it on one node, tests/cluster/ddp_across_nodes.py across two.
TINY_DDP_CONFIG = TrainConfig(
    model=ModelConfig(preset="gpt2-nano", seq_len=32),
    optimizer=OptimizerConfig(name="adamw", lr=3e-3),
    evaluation=EvalConfig(every_tokens=16 * 32 * 4, tokens=256),
    resources=ResourcesConfig(max_micro_batch=4, cpus_per_worker=1),
    batch_size=16,
    token_budget=16 * 32 * 16,
)


def on_workers(cfg: TrainConfig, workers: int) -> TrainConfig:
    """`cfg` data-parallel over `workers` workers."""
    return cfg.model_copy(update={"resources": cfg.resources.model_copy(update={"workers_per_trial": workers})})


def assert_ddp_matches_one_worker(single: list[dict], ddp: list[dict], ddp_final: dict) -> None:
    """DDP over 2 workers is the 1-worker run (histories of `TINY_DDP_CONFIG`): the same global batches in
    the same order, so the same curve up to float summation order (which training amplifies a little step
    by step); both ranks ended with identical weights (all-gathered and compared inside the run)."""
    assert ddp_final["ranks_in_sync"] is True
    assert [m["tokens"] for m in ddp] == [m["tokens"] for m in single]
    assert ddp[0]["val_loss"] == pytest.approx(single[0]["val_loss"], rel=1e-5)
    for a, b in zip(single, ddp, strict=True):
        assert b["val_loss"] == pytest.approx(a["val_loss"], rel=1e-3)
        assert b["train_loss"] == pytest.approx(a["train_loss"], rel=1e-3)


# ---- the smallest real sweep ----------------------------------------------------------------------


def real_report() -> dict[str, Any]:
    """A real report (`build_report`) of adamw at batch 4 and 8: 2 search trials and 2 seeds each, as
    report.json and the service's store hold it (JSON)."""
    from spec_helpers import spec_for

    from sweeps.analysis import TrialResult, build_report

    results = [
        TrialResult("adamw", bs, lr, seed, role, "completed", loss + 0.01 * seed, 4096, 4096 // (bs * 32))
        for bs, loss in ((4, 5.12), (8, 5.30))
        for lr, seed, role in ((3e-3, 0, "search"), (1e-2, 0, "search"), (3e-3, 1, "confirm"), (3e-3, 2, "confirm"))
    ]
    spec = spec_for(
        name="cli", batch_sizes=(4, 8), tolerance=0.05, lr=(1e-3, 1e-2), seeds=2, seq_len=32, token_budget=4096
    )
    report = build_report(results, spec=spec)
    return report.model_dump(mode="json")


def tiny_spec(name: str = "tiny", **overrides: Any) -> dict[str, Any]:
    """The smallest real sweep: 6 trials (2 lrs x 2 batch sizes + a seed each) of 5,888 tokens of gpt2-nano."""
    spec: dict[str, Any] = {
        "name": name,
        "model": {"preset": "gpt2-nano", "seq_len": 32},
        # vocabulary 512: a step of gpt2-nano costs a third of one at the default 4096 (its LM head is most of
        # it); the tokenizer is trained once per vocabulary and cached for the session
        "data": {"source": "builtin", "vocab_size": 512},
        "optimizers": [{"name": "adamw"}],
        "batch_sizes": [4, 8],
        "token_budget": 6000,
        # 4,096 tokens every 1,536: the spec's defaults (32,768 every tenth of the budget) would score 55x
        # the tokens each trial trains, 8-10 s of a trial's ~1 s of training. The flat keys (still accepted,
        # moved into `evaluation`): callers override them as such, and every test built on this spec runs them
        "eval_every_tokens": 1536,
        "eval_tokens": 4096,
        "lr": {"min": 1e-3, "max": 1e-2, "trials_per_batch_size": 2},
        "seeds": 1,
        "degradation": {"tolerance": 0.05, "baseline": "adamw"},
        "resources": {"max_concurrent_trials": 2},
    }
    spec.update(overrides)
    return spec


# Debian's Chromium (`/usr/bin/chromium`, which `make test`'s setup installs), driven by Playwright, whose
# own browser download does not work offline (its Python wheel carries its driver). Headless on a machine
# with no network: without the background-networking flags Chromium's own connections are refused by the
# closed network, many at a time.
CHROMIUM = os.environ.get("BATCHSWEEP_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@contextmanager
def chromium() -> Iterator[Any]:
    """A Playwright `Browser` on Debian's Chromium; the test fails (never skips) where it is missing."""
    from playwright.sync_api import sync_playwright

    exe = CHROMIUM if os.path.exists(CHROMIUM) else shutil.which("chromium")
    if exe is None:
        pytest.fail("Chromium is missing: these tests need Debian's `chromium` package (apt-get install -y chromium)")
    # Playwright, not our own DevTools-protocol client: the browser's events come typed and tested upstream.
    # A screenshot is a record, and the pages use system fonts only; Chromium's document.fonts.ready, which a
    # screenshot awaits, has hung past 120 s under the suite's load: Playwright's own switch skips that wait
    # (read by its driver, which this starts)
    os.environ.setdefault("PW_TEST_SCREENSHOT_NO_FONTS_READY", "1")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=exe, headless=True, args=CHROMIUM_FLAGS)
        try:
            yield browser
        finally:
            browser.close()
