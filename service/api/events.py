"""Server-sent events of one sweep's progress, so clients watch instead of polling.

    retry: 2000              first: a client that reconnects waits 2 s
    event: progress          whenever the sweep changed (its revision moved); data: the sweep JSON
    event: end               once, when the sweep is final; data: the sweep JSON; then the stream closes
    : heartbeat              a comment when nothing happened for `sse_heartbeat_s` (keeps proxies open)

Each event carries `id: <revision>`. The stream re-reads the sweep's revision from the store every
`sse_interval_s` (in a worker thread) and the whole row only when it moved. A stream opened with a
session cookie ends within SESSION_RECHECK_S of that session's end (sign-out, expiry).

The route (service/api/routes/sweeps.py) yields these `ServerSentEvent`s with
`response_class=EventSourceResponse`: FastAPI writes the wire format and the no-cache/no-buffering
headers. Its own `: ping` after 15 s of silence stays as a backstop (a slow store read).
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator
from typing import Annotated

import anyio
import anyio.to_thread
from fastapi import Depends, Request
from fastapi.sse import ServerSentEvent

from service import manager
from service.api.auth import Owner, web_session
from service.api.deps import LimitsDep, StoreDep, SweepId
from service.api.sessions import COOKIE
from service.models import SweepSummary
from service.settings import Settings
from service.store.database import Store

log = logging.getLogger(__name__)

RETRY_MS = 2000
# Ours, not FastAPI's keep-alive: that one's interval is a fixed module-private 15 s; this one is a setting.
HEARTBEAT = ServerSentEvent(comment="heartbeat")
SESSION_RECHECK_S = 1.0


async def sweep_events(
    request: Request, store: Store, settings: Settings, sweep_id: str
) -> AsyncIterator[ServerSentEvent]:
    yield ServerSentEvent(retry=RETRY_MS)
    seen: int | None = None
    last_sent = time.monotonic()
    # a stream a browser opened with its session cookie ends when that session does (signed out,
    # expired): it is looked up again every SESSION_RECHECK_S
    cookie = request.cookies.get(COOKIE) if "authorization" not in request.headers else None
    checked = time.monotonic()
    while True:
        if cookie is not None and time.monotonic() - checked >= SESSION_RECHECK_S:
            if await web_session(request, cookie) is None:
                return
            checked = time.monotonic()
        revision = await anyio.to_thread.run_sync(store.revision, sweep_id)
        if revision is None:  # deleted under us
            return
        if revision != seen:
            row = await anyio.to_thread.run_sync(store.get, sweep_id)
            if row is None:
                return
            seen = row.revision
            summary = SweepSummary.from_row(row, settings.mlflow_link(row.experiment_id))
            event = "end" if row.final else "progress"
            yield ServerSentEvent(event=event, data=summary, id=str(row.revision))
            if row.final:
                return
            last_sent = time.monotonic()
        elif time.monotonic() - last_sent >= settings.sse_heartbeat_s:
            yield HEARTBEAT
            last_sent = time.monotonic()
        if await request.is_disconnected():
            return
        await anyio.sleep(settings.sse_interval_s)


async def stream_slot(sweep_id: SweepId, owner: Owner, store: StoreDep, limits: LimitsDep) -> AsyncIterator[str]:
    """The sweep's id, for as long as one of `owner`'s event-stream slots (service/api/limits.py) is held
    for it: while the stream is open.

    A dependency with `yield`: FastAPI runs it before the response starts (so a 404 or 429 is a plain
    error answer) and its `finally` after the response has ended, however it ended (done, the client
    gone, cancelled), so the per-owner count follows the streams actually open."""
    await manager.get_row(store, sweep_id, owner)  # 404 before the stream starts
    release = limits.open_stream(owner)  # 429 beyond the owner's limit
    try:
        yield sweep_id
    finally:
        release()


StreamSlot = Annotated[str, Depends(stream_slot)]

__all__ = ["HEARTBEAT", "RETRY_MS", "StreamSlot", "stream_slot", "sweep_events"]
