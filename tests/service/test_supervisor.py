"""The supervisor keeps the store in step with the drivers: poll, finish, lose, relaunch, reconcile."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anyio.to_thread
import pytest
from harness import tiny_spec
from svc_helpers import FakeLauncher

from service.cluster.launcher import DriverLost, prepare_optuna
from service.cluster.supervisor import Supervisor, driver_lost_error
from service.settings import Settings
from service.store.database import Store
from sweeps.stores import open_storage


@pytest.fixture
def store(settings: Settings) -> Iterator[Store]:
    s = Store(settings.database)
    s.migrate()
    yield s
    s.dispose()


def run(coro_fn: Callable[[], Any]) -> Any:
    return asyncio.run(coro_fn())


async def poll_and_launch(sup: Supervisor) -> None:
    """One poll pass, then the launches it asks for, waited for (as `Supervisor.run` does, once)."""
    for row in await anyio.to_thread.run_sync(sup.poll_once):
        sup.launch(row)
    while sup._launching:
        await asyncio.sleep(0.01)


def new(store: Store, sweep_id: str, status: str = "queued", **fields: Any) -> None:
    store.create(sweep_id=sweep_id, owner="alice", spec=tiny_spec())
    if status != "queued" or fields:
        store.update(sweep_id, status=status, **fields)


def test_poll_writes_progress_then_final_report_and_kills_the_driver(
    store: Store, launcher: FakeLauncher, settings: Settings
) -> None:
    new(store, "s-1", "running")
    launcher.start("s-1", {})
    sup = Supervisor(store, launcher, settings)
    launcher.set("s-1", progress={"trials_done": 1}, experiment_id="3")
    assert sup.poll_once() == []
    row = store.get("s-1")
    assert row is not None and (row.status, row.progress, row.experiment_id) == ("running", {"trials_done": 1}, "3")
    assert launcher.killed == []
    launcher.finish("s-1", report={"answer": 1})
    sup.poll_once()
    row = store.get("s-1")
    assert row is not None and (row.status, row.report) == ("succeeded", {"answer": 1})
    assert row.finished_at is not None
    # kill only after the result is stored
    assert launcher.killed == ["s-1"]


def test_lost_driver_is_relaunched_after_a_backoff_and_resumes(
    store: Store, launcher: FakeLauncher, make_settings: Callable[..., Settings]
) -> None:
    settings = make_settings(driver_restart_backoff_s=0.3, max_driver_starts=3)
    new(store, "s-1", "running")
    store.count_driver_start("s-1")  # its first driver, now gone
    sup = Supervisor(store, launcher, settings)
    assert sup.poll_once() == []  # not at once: the backoff runs first
    assert store.get("s-1").status == "running"  # type: ignore[union-attr]
    time.sleep(0.35)
    assert [r.id for r in sup.poll_once()] == ["s-1"]  # relaunched under the same id


def test_lost_driver_relaunches_are_bounded_then_the_sweep_fails_saying_why(
    store: Store, launcher: FakeLauncher, make_settings: Callable[..., Settings]
) -> None:
    settings = make_settings(driver_restart_backoff_s=0.0, max_driver_starts=2)
    new(store, "s-1", "running")
    sup = Supervisor(store, launcher, settings)

    async def lose_and_relaunch() -> None:
        for _ in range(2):  # each start's driver is lost at once
            await poll_and_launch(sup)
            launcher.drivers.pop("s-1", None)
        await anyio.to_thread.run_sync(sup.poll_once)

    run(lose_and_relaunch)
    row = store.get("s-1")
    assert launcher.started == ["s-1", "s-1"]
    assert row is not None and (row.status, row.driver_starts) == ("failed", 2)
    assert row.error == driver_lost_error(2) and "lost 2 time(s)" in row.error


def test_a_cancelled_sweep_whose_driver_is_gone_ends_cancelled_not_relaunched(
    store: Store, launcher: FakeLauncher, settings: Settings
) -> None:
    new(store, "s-1", "running", cancel_requested=True)
    assert Supervisor(store, launcher, settings).poll_once() == []
    assert store.get("s-1").status == "cancelled"  # type: ignore[union-attr]
    assert launcher.started == []


def test_busy_driver_is_asked_again_later(store: Store, launcher: FakeLauncher, settings: Settings) -> None:
    new(store, "s-1", "running")
    launcher.start("s-1", {})
    launcher.busy.add("s-1")
    Supervisor(store, launcher, settings).poll_once()
    row = store.get("s-1")
    assert row is not None and row.status == "running"  # a slow answer is not a lost driver


def test_reconcile_relaunches_queued_and_kills_leftover_drivers(
    store: Store, launcher: FakeLauncher, settings: Settings
) -> None:
    new(store, "queued-1")  # stored, but the service stopped before launching it
    new(store, "done-1", "succeeded", report={"a": 1})
    launcher.start("done-1", {})  # stored as final, but its actor was never killed
    new(store, "cancel-1", cancel_requested=True)  # cancelled before it ever started

    async def go() -> None:
        sup = Supervisor(store, launcher, settings)
        await sup.reconcile()
        for _ in range(100):
            if "queued-1" in launcher.started:
                break
            await asyncio.sleep(0.02)

    run(go)
    assert "queued-1" in launcher.started
    assert launcher.killed == ["done-1"]
    assert store.get("done-1").status == "succeeded"  # type: ignore[union-attr]
    assert store.get("cancel-1").status == "cancelled"  # type: ignore[union-attr]
    assert "cancel-1" not in launcher.started


def test_reconcile_keeps_polling_a_driver_that_survived(
    store: Store, launcher: FakeLauncher, settings: Settings
) -> None:
    new(store, "s-1", "running")
    launcher.start("s-1", {})
    launcher.set("s-1", progress={"trials_done": 2})

    async def go() -> None:
        await Supervisor(store, launcher, settings).reconcile()

    run(go)
    row = store.get("s-1")
    assert row is not None and row.status == "running" and row.progress == {"trials_done": 2}
    assert launcher.killed == [] and launcher.started == ["s-1"]  # not started twice


def test_unknown_status_from_a_driver_changes_nothing(store: Store, launcher: FakeLauncher, settings: Settings) -> None:
    new(store, "s-1", "running")
    launcher.start("s-1", {})
    launcher.set("s-1", status="exploded")
    Supervisor(store, launcher, settings).poll_once()
    assert store.get("s-1").status == "running"  # type: ignore[union-attr]


def test_a_relaunch_that_fails_to_start_is_tried_again_not_final(
    store: Store, launcher: FakeLauncher, make_settings: Callable[..., Settings]
) -> None:
    settings = make_settings(driver_restart_backoff_s=0.0, max_driver_starts=4)
    new(store, "s-1", "running")
    store.count_driver_start("s-1")  # its first driver, now gone
    sup = Supervisor(store, launcher, settings)

    launcher.fail_start = "Ray Client: connection refused"
    run(lambda: poll_and_launch(sup))
    row = store.get("s-1")
    assert row is not None and (row.status, row.error, row.driver_starts) == ("running", None, 2)
    launcher.fail_start = None
    run(lambda: poll_and_launch(sup))
    assert launcher.started == ["s-1"] and store.get("s-1").driver_starts == 3  # type: ignore[union-attr]


def test_a_driver_that_never_answers_is_given_up_and_relaunched_or_cancelled(
    store: Store, launcher: FakeLauncher, make_settings: Callable[..., Settings]
) -> None:
    settings = make_settings(driver_unresponsive_s=0.2, driver_restart_backoff_s=0.0)
    new(store, "s-1", "running")
    new(store, "s-2", "running", cancel_requested=True)
    for sweep_id in ("s-1", "s-2"):
        store.count_driver_start(sweep_id)
        launcher.start(sweep_id, {})
        launcher.busy.add(sweep_id)
    sup = Supervisor(store, launcher, settings)
    sup.poll_once()
    assert launcher.killed == []  # a slow answer is not yet a lost driver
    time.sleep(0.25)
    sup.poll_once()
    assert sorted(launcher.killed) == ["s-1", "s-2"]  # given up on, visibly (the log says so)
    launcher.busy.clear()
    assert [r.id for r in sup.poll_once()] == ["s-1"]  # relaunched; the cancelled one ends
    assert store.get("s-2").status == "cancelled"  # type: ignore[union-attr]


def test_a_first_start_whose_driver_died_as_it_started_is_relaunched_not_failed(
    store: Store, launcher: FakeLauncher, make_settings: Callable[..., Settings], monkeypatch: pytest.MonkeyPatch
) -> None:
    # the soak's kill -9 of a driver actor while the service was starting it failed the sweep:
    # "driver failed to start (ActorDiedError)", a fault reported as a result
    settings = make_settings(driver_restart_backoff_s=0.0, max_driver_starts=3)
    new(store, "s-1")
    sup = Supervisor(store, launcher, settings)
    starts = iter([DriverLost("s-1: its driver died while it started")])
    start = launcher.start

    def dies_once(sweep_id: str, spec: dict[str, Any]) -> None:
        if (exc := next(starts, None)) is not None:
            raise exc
        start(sweep_id, spec)

    monkeypatch.setattr(launcher, "start", dies_once)
    run(lambda: poll_and_launch(sup))  # queued, no driver: started, and its actor dies
    row = store.get("s-1")
    assert row is not None and (row.status, row.error, row.driver_starts) == ("queued", None, 1)
    run(lambda: poll_and_launch(sup))  # a lost driver: relaunched after the backoff
    row = store.get("s-1")
    assert launcher.started == ["s-1"] and row is not None and (row.status, row.driver_starts) == ("queued", 2)
    sup.poll_once()
    assert store.get("s-1").status == "running"  # type: ignore[union-attr]


def test_starts_that_keep_dying_are_bounded_then_the_sweep_fails_saying_why(
    store: Store, launcher: FakeLauncher, make_settings: Callable[..., Settings], monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = make_settings(driver_restart_backoff_s=0.0, max_driver_starts=2)
    new(store, "s-1")
    sup = Supervisor(store, launcher, settings)

    def dies(sweep_id: str, spec: dict[str, Any]) -> None:
        raise DriverLost(f"{sweep_id}: its driver died while it started")

    monkeypatch.setattr(launcher, "start", dies)
    for _ in range(3):
        run(lambda: poll_and_launch(sup))
    row = store.get("s-1")
    assert row is not None and (row.status, row.driver_starts, row.error) == ("failed", 2, driver_lost_error(2))


def test_a_driver_lost_before_a_poll_saw_it_run_is_relaunched_after_the_backoff(
    store: Store, launcher: FakeLauncher, make_settings: Callable[..., Settings]
) -> None:
    # started, then killed before the poller stored "running": the store still says queued
    settings = make_settings(driver_restart_backoff_s=0.3, max_driver_starts=3)
    new(store, "s-1")
    store.count_driver_start("s-1")
    sup = Supervisor(store, launcher, settings)
    assert sup.poll_once() == []  # a lost driver, not a sweep never started: the backoff runs first
    time.sleep(0.35)
    assert [r.id for r in sup.poll_once()] == ["s-1"]


def test_closing_a_sweeps_leftovers_keeps_no_connection_open(store: Store, settings: Settings) -> None:
    # an Optuna storage left to the garbage collector held two SQLite fds per cancelled sweep until a full
    # collection: the soak's API grew 69 -> 81 open fds
    optuna_db = settings.optuna_url.removeprefix("sqlite:///")

    def open_on_optuna_db() -> int:
        fds = 0
        for fd in os.listdir("/proc/self/fd"):
            with contextlib.suppress(OSError):
                fds += os.readlink(f"/proc/self/fd/{fd}") == optuna_db
        return fds

    sup = Supervisor(store, FakeLauncher(), settings)
    gc.disable()  # as rare as a full collection is in a long-lived API
    try:
        for i in range(3):
            new(store, f"s-{i}", "running", cancel_requested=True)  # its driver gone: ends here, closing leftovers
            sup.poll_once()
            assert store.get(f"s-{i}").status == "cancelled"  # type: ignore[union-attr]
        assert open_on_optuna_db() == 0
    finally:
        gc.enable()


def test_drivers_opening_the_optuna_storage_the_service_prepared_do_not_race(tmp_path: Path) -> None:
    # the soak's first two sweeps, started 0.5 s apart on a new data dir: one failed with "UNIQUE
    # constraint failed: alembic_version.version_num" as both drivers created Optuna's tables
    url = f"sqlite:///{tmp_path / 'optuna.db'}"
    prepare_optuna(url)  # RayLauncher.connect, before any driver
    barrier, errors = threading.Barrier(4), []

    def driver() -> None:
        barrier.wait()
        try:
            open_storage(url).engine.dispose()  # type: ignore[attr-defined]
        except Exception as exc:
            errors.append(repr(exc))

    drivers = [threading.Thread(target=driver) for _ in range(4)]
    for t in drivers:
        t.start()
    for t in drivers:
        t.join()
    assert errors == []
    prepare_optuna("postgresql://nobody@127.0.0.1:1/none")  # unreachable: logged, not raised


def test_a_driver_created_but_never_started_is_started_or_ended_if_cancelled(
    store: Store, launcher: FakeLauncher, settings: Settings
) -> None:
    """The service was killed between creating a sweep's driver and starting it (the soak's kill -9 of the API
    right after a submit): the driver answers "queued" and would wait for ever. The next service starts it;
    with a cancel pending, it ends the sweep cancelled instead."""
    for sweep_id in ("s-1", "s-2"):
        new(store, sweep_id)
        store.count_driver_start(sweep_id)
        launcher.start(sweep_id, {})
        launcher.set(sweep_id, status="queued", started_at=None)  # created, `start` never called
    store.request_cancel("s-2")
    sup = Supervisor(store, launcher, settings)
    assert [r.id for r in sup.poll_once()] == ["s-1"]  # started again at once: nothing is lost
    assert store.get("s-2").status == "cancelled" and launcher.killed == ["s-2"]  # type: ignore[union-attr]
    run(lambda: poll_and_launch(sup))
    assert launcher.started.count("s-1") == 2 and store.get("s-1").driver_starts == 2  # type: ignore[union-attr]
