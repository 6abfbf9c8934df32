"""A cap on request bodies, as plain ASGI (no BaseHTTPMiddleware: it costs every request a task).

A declared Content-Length over the cap is refused before a byte is read; a chunked body is counted
as it arrives and refused once it passes the cap, so no body larger than the cap is ever buffered.
"""

from __future__ import annotations

import json

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.errors import PayloadTooLarge, error_body


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

        await self.app(scope, counted, send)


async def _send_413(send: Send, limit: int) -> None:
    body = json.dumps(
        error_body("payload_too_large", f"request body exceeds the limit of {limit} bytes")
    ).encode()
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
