"""Local processes by process id: free loopback ports, waiting for a port, stopping a process tree.

Everything here stops exactly what it is given (a pid and what runs below it, found by psutil),
never processes found by name: `ray stop`, `pkill` and `killall` end other people's clusters too.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time

import psutil

LOOPBACK = "127.0.0.1"


def free_ports(n: int = 1, exclude: set[int] | None = None) -> list[int]:
    """`n` distinct free loopback ports (sockets held open together, so none is handed out twice)."""
    held: list[socket.socket] = []
    try:
        ports: list[int] = []
        while len(ports) < n:
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            held.append(s)
            s.bind((LOOPBACK, 0))
            port = int(s.getsockname()[1])
            if port not in (exclude or set()) and port not in ports:
                ports.append(port)
        return ports
    finally:
        for s in held:
            s.close()


def free_port() -> int:
    return free_ports(1)[0]


def port_open(port: int, host: str = LOOPBACK, timeout_s: float = 0.5) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(timeout_s)
        return s.connect_ex((host, port)) == 0


def wait_for_port(port: int, timeout_s: float, proc: subprocess.Popen[bytes] | None = None) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode} before port {port} opened")
        if port_open(port):
            return
        time.sleep(0.2)
    raise TimeoutError(f"port {port} did not open within {timeout_s} s")


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE  # a zombie has exited; its parent reaps it
    except psutil.Error:
        return False


def cmdline(pid: int) -> list[str]:
    try:
        return psutil.Process(pid).cmdline()
    except psutil.Error:
        return []


def descendants(pid: int) -> list[int]:
    """Every live process below `pid`."""
    try:
        return [child.pid for child in psutil.Process(pid).children(recursive=True)]
    except psutil.Error:
        return []


def _children(pid: int) -> list[int]:
    try:
        return [child.pid for child in psutil.Process(pid).children()]
    except psutil.Error:
        return []


def stop_tree(
    pid: int, *, timeout_s: float = 20.0, group: bool = True, proc: subprocess.Popen[bytes] | None = None
) -> None:
    """SIGTERM `pid` (its process group when `group`), then SIGKILL what is left of it and its descendants.

    Descendants are listed first: Ray workers start process groups of their own, so the group alone
    misses them. Direct children outside the group (the Ray head `sweeps serve` starts runs in a group of
    its own) get a SIGTERM once `pid` is gone, so that they stop what is below them in order, before
    whatever is left of the tree 10 s later is SIGKILLed. `proc`, when this process started `pid`, is reaped.
    """
    tree = descendants(pid)
    children = _children(pid)

    def signal_it(sig: signal.Signals) -> None:
        try:
            if group:
                os.killpg(pid, sig)
            else:
                os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def gone() -> bool:
        return proc.poll() is not None if proc is not None else not alive(pid)

    if not gone():
        signal_it(signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        while not gone() and time.monotonic() < deadline:
            time.sleep(0.1)
    signal_it(signal.SIGKILL)
    if proc is not None:
        proc.wait()
    for child in children:
        try:
            os.kill(child, signal.SIGTERM)
        except ProcessLookupError:
            pass  # gone with the group
    deadline = time.monotonic() + 10
    while any(alive(p) for p in tree) and time.monotonic() < deadline:
        time.sleep(0.2)  # workers notice their raylet is gone and exit by themselves
    for child in tree:
        if alive(child):
            try:
                os.kill(child, signal.SIGKILL)
            except ProcessLookupError:
                pass
