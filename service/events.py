"""Server-sent events of one sweep's progress, so clients watch instead of polling.

    event: progress          whenever the sweep changed (its revision moved); data: the sweep JSON
    event: end               once, when the sweep is final; data: the sweep JSON; then the stream closes
    : heartbeat              a comment when nothing happened for `sse_heartbeat_s` (keeps proxies open)

Each event carries `id: <revision>`. The stream re-reads the sweep's revision from the store every
`sse_interval_s` (in a worker thread) and the whole row only when it moved.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import anyio
import anyio.to_thread
from fastapi import Request
from fastapi.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from service.schemas import SweepSummary
from service.settings import Settings
from service.store import Store

log = logging.getLogger(__name__)

SSE_HEADERS = {
    "Cache-Control": "no-cache",
    "X-Accel-Buffering": "no",  # nginx and friends: do not buffer the stream
}


def sse(event: str, data: str, event_id: int | None = None) -> str:
    lines = [f"event: {event}"]
    if event_id is not None:
        lines.append(f"id: {event_id}")
    lines.extend(f"data: {line}" for line in data.splitlines() or [""])
    return "\n".join(lines) + "\n\n"


async def sweep_events(request: Request, store: Store, settings: Settings, sweep_id: str) -> AsyncIterator[str]:
    yield "retry: 2000\n\n"  # a client that reconnects waits 2 s
    seen: int | None = None
    last_sent = time.monotonic()
    while True:
        revision = await anyio.to_thread.run_sync(store.revision, sweep_id)
        if revision is None:  # deleted under us
            return
        if revision != seen:
            row = await anyio.to_thread.run_sync(store.get, sweep_id)
            if row is None:
                return
            seen = row.revision
            body = SweepSummary.from_row(row, settings.mlflow_link(row.experiment_id)).model_dump_json()
            if row.final:
                yield sse("end", body, row.revision)
                return
            yield sse("progress", body, row.revision)
            last_sent = time.monotonic()
        elif time.monotonic() - last_sent >= settings.sse_heartbeat_s:
            yield ": heartbeat\n\n"
            last_sent = time.monotonic()
        if await request.is_disconnected():
            return
        await anyio.sleep(settings.sse_interval_s)


class HeldStream(StreamingResponse):
    """A streaming response that calls `release` once it ends, however it ends (done, the client gone,
    cancelled): the per-owner stream count (service/limits.py) follows the streams actually open."""

    def __init__(self, content: Any, *, release: Callable[[], None], **kwargs: Any) -> None:
        super().__init__(content, **kwargs)
        self._release = release

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._release()


__all__ = ["SSE_HEADERS", "HeldStream", "sse", "sweep_events"]
