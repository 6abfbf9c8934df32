"""Connections cannot take the service from everyone.

In process (uvicorn in a thread with the service's connection options, a fake launcher): each bound by
itself, exactly: the idle connection closed first to make room, 503 when every connection is busy, 408 for
a head or a body past its deadline, 431 for a head past its size, the idle bound between requests, and
pipelined requests still answered.

Live: `python -m service` with a file-descriptor limit of 400 (prlimit, soft and hard), short timeouts from
the environment, and against it at once 420 idle sockets, 50 slow request heads and 20 slow bodies (both
trickling a byte every half second), and one request head that never ends (1 MiB of one header).
Meanwhile `/healthz` and an owner's `GET /sweeps` are asked on fresh connections every 0.5 s: each answers
200 within 2 s. By the end every attacking socket has been closed by the service: idle ones within the
head bound (or earlier, to make room), the slow heads and bodies with 408 at their deadlines (trickling does
not extend them), the endless head as soon as it passes the header size bound.

Before the limits (issue 46, "Connections"), the idle sockets alone used every descriptor: the service could
accept nothing more (uvloop accepts and drops each new connection then) and every probe failed.
"""

from __future__ import annotations

import errno
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from harness import LOOPBACK, ServiceProcess, free_port
from svc_helpers import ALICE, TOKENS, FakeLauncher, auth, wait_until

from service.app import create_app
from service.settings import Settings

FD_LIMIT = 400
HEADER_TIMEOUT_S, BODY_TIMEOUT_S, KEEP_ALIVE_S = 3.0, 3.0, 2.0
MAX_HEADER_BYTES = 16 * 1024
IDLE, SLOW_HEADS, SLOW_BODIES = 420, 50, 20
PROBE_BOUND_S = 2.0


def connect(port: int) -> socket.socket:
    sock = socket.create_connection((LOOPBACK, port), timeout=5)
    sock.setblocking(False)
    return sock


def closed_by_peer(sock: socket.socket) -> tuple[bool, bytes]:
    """Whether the service has closed `sock` (EOF or reset), and what it answered before."""
    data = b""
    while True:
        try:
            chunk = sock.recv(65536)
        except BlockingIOError:
            return False, data
        except OSError:  # reset
            return True, data
        if not chunk:
            return True, data
        data += chunk


def trickle(sock: socket.socket, data: bytes) -> None:
    try:
        sock.send(data)
    except BlockingIOError:
        pass
    except OSError as exc:  # closed by the service: the next closed_by_peer() says so
        if exc.errno not in (errno.EPIPE, errno.ECONNRESET):
            raise


def probe(url: str, path: str, headers: dict[str, str] | None = None) -> tuple[int | str, float]:
    started = time.monotonic()
    try:
        status: int | str = httpx.get(f"{url}{path}", headers=headers, timeout=PROBE_BOUND_S).status_code
    except httpx.HTTPError as exc:
        status = type(exc).__name__
    return status, time.monotonic() - started


def open_fds(pid: int) -> int:
    return len(list(Path(f"/proc/{pid}/fd").iterdir()))


def read_until_closed(sock: socket.socket, timeout_s: float) -> tuple[bytes, float]:
    """What the service sent on `sock` until it closed it, and after how many seconds (inf: still open)."""
    started = time.monotonic()
    sock.settimeout(0.05)
    data = b""
    while time.monotonic() - started < timeout_s:
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            continue
        except OSError:  # reset
            return data, time.monotonic() - started
        if not chunk:
            return data, time.monotonic() - started
        data += chunk
    return data, float("inf")


# --------------------------------------------------------------------------------------------------
# In process: each bound by itself
# --------------------------------------------------------------------------------------------------

SMALL = {
    "max_connections": 4,
    "header_timeout_s": 1.0,
    "body_timeout_s": 1.0,
    "keep_alive_s": 0.5,
    "max_header_bytes": 2048,
}


@pytest.fixture
def guarded(make_settings: Callable[..., Settings]) -> Iterator[int]:
    """The app (fake launcher) under uvicorn with the service's connection options: its port."""
    from service.server import connection_options  # here: on code without them, only these tests fail

    settings = make_settings(**SMALL)
    port = free_port()
    config = uvicorn.Config(
        create_app(settings, launcher=FakeLauncher()),
        host=LOOPBACK,
        port=port,
        log_level="warning",
        timeout_graceful_shutdown=1,
        **connection_options(settings),
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_until(lambda: server.started, 60, what="uvicorn start")
    try:
        yield port
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def status_of(response: bytes) -> int | None:
    return int(response.split(b" ", 2)[1]) if response.startswith(b"HTTP/1.1 ") else None


def get(port: int, path: str = "/healthz") -> socket.socket:
    sock = socket.create_connection((LOOPBACK, port), timeout=5)
    sock.sendall(f"GET {path} HTTP/1.1\r\nHost: {LOOPBACK}\r\n\r\n".encode())
    return sock


def answer(sock: socket.socket, timeout_s: float = 5.0) -> bytes:
    """One response on a kept-alive connection (headers and a Content-Length body)."""
    sock.settimeout(timeout_s)
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"closed after {data!r}"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")
    )
    while len(body) < length:
        body += sock.recv(65536)
    return head


