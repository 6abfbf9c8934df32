"""Run the service with uvicorn: `python -m service [--host H] [--port P]` or `sweeps serve`.

Connections are bounded here, for a service reachable directly and not only behind an Ingress (issue 46):
uvicorn alone holds an idle or half-sent connection for as long as the client likes (its keep-alive timer
starts only after a first response), keeps an unfinished request head in memory whatever its size
(httptools), and its `limit_concurrency` answers 503 only to a request that arrived, so idle sockets still
take every file descriptor, and then nobody, not even `/healthz`, gets an answer. `GuardedHttpTools`, uvicorn's
httptools protocol with these bounds (settings in service/settings.py):

- a request head must be whole within `header_timeout_s` of the connection's opening, or of its first byte
  after a previous response (a deadline: trickling bytes does not extend it), and no larger than
  `max_header_bytes`: else 408 or 431, and the connection is closed;
- a request body must be whole within `body_timeout_s` of its head: else 408 (while nothing was answered)
  and the connection is closed; the route reading it sees a disconnect;
- between requests a connection may idle `keep_alive_s` (uvicorn's own timer);
- at most `max_connections` at once: one more first closes the connection idle longest (no request in
  progress: between requests, or still sending its head), and gets 503 and is closed when every one is
  busy. By default the file-descriptor soft limit less what the service keeps for itself, so an accept
  never meets EMFILE and the stores and Ray always have descriptors left.
"""

from __future__ import annotations

import asyncio
import logging
import resource
from typing import Any, ClassVar

import uvicorn
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from service.app import create_app
from service.settings import Settings
from sweeps.logs import configure as configure_logs

log = logging.getLogger(__name__)

# descriptors the service keeps for itself beside its client connections: its stores (SQLite files and
# journals, or PostgreSQL connections), the Ray client's gRPC channels, MLflow, log files, the event loop
# and the threads' pipes, a metrics port: 46 measured at rest with a Ray client (tests/service/test_connections.py),
# so four times that
FD_RESERVE = 200
DEFAULT_MAX_CONNECTIONS = 4096  # each may hold up to max_header_bytes, or a request in progress


def serve(settings: Settings | None = None, *, log_level: str = "info") -> None:
    settings = settings or Settings()
    configure_logs(settings.log_format, log_level)  # text or JSON lines (SWEEPS_LOG_FORMAT)
    uvicorn.run(
        create_app(settings),
        host=settings.host,
        port=settings.port,
        log_level=log_level,
        **connection_options(settings),
        # event streams stay open; without a bound a restart would wait for every watcher to leave
        timeout_graceful_shutdown=3,
        access_log=False,  # one line per request costs more than the request under load
        log_config=None,  # uvicorn's loggers propagate to the root's handlers, formatted as configured
        # nothing here reads the client's address; behind a proxy, its X-Forwarded-* would only cost time
        proxy_headers=False,
    )


def connection_options(settings: Settings) -> dict[str, Any]:
    """uvicorn's options that bound connections (the tests run uvicorn in a thread with them too)."""
    return {
        "http": guarded_protocol(settings),
        "ws": "none",  # no route speaks WebSocket: an upgrade is answered as plain HTTP
        "timeout_keep_alive": settings.keep_alive_s,  # a float is fine for call_later
    }


