"""Pages drawn outside the serving process: a finished sweep's dashboard, a study's law.

Drawing reads MLflow and builds every plotly figure: about a second of CPU for a small sweep, more for a
large one, in pure Python that holds the GIL. On a thread of the API's process it took the GIL from the
event loop at every switch interval (5 ms) for the whole render, and /healthz and every other request
answered that much slower. In a process of its own it costs the loop nothing: the thread that waits for
it sleeps on a pipe. One process (`RenderProcess`), started at the first render and kept (its imports,
plotly and MLflow, take seconds), draws one page at a time; each page is drawn once and kept (`PageCache`).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import TypeVar

import anyio
import anyio.to_process
import anyio.to_thread
from anyio import BrokenWorkerProcess
from anyio.from_thread import BlockingPortal, start_blocking_portal

T = TypeVar("T")


class RenderProcess:
    """A process that runs page renders (picklable callables) one at a time, for every app in this process:
    anyio's worker process (`anyio.to_process`), driven from an event loop of its own (a portal thread) so
    that one process serves every app and test server here, whichever loop asks. The worker reads its work
    from a pipe: when the API exits or is killed it reads the end of the pipe and exits too; idle for 5
    minutes, it is replaced at the next page. Started like `multiprocessing`'s spawn: it imports the API's
    main module again, under `__mp_main__` (`sweeps serve` and `python -m` guard their entry points)."""

    def __init__(self) -> None:
        self._portal: BlockingPortal | None = None
        self._running: AbstractContextManager[BlockingPortal] | None = None  # held: collected, it stops the portal
        self._lock = threading.Lock()

    def _started(self) -> BlockingPortal:
        with self._lock:
            if self._portal is None:
                self._running = start_blocking_portal(name="render-process")  # a daemon thread
                portal = self._running.__enter__()
                portal.call(_one_process)
                self._portal = portal
            return self._portal

    def run(self, fn: Callable[[], T]) -> T:
        """fn() in the render process (blocking: call it from a worker thread). Its exceptions are raised
        here as they were raised there; a worker killed mid-page (out of memory) is replaced, once."""
        portal = self._started()
        try:
            return portal.call(anyio.to_process.run_sync, fn)
        except BrokenWorkerProcess:
            return portal.call(anyio.to_process.run_sync, fn)


async def _one_process() -> None:
    anyio.to_process.current_default_process_limiter().total_tokens = 1  # this loop's: one page at a time


RENDERER = RenderProcess()  # the process's one: every app (and, in tests, every server) shares its process


class PageCache:
    """Pages that never change once drawn (a finished sweep's dashboard, a finished study's law), drawn
    once each in the render process. At most `size` pages are kept (least recently shown first out);
    requests for a page being drawn wait for that drawing; one page is drawn at a time."""

    def __init__(self, size: int = 32, renderer: RenderProcess = RENDERER) -> None:
        self.size = size
        self.renders = 0  # how many pages were drawn (the cache's misses)
        self._renderer = renderer
        self._pages: OrderedDict[tuple[str, ...], str] = OrderedDict()
        self._pending: dict[tuple[str, ...], anyio.Event] = {}
        self._limiter = anyio.CapacityLimiter(1)

    async def get(self, key: tuple[str, ...], render: Callable[[], str]) -> str:
        """The page under `key`, drawn by `render` (picklable: a module's function, or a partial of one)
        when no page is kept under it."""
        while key not in self._pages:
            pending = self._pending.get(key)
            if pending is not None:
                await pending.wait()  # drawn by another request (or failed there: try again)
                continue
            done = self._pending[key] = anyio.Event()
            try:
                html = await anyio.to_thread.run_sync(self._renderer.run, render, limiter=self._limiter)
                self.renders += 1
                self._pages[key] = html
                while len(self._pages) > self.size:
                    self._pages.popitem(last=False)
            finally:
                del self._pending[key]
                done.set()
            return html
        self._pages.move_to_end(key)
        return self._pages[key]
