"""The service's store of sweeps: SQLAlchemy 2 models and the queries the service makes.

The table `sweeps`: the spec as submitted (normalised), who owns it, its status, the driver's last
progress and the final report; `studies`: a study submitted over HTTP, whose scales are rows of `sweeps`. Two more for the browser pages: `web_sessions` and `sign_in_links`
(their queries are in service/api/sessions.py). SQLite by default, PostgreSQL by URL; the schema comes from the Alembic
migrations in service/store/alembic/ (`Store.migrate()` runs `upgrade head`).

Every method is synchronous (a plain SQLAlchemy engine): the web layer calls them in a worker thread.
Rows come back detached (`expire_on_commit=False`), so callers read them without a session.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import secrets
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import (
    JSON,
    DateTime,
    Engine,
    Float,
    Index,
    Integer,
    String,
    Text,
    TypeDecorator,
    UniqueConstraint,
    create_engine,
    event,
    func,
    select,
    text,
)
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column, sessionmaker

from sweeps.status import ACTIVE_SWEEP_STATUSES, FINAL_SWEEP_STATUSES, SweepStatus

log = logging.getLogger(__name__)


# the one enum of sweep statuses (sweeps/status.py), under the names this module's callers use
FINAL_STATUSES, ACTIVE_STATUSES = FINAL_SWEEP_STATUSES, ACTIVE_SWEEP_STATUSES


class UTCDateTime(TypeDecorator[datetime]):
    """Timezone-aware UTC datetimes on every backend (SQLite drops the zone; this puts it back)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is not None and value.tzinfo is None:
            raise ValueError("naive datetime; store UTC-aware datetimes only")
        return value.astimezone(UTC) if value is not None else None

    def process_result_value(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def utcnow() -> datetime:
    return datetime.now(UTC)


class Base(DeclarativeBase):
    pass


class SweepRow(Base):
    __tablename__ = "sweeps"

    id: Mapped[str] = mapped_column(String(80), primary_key=True)
    owner: Mapped[str] = mapped_column(String(64))
    name: Mapped[str] = mapped_column(String(64))
    spec: Mapped[dict[str, Any]] = mapped_column(JSON)
    spec_hash: Mapped[str] = mapped_column(String(64))  # sha256 of the normalised spec: idempotency checks
    status: Mapped[str] = mapped_column(String(16), default=SweepStatus.queued.value)
    progress: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    report: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    error: Mapped[str | None] = mapped_column(Text, nullable=True)
    experiment_id: Mapped[str | None] = mapped_column(String(64), nullable=True)
    idempotency_key: Mapped[str | None] = mapped_column(String(200), nullable=True)
    cancel_requested: Mapped[bool] = mapped_column(default=False)
    # driver actors started for this sweep: a lost driver is relaunched (and resumes) a bounded number of times
    driver_starts: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    # its price when submitted, in GPU-hours (service.policy.capped_price): an owner's sweeps within a window are
    # capped by their sum. NULL: submitted before this column existed, counted as nothing
    gpu_hours: Mapped[float | None] = mapped_column(Float, nullable=True)
    # bumped on every change: event streams compare it instead of the whole row
    revision: Mapped[int] = mapped_column(Integer, default=1)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime())
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)

    __table_args__ = (
        # a retried submit finds its sweep by (owner, key); NULL keys never collide
        UniqueConstraint("owner", "idempotency_key", name="uq_sweeps_owner_idempotency_key"),
        Index("ix_sweeps_owner_created", "owner", "created_at"),
        Index("ix_sweeps_status", "status"),
    )

    @property
    def final(self) -> bool:
        return SweepStatus(self.status).final


