"""Keeps the store in step with the sweep drivers on Ray.

- `launch`: starts a queued sweep's driver in a worker thread (a submit never waits for it).
- `poll_once`: for every queued/running sweep, reads its driver's `state()` and writes status,
  progress, experiment id and, at the end, the report into the store; then kills the finished actor.
  A queued sweep without a driver (the service stopped before launching it) is launched. A running
  sweep whose driver is gone (killed, its node lost, the cluster restarted) is relaunched under the
  same id, after a backoff, and its new driver resumes from the Optuna storage (finished trials are
  kept, the ones that were running are run again); only after `max_driver_starts` starts is it
  failed, with what happened in its error. A sweep that ends without a driver leaves nothing
  RUNNING in Optuna or MLflow (`sweeps.stores.close_leftovers`).
- `reconcile`: on start, one `poll_once`, and drivers of sweeps the store already has as final are
  killed (the service stopped between storing the result and killing the actor).
- `run`: `poll_once` every `poll_interval_s` until stopped.
- the running studies (`service.studies.StudyRunner`) are moved along at the end of each pass.
"""

from __future__ import annotations

import asyncio
import logging
import time
from datetime import UTC, datetime
from typing import Any

import anyio
import anyio.to_thread

from service.cluster.launcher import DriverBusy, DriverLost, Launcher
from service.settings import Settings
from service.store.database import FINAL_STATUSES, Store, SweepRow, SweepStatus, utcnow
from service.studies import StudyRunner
from sweeps.stores import close_leftovers  # at start, not at the first cancel (why: sweeps/stores.py)

log = logging.getLogger(__name__)


def driver_lost_error(starts: int) -> str:
    return (
        f"the sweep's driver was lost {starts} time(s) (its actor process died, its node was lost or the Ray "
        f"cluster restarted) and was relaunched each time until the limit of {starts} starts; see the "
        "service log and the Ray logs of the driver"
    )


def _when(epoch: Any) -> datetime | None:
    return datetime.fromtimestamp(float(epoch), UTC) if epoch is not None else None