def slow_body(port: int) -> socket.socket:
    sock = socket.create_connection((LOOPBACK, port), timeout=5)
    sock.sendall(
        f"POST /sweeps HTTP/1.1\r\nHost: {LOOPBACK}\r\nAuthorization: Bearer {ALICE}\r\n"
        "Content-Type: application/yaml\r\nContent-Length: 1000\r\n\r\nname: x\n".encode()
    )
    return sock


def test_the_idle_connection_longest_idle_makes_room(guarded: int) -> None:
    idle = [socket.create_connection((LOOPBACK, guarded), timeout=5) for _ in range(4)]
    time.sleep(0.1)
    probe = get(guarded)
    assert status_of(answer(probe)) == 200
    # the oldest idle one was closed, without a word; the others still open
    assert read_until_closed(idle[0], 0.5)[0] == b""
    assert all(read_until_closed(s, 0.1)[1] == float("inf") for s in idle[1:])
    for sock in [*idle, probe]:
        sock.close()


def test_busy_connections_are_not_closed_a_new_one_gets_503(guarded: int) -> None:
    bodies = [slow_body(guarded) for _ in range(4)]
    time.sleep(0.2)
    refused, took = read_until_closed(get(guarded), 2)
    assert status_of(refused) == 503 and b"retry-after: 1" in refused.lower() and took < 0.5, refused
    # the bodies' deadline: 408 each, then room again
    for sock in bodies:
        response, took = read_until_closed(sock, 3)
        assert status_of(response) == 408 and took < 1.5, (response, took)
        sock.close()
    assert status_of(answer(get(guarded))) == 200


def test_a_head_past_its_deadline_or_size_is_refused(guarded: int) -> None:
    slow = socket.create_connection((LOOPBACK, guarded), timeout=5)
    slow.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: ")
    started = time.monotonic()
    while time.monotonic() - started < 1.6:  # a byte every 0.2 s does not extend the deadline
        try:
            slow.sendall(b"a")
        except OSError:
            break
        time.sleep(0.2)
    response, _ = read_until_closed(slow, 1)
    assert status_of(response) == 408, response
    assert 0.9 < time.monotonic() - started < 2.0

    big = socket.create_connection((LOOPBACK, guarded), timeout=5)
    big.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 3000)
    response, took = read_until_closed(big, 1)
    assert status_of(response) == 431 and took < 0.5, response
    for sock in (slow, big):
        sock.close()


@pytest.mark.serial  # it times the idle bound: beside another test on 2 cores the answer itself comes late
def test_keep_alive_and_pipelining(guarded: int) -> None:
    sock = get(guarded)
    assert status_of(answer(sock)) == 200
    # a second request on the same connection, then the idle bound
    sock.sendall(f"GET /healthz HTTP/1.1\r\nHost: {LOOPBACK}\r\n\r\n".encode())
    assert status_of(answer(sock)) == 200
    _, took = read_until_closed(sock, 2)
    assert 0.3 < took < 1.0, took
    # two requests in one write: both answered
    two = socket.create_connection((LOOPBACK, guarded), timeout=5)
    two.sendall(f"GET /healthz HTTP/1.1\r\nHost: {LOOPBACK}\r\n\r\n".encode() * 2)
    assert status_of(answer(two)) == 200 and status_of(answer(two)) == 200
    for s in (sock, two):
        s.close()


# --------------------------------------------------------------------------------------------------
# Live: the real service with a low descriptor limit, everything at once
# --------------------------------------------------------------------------------------------------


