"""service.cluster.processes.stop_tree: what it stops, and how."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from service.cluster.processes import alive, cmdline, descendants, stop_tree

# a child that, on SIGTERM, notes it and exits (as `ray start --block` stops its head in order)
CHILD = """
import pathlib, signal, sys, time
def stop(*_):
    pathlib.Path(sys.argv[1]).write_text("SIGTERM")
    sys.exit(0)
signal.signal(signal.SIGTERM, stop)
time.sleep(600)
"""
# a parent that starts it in a process group of its own (as `sweeps serve` starts its Ray head)
PARENT = """
import subprocess, sys, time
subprocess.Popen([sys.executable, "-c", sys.argv[1], sys.argv[2]], process_group=0)
time.sleep(600)
"""


def test_a_child_in_its_own_group_is_asked_to_stop_then_nothing_is_left(tmp_path: Path) -> None:
    marker = tmp_path / "child-stopped"
    parent = subprocess.Popen([sys.executable, "-c", PARENT, CHILD, str(marker)], process_group=0)
    deadline = time.monotonic() + 30
    while not (tree := descendants(parent.pid)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(tree) == 1, tree
    time.sleep(0.5)  # the child's handler is installed
    stop_tree(parent.pid, proc=parent)
    # SIGTERMed (its handler ran), not only SIGKILLed 10 s later: it could stop what is below it in order
    assert marker.read_text() == "SIGTERM"
    assert parent.returncode is not None and not any(alive(p) for p in tree)


def test_the_ray_heads_temp_dir_is_short_private_and_unguessable(tmp_path: Path) -> None:
    from service.cluster.ray_head import MAX_TEMP_DIR_CHARS, LocalRayHead

    short = LocalRayHead(Path("/tmp") / f"d{os.getpid()}")
    try:
        assert short.temp_dir() == short.dir / "tmp"  # short enough: inside the data dir
    finally:
        shutil.rmtree(short.dir.parent, ignore_errors=True)
    long_head = LocalRayHead(tmp_path / ("x" * 60))
    made = [long_head.temp_dir() for _ in range(2)]
    try:
        for path in made:
            assert len(str(path)) <= MAX_TEMP_DIR_CHARS  # Unix socket paths below it stay within 107 bytes
            assert path.is_dir() and stat.S_IMODE(path.stat().st_mode) == 0o700 and path.stat().st_uid == os.getuid()
        assert made[0] != made[1]  # a fresh, random name each start: nothing another user could plant first
    finally:
        for path in made:
            shutil.rmtree(path, ignore_errors=True)


# a driver that leaves an actor alive on the head, as Ray Train's detached coordinator does after a trial
DETACHED = """
import ray
ray.init()
@ray.remote(num_cpus=0)
class Kept:
    def ping(self):
        return 1
kept = Kept.options(name="kept", lifetime="detached").remote()
assert ray.get(kept.ping.remote()) == 1
"""


@pytest.mark.ray
def test_a_head_with_a_live_actor_stops_on_sigterm_without_draining(tmp_path: Path) -> None:
    """`ray start` drains its node for up to 30 s before stopping while an actor lives (for Ray Serve):
    with the head's environment (`head_env`) it stops at once, by itself, instead of being SIGKILLed when
    `stop_head_process`'s grace ran out (every test and `sweeps serve` stop waited 30 s for it)."""
    from harness import RayHead, venv_env

    head = RayHead(tmp_path / "head.log", num_cpus=1).start(timeout_s=180)
    proc = head.proc
    assert proc is not None
    try:
        subprocess.run([sys.executable, "-c", DETACHED], env=venv_env(head.client_env), check=True, timeout=180)
    finally:
        head.stop()
    log = (tmp_path / "head.log").read_text()
    assert "Draining for up to" not in log, log[-2000:]
    # it ran its own SIGTERM handler to the end (exit status 1), not SIGKILLed after the grace period
    assert proc.returncode == 1, proc.returncode


# a stand-in for `ray start --head --block`: its first start exits at once (as a head whose agent found its
# port taken does), every later one listens on its GCS and dashboard ports and prints Ray's ready line
FAKE_HEAD = """
import pathlib, socket, sys, time
tries = pathlib.Path(sys.argv[1])
n = int(tries.read_text()) + 1 if tries.exists() else 1
tries.write_text(str(n))
if n <= int(sys.argv[2]):
    print("Address already in use", flush=True)
    sys.exit(1)
held = []
for port in sys.argv[3:5]:
    s = socket.socket()
    s.bind(("127.0.0.1", int(port)))
    s.listen()
    held.append(s)
print("Ray runtime started.", flush=True)
time.sleep(600)
"""


def _fake_head(tries: Path, failures: int):  # the `command` of launch_head
    def command(*, port: int, dashboard_port: int, **_: object) -> list[str]:
        return [sys.executable, "-c", FAKE_HEAD, str(tries), str(failures), str(port), str(dashboard_port)]

    return command


def test_a_head_that_exits_during_its_start_is_started_again_on_new_ports(tmp_path: Path) -> None:
    from service.cluster.processes import port_open
    from service.cluster.ray_head import launch_head

    log, tries = tmp_path / "head.log", tmp_path / "tries"
    proc, port, dashboard = launch_head(
        log, env=os.environ, num_cpus=1, timeout_s=30, command=_fake_head(tries, failures=1)
    )
    try:
        assert tries.read_text() == "2" and proc.poll() is None
        assert port_open(port) and port_open(dashboard)
        assert log.read_text().count("Address already in use") == 1
    finally:
        stop_tree(proc.pid, proc=proc)


def test_a_head_that_never_starts_is_given_up_after_its_tries_and_one_that_hangs_is_stopped(tmp_path: Path) -> None:
    from service.cluster.ray_head import START_TRIES, launch_head

    tries = tmp_path / "tries"
    with pytest.raises(RuntimeError, match=f"failed to start {START_TRIES} times"):
        launch_head(tmp_path / "a.log", env=os.environ, num_cpus=1, timeout_s=30, command=_fake_head(tries, 99))
    assert tries.read_text() == str(START_TRIES)

    def silent(**_: object) -> list[str]:
        return [sys.executable, "-c", "import time; time.sleep(600)"]

    started = time.monotonic()
    with pytest.raises(TimeoutError, match="Ray runtime started"):
        launch_head(tmp_path / "b.log", env=os.environ, num_cpus=1, timeout_s=1, command=silent)
    assert time.monotonic() - started < 15
    assert not [p for p in descendants(os.getpid()) if "time.sleep(600)" in " ".join(cmdline(p))]
