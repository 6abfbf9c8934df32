"""Local processes for tests and benchmarks: a Ray head, the service under uvicorn, a PostgreSQL server.

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
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from service.processes import LOOPBACK, free_port, free_ports, stop_tree, wait_for_port
from service.ray_head import LOOPBACK_ENV, head_command, head_env

__all__ = ["LOOPBACK", "LOOPBACK_ENV", "PostgresServer", "RayHead", "ServiceProcess", "free_port"]

log = logging.getLogger(__name__)


def _venv_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
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
    port: int = 0  # 0: a free one
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

    def __post_init__(self) -> None:
        if not self.port or not self.dashboard_port:
            self.port, self.dashboard_port = free_ports(2)

    def start(self, timeout_s: float = 90.0) -> RayHead:
        cmd = head_command(
            port=self.port, dashboard_port=self.dashboard_port, num_cpus=self.num_cpus,
            extra_ports=free_ports(7, exclude={self.port, self.dashboard_port}),
        )  # fmt: skip
        env = head_env({"RAY_AUTH_TOKEN": self.token})
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as out:
            self.proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, process_group=0)
        wait_for_port(self.port, timeout_s, self.proc)
        # the dashboard (Job and State APIs) comes up last; Train V2 needs it
        wait_for_port(self.dashboard_port, timeout_s, self.proc)
        log.info("ray head at %s (pid %s)", self.address, self.proc.pid)
        return self

    def stop(self) -> None:
        if self.proc is not None:
            stop_tree(self.proc.pid, proc=self.proc)
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
            env = _venv_env(self.env | {"SWEEPS_HOST": LOOPBACK, "SWEEPS_PORT": str(self.port)})
            command = [sys.executable, "-m", "service", "--log-level", "info"]
        else:
            env, command = _venv_env(self.env), self.command
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
