"""The store's contract, run on SQLite and on a real PostgreSQL server (one parametrized suite)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from datetime import UTC
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from harness import PostgresServer
from sqlalchemy import inspect

from service.store.database import Base, IdempotencyConflict, Store, TooManyActive, utcnow
from service.store.migrations import current


@pytest.fixture(params=["sqlite", "postgresql"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    if request.param == "sqlite":
        s = Store(f"sqlite:///{tmp_path / 'store' / 'service.db'}")
    else:
        pg: PostgresServer = request.getfixturevalue("postgres")
        s = Store(pg.url)
    s.migrate()
    s.delete_all()  # the PostgreSQL database is shared by the session
    try:
        yield s
    finally:
        s.dispose()


def spec(name: str = "s", budget: int = 1000) -> dict[str, object]:
    return {"name": name, "token_budget": budget}


def test_migrations_reach_head_and_match_the_models(store: Store) -> None:
    assert current(store.engine) == "0007"
    assert "sweeps" in inspect(store.engine).get_table_names()
    # the Alembic migration creates exactly what the SQLAlchemy models declare
    with store.engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn), Base.metadata)
    assert diff == []
    store.migrate()  # a second start migrates nothing and fails nothing
    assert current(store.engine) == "0007"


def test_create_then_get_round_trips_spec_and_utc_times(store: Store) -> None:
    created = store.create(sweep_id="a-1", owner="alice", spec=spec("a"))
    assert not created.replayed
    row = store.get("a-1")
    assert row is not None
    assert (row.id, row.owner, row.name, row.status, row.revision) == ("a-1", "alice", "a", "queued", 1)
    assert row.spec == spec("a")
    assert row.created_at.tzinfo is not None and row.created_at.utcoffset() == UTC.utcoffset(None)
    assert abs((utcnow() - row.created_at).total_seconds()) < 60


def test_get_hides_other_owners_sweeps(store: Store) -> None:
    store.create(sweep_id="a-1", owner="alice", spec=spec())
    assert store.get("a-1", owner="alice") is not None
    assert store.get("a-1", owner="bob") is None
    assert store.get("nope") is None


def test_update_bumps_revision_only_on_change(store: Store) -> None:
    store.create(sweep_id="a-1", owner="alice", spec=spec())
    row = store.update("a-1", status="running", progress={"trials_done": 1})
    assert row is not None and row.revision == 2
    row = store.update("a-1", status="running", progress={"trials_done": 1})
    assert row is not None and row.revision == 2  # nothing changed: event streams stay quiet
    row = store.update("a-1", progress={"trials_done": 2}, report={"answer": [1, 2]})
    assert row is not None and row.revision == 3
    assert store.get("a-1").report == {"answer": [1, 2]}  # type: ignore[union-attr]
    assert store.revision("a-1") == 3
    assert store.update("nope", status="failed") is None
    with pytest.raises(ValueError, match="cannot update"):
        store.update("a-1", owner="bob")


def test_page_is_newest_first_filtered_and_owner_scoped(store: Store) -> None:
    for i in range(5):
        store.create(sweep_id=f"a-{i}", owner="alice", spec=spec())
        time.sleep(0.002)  # distinct creation times
    store.create(sweep_id="b-0", owner="bob", spec=spec())
    store.update("a-1", status="running")
    store.update("a-3", status="succeeded")

    page = store.list_sweeps(owner="alice", limit=2)
    assert page.total == 5
    assert [r.id for r in page.items] == ["a-4", "a-3"]
    assert [r.id for r in store.list_sweeps(owner="alice", limit=2, offset=2).items] == ["a-2", "a-1"]
    assert [r.id for r in store.list_sweeps(owner="alice", limit=2, offset=4).items] == ["a-0"]
    running = store.list_sweeps(owner="alice", statuses=["running", "succeeded"])
    assert (running.total, [r.id for r in running.items]) == (2, ["a-3", "a-1"])
    assert [r.id for r in store.list_sweeps(owner="bob").items] == ["b-0"]


def test_active_and_count_active(store: Store) -> None:
    store.create(sweep_id="a-0", owner="alice", spec=spec())
    store.create(sweep_id="a-1", owner="alice", spec=spec())
    store.create(sweep_id="b-0", owner="bob", spec=spec())
    store.update("a-0", status="running")
    store.update("a-1", status="cancelled")
    assert [r.id for r in store.active()] == ["a-0", "b-0"]  # oldest first
    assert store.count_active("alice") == 1
    assert store.statuses(["a-0", "a-1", "zz"]) == {"a-0": "running", "a-1": "cancelled"}


def test_idempotency_key_returns_the_same_sweep(store: Store) -> None:
    first = store.create(sweep_id="a-0", owner="alice", spec=spec(), idempotency_key="k1")
    again = store.create(sweep_id="a-1", owner="alice", spec=spec(), idempotency_key="k1")
    assert again.replayed and again.row.id == first.row.id == "a-0"
    assert store.get("a-1") is None  # nothing new was stored
    # keys are per owner: bob's k1 is another sweep
    bobs = store.create(sweep_id="b-0", owner="bob", spec=spec(), idempotency_key="k1")
    assert not bobs.replayed and bobs.row.id == "b-0"
    with pytest.raises(IdempotencyConflict) as info:
        store.create(sweep_id="a-2", owner="alice", spec=spec(budget=2), idempotency_key="k1")
    assert info.value.existing.id == "a-0"


def test_limit_on_active_sweeps_per_owner(store: Store) -> None:
    store.create(sweep_id="a-0", owner="alice", spec=spec(), idempotency_key="k", max_active=1)
    with pytest.raises(TooManyActive) as info:
        store.create(sweep_id="a-1", owner="alice", spec=spec(), max_active=1)
    assert (info.value.active, info.value.limit) == (1, 1)
    # a retried submit is answered even at the limit: it creates nothing
    assert store.create(sweep_id="a-2", owner="alice", spec=spec(), idempotency_key="k", max_active=1).replayed
    store.create(sweep_id="b-0", owner="bob", spec=spec(), max_active=1)  # other owners are not counted
    store.update("a-0", status="failed")
    store.create(sweep_id="a-3", owner="alice", spec=spec(), max_active=1)  # a final sweep frees its slot


def test_limit_holds_under_concurrent_submits(store: Store) -> None:
    results: list[str] = []

    def submit(i: int) -> None:
        try:
            store.create(sweep_id=f"c-{i}", owner="carol", spec=spec(), max_active=2)
            results.append("ok")
        except TooManyActive:
            results.append("refused")

    threads = [threading.Thread(target=submit, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # "count, then insert" is one critical section: never more than the limit
    assert sorted(results) == ["ok"] * 2 + ["refused"] * 6
    assert store.count_active("carol") == 2


def test_request_cancel_flags_unfinished_sweeps_only(store: Store) -> None:
    store.create(sweep_id="a-0", owner="alice", spec=spec())
    row = store.request_cancel("a-0")
    assert row is not None and row.cancel_requested and row.revision == 2
    store.create(sweep_id="a-1", owner="alice", spec=spec())
    store.update("a-1", status="succeeded")
    row = store.request_cancel("a-1")
    assert row is not None and not row.cancel_requested  # final sweeps are left alone
    assert store.request_cancel("nope") is None


def test_ping(store: Store) -> None:
    store.ping()