class StudyRow(Base):
    """A study (sweeps/study.py) submitted over HTTP: its scales' sweeps are rows of `sweeps` with the ids
    `<study id>-s<i>` (smallest scale first), created one at a time as the one before succeeds
    (`service.studies`); `laws` is `sweeps.law.OptimizerLaw` per optimizer as JSON once all have. A study with
    `confirm: true` has one more sweep after its scales, `<study id>-s<scales + 1>`, made from the laws;
    `confirmations` is `sweeps.law.Confirmation` per law as JSON once it succeeded, `confirm_note` why none
    ran where no law predicted a size it could test."""

    __tablename__ = "studies"

    id: Mapped[str] = mapped_column(String(80), primary_key=True)
    owner: Mapped[str] = mapped_column(String(64))
    name: Mapped[str] = mapped_column(String(64))
    spec: Mapped[dict[str, Any]] = mapped_column(JSON)
    status: Mapped[str] = mapped_column(String(16), default=SweepStatus.running.value)
    error: Mapped[str | None] = mapped_column(Text, nullable=True)
    laws: Mapped[list[dict[str, Any]] | None] = mapped_column(JSON, nullable=True)
    confirmations: Mapped[list[dict[str, Any]] | None] = mapped_column(JSON, nullable=True)
    confirm_note: Mapped[str | None] = mapped_column(Text, nullable=True)
    run_id: Mapped[str | None] = mapped_column(String(64), nullable=True)  # the study's MLflow run
    cancel_requested: Mapped[bool] = mapped_column(default=False)
    # its sweeps' prices together (its confirmation at most among them: service.policy.study_hours)
    gpu_hours: Mapped[float | None] = mapped_column(Float, nullable=True)
    revision: Mapped[int] = mapped_column(Integer, default=1)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime())
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)

    __table_args__ = (Index("ix_studies_owner_created", "owner", "created_at"), Index("ix_studies_status", "status"))

    @property
    def final(self) -> bool:
        return SweepStatus(self.status).final

    def sweep_id(self, scale: int) -> str:
        """The id of the sweep of scale `scale` (1: the smallest; the number of scales + 1: the confirmation)."""
        return f"{self.id}-s{scale}"


class WebSessionRow(Base):
    """A browser signed in as `owner` (service/api/sessions.py). The cookie holds the session's random id,
    signed; only its sha256 is stored. Signing out deletes the row, so the cookie stops working; so does
    removing the owner or changing their token."""

    __tablename__ = "web_sessions"

    id_hash: Mapped[str] = mapped_column(String(64), primary_key=True)  # sha256 hex of the id in the cookie
    owner: Mapped[str] = mapped_column(String(64))
    token_mark: Mapped[str] = mapped_column(String(64))  # the owner's token when signed in (sessions.token_mark)
    csrf_token: Mapped[str] = mapped_column(String(64))  # the synchronizer token of this session's forms
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    expires_at: Mapped[datetime] = mapped_column(UTCDateTime())

    __table_args__ = (Index("ix_web_sessions_expires", "expires_at"),)


class SignInLinkRow(Base):
    """A one-time sign-in link of `owner` (POST /login/once): used once, or never after `expires_at`, or
    after the owner is removed or their token changed."""

    __tablename__ = "sign_in_links"

    code_hash: Mapped[str] = mapped_column(String(64), primary_key=True)  # sha256 hex of the code in the link
    owner: Mapped[str] = mapped_column(String(64))
    token_mark: Mapped[str] = mapped_column(String(64))  # the owner's token when minted (sessions.token_mark)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    expires_at: Mapped[datetime] = mapped_column(UTCDateTime())

    __table_args__ = (Index("ix_sign_in_links_expires", "expires_at"),)


def new_sweep_id(name: str) -> str:
    """`<spec name>-<8 hex>`: the MLflow experiment name and Optuna study prefix, so one per submit (a study's
    id too, and its scales' sweeps `<study id>-s<i>`)."""
    return f"{name}-{secrets.token_hex(4)}"