def connection_limit(settings: Settings) -> int:
    """`settings.max_connections`, or (None) what the file-descriptor soft limit leaves; logged."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    unlimited = soft == resource.RLIM_INFINITY
    room = DEFAULT_MAX_CONNECTIONS if unlimited else max(soft - FD_RESERVE, soft // 2)
    limit = settings.max_connections or min(DEFAULT_MAX_CONNECTIONS, room)
    log.info(
        "connections: at most %d at once (file-descriptor soft limit %s); a request head within %g s and %d "
        "bytes, a body within %g s; idle %g s between requests",
        limit, "unlimited" if unlimited else soft, settings.header_timeout_s,
        settings.max_header_bytes, settings.body_timeout_s, settings.keep_alive_s,
    )  # fmt: skip
    if not unlimited and limit > room:
        log.warning(
            "SWEEPS_MAX_CONNECTIONS=%d leaves the service %d of its %d file descriptors for itself (it may need "
            "%d): under a flood of connections its stores and Ray may find none; raise `ulimit -n` or lower "
            "SWEEPS_MAX_CONNECTIONS",
            limit, max(soft - limit, 0), soft, min(FD_RESERVE, soft - room),
        )  # fmt: skip
    return limit


def guarded_protocol(settings: Settings) -> type[GuardedHttpTools]:
    """`GuardedHttpTools` with this service's bounds (a class per server: it holds the server's idle set and
    its deadline check)."""
    return type(
        "GuardedHttpTools",
        (GuardedHttpTools,),
        {
            "max_connections": connection_limit(settings),
            "header_timeout_s": settings.header_timeout_s,
            "max_header_bytes": settings.max_header_bytes,
            "body_timeout_s": settings.body_timeout_s,
            # deadlines are checked this often: they hold to within a quarter of the shorter one (0.5 s at most)
            "tick_s": min(0.5, settings.header_timeout_s / 4, settings.body_timeout_s / 4),
            "idle": {},
            "ticker": None,
        },
    )


class GuardedHttpTools(HttpToolsProtocol):
    """uvicorn's httptools protocol with a deadline on the request head and body, a bound on the head's size
    and on the connections open at once (see the module's doc).

    A deadline is a number on the connection, set and cleared on the parser's callbacks, and one timer per
    server looks at every connection's each `tick_s`. A timer per request instead (`call_later` and `cancel`,
    ~2 µs each on uvloop) would cost about twice what the guard costs now: ~4% of the cached
    `GET /sweeps/{id}`'s requests/s (35.3k against 33.7k/s, the server in a process of its own, 50 clients of
    benchmarks/api_load.py; its p99 the same)."""

    max_connections: ClassVar[int]
    header_timeout_s: ClassVar[float]
    max_header_bytes: ClassVar[int]
    body_timeout_s: ClassVar[float]
    tick_s: ClassVar[float]
    # connections with no request in progress, longest idle first: the ones closed to make room
    idle: ClassVar[dict[GuardedHttpTools, None]]
    ticker: ClassVar[asyncio.TimerHandle | None]  # the deadline check, while connections are open

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.deadline = 0.0  # loop time by which the head or the body must be whole; 0: none
        self.awaiting_head = True  # the next bytes are a request head
        self.head_bytes = 0

    # ---- asyncio.Protocol ---------------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if len(self.connections) > self.max_connections:
            victim = next(iter(self.idle), None)
            if victim is None:  # every connection is busy with a request
                self.answer_and_close(503, "The service has too many connections open; try again shortly.")
                return
            self.idle.pop(victim)
            victim.close()
        self.idle[self] = None
        self.deadline = self.loop.time() + self.header_timeout_s
        cls = type(self)
        if cls.ticker is None:
            cls.ticker = self.loop.call_later(self.tick_s, cls.check_deadlines, self.loop, self.connections)

    def connection_lost(self, exc: Exception | None) -> None:
        self.idle.pop(self, None)
        self.deadline = 0.0
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self.awaiting_head:
            # the head's clock starts at its first byte after a response (at the connection's opening for
            # the first); a pipelined head that arrives while a response is under way waits for its turn
            if not self.deadline and (self.cycle is None or self.cycle.response_complete):
                self.deadline = self.loop.time() + self.header_timeout_s
            self.head_bytes += len(data)
        super().data_received(data)
        # counted before parsing: httptools keeps a header's name and value whole until the next one
        if self.awaiting_head and self.head_bytes > self.max_header_bytes and not self.transport.is_closing():
            self.answer_and_close(431, f"The request head exceeds {self.max_header_bytes} bytes.")

    # ---- the parser's callbacks -------------------------------------------------------------------------------

    def on_headers_complete(self) -> None:
        self.awaiting_head, self.head_bytes = False, 0
        self.idle.pop(self, None)
        self.deadline = self.loop.time() + self.body_timeout_s  # cleared at once when there is no body
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        self.deadline = 0.0
        self.awaiting_head = True
        super().on_message_complete()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        # uvicorn arms its keep-alive timer when no pipelined request follows: idle from now
        if self.timeout_keep_alive_task is not None and not self.transport.is_closing():
            self.idle[self] = None

    # ---- deadlines ----------------------------------------------------------------------------------------

    @classmethod
    def check_deadlines(cls, loop: asyncio.AbstractEventLoop, connections: set[Any]) -> None:
        now = loop.time()
        for connection in list(connections):
            if isinstance(connection, GuardedHttpTools) and connection.deadline and now >= connection.deadline:
                connection.deadline_passed()
        cls.ticker = loop.call_later(cls.tick_s, cls.check_deadlines, loop, connections) if connections else None

    def deadline_passed(self) -> None:
        self.deadline = 0.0
        if self.transport.is_closing():
            return
        if self.awaiting_head:
            self.answer_and_close(408, f"The request head did not arrive within {self.header_timeout_s:g} s.")
        elif self.cycle is not None and not self.cycle.response_started:
            self.answer_and_close(408, f"The request body did not arrive within {self.body_timeout_s:g} s.")
        else:
            self.close()

    def close(self) -> None:
        """Close the connection; a request in progress sees a disconnect, and nothing it sends goes out."""
        self.deadline = 0.0
        if self.cycle is not None and not self.cycle.response_complete:
            self.cycle.disconnected = True
            self.cycle.message_event.set()
        self.transport.close()

    def answer_and_close(self, status: int, message: str) -> None:
        body = message.encode()
        content = [STATUS_LINE[status]]
        for name, value in self.server_state.default_headers:
            content.extend([name, b": ", value, b"\r\n"])
        content.extend(
            [
                b"content-type: text/plain; charset=utf-8\r\n",
                b"content-length: " + str(len(body)).encode() + b"\r\n",
                b"connection: close\r\n",
                *([b"retry-after: 1\r\n"] if status == 503 else []),
                b"\r\n",
                body,
            ]
        )
        self.transport.write(b"".join(content))
        self.close()
