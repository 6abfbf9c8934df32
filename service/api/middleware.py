"""Plain ASGI middleware (no BaseHTTPMiddleware: it costs every request a task).

`BodyLimit`: a declared Content-Length over the cap is refused before a byte is read; a chunked body
is counted as it arrives and refused once it passes the cap, so no body larger than the cap is ever
buffered. A client that leaves before its body is whole (or is closed by the body deadline,
service/server.py) ends its request quietly: nobody is there to answer, and it is no error of the service.

`PrefixHeaders`: headers added to every answer under one path prefix (the offline docs' files, which
fastapi-offline serves through a mount of its own, get `X-Content-Type-Options: nosniff` this way).

`HotReads`: `GET /sweeps/{id}` with a bearer token answered before routing, by the same read as the
route (`SweepReader.detail_json`: the view cache, the store on a miss, the owner check) and counted in the
request metrics by itself. Other forms of the request (a session cookie, no valid token, an id the route
refuses) go on to the FastAPI route, which also documents the endpoint; a test checks that both answer
byte for byte the same.
"""

from __future__ import annotations

import json
import re
import time
from typing import Any

from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.api.deps import SWEEP_ID_CHARS
from service.api.errors import PayloadTooLarge, error_body, service_error_response
from service.errors import ServiceError
from service.views import SweepReader

# the route's path, `/sweeps/{sweep_id}`: one segment, as Starlette's `{name}` converter matches
SWEEP_PATH = re.compile(r"/sweeps/([^/]+)")
# the same path with an id the route accepts (any other is the route's 422): what HotReads answers
SWEEP_READ = re.compile(rf"/sweeps/({SWEEP_ID_CHARS})")
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
    """`GET /sweeps/{id}` with a bearer token, answered without FastAPI's routing and dependency solving.

    Clients watching a sweep poll this endpoint. Through FastAPI a cached answer still cost ~200 µs
    in the app (routing, dependency solving), ~15 µs here (measured in-process); with 50 clients on
    the 2-core machine that is ~2,000 against ~6,000 requests/s and a p99 of ~50 against ~20 ms
    (benchmarks/api_load.py). A cached sweep costs a header look-up, a dict look-up and the write.

    It is another way in, not another read: the body or the refusal is `SweepReader.detail_json`'s
    (service/views.py, the one read of a sweep and its one owner check), as on the route. What it
    cannot answer cheaply goes on to the route (service/api/routes/sweeps.py): no bearer token that
    names an owner (a session cookie, 401, a browser sent to sign in), an id of another form (422).
    A test checks that both answer byte for byte the same. `state` is `app.state`, read at request
    time (the lifespan puts `tokens` and `reader` on it).
    """

    def __init__(self, app: ASGIApp, state: Any) -> None:
        self.app, self.state = app, state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "GET" and (read := self._read(scope)) is not None:
            started = time.perf_counter()
            reader, sweep_id, owner = read
            try:
                body = await reader.detail_json(sweep_id, owner)
            except ServiceError as exc:  # not found: the error the route's handler answers
                refusal = service_error_response(exc)
                await refusal(scope, receive, send)
                status = refusal.status_code
            else:
                headers = [(b"content-length", str(len(body)).encode()), *_JSON_HEADERS]
                await send({"type": "http.response.start", "status": 200, "headers": headers})
                await send({"type": "http.response.body", "body": body})
                status = 200
            # an answer here counts itself (service.api.metrics.Metrics, when on): RequestMetrics sits inside
            # this middleware, so the hot read pays no wrapper of its messages (11 % of its p99 with one)
            if (metrics := getattr(self.state, "metrics", None)) is not None:
                metrics.record("GET", HOT_ROUTE, status, time.perf_counter() - started)
            return
        await self.app(scope, receive, send)

    def _read(self, scope: Scope) -> tuple[SweepReader, str, str] | None:
        """(the reader, the sweep id, the bearer's owner) when the request is one this answers; else None."""
        path, root = scope["path"], scope.get("root_path", "")
        match = SWEEP_READ.fullmatch(path[len(root) :] if root and path.startswith(root) else path)
        reader = getattr(self.state, "reader", None)  # None until the lifespan has run
        if match is None or reader is None:
            return None
        authorization = next((v for k, v in scope["headers"] if k == b"authorization"), None)
        if authorization is None:
            return None
        owner = self.state.tokens.bearer(authorization.decode("latin-1"))
        if owner is None:
            return None
        return reader, match[1], owner
