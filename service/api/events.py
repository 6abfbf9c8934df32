"""Server-sent events of one sweep's or one study's progress, so clients watch instead of polling.

    retry: 2000              first: a client that reconnects waits 2 s
    event: progress          whenever it changed; data: the sweep's (the study's) JSON
    event: end               once, when it is final; data: its JSON; then the stream closes
    : heartbeat              a comment when nothing happened for `sse_heartbeat_s` (keeps proxies open)

A sweep's events carry `id: <revision>`: its stream re-reads the sweep's revision from the store every
`sse_interval_s` (in a worker thread) and the whole row only when it moved. A study's carry
`id: <revision>.<step>`: it moves when the study's row or the status of one of its sweeps (its scales', its
confirmation's) does (a sweep's own progress is on its own stream). A stream opened with a session cookie ends within SESSION_RECHECK_S
of that session's end (sign-out, expiry); each open stream holds one of the owner's stream slots.

The routes (service/api/routes/sweeps.py, studies.py) yield these `ServerSentEvent`s with
`response_class=EventSourceResponse`: FastAPI writes the wire format and the no-cache/no-buffering
headers. Its own `: ping` after 15 s of silence stays as a backstop (a slow store read).
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Callable, Hashable
from typing import Annotated

import anyio
import anyio.to_thread
from fastapi import Depends, Request
from fastapi.sse import ServerSentEvent
from pydantic import BaseModel

from service import manager, studies
from service.api.auth import Owner, web_session
from service.api.deps import LimitsDep, StoreDep, StudyId, SweepId
from service.api.sessions import COOKIE
from service.models import SweepSummary
from service.settings import Settings
from service.store.database import Store, SweepStatus
from sweeps.study import StudySpec

log = logging.getLogger(__name__)

RETRY_MS = 2000
# Ours, not FastAPI's keep-alive: that one's interval is a fixed module-private 15 s; this one is a setting.
HEARTBEAT = ServerSentEvent(comment="heartbeat")
SESSION_RECHECK_S = 1.0


# (version, the event's data, its id, final) of what a stream watches, or None when it is gone (deleted)
Reading = tuple[Hashable, BaseModel, str, bool]


async def _events(
    request: Request,
    settings: Settings,
    version: Callable[[], Hashable | None] | None,
    read: Callable[[], Reading | None],
) -> AsyncIterator[ServerSentEvent]:
    """The stream of one thing: `version()` (cheap, in a worker thread) every `sse_interval_s`, and `read()`
    only when it moved; without a `version`, `read()` every interval, its own version deciding. `progress`
    events, then one `end`."""
    yield ServerSentEvent(retry=RETRY_MS)
    seen: Hashable | None = None
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
        if version is None:
            reading = await anyio.to_thread.run_sync(read)
            now = reading[0] if reading is not None else None
        else:
            reading, now = None, await anyio.to_thread.run_sync(version)
        if now is None:  # deleted under us
            return
        if now != seen:
            if reading is None:
                reading = await anyio.to_thread.run_sync(read)
            if reading is None:
                return
            seen, data, event_id, final = reading
            yield ServerSentEvent(event="end" if final else "progress", data=data, id=event_id)
            if final:
                return
            last_sent = time.monotonic()
        elif time.monotonic() - last_sent >= settings.sse_heartbeat_s:
            yield HEARTBEAT
            last_sent = time.monotonic()
        if await request.is_disconnected():
            return
        await anyio.sleep(settings.sse_interval_s)


def sweep_events(request: Request, store: Store, settings: Settings, sweep_id: str) -> AsyncIterator[ServerSentEvent]:
    """The sweep's events: its revision read every interval, the whole row only when it moved."""

    def read() -> Reading | None:
        row = store.get(sweep_id)
        if row is None:
            return None
        summary = SweepSummary.from_row(row, settings.mlflow_link(row.experiment_id))
        return row.revision, summary, str(row.revision), row.final

    return _events(request, settings, lambda: store.revision(sweep_id), read)


def study_events(request: Request, store: Store, settings: Settings, study_id: str) -> AsyncIterator[ServerSentEvent]:
    """The study's events: a `progress` event when the study or the status of one of its sweeps (its scales',
    its confirmation's) moved (a sweep's own progress is its sweep's stream); `end` when the study is final. Its
    id, `<revision>.<step>`, grows with both (`step`: each sweep counted 0 pending, 1 queued, 2 running, 3
    final or not run)."""

    spec: list[StudySpec] = []  # validated once a stream: a study's spec never changes

    def read() -> Reading | None:
        row = store.get_study(study_id)
        if row is None:
            return None
        if not spec:
            spec.append(StudySpec.model_validate(row.spec))
        summary = studies.summary(store, row, spec[0])
        moving = [scale.status for scale in summary.scales]
        if summary.confirmation is not None:
            moving.append(summary.confirmation.status)
        step = sum(_STEP.get(status, 3) for status in moving)
        final = SweepStatus(summary.status).final
        return (summary.revision, step), summary, f"{summary.revision}.{step}", final

    # no cheaper version than the reading itself: the scales' statuses are in other rows
    return _events(request, settings, None, read)


_STEP = {"pending": 0, SweepStatus.queued.value: 1, SweepStatus.running.value: 2}


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


async def study_stream_slot(study_id: StudyId, owner: Owner, store: StoreDep, limits: LimitsDep) -> AsyncIterator[str]:
    """The study's id, for as long as one of `owner`'s event-stream slots is held for it (as `stream_slot`)."""
    await studies.get(store, study_id, owner)  # 404 before the stream starts
    release = limits.open_stream(owner)
    try:
        yield study_id
    finally:
        release()


StudyStreamSlot = Annotated[str, Depends(study_stream_slot)]

__all__ = [
    "HEARTBEAT",
    "RETRY_MS",
    "StreamSlot",
    "StudyStreamSlot",
    "stream_slot",
    "study_events",
    "study_stream_slot",
    "sweep_events",
]
