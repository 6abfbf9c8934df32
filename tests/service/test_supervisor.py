"""The supervisor keeps the store in step with the drivers: poll, finish, lose, relaunch, reconcile."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from svc_helpers import FakeLauncher, tiny_spec

from service.settings import Settings
from service.store import Store
from service.supervisor import DRIVER_LOST, Supervisor


@pytest.fixture
def store(settings: Settings) -> Iterator[Store]:
    s = Store(settings.database)
    s.migrate()
    yield s
    s.dispose()


def run(coro_fn: Callable[[], Any]) -> Any:
    return asyncio.run(coro_fn())


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


def test_running_sweep_without_driver_is_failed_as_lost(
    store: Store, launcher: FakeLauncher, settings: Settings
) -> None:
    new(store, "s-1", "running")
    Supervisor(store, launcher, settings).poll_once()
    row = store.get("s-1")
    assert row is not None and (row.status, row.error) == ("failed", DRIVER_LOST)


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
