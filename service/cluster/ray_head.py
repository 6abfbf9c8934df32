"""A local Ray head in a process group of its own: the service's cluster when no RAY_ADDRESS is given.

Why not `ray.init()` in the service: Ray forks the head's processes (GCS, raylet, dashboard, monitor)
with PR_SET_PDEATHSIG=SIGKILL, which Linux fires when the *thread* that forked them exits. From a
web worker thread the whole cluster was killed 10-70 s after the first sweep started, and a head
started in the service process dies with every restart of the service. Here the head is
`ray start --head --block` in a process of its own: its own main thread forks those processes and
never exits, so the head outlives every thread of the service and the service itself. A restarted
service reads `<data dir>/ray/head.json` and connects to the same head, where the detached sweep
drivers kept running.

- loopback only (GCS, raylet, dashboard and workers on 127.0.0.1), token auth on (the token in
  ~/.ray/auth_token, created before the first start on a machine that has none);
- private to its user: the data dir and `<data dir>/ray/` mode 0700, the head started with a umask of
  077 (`service/private.py`), so the folders Ray makes 0777 whatever the umask are out of other users'
  reach;
- Ray's temp dir (sessions, logs, sockets) at `<data dir>/ray/tmp`, or, when that path is too long
  for the Unix sockets Ray puts in it (107 bytes), a private folder of a random name under /tmp;
- stopped only on request: `sweeps stop-head [--data-dir DIR]`, which ends that process and what runs
  below it, by process id.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from filelock import FileLock

from service.cluster.processes import LOOPBACK, alive, cmdline, free_ports, port_open, stop_tree, wait_for_port
from service.private import PRIVATE_UMASK, private_dir

log = logging.getLogger(__name__)

# Ray's socket paths are `<temp dir>/session_<date>_<time>_<usec>_<pid>/sockets/plasma_store`: about
# 64 bytes after the temp dir, within the 107 of sun_path
MAX_TEMP_DIR_CHARS = 40
# what the head's processes (Ray, sweep drivers, trials) do not inherit from the service's environment
HEAD_WITHOUT = ("SWEEPS_TOKENS", "SWEEPS_SESSION_SECRET")
TEMP_PREFIX = "batchsweep-ray-"  # + 8 random characters (tempfile.mkdtemp)


def head_command(
    *, port: int, dashboard_port: int, num_cpus: int | None, temp_dir: Path | None = None, extra_ports: list[int]
) -> list[str]:
    """`ray start --head --block` on loopback with every port chosen (Ray refuses two components on one port)."""
    client, node_manager, object_manager, agent_http, agent_grpc, env_agent, metrics = extra_ports
    cmd = [
        str(Path(sys.executable).parent / "ray"), "start", "--head", "--block",
        f"--node-ip-address={LOOPBACK}", f"--dashboard-host={LOOPBACK}",
        f"--port={port}", f"--dashboard-port={dashboard_port}",
        f"--ray-client-server-port={client}", f"--node-manager-port={node_manager}",
        f"--object-manager-port={object_manager}", f"--dashboard-agent-listen-port={agent_http}",
        f"--dashboard-agent-grpc-port={agent_grpc}", f"--runtime-env-agent-port={env_agent}",
        f"--metrics-export-port={metrics}", "--num-gpus=0",
        "--include-dashboard=true", "--disable-usage-stats",
    ]  # fmt: skip
    if num_cpus is not None:
        cmd.append(f"--num-cpus={num_cpus}")
    if temp_dir is not None:
        cmd.append(f"--temp-dir={temp_dir}")
    return cmd


# what `ray start` prints once its node (GCS, raylet, agents) is up and registered; the GCS and dashboard
# ports open before the raylet registers, and a raylet whose agent could not bind its port dies after them
READY_LINE = "Ray runtime started."
# a port `free_ports` found free can be taken by another process before Ray binds it (a check, not a
# lease): a start that fails is retried on new ports this many times in all
START_TRIES = 3


def launch_head(
    log_path: Path,
    *,
    env: Mapping[str, str],
    num_cpus: int | None,
    timeout_s: float,
    temp_dir: Path | None = None,
    command: Callable[..., list[str]] = head_command,
    **popen: Any,
) -> tuple[subprocess.Popen[bytes], int, int]:
    """Start `ray start --head --block` (`command`) on free ports, its output appended to `log_path`, in a
    process group of its own; return (process, GCS port, dashboard port) once it printed READY_LINE and both
    ports answer. A start whose process exits first (a port taken meanwhile, a raylet that died) is retried
    on new ports, START_TRIES in all; a start that hangs past `timeout_s` is stopped and raises TimeoutError."""
    for attempt in range(1, START_TRIES + 1):
        port, dashboard_port, *extra = free_ports(9)
        cmd = command(port=port, dashboard_port=dashboard_port, num_cpus=num_cpus, temp_dir=temp_dir, extra_ports=extra)
        start = log_path.stat().st_size if log_path.exists() else 0
        with open(log_path, "ab") as out:
            proc = subprocess.Popen(
                cmd, env=dict(env), stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                process_group=0, **popen,
            )  # fmt: skip
        try:
            _wait_for_line(log_path, start, READY_LINE, timeout_s, proc)
            wait_for_port(port, timeout_s, proc)
            # the dashboard (Job and State APIs) comes up last; Train V2 needs it
            wait_for_port(dashboard_port, timeout_s, proc)
            return proc, port, dashboard_port
        except RuntimeError as exc:  # it exited
            stop_head_process(proc.pid, proc=proc)
            if attempt == START_TRIES:
                raise RuntimeError(f"the Ray head failed to start {START_TRIES} times; the last: {exc}") from None
            log.warning("the Ray head exited during its start (%s); retrying on new ports (%s)", exc, log_path)
        except TimeoutError:
            stop_head_process(proc.pid, proc=proc)
            raise
    raise AssertionError("unreachable")


def _wait_for_line(path: Path, offset: int, line: str, timeout_s: float, proc: subprocess.Popen[bytes]) -> None:
    """Until `line` appears in `path` past byte `offset`; RuntimeError where `proc` exits first."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with open(path, "rb") as f:
            f.seek(offset)
            if line.encode() in f.read():
                return
        if proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode} before it printed {line!r}")
        time.sleep(0.2)
    raise TimeoutError(f"{line!r} did not appear within {timeout_s} s")