@pytest.fixture
def limited_service(ray_head: Any, tmp_path: Path) -> Any:
    port = free_port()
    env = ray_head.client_env | {
        "SWEEPS_DATA_DIR": str(tmp_path / "data"),
        "SWEEPS_TOKENS": TOKENS,
        "SWEEPS_HOST": LOOPBACK,
        "SWEEPS_PORT": str(port),
        "SWEEPS_HEADER_TIMEOUT_S": str(HEADER_TIMEOUT_S),
        "SWEEPS_BODY_TIMEOUT_S": str(BODY_TIMEOUT_S),
        "SWEEPS_KEEP_ALIVE_S": str(KEEP_ALIVE_S),
        "SWEEPS_MAX_HEADER_BYTES": str(MAX_HEADER_BYTES),
        "PYTHONUNBUFFERED": "1",
    }
    limit = f"--nofile={FD_LIMIT}:{FD_LIMIT}"
    svc = ServiceProcess(
        env=env,
        log_path=tmp_path / "service.log",
        port=port,
        command=["prlimit", limit, "--", sys.executable, "-m", "service", "--log-level", "info"],
    )
    svc.start()
    try:
        yield svc
    finally:
        svc.stop()


@pytest.mark.ray
@pytest.mark.timeout(240)
def test_idle_and_slow_connections_do_not_starve_healthz(limited_service: ServiceProcess) -> None:
    svc = limited_service
    assert svc.proc is not None
    fds_at_rest = open_fds(svc.proc.pid)
    port = svc.port
    sockets: dict[str, list[socket.socket]] = {"idle": [], "head": [], "body": []}
    huge: socket.socket | None = None
    failures: list[str] = []
    probes, slowest = 0, 0.0
    try:
        started = time.monotonic()
        for _ in range(IDLE):
            sockets["idle"].append(connect(port))
        for i in range(SLOW_HEADS):
            sock = connect(port)
            trickle(sock, f"GET /healthz HTTP/1.1\r\nHost: {LOOPBACK}\r\nX-Slow-{i}: ".encode())
            sockets["head"].append(sock)
        body_head = (
            f"POST /sweeps HTTP/1.1\r\nHost: {LOOPBACK}\r\nAuthorization: Bearer {ALICE}"
            "\r\nContent-Type: application/yaml\r\nContent-Length: 4000\r\n\r\nname: slow\n"
        ).encode()
        for _ in range(SLOW_BODIES):
            sock = connect(port)
            trickle(sock, body_head)
            sockets["body"].append(sock)
        opened_s = time.monotonic() - started

        # one head that never ends: the service must not hold it in memory beyond its bound
        huge = socket.create_connection((LOOPBACK, port), timeout=5)
        huge_closed = False
        try:
            huge.sendall(f"GET /healthz HTTP/1.1\r\nHost: {LOOPBACK}\r\nX-Big: ".encode())
            for _ in range(16):
                huge.sendall(b"a" * 65536)
                time.sleep(0.05)
        except OSError:  # reset: the service closed it
            huge_closed = True

        # probes on fresh connections while the slow ones trickle, for longer than every bound
        deadline = time.monotonic() + max(HEADER_TIMEOUT_S, BODY_TIMEOUT_S, KEEP_ALIVE_S) + 3.0
        while time.monotonic() < deadline:
            for sock in sockets["head"] + sockets["body"]:
                trickle(sock, b"a")
            for path, headers in (("/healthz", None), ("/sweeps", auth())):
                status, took = probe(svc.url, path, headers)
                probes, slowest = probes + 1, max(slowest, took)
                if status != 200 or took > PROBE_BOUND_S:
                    failures.append(f"{path}: {status} after {took:.2f} s")
            time.sleep(0.5)

        ends = {kind: [closed_by_peer(s) for s in socks] for kind, socks in sockets.items()}
        still_open = {kind: sum(not closed for closed, _ in end) for kind, end in ends.items()}
        # the slow heads and bodies came last, so no idle one made room for a probe by closing them: each
        # was told 408 at its deadline
        answers = {kind: sorted({status_of(data) for _, data in ends[kind]}, key=str) for kind in ("head", "body")}
        if not huge_closed:
            huge.setblocking(False)
            huge_closed = closed_by_peer(huge)[0]
        fds_after = open_fds(svc.proc.pid)
    finally:
        for socks in sockets.values():
            for sock in socks:
                sock.close()
        if huge is not None:
            huge.close()

    print(f"opened {IDLE + SLOW_HEADS + SLOW_BODIES} sockets in {opened_s:.1f} s; service fds {fds_at_rest} at rest,"
          f" {fds_after} at the end; {probes} probes (slowest {slowest:.2f} s), still open: {still_open}, answers: {answers}")  # fmt: skip
    assert not failures, f"{len(failures)} of {probes} probes failed: {failures[:10]}"
    assert still_open == {"idle": 0, "head": 0, "body": 0}, f"connections the service kept open: {still_open}"
    assert answers == {"head": [408], "body": [408]}, answers
    assert huge_closed, "a request head past the header size bound was kept open"
    assert svc.proc.poll() is None, svc.tail()
    log = svc.tail(200_000)
    assert "Traceback" not in log, log[-4000:]
