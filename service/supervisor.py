"""Keeps the store in step with the sweep drivers on Ray.

- `launch`: starts a queued sweep's driver in a worker thread (a submit never waits for it).
- `poll_once`: for every queued/running sweep, reads its driver's `state()` and writes status,
  progress, experiment id and, at the end, the report into the store; then kills the finished actor.
  A running sweep whose driver is gone is failed ("driver lost"); a queued sweep without a driver
  (the service stopped before launching it) is launched.
- `reconcile`: on start, one `poll_once`, and drivers of sweeps the store already has as final are
  killed (the service stopped between storing the result and killing the actor).
- `run`: `poll_once` every `poll_interval_s` until stopped.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime
from typing import Any

import anyio
import anyio.to_thread

from service.launcher import DriverBusy, Launcher
from service.settings import Settings
from service.store import FINAL_STATUSES, Store, SweepRow, SweepStatus, utcnow

log = logging.getLogger(__name__)

DRIVER_LOST = "driver lost (Ray cluster restarted?)"


def _when(epoch: Any) -> datetime | None:
    return datetime.fromtimestamp(float(epoch), UTC) if epoch is not None else None


class Supervisor:
    def __init__(self, store: Store, launcher: Launcher, settings: Settings) -> None:
        self.store, self.launcher, self.settings = store, launcher, settings
        self._launching: set[str] = set()  # touched on the event loop only
        self._tasks: set[asyncio.Task[None]] = set()
        self._stop = asyncio.Event()
        self._poller: asyncio.Task[None] | None = None

    # ---- launching --------------------------------------------------------------------------------

    def launch(self, row: SweepRow) -> None:
        """Start the sweep's driver in the background; a second call while one is in flight does nothing."""
        if row.id in self._launching:
            return
        self._launching.add(row.id)
        task = asyncio.get_running_loop().create_task(self._launch(row.id, row.spec), name=f"launch-{row.id}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _launch(self, sweep_id: str, spec: dict[str, Any]) -> None:
        try:
            await anyio.to_thread.run_sync(self.launcher.start, sweep_id, spec)
            log.info("sweep %s: driver started", sweep_id)
            row = await anyio.to_thread.run_sync(self.store.get, sweep_id)
            if row is not None and row.cancel_requested:
                # the cancel arrived while the driver was starting: pass it on now
                await anyio.to_thread.run_sync(self.launcher.cancel, sweep_id)
        except Exception as exc:
            log.exception("sweep %s: driver failed to start", sweep_id)
            error = f"driver failed to start: {type(exc).__name__}: {exc}"
            await anyio.to_thread.run_sync(
                lambda: self.store.update(sweep_id, status=SweepStatus.failed.value, error=error, finished_at=utcnow())
            )
        finally:
            self._launching.discard(sweep_id)

    # ---- cancelling -------------------------------------------------------------------------------

    async def cancel(self, sweep_id: str) -> SweepRow | None:
        """Flag the cancel in the store and tell the driver; a sweep with no driver yet ends cancelled here."""
        row = await anyio.to_thread.run_sync(self.store.request_cancel, sweep_id)
        if row is None or row.final:
            return row
        told = await anyio.to_thread.run_sync(self.launcher.cancel, sweep_id)
        if not told and row.id not in self._launching and row.status == SweepStatus.queued.value:
            row = await anyio.to_thread.run_sync(
                lambda: self.store.update(sweep_id, status=SweepStatus.cancelled.value, finished_at=utcnow())
            )
        return row

    # ---- polling ----------------------------------------------------------------------------------

    def poll_once(self) -> list[SweepRow]:
        """One pass over the active sweeps (blocking; run in a thread). Returns queued sweeps to launch."""
        to_launch: list[SweepRow] = []
        for row in self.store.active():
            try:
                if self._poll_one(row):
                    to_launch.append(row)
            except DriverBusy as exc:
                log.info("%s", exc)
            except Exception:
                log.exception("sweep %s: poll failed", row.id)
        return to_launch

    def _poll_one(self, row: SweepRow) -> bool:
        state = self.launcher.state(row.id)
        if state is None:
            return self._no_driver(row)
        status = state.get("status")
        if status not in SweepStatus.__members__:
            log.warning("sweep %s: driver reports unknown status %r", row.id, status)
            return False
        final = SweepStatus(status) in FINAL_STATUSES
        fields: dict[str, Any] = {
            "status": status,
            "started_at": _when(state.get("started_at")) or row.started_at,
            "finished_at": _when(state.get("finished_at")) or (utcnow() if final else None),
        }
        if state.get("progress") is not None:
            fields["progress"] = state["progress"]
        if state.get("experiment_id") is not None:
            fields["experiment_id"] = str(state["experiment_id"])
        if state.get("error") is not None:
            fields["error"] = str(state["error"])
        if final:
            fields["report"] = state.get("report")
        self.store.update(row.id, **fields)
        if final:
            # the result is stored: the driver has nothing left to give
            log.info("sweep %s: %s", row.id, status)
            self.launcher.kill(row.id)
        elif row.cancel_requested:
            self.launcher.cancel(row.id)  # idempotent; covers a cancel that raced the driver's start
        return False

    def _no_driver(self, row: SweepRow) -> bool:
        if row.status == SweepStatus.running.value:
            log.warning("sweep %s: %s", row.id, DRIVER_LOST)
            self.store.update(row.id, status=SweepStatus.failed.value, error=DRIVER_LOST, finished_at=utcnow())
            return False
        if row.id in self._launching:
            return False
        if row.cancel_requested:
            self.store.update(row.id, status=SweepStatus.cancelled.value, finished_at=utcnow())
            return False
        return True  # queued and never started (the service stopped first): start it now

    async def reconcile(self) -> None:
        """Bring the store in line with the cluster: on service start, before the first request."""
        try:
            ids = await anyio.to_thread.run_sync(self.launcher.driver_ids)
        except Exception:
            log.exception("cannot list sweep drivers on the cluster")
            ids = []
        statuses = await anyio.to_thread.run_sync(self.store.statuses, ids)
        for sweep_id in ids:
            status = statuses.get(sweep_id)
            if status is None:
                log.warning("driver of sweep %s is not in this store; leaving it alone", sweep_id)
            elif SweepStatus(status) in FINAL_STATUSES:
                log.info("sweep %s is %s: killing its leftover driver", sweep_id, status)
                await anyio.to_thread.run_sync(self.launcher.kill, sweep_id)
        await self._poll_and_launch()

    async def _poll_and_launch(self) -> None:
        for row in await anyio.to_thread.run_sync(self.poll_once):
            self.launch(row)

    async def run(self) -> None:
        while not self._stop.is_set():
            try:
                await self._poll_and_launch()
            except Exception:
                log.exception("poll pass failed")
            try:
                await asyncio.wait_for(self._stop.wait(), timeout=self.settings.poll_interval_s)
            except TimeoutError:
                pass

    def start(self) -> None:
        self._poller = asyncio.get_running_loop().create_task(self.run(), name="sweep-poller")

    async def stop(self) -> None:
        self._stop.set()
        if self._poller is not None:
            await self._poller
        for task in list(self._tasks):
            # a launch in flight finishes (it is a few seconds at most); cancelling it would leave a
            # started driver that the store still has as queued, which the next start reconciles anyway
            await asyncio.wait([task], timeout=30)