class Supervisor:
    def __init__(self, store: Store, launcher: Launcher, settings: Settings) -> None:
        self.store, self.launcher, self.settings = store, launcher, settings
        self._launching: set[str] = set()  # touched on the event loop only
        self._tasks: set[asyncio.Task[None]] = set()
        self._stop = asyncio.Event()
        self._poller: asyncio.Task[None] | None = None
        # sweep id -> monotonic time before which a lost driver is not relaunched (touched by the poller only)
        self._relaunch_at: dict[str, float] = {}
        # sweep id -> monotonic time since which its driver's state() has not answered (the poller only)
        self._busy_since: dict[str, float] = {}
        # the running studies, moved along on each pass: a study's next scale is a queued sweep of the store
        self.studies = StudyRunner(store, settings)

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
        relaunch = False
        try:
            before = await anyio.to_thread.run_sync(self.store.get, sweep_id)
            # a driver started before (the store may still say queued: it was lost before a poll saw it run)
            relaunch = before is not None and (before.status == SweepStatus.running.value or before.driver_starts > 0)
            await anyio.to_thread.run_sync(self.store.count_driver_start, sweep_id)
            await anyio.to_thread.run_sync(self.launcher.start, sweep_id, spec)
            log.info("sweep %s: driver started", sweep_id)
            row = await anyio.to_thread.run_sync(self.store.get, sweep_id)
            if row is not None and row.cancel_requested:
                # the cancel arrived while the driver was starting: pass it on now
                await anyio.to_thread.run_sync(self.launcher.cancel, sweep_id)
        except Exception as exc:
            if relaunch or isinstance(exc, DriverLost):
                # a relaunch, or a first start whose actor died as it started (killed, its node lost): the
                # cluster is what failed, as when a running driver is lost; the next polls find no driver
                # and try again after the backoff, up to max_driver_starts
                log.warning(
                    "sweep %s: %s its driver failed (%s); trying again later",
                    sweep_id, "relaunching" if relaunch else "starting", type(exc).__name__,
                )  # fmt: skip
                return
            log.exception("sweep %s: driver failed to start", sweep_id)
            # the exception's text names the cluster's hosts and files: the log has it, clients get its type
            error = f"driver failed to start ({type(exc).__name__}); the service log says why"
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
        """One pass over the active sweeps, then the running studies (blocking; run in a thread). Returns
        queued sweeps to launch (a study's next scale among them on the next pass)."""
        to_launch: list[SweepRow] = []
        for row in self.store.active():
            try:
                if self._poll_one(row):
                    to_launch.append(row)
                self._busy_since.pop(row.id, None)
            except DriverBusy as exc:
                log.info("%s", exc)
                self._watch_busy(row)
            except Exception:
                log.exception("sweep %s: poll failed", row.id)
        self.studies.advance()
        return to_launch

    def _watch_busy(self, row: SweepRow) -> None:
        """A driver that has not answered `state()` for driver_unresponsive_s is given up: killed, so that
        the next polls treat it as lost (relaunched after the backoff, or ended cancelled when a cancel
        is pending) instead of holding its owner's slot for ever."""
        now = time.monotonic()
        since = self._busy_since.setdefault(row.id, now)
        if now - since < self.settings.driver_unresponsive_s:
            return
        log.error(
            "sweep %s: its driver has not answered for %.0f s; killing it (a relaunch resumes from its recorded "
            "trials%s)", row.id, now - since, "; the pending cancel ends it" if row.cancel_requested else "",
        )  # fmt: skip
        del self._busy_since[row.id]
        self.launcher.kill(row.id)

    def _poll_one(self, row: SweepRow) -> bool:
        state = self.launcher.state(row.id)
        if state is None:
            return self._no_driver(row)
        status = state.get("status")
        if status not in SweepStatus.__members__:
            log.warning("sweep %s: driver reports unknown status %r", row.id, status)
            return False
        if SweepStatus(status) == SweepStatus.queued and row.id not in self._launching:
            # a driver created and never started: the service that created it stopped in between (its
            # `start` never came), and the driver would wait for it for ever
            if row.cancel_requested:
                self.launcher.kill(row.id)
                self._end_without_driver(row, SweepStatus.cancelled, None)
                return False
            log.warning("sweep %s: its driver was created but never started; starting it", row.id)
            return True  # launched again: the launcher finds the driver and starts it (idempotent)
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
            if status == SweepStatus.cancelled:
                self._close_leftovers(row.id)  # a trial the cancel cut before it reported: nothing stays RUNNING
        elif row.cancel_requested:
            self.launcher.cancel(row.id)  # idempotent; covers a cancel that raced the driver's start
        return False

    def _no_driver(self, row: SweepRow) -> bool:
        if row.id in self._launching:
            return False
        if row.cancel_requested:
            self._end_without_driver(row, SweepStatus.cancelled, None)
            return False
        if row.status == SweepStatus.queued.value and row.driver_starts == 0:
            return True  # never started (the service stopped first): start it now
        # its driver is gone: running, or still queued in the store (lost as it started, or before a poll
        # saw it run)
        if row.driver_starts >= self.settings.max_driver_starts:
            error = driver_lost_error(row.driver_starts)
            log.error("sweep %s: %s", row.id, error)
            self._end_without_driver(row, SweepStatus.failed, error)
            return False
        now = time.monotonic()
        due = self._relaunch_at.get(row.id)
        if due is None:
            backoff = min(60.0, self.settings.driver_restart_backoff_s * 2 ** max(0, row.driver_starts - 1))
            self._relaunch_at[row.id] = now + backoff
            log.warning(
                "sweep %s: its driver is gone (start %d of at most %d); relaunching in %.0f s, it resumes "
                "from its recorded trials", row.id, row.driver_starts, self.settings.max_driver_starts, backoff,
            )  # fmt: skip
            due = now + backoff
        if now < due:
            return False
        del self._relaunch_at[row.id]
        return True

    def _end_without_driver(self, row: SweepRow, status: SweepStatus, error: str | None) -> None:
        """Final without a driver to say so: close what it left RUNNING in Optuna and MLflow, then store it."""
        self._close_leftovers(row.id)
        self.store.update(row.id, status=status.value, error=error, finished_at=utcnow())

    def _close_leftovers(self, sweep_id: str) -> None:
        """`sweeps.stores.close_leftovers`, logged; a failure is logged, not raised (the sweep still ends)."""
        try:
            trials, runs = close_leftovers(sweep_id, self.settings.runtime())
            if trials or runs:
                log.info("sweep %s: closed %d running trials and %d running MLflow runs", sweep_id, trials, runs)
        except Exception:
            log.exception("sweep %s: could not close its running trials and runs", sweep_id)

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
        await anyio.to_thread.run_sync(self.studies.join)  # a law being recorded is written whole
        for task in list(self._tasks):
            # a launch in flight finishes (it is a few seconds at most); cancelling it would leave a
            # started driver that the store still has as queued, which the next start reconciles anyway
            await asyncio.wait([task], timeout=30)