def stop_head_process(pid: int, *, timeout_s: float = 30.0, proc: subprocess.Popen[bytes] | None = None) -> None:
    """Stop a `ray start --head --block` process and everything below it. SIGTERM to that process alone:
    its handler stops the GCS, raylet and workers in order (an idle head: gone in ~3 s, measured); SIGTERM
    to its whole process group instead kills them under it and leaves the GCS server lingering ~30 s. What
    is still alive after `timeout_s` is SIGKILLed (`stop_tree`)."""
    stop_tree(pid, timeout_s=timeout_s, group=False, proc=proc)


def head_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """Environment of `ray start`: this interpreter's bin first on PATH (Ray workers and job
    entrypoints resolve `python` through it), loopback only, token auth, Train V2's knobs."""
    from worker.local_ray import LOOPBACK_ENV, TRAIN_ENV, ensure_token  # loopback only (why: worker/local_ray.py)

    ensure_token()  # `ray start` turns token auth on only where a token exists
    env = dict(os.environ)  # what the service was started with, passed on (less the below)
    env.pop("RAY_ADDRESS", None)
    for secret in HEAD_WITHOUT:  # the API's own secrets: no driver, trial or Ray process needs them
        env.pop(secret, None)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env.update({**TRAIN_ENV, **LOOPBACK_ENV, "RAY_AUTH_MODE": "token", "RAY_USAGE_STATS_ENABLED": "0"})
    # on SIGTERM `ray start` first drains its node for Ray Serve, up to this many seconds (default 30) while
    # any actor lives (Train's detached coordinator stays after the first trial); nothing here serves, and a
    # stopped head ends its trials either way: a head with a live actor took 31-40 s to stop, ~2 s with 0
    env["RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S"] = "0"
    env.update(extra or {})
    return env


