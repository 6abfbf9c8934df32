"""Plain ASGI middleware (no BaseHTTPMiddleware: it costs every request a task).

`BodyLimit`: a declared Content-Length over the cap is refused before a byte is read; a chunked body
is counted as it arrives and refused once it passes the cap, so no body larger than the cap is ever
buffered. A client that leaves before its body is whole (or is closed by the body deadline,
service/server.py) ends its request quietly: nobody is there to answer, and it is no error of the service.

`PrefixHeaders`: headers added to every answer under one path prefix (the offline docs' files, which
fastapi-offline serves through a mount of its own, get `X-Content-Type-Options: nosniff` this way).

`HotReads`: `GET /sweeps/{id}` answered from the view cache before routing, when the cache holds the
sweep for the caller's token (counted in the request metrics by itself). Everything else goes on to the FastAPI route, which owns the meaning of
the endpoint (401, 404, cache misses, the OpenAPI docs); a test checks that both answer byte for byte
the same.
"""

from __future__ import annotations

import json
import re
import time
from typing import Any

from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.api.errors import PayloadTooLarge, error_body

# the route's path, `/sweeps/{sweep_id}`: one segment, as Starlette's `{name}` converter matches
SWEEP_PATH = re.compile(r"/sweeps/([^/]+)")
HOT_ROUTE = "/sweeps/{sweep_id}"  # the route template HotReads answers for (its metrics label)
_JSON_HEADERS = [(b"content-type", b"application/json")]


class BodyLimit:
    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for name, value in scope.get("headers", ()):
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    declared = -1
                if declared > self.max_bytes:
                    await _send_413(send, self.max_bytes)
                    return
                break

        seen = 0

        async def counted() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    # raised inside the route's body read; the error handler answers 413
                    raise PayloadTooLarge(self.max_bytes)
            return message

        try:
            await self.app(scope, counted, send)
        except ClientDisconnect:
            pass  # the route read a body whose sender is gone (uvicorn drops whatever is sent after)


class PrefixHeaders:
    def __init__(self, app: ASGIApp, prefix: str, headers: dict[str, str]) -> None:
        self.app, self.prefix = app, prefix.rstrip("/") + "/"
        self.headers = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope["path"].startswith(self.prefix):
            await self.app(scope, receive, send)
            return
        names = {name for name, _ in self.headers}

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                kept = [(k, v) for k, v in message.get("headers", []) if k.lower() not in names]
                message = {**message, "headers": kept + self.headers}
            await send(message)

        await self.app(scope, receive, with_headers)


async def _send_413(send: Send, limit: int) -> None:
    body = json.dumps(error_body("payload_too_large", f"request body exceeds the limit of {limit} bytes")).encode()
    await send(
        {
            "type": "http.response.start",
            "status": 413,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                # the client may still be sending: tell it this connection is done
                (b"connection", b"close"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


class HotReads:
    """The polling read of a sweep without routing or dependency solving.

    Clients watching a sweep poll this endpoint. Through FastAPI a cached answer still cost ~200 µs
    in the app (routing, dependency solving), ~15 µs here (measured in-process); with 50 clients on
    the 2-core machine that is ~2,000 against ~6,000 requests/s and a p99 of ~50 against ~20 ms
    (benchmarks/api_load.py). A hit costs a header look-up, a dict look-up and the write. `state` is
    `app.state`, read at request time (the lifespan puts `tokens` and `reader` on it).
    """

    def __init__(self, app: ASGIApp, state: Any) -> None:
        self.app, self.state = app, state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "GET":
            started = time.perf_counter()
            if (body := self._hit(scope)) is not None:
                headers = [(b"content-length", str(len(body)).encode()), *_JSON_HEADERS]
                await send({"type": "http.response.start", "status": 200, "headers": headers})
                await send({"type": "http.response.body", "body": body})
                # a hit counts itself (service.api.metrics.Metrics, when on): RequestMetrics sits inside this
                # middleware, so the hot read pays no wrapper of its messages (11 % of its p99 with one)
                if (metrics := getattr(self.state, "metrics", None)) is not None:
                    metrics.record("GET", HOT_ROUTE, 200, time.perf_counter() - started)
                return
        await self.app(scope, receive, send)

    def _hit(self, scope: Scope) -> bytes | None:
        path, root = scope["path"], scope.get("root_path", "")
        match = SWEEP_PATH.fullmatch(path[len(root) :] if root and path.startswith(root) else path)
        reader = getattr(self.state, "reader", None)  # None until the lifespan has run
        if match is None or reader is None:
            return None
        authorization = next((v for k, v in scope["headers"] if k == b"authorization"), None)
        if authorization is None:
            return None
        owner = self.state.tokens.bearer(authorization.decode("latin-1"))
        if owner is None:
            return None
        return reader.cached_json(match[1], owner)  # type: ignore[no-any-return]
