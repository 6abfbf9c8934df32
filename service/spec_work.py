"""Reading a submitted spec (parse, validate, price): CPU work that one owner must not turn against everyone.

A worst-case body (sweeps.documents.MAX_NODES values within the body limit) costs tens of milliseconds of
CPU, and an owner within their rate limits may send dozens at once. On the shared thread pool those bursts
held every thread that reads the store and answers `/healthz`, and many threads holding the GIL at once
starved the event loop. So each spec is read in a pool of its own (one thread: never more than one core's
worth of GIL), one at a time per owner: a burst from one owner queues behind itself, and another owner's
spec waits for at most the one being read.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import anyio
import anyio.to_thread

T = TypeVar("T")


class SpecWork:
    """Runs spec work off the event loop: at most `threads` at once overall, one at a time per owner."""

    def __init__(self, threads: int = 1) -> None:
        if threads < 1:
            raise ValueError(f"threads must be >= 1, got threads={threads}")
        self.threads = threads
        self._limiter: anyio.CapacityLimiter | None = None  # made in the event loop, on first use
        self._owners: dict[str, anyio.Lock] = {}  # owner -> their turn; dropped when nobody holds or waits

    async def run(self, owner: str, fn: Callable[..., T], *args: object) -> T:
        if self._limiter is None:
            self._limiter = anyio.CapacityLimiter(self.threads)
        lock = self._owners.setdefault(owner, anyio.Lock())
        try:
            async with lock:
                return await anyio.to_thread.run_sync(fn, *args, limiter=self._limiter)
        finally:
            if not lock.locked() and not lock.statistics().tasks_waiting and self._owners.get(owner) is lock:
                del self._owners[owner]

    def owners(self) -> int:
        """Owners with spec work held or waiting (bounded by the rate limits; none once all work is done)."""
        return len(self._owners)