def spec_hash(spec: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(spec, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


class IdempotencyConflict(Exception):
    """The idempotency key was used before for a different spec."""

    def __init__(self, existing: SweepRow) -> None:
        super().__init__(f"idempotency key already used for sweep {existing.id} with a different spec")
        self.existing = existing


class TooManyActive(Exception):
    def __init__(self, active: int, limit: int) -> None:
        super().__init__(f"{active} sweeps queued or running; the limit per owner is {limit}")
        self.active, self.limit = active, limit


@dataclass(frozen=True)
class Budget:
    """The most GPU-hours one owner's sweeps created within `window` of a submit may be priced at, together."""

    gpu_hours: float
    window: timedelta


class OverBudget(Exception):
    """The owner's sweeps within the window (`spent`) and this one (`price`) would pass the budget."""

    def __init__(self, spent: float, price: float, budget: Budget, frees_at: datetime | None) -> None:
        super().__init__(f"{spent:g} GPU-hours spent within the window, {price:g} more asked; the budget is {budget}")
        self.spent, self.price, self.budget, self.frees_at = spent, price, budget, frees_at


def frees_at(priced: Sequence[tuple[datetime, float]], price: float, budget: Budget) -> datetime | None:
    """When `price` more fits the budget, as the sweeps of `priced` (created at, GPU-hours; oldest first, all within
    the window now) leave the window; None when it never does (the price alone is over the budget)."""
    if price > budget.gpu_hours:
        return None
    left = math.fsum(h for _, h in priced)
    if left + price <= budget.gpu_hours:
        return utcnow()
    for created, hours in priced:
        left -= hours
        if left + price <= budget.gpu_hours:
            return created + budget.window
    return priced[-1][0] + budget.window  # all gone (what rounding left in `left` is no sweep)


@dataclass(frozen=True)
class Created:
    row: SweepRow
    replayed: bool  # True: an earlier submit with the same idempotency key made it


@dataclass(frozen=True)
class SweepList:
    """One page of an owner's sweeps (`Store.list_sweeps`), and how many match in all."""

    items: list[SweepRow]
    total: int


# Fields the poller and the routes may change after creation.
_MUTABLE = frozenset(
    {"status", "progress", "report", "error", "experiment_id", "cancel_requested", "started_at", "finished_at"}
)


class Store:
    def __init__(self, url: str, *, echo: bool = False) -> None:
        self.url = url
        self.engine: Engine = make_engine(url, echo=echo)
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)
        # SQLite has no row locks to order concurrent submits of one owner; one process writes it, so a
        # process lock makes "count active, then insert" atomic. PostgreSQL takes an advisory lock.
        self._submit_lock = threading.Lock()
        # called with a sweep id after each committed change (e.g. to drop cached renders of it)
        self.listeners: list[Callable[[str], None]] = []

    @property
    def dialect(self) -> str:
        return self.engine.dialect.name

    def migrate(self) -> None:
        """`alembic upgrade head` on this store's database."""
        from service.store.migrations import upgrade

        if self.dialect == "sqlite":
            Path(self.engine.url.database or "").parent.mkdir(parents=True, exist_ok=True)
        upgrade(self.engine)

    def dispose(self) -> None:
        self.engine.dispose()

    @contextmanager
    def transaction(self) -> Iterator[Session]:
        """A SQLAlchemy session in one transaction: committed at the end, rolled back on an exception."""
        with self._sessions() as s, s.begin():
            yield s

    def ping(self) -> None:
        with self.engine.connect() as conn:
            conn.execute(text("SELECT 1"))

    # ---- writes -----------------------------------------------------------------------------------

    def create(
        self,
        *,
        sweep_id: str,
        owner: str,
        spec: dict[str, Any],
        idempotency_key: str | None = None,
        max_active: int | None = None,
        gpu_hours: float | None = None,
        budget: Budget | None = None,
    ) -> Created:
        """Insert a queued sweep priced at `gpu_hours`, or return the one an earlier submit with the same key made.

        Raises `IdempotencyConflict` when the key was used for another spec, `TooManyActive` when the
        owner already has `max_active` sweeps queued or running, `OverBudget` when the owner's sweeps created
        within the budget's window and this one are priced above it (a replay is never refused).
        """
        digest = spec_hash(spec)
        with self._submit_lock:
            try:
                with self.transaction() as s:
                    if self.dialect == "postgresql":
                        # serialises submits of one owner across processes, until this transaction ends
                        s.execute(text("SELECT pg_advisory_xact_lock(hashtext(:owner))"), {"owner": owner})
                    existing = self._by_key(s, owner, idempotency_key) if idempotency_key is not None else None
                    if existing is None:
                        if max_active is not None:
                            active = self._count_active(s, owner)
                            if active >= max_active:
                                raise TooManyActive(active, max_active)
                        now = utcnow()
                        if budget is not None and gpu_hours is not None:
                            priced = self._priced_since(s, owner, now - budget.window)
                            spent = math.fsum(h for _, h in priced)
                            if spent + gpu_hours > budget.gpu_hours:
                                raise OverBudget(spent, gpu_hours, budget, frees_at(priced, gpu_hours, budget))
                        row = SweepRow(
                            id=sweep_id,
                            owner=owner,
                            name=str(spec.get("name", "")),
                            spec=spec,
                            spec_hash=digest,
                            status=SweepStatus.queued.value,
                            idempotency_key=idempotency_key,
                            cancel_requested=False,
                            gpu_hours=gpu_hours,
                            revision=1,
                            created_at=now,
                            updated_at=now,
                        )
                        s.add(row)
            except IntegrityError:
                # another process inserted the same (owner, key) between our read and our insert
                if idempotency_key is None:
                    raise
                with self._sessions() as s:
                    existing = self._by_key(s, owner, idempotency_key)
                if existing is None:
                    raise
        # judged after the transaction ended cleanly: raising inside it would expire the row
        if existing is not None:
            return self._replay(existing, digest)
        return Created(row, replayed=False)

    @staticmethod
    def _replay(existing: SweepRow, digest: str) -> Created:
        if existing.spec_hash != digest:
            raise IdempotencyConflict(existing)
        return Created(existing, replayed=True)

    def update(self, sweep_id: str, **fields: Any) -> SweepRow | None:
        """Set `fields`; bumps the revision only when something changed. None if no such sweep."""
        unknown = set(fields) - _MUTABLE
        if unknown:
            raise ValueError(f"cannot update {sorted(unknown)}; mutable fields: {sorted(_MUTABLE)}")
        with self.transaction() as s:
            row = s.get(SweepRow, sweep_id, with_for_update=self.dialect == "postgresql")
            if row is None:
                return None
            changed = {k: v for k, v in fields.items() if getattr(row, k) != v}
            if changed:
                for key, value in changed.items():
                    setattr(row, key, value)
                row.revision += 1
                row.updated_at = utcnow()
        if changed:
            self._changed(sweep_id)
        return row

    def count_driver_start(self, sweep_id: str) -> int:
        """One more driver start of the sweep (before it is started); returns the count."""
        with self.transaction() as s:
            row = s.get(SweepRow, sweep_id, with_for_update=self.dialect == "postgresql")
            if row is None:
                return 0
            row.driver_starts += 1
            return row.driver_starts

    def request_cancel(self, sweep_id: str) -> SweepRow | None:
        """Flag a cancel; a sweep that is still queued and never started ends here as cancelled."""
        with self.transaction() as s:
            row = s.get(SweepRow, sweep_id, with_for_update=self.dialect == "postgresql")
            if row is None or row.final:
                return row
            row.cancel_requested = True
            row.revision += 1
            row.updated_at = utcnow()
        self._changed(sweep_id)
        return row

    # ---- studies ----------------------------------------------------------------------------------

    def create_study(self, *, study_id: str, owner: str, spec: dict[str, Any], gpu_hours: float) -> StudyRow:
        """Insert a study, running: the supervisor creates its first sweep on its next pass."""
        now = utcnow()
        row = StudyRow(
            id=study_id,
            owner=owner,
            name=str(spec.get("name", "")),
            spec=spec,
            status=SweepStatus.running.value,
            cancel_requested=False,
            gpu_hours=gpu_hours,
            revision=1,
            created_at=now,
            updated_at=now,
        )
        with self.transaction() as s:
            s.add(row)
        return row

    def get_study(self, study_id: str, *, owner: str | None = None) -> StudyRow | None:
        """The study, or None when it does not exist or belongs to another owner."""
        with self._sessions() as s:
            row = s.get(StudyRow, study_id)
            return None if row is None or (owner is not None and row.owner != owner) else row

    def list_studies(self, *, owner: str, limit: int = 20, offset: int = 0) -> tuple[list[StudyRow], int]:
        """The owner's studies, newest first, and how many they have in all."""
        where = StudyRow.owner == owner
        with self._sessions() as s:
            total = s.execute(select(func.count()).select_from(StudyRow).where(where)).scalar_one()
            rows = s.execute(
                select(StudyRow).where(where).order_by(StudyRow.created_at.desc(), StudyRow.id.desc()).limit(limit)
                .offset(offset)
            ).scalars().all()  # fmt: skip
        return list(rows), int(total)

    def reserved(self, owner: str) -> float:
        """GPU-hours the owner's running studies will still spend: each study's price less that of its sweeps
        made so far (those count in `priced_since` as any sweep)."""
        with self._sessions() as s:
            studies = s.execute(
                select(StudyRow.id, StudyRow.gpu_hours).where(
                    StudyRow.owner == owner, StudyRow.status == SweepStatus.running.value
                )
            ).all()
            left = 0.0
            for study_id, hours in studies:
                # its scales' sweeps: ids are [a-z0-9-] (a spec's name and hex), so no LIKE wildcard is in one
                made = s.execute(
                    select(func.coalesce(func.sum(SweepRow.gpu_hours), 0.0)).where(
                        SweepRow.owner == owner, SweepRow.id.like(f"{study_id}-s%")
                    )
                ).scalar_one()
                left += max(0.0, float(hours or 0.0) - float(made))
        return left

    def active_studies(self) -> list[StudyRow]:
        """Every running study, oldest first (the supervisor's work list)."""
        with self._sessions() as s:
            rows = s.execute(
                select(StudyRow).where(StudyRow.status == SweepStatus.running.value).order_by(StudyRow.created_at)
            ).scalars().all()  # fmt: skip
        return list(rows)

    def update_study(self, study_id: str, **fields: Any) -> StudyRow | None:
        """Set `fields` (status, error, laws, confirmations, confirm_note, run_id, cancel_requested,
        finished_at); None if no such study."""
        allowed = {"status", "error", "laws", "confirmations", "confirm_note", "run_id", "cancel_requested"}
        unknown = set(fields) - allowed - {"finished_at"}
        if unknown:
            raise ValueError(f"cannot update a study's {sorted(unknown)}")
        with self.transaction() as s:
            row = s.get(StudyRow, study_id, with_for_update=self.dialect == "postgresql")
            if row is None:
                return None
            changed = {k: v for k, v in fields.items() if getattr(row, k) != v}
            for key, value in changed.items():
                setattr(row, key, value)
            if changed:
                row.revision += 1
                row.updated_at = utcnow()
        return row

    def _changed(self, sweep_id: str) -> None:
        for listener in self.listeners:
            listener(sweep_id)

    def delete_all(self) -> None:
        """Tests only."""
        with self.transaction() as s:
            s.execute(SweepRow.__table__.delete())

    # ---- reads ------------------------------------------------------------------------------------

    def get(self, sweep_id: str, *, owner: str | None = None) -> SweepRow | None:
        """The sweep, or None when it does not exist or belongs to another owner."""
        with self._sessions() as s:
            row = s.get(SweepRow, sweep_id)
            if row is None or (owner is not None and row.owner != owner):
                return None
            return row

    def revision(self, sweep_id: str) -> int | None:
        """Just the revision: event streams read this twice a second and the row only when it moved."""
        with self._sessions() as s:
            return s.execute(select(SweepRow.revision).where(SweepRow.id == sweep_id)).scalar_one_or_none()

    def list_sweeps(
        self, *, owner: str, statuses: Sequence[str] | None = None, limit: int = 20, offset: int = 0
    ) -> SweepList:
        """The owner's sweeps, newest first."""
        where = [SweepRow.owner == owner]
        if statuses:
            where.append(SweepRow.status.in_(list(statuses)))
        with self._sessions() as s:
            total = s.execute(select(func.count()).select_from(SweepRow).where(*where)).scalar_one()
            rows = (
                s.execute(
                    select(SweepRow)
                    .where(*where)
                    .order_by(SweepRow.created_at.desc(), SweepRow.id.desc())
                    .limit(limit)
                    .offset(offset)
                )
                .scalars()
                .all()
            )
        return SweepList(items=list(rows), total=int(total))

    def active(self) -> list[SweepRow]:
        """Every queued or running sweep, oldest first (the poller's work list)."""
        with self._sessions() as s:
            rows = (
                s.execute(
                    select(SweepRow)
                    .where(SweepRow.status.in_([st.value for st in ACTIVE_STATUSES]))
                    .order_by(SweepRow.created_at)
                )
                .scalars()
                .all()
            )
        return list(rows)

    def statuses(self, sweep_ids: Sequence[str]) -> dict[str, str]:
        if not sweep_ids:
            return {}
        with self._sessions() as s:
            rows = s.execute(select(SweepRow.id, SweepRow.status).where(SweepRow.id.in_(list(sweep_ids)))).all()
        return {r.id: r.status for r in rows}

    def tallies(self) -> list[tuple[str, str, int, int]]:
        """(status, owner, sweeps, driver starts) for every status and owner with sweeps: one grouped query."""
        with self._sessions() as s:
            rows = s.execute(
                select(
                    SweepRow.status, SweepRow.owner, func.count(), func.coalesce(func.sum(SweepRow.driver_starts), 0)
                ).group_by(SweepRow.status, SweepRow.owner)
            ).all()
        return [(str(r[0]), str(r[1]), int(r[2]), int(r[3])) for r in rows]

    def count_active(self, owner: str) -> int:
        with self._sessions() as s:
            return self._count_active(s, owner)

    @staticmethod
    def _count_active(s: Session, owner: str) -> int:
        return int(
            s.execute(
                select(func.count())
                .select_from(SweepRow)
                .where(SweepRow.owner == owner, SweepRow.status.in_([st.value for st in ACTIVE_STATUSES]))
            ).scalar_one()
        )

    def priced_since(self, owner: str, since: datetime) -> list[tuple[datetime, float]]:
        """(created at, GPU-hours) of the owner's priced sweeps created at or after `since`, oldest first."""
        with self._sessions() as s:
            return self._priced_since(s, owner, since)

    @staticmethod
    def _priced_since(s: Session, owner: str, since: datetime) -> list[tuple[datetime, float]]:
        rows = s.execute(
            select(SweepRow.created_at, SweepRow.gpu_hours)
            .where(SweepRow.owner == owner, SweepRow.created_at >= since, SweepRow.gpu_hours.is_not(None))
            .order_by(SweepRow.created_at)
        ).all()
        return [(r[0], float(r[1])) for r in rows]

    @staticmethod
    def _by_key(s: Session, owner: str, key: str) -> SweepRow | None:
        return s.execute(
            select(SweepRow).where(SweepRow.owner == owner, SweepRow.idempotency_key == key)
        ).scalar_one_or_none()


def make_engine(url: str, *, echo: bool = False) -> Engine:
    """An engine for `url`; SQLite gets WAL and a busy timeout so readers and the poller coexist."""
    for plain in ("postgresql://", "postgres://"):
        if url.startswith(plain):
            url = "postgresql+psycopg://" + url[len(plain) :]  # psycopg 3, not SQLAlchemy's psycopg2 default
    if url.startswith("sqlite"):
        # a pool as large as the busy part of the thread pool: overflow connections are opened and
        # closed per use, and opening one (with its pragmas) costs more than the query
        engine = create_engine(url, echo=echo, connect_args={"timeout": 30}, pool_size=20, max_overflow=20)

        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")  # readers never wait for the writer
            cur.execute("PRAGMA busy_timeout=30000")
            cur.execute("PRAGMA synchronous=NORMAL")  # safe with WAL; a crash loses at most the last commit
            cur.close()

        return engine
    return create_engine(url, echo=echo, pool_pre_ping=True, pool_size=10, max_overflow=20)


__all__ = [
    "ACTIVE_STATUSES",
    "FINAL_STATUSES",
    "Base",
    "Budget",
    "Created",
    "IdempotencyConflict",
    "OverBudget",
    "SweepList",
    "SignInLinkRow",
    "Store",
    "StudyRow",
    "SweepRow",
    "SweepStatus",
    "TooManyActive",
    "WebSessionRow",
    "frees_at",
    "make_engine",
    "new_sweep_id",
    "spec_hash",
]