@dataclass
class HeadState:
    """What `head.json` records of a running head."""

    pid: int
    address: str  # 127.0.0.1:<GCS port>
    dashboard_port: int
    temp_dir: str
    started_at: float

    @property
    def gcs_port(self) -> int:
        return int(self.address.rsplit(":", 1)[1])

    def running(self) -> bool:
        """The recorded process is still `ray start --head` and its GCS answers."""
        argv = cmdline(self.pid)
        is_head = alive(self.pid) and "start" in argv and "--head" in argv and any(a.endswith("ray") for a in argv[:3])
        return is_head and port_open(self.gcs_port)


class LocalRayHead:
    """The service's local Ray head, found again or started, under `<data dir>/ray/`."""

    def __init__(self, data_dir: Path, *, num_cpus: int | None = None, start_timeout_s: float = 120.0) -> None:
        self.dir = Path(data_dir).resolve() / "ray"
        self.num_cpus = num_cpus
        self.start_timeout_s = start_timeout_s

    @property
    def state_path(self) -> Path:
        return self.dir / "head.json"

    @property
    def log_path(self) -> Path:
        return self.dir / "head.log"

    def temp_dir(self) -> Path:
        """Where the head's Ray processes put their sockets and logs: `<data dir>/ray/tmp` (mode 0700, in
        folders of 0700) where that path is short enough for Unix sockets, else a new private folder (mode
        0700, a name nobody can guess, so no other user can plant or read it) in the temporary directory,
        or in /tmp where that is long. Recorded in head.json; removed when the head stops."""
        own = self.dir / "tmp"
        if len(str(own)) <= MAX_TEMP_DIR_CHARS:
            return private_dir(own)
        base = tempfile.gettempdir()
        if len(os.path.join(base, TEMP_PREFIX + "x" * 8)) > MAX_TEMP_DIR_CHARS:
            base = "/tmp"
        return Path(tempfile.mkdtemp(prefix=TEMP_PREFIX, dir=base))

    def read(self) -> HeadState | None:
        try:
            return HeadState(**json.loads(self.state_path.read_text()))
        except (OSError, ValueError, TypeError):
            return None

    def running(self) -> HeadState | None:
        state = self.read()
        return state if state is not None and state.running() else None

    def _private_dir(self) -> Path:
        """`<data dir>/ray/`, it and the data dir mode 0700 (`service.private.private_dir`)."""
        private_dir(self.dir.parent)
        return private_dir(self.dir)

    def ensure(self) -> HeadState:
        """The running head of this data dir; started first when there is none. Safe across processes."""
        self._private_dir()
        with FileLock(str(self.dir / "head.lock")):
            state = self.running()
            if state is not None:
                log.info("reusing the local Ray head at %s (pid %d)", state.address, state.pid)
                return state
            return self._start()

    def _start(self) -> HeadState:
        temp_dir = self.temp_dir()
        # a process group of its own (launch_head): a Ctrl-C meant for the service does not reach the head; a
        # umask of 077 whatever the service's own: what the head, its drivers and trials write is their user's
        try:
            proc, port, dashboard_port = launch_head(
                self.log_path, env=head_env(), num_cpus=self.num_cpus, temp_dir=temp_dir,
                timeout_s=self.start_timeout_s, cwd=self.dir, umask=PRIVATE_UMASK,
            )  # fmt: skip
        except (RuntimeError, TimeoutError) as exc:
            tail = self.log_path.read_text(errors="replace")[-2000:]
            raise RuntimeError(f"the local Ray head did not start ({exc}); {self.log_path}:\n{tail}") from None
        state = HeadState(
            pid=proc.pid, address=f"{LOOPBACK}:{port}", dashboard_port=dashboard_port,
            temp_dir=str(temp_dir), started_at=time.time(),
        )  # fmt: skip
        tmp = self.state_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(state)))
        tmp.replace(self.state_path)
        log.info("started a local Ray head at %s (pid %d, logs %s)", state.address, state.pid, self.log_path)
        return state

    def stop(self, timeout_s: float = 30.0) -> HeadState | None:
        """Stop the recorded head and everything below it; None when none was running."""
        self._private_dir()
        with FileLock(str(self.dir / "head.lock")):
            state = self.running()
            if state is not None:
                stop_head_process(state.pid, timeout_s=timeout_s)
                if Path(state.temp_dir).name.startswith(TEMP_PREFIX):  # the private folder _start made
                    shutil.rmtree(state.temp_dir, ignore_errors=True)
            self.state_path.unlink(missing_ok=True)
            return state
