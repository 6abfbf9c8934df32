"""`GET /sweeps/{id}`: `SweepReader.detail_json`, the one read of a sweep for its owner, over `ViewCache`.

The hot read of the API is clients polling one sweep. Serving it from the store costs a worker-thread
hop and a query per request, which halves what the event loop can serve on a small machine (measured
with benchmarks/api_load.py). So the rendered JSON is kept here, in `ViewCache`: every writer in this
process (the poller, cancel) invalidates the sweep's entry, and `ttl_s` bounds how stale an entry can be
when another process wrote the store (several replicas on one PostgreSQL).

Entries are touched from the event loop and from the poller's thread; single dict operations are
atomic under the GIL, and a per-sweep generation counter keeps a slow reader from putting back a
render older than the last invalidation.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import anyio.to_thread

from service.errors import not_found
from service.models import SweepDetail
from service.settings import Settings
from service.store.database import Store

log = logging.getLogger(__name__)

# reads a sweep for the cache: (its owner, its rendered body), or None when there is no such sweep
Fetch = Callable[[str], Awaitable[tuple[str, bytes] | None]]


@dataclass(frozen=True)
class View:
    owner: str
    body: bytes
    made_at: float


class ViewCache:
    def __init__(self, ttl_s: float, max_entries: int = 10_000) -> None:
        self.ttl_s = ttl_s
        self.max_entries = max_entries
        self._views: dict[str, View] = {}
        self._generation: dict[str, int] = {}
        self._loading: dict[str, asyncio.Future[View | None]] = {}  # event loop only
        self._tasks: set[asyncio.Task[None]] = set()

    def get(self, sweep_id: str) -> View | None:
        view = self._views.get(sweep_id)
        if view is None or time.monotonic() - view.made_at > self.ttl_s:
            return None
        return view

    async def load(self, sweep_id: str, fetch: Fetch) -> View | None:
        """The sweep's view: fresh from memory; expired from memory while one background fetch renews it
        (this reader does not wait for it); else fetched, concurrent misses of one sweep sharing a single
        fetch.

        Without this, every client polling a sweep misses at the same moment when its entry expires,
        and that burst (or the wait for one store read in a busy thread pool) is the latency tail of
        the whole API. `fetch(sweep_id)` returns (owner, body), or None when there is no such sweep.
        """
        view = self._views.get(sweep_id)
        if view is not None:
            if time.monotonic() - view.made_at > self.ttl_s and sweep_id not in self._loading:
                self._start_fetch(sweep_id, fetch)  # the renewal
            return view
        pending = self._loading.get(sweep_id) or self._start_fetch(sweep_id, fetch)
        return await asyncio.shield(pending)

    def _start_fetch(self, sweep_id: str, fetch: Fetch) -> asyncio.Future[View | None]:
        """One fetch of the sweep, registered before it starts so later readers join it."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[View | None] = loop.create_future()
        future.add_done_callback(self._retrieve)
        self._loading[sweep_id] = future
        generation = self.generation(sweep_id)

        async def run() -> None:
            try:
                fetched = await fetch(sweep_id)
                view = None
                if fetched is not None:
                    view = View(fetched[0], fetched[1], time.monotonic())
                    self.put(sweep_id, generation, *fetched)
                future.set_result(view)
            except BaseException as exc:  # handed to every waiter
                future.set_exception(exc)
            finally:
                self._loading.pop(sweep_id, None)

        task = loop.create_task(run())
        self._tasks.add(task)  # a strong reference until it is done
        task.add_done_callback(self._tasks.discard)
        return future

    @staticmethod
    def _retrieve(future: asyncio.Future[View | None]) -> None:
        # a renewal nobody awaited: log its failure instead of "exception was never retrieved"
        if not future.cancelled() and future.exception() is not None:
            log.warning("fetching a sweep view failed: %r", future.exception())

    def generation(self, sweep_id: str) -> int:
        """Read before fetching the row; pass to `put`."""
        return self._generation.get(sweep_id, 0)

    def put(self, sweep_id: str, generation: int, owner: str, body: bytes) -> None:
        if self.ttl_s <= 0 or self._generation.get(sweep_id, 0) != generation:
            return  # invalidated while we were reading: this render may be older than the store
        if len(self._views) >= self.max_entries:
            self._views.clear()  # crude, but bounded; a cleared cache only costs store reads
        self._views[sweep_id] = View(owner, body, time.monotonic())

    def invalidate(self, sweep_id: str) -> None:
        self._generation[sweep_id] = self._generation.get(sweep_id, 0) + 1
        self._views.pop(sweep_id, None)


@dataclass(frozen=True)
class SweepReader:
    """`GET /sweeps/{id}`: `detail_json`, the one read of a sweep and its one owner check, whichever way
    the request came in (the route, or `service.api.middleware.HotReads` before routing). From the view
    cache when it holds the sweep: no thread hop, no query."""

    store: Store
    settings: Settings
    views: ViewCache

    async def detail_json(self, sweep_id: str, owner: str) -> bytes:
        """The sweep's `SweepDetail` as JSON; NotFound when there is none or it is another owner's (the
        same answer for both: an owner learns nothing of other owners' sweeps)."""
        view = await self.views.load(sweep_id, self._fetch)
        if view is None or view.owner != owner:
            raise not_found(sweep_id)
        return view.body

    async def _fetch(self, sweep_id: str) -> tuple[str, bytes] | None:
        row = await anyio.to_thread.run_sync(self.store.get, sweep_id)
        if row is None:
            return None
        link = self.settings.mlflow_link(row.experiment_id)
        return row.owner, SweepDetail.from_row(row, link).model_dump_json().encode()
