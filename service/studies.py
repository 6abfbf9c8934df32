"""A study over HTTP (POST /studies): what `sweeps study` does on the command line, owned by the service.

Submit validates the study as its dry run does (each scale's sweep as its own submit would be judged) and
refuses it whole where one of its sweeps passes the cap per sweep (422), where together they pass the owner's
within the window or the owner has no room for another active sweep (429). The study is then a row of the store; `StudyRunner.advance`, on each pass of the supervisor,
moves every running study along: it creates the sweep of its next scale (`<study id>-s<i>`, smallest first,
transferred from the scales before it as `sweeps.study.transferred` says) once the one before succeeded, as a
queued sweep that the supervisor launches like any other (so its driver, restarts, cancel, per-owner limits
and caps are a sweep's); once every scale has its report, it fits the law (`sweeps.law.study_laws`, against
the baseline and against each optimizer itself), records the study in MLflow (`sweeps.study_record`) with its
figure (`dashboards.study`), and stores the laws. Everything it needs is in the store, so a restarted service
goes on where the last one stopped: a scale's sweep id is fixed, and one that exists is never made twice.

Predict, then confirm (`confirm: true`): once every scale has its report the laws are fitted and stored first;
then the confirmation sweep at the target (`sweeps.study.confirm_spec` from the laws against the baseline, one
per optimizer, so within the bound its submit was priced at: `service.policy.study_hours`) is created as the
study's next sweep, `<study id>-s<scales + 1>`, and waited for as a scale is; its report judges every law
(`sweeps.law.confirm_laws`), and the study is recorded with the laws and their confirmations. Where no law
predicts a size the target could test, the study ends with its laws and a note saying so.

A sweep of the study that fails or is cancelled ends the study (failed or cancelled, naming it); a cancel of
the study cancels the sweep running and creates no other.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any

import anyio.to_thread
from sqlalchemy.exc import IntegrityError

from service.errors import Conflict, Invalid, not_found
from service.models import LawConfirmation, StudyConfirmation, StudyScaleState, StudySummary, public_error
from service.policy import (
    capped_price,
    over_owner_cap,
    owner_budget,
    owner_cap_problem,
    parse_body,
    study_hours,
    sweep_cap_problem,
    too_many_active,
    validate_study,
)
from service.render import PageCache
from service.settings import Settings
from service.spec_work import SpecWork
from service.store.database import (
    OverBudget,
    Store,
    StudyRow,
    SweepStatus,
    TooManyActive,
    frees_at,
    new_sweep_id,
    utcnow,
)
from sweeps.spec import SweepSpec
from sweeps.study import StudySpec, confirm_spec, transferred

if TYPE_CHECKING:
    from sweeps.law import OptimizerLaw
    from sweeps.report import Report

log = logging.getLogger(__name__)

REFERENCES = ("baseline", "self")  # the laws a study over HTTP fits: its brackets against both references
CONFIRMING = REFERENCES[0]  # the laws whose predictions choose the confirmation sweep's sizes: one per optimizer
RETRY_S = 30  # seconds before a study's law is tried again after it could not be fitted or recorded


def _validated(body: bytes, content_type: str | None, settings: Settings) -> tuple[StudySpec, list[tuple[str, float]]]:
    """The study (`service.policy.validate_study`) and each sweep it may make priced at the caps' pricing
    (`service.policy.study_hours`: its confirmation at most among them)."""
    study = validate_study(parse_body(body, content_type), settings)
    return study, study_hours(study)


async def submit(
    *, body: bytes, content_type: str | None, owner: str, settings: Settings, store: Store, work: SpecWork
) -> StudyRow:
    """Store a valid study, refused whole (422) where one of its sweeps (its confirmation at most among them)
    passes the cap per sweep, (429) where together they pass the owner's within the window or the owner has no
    room for another active sweep."""
    study, hours = await work.run(owner, _validated, body, content_type, settings)
    for name, h in hours:  # each sweep as its own submit would be judged
        if (problem := sweep_cap_problem(h, settings)) is not None:
            raise Invalid("gpu_hours_per_sweep", f"{name}: {problem}")
    total = math.fsum(h for _, h in hours)
    if (budget := owner_budget(settings)) is not None:  # and all of them together, as if submitted now
        priced = await anyio.to_thread.run_sync(store.priced_since, owner, utcnow() - budget.window)
        # the owner's running studies' sweeps not made yet count as spent: they will be
        reserved = await anyio.to_thread.run_sync(store.reserved, owner)
        spent = math.fsum(h for _, h in priced) + reserved
        if spent + total > budget.gpu_hours:
            if total > budget.gpu_hours:  # the study alone: refused on every retry
                raise Invalid("gpu_hours_per_owner", owner_cap_problem(owner, 0.0, total, settings) or "")
            # when enough of the owner's sweeps have left the window; with a running study's sweeps still to come
            # (not in the window yet), not before a whole window from now
            wait = frees_at(priced, total + reserved, budget) if total + reserved <= budget.gpu_hours else None
            raise over_owner_cap(owner, OverBudget(spent, total, budget, wait or utcnow() + budget.window), settings)
    active = await anyio.to_thread.run_sync(store.count_active, owner)
    if active >= settings.max_concurrent_per_owner:
        raise too_many_active(owner, active, settings, study=True)
    spec = study.model_dump(mode="json")
    row = await anyio.to_thread.run_sync(
        lambda: store.create_study(study_id=new_sweep_id(study.name), owner=owner, spec=spec, gpu_hours=total)
    )
    log.info("study %s submitted by %s: %d sweeps", row.id, owner, len(hours))
    return row


def summary(store: Store, row: StudyRow, study: StudySpec | None = None) -> StudySummary:
    """The study with each scale's sweep and its status ("pending": not created yet), and its confirmation
    where it confirms. Blocking. `study`: its spec validated already (a stream reads the study often; its spec
    never changes)."""
    study = study or StudySpec.model_validate(row.spec)
    specs = study.sweep_specs()
    ids = [row.sweep_id(i) for i in range(1, len(specs) + 1)]
    confirm_id = row.sweep_id(len(specs) + 1)
    statuses = store.statuses([*ids, confirm_id] if study.confirm else ids)
    scales = [
        StudyScaleState(
            scale=i,
            sweep_id=sweep_id,
            model=spec.model.preset or "custom",
            trained_tokens=spec.trained_tokens,
            status=statuses.get(sweep_id, "pending"),
        )
        for i, (sweep_id, spec) in enumerate(zip(ids, specs, strict=True), 1)
    ]
    confirmation = None
    if study.confirm:
        confirmation = StudyConfirmation(
            sweep_id=confirm_id,
            status=statuses.get(confirm_id, "not_run" if row.confirm_note is not None else "pending"),  # type: ignore[arg-type]
            note=row.confirm_note,
            laws=[LawConfirmation.from_stored(c) for c in row.confirmations] if row.confirmations is not None else None,
        )
    return StudySummary(
        id=row.id, name=row.name, status=row.status, cancel_requested=row.cancel_requested,  # type: ignore[arg-type]
        error=public_error(row.error), scales=scales, laws=row.laws, confirmation=confirmation, run_id=row.run_id,
        gpu_hours=row.gpu_hours, created_at=row.created_at, updated_at=row.updated_at, finished_at=row.finished_at,
        revision=row.revision,
    )  # fmt: skip


async def get(store: Store, study_id: str, owner: str) -> StudySummary:
    def read() -> StudySummary:
        row = store.get_study(study_id, owner=owner)
        if row is None:
            raise not_found(study_id, "study")
        return summary(store, row)

    return await anyio.to_thread.run_sync(read)


async def list_studies(store: Store, owner: str, limit: int, offset: int) -> tuple[list[StudySummary], int]:
    def read() -> tuple[list[StudySummary], int]:
        rows, total = store.list_studies(owner=owner, limit=limit, offset=offset)
        return [summary(store, r) for r in rows], total

    return await anyio.to_thread.run_sync(read)


async def law_page(store: Store, cache: PageCache, study_id: str, owner: str, *, plotlyjs_src: str) -> str:
    """The study's law as one HTML page (`dashboards.study.law_page`, from the laws it stored, with where its
    confirmation stands where it confirms), drawn once per revision of the study and status of its
    confirmation's sweep in the render process (`cache`, the app's), loading plotly.js from `plotlyjs_src`;
    409 until the study has its laws."""
    from dashboards.study import law_page as draw

    row = await anyio.to_thread.run_sync(lambda: store.get_study(study_id, owner=owner))
    if row is None:
        raise not_found(study_id, "study")
    if row.laws is None:
        raise Conflict("not_finished", f"study {study_id!r} is {row.status}; its law comes when every scale succeeded")
    confirmation = (await anyio.to_thread.run_sync(summary, store, row)).confirmation
    confirming = None
    if confirmation is not None:  # plain data for the render process (`dashboards.study.ConfirmationState`)
        status = getattr(confirmation.status, "value", confirmation.status)
        confirming = {"status": status, "sweep_id": confirmation.sweep_id, "note": confirmation.note}
        confirming["confirmations"] = row.confirmations
    key = ("study", row.id, str(row.revision), confirming["status"] if confirming else "", plotlyjs_src)
    return await cache.get(key, partial(draw, row.laws, row.id, plotlyjs_src, confirming))


async def cancel(store: Store, supervisor: Any, study_id: str, owner: str) -> StudySummary:
    """Flag the cancel and cancel the sweep running, a scale's or the confirmation's (the runner creates no
    other and ends the study once it has ended); 409 when the study already ended."""
    row = await anyio.to_thread.run_sync(lambda: store.get_study(study_id, owner=owner))
    if row is None:
        raise not_found(study_id, "study")
    if row.final:
        raise Conflict("already_finished", f"study {study_id!r} is already {row.status}; nothing to cancel")
    await anyio.to_thread.run_sync(lambda: store.update_study(study_id, cancel_requested=True))
    now = await anyio.to_thread.run_sync(summary, store, row)  # one read of its sweeps' statuses
    sweeps = [(s.sweep_id, s.status) for s in now.scales]
    if now.confirmation is not None:
        sweeps.append((now.confirmation.sweep_id, now.confirmation.status))
    for sweep_id, state in sweeps:
        if state not in ("pending", "not_run") and not SweepStatus(state).final:
            await supervisor.cancel(sweep_id)
    return await get(store, study_id, owner)


class StudyRunner:
    """Moves the running studies along, on the supervisor's pass (blocking; its thread). The laws of a study
    whose scales all succeeded are fitted, and the study recorded, on a thread of its own (MLflow writes may
    wait out an outage), one study at a time, never twice at once."""

    def __init__(self, store: Store, settings: Settings) -> None:
        self.store, self.settings = store, settings
        self._finishing: set[str] = set()
        self._retry_at: dict[str, float] = {}  # study id -> monotonic time of the next try after a failed one
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []

    def advance(self) -> list[str]:
        """One pass over the running studies; the ids of the sweeps it created (queued, to launch)."""
        created = []
        for row in self.store.active_studies():
            try:
                if (sweep_id := self._advance(row)) is not None:
                    created.append(sweep_id)
            except Exception:
                log.exception("study %s: could not move it along", row.id)
        return created

    def _advance(self, row: StudyRow) -> str | None:
        study = StudySpec.model_validate(row.spec)
        done: list[tuple[SweepSpec, Any]] = []
        for i, spec in enumerate(study.sweep_specs(), 1):
            sweep = self.store.get(row.sweep_id(i))
            if sweep is None:
                if row.cancel_requested:
                    self._end(row, SweepStatus.cancelled, None)
                    return None
                return self._create(row, i, transferred(spec, done) if study.transfer else spec, f"scale {i}'s")
            report = self._report(row, sweep, f"scale {i}'s")
            if report is None:
                return None
            done.append((SweepSpec.from_stored(sweep.spec), report))
        if not study.confirm:
            self._later(row, self._finish, study, done, None, None)
            return None
        return self._confirm(row, study, done)

    def _report(self, row: StudyRow, sweep: Any, what: str) -> Report | None:
        """The report of the study's sweep `sweep` once it succeeded; None while it runs, or once it ended
        otherwise (the study then ends too, failed or cancelled, naming it)."""
        if not sweep.final:
            return None
        if sweep.status != SweepStatus.succeeded.value or sweep.report is None:
            status = SweepStatus.cancelled if sweep.status == SweepStatus.cancelled.value else SweepStatus.failed
            why = public_error(sweep.error) or "no error recorded"
            self._end(row, status, f"{what} sweep {sweep.id} ended {sweep.status}: {why}")
            return None
        from sweeps.analysis import read_report

        return read_report(sweep.report)

    def _confirm(self, row: StudyRow, study: StudySpec, done: list[tuple[SweepSpec, Any]]) -> str | None:
        """A confirming study whose scales all succeeded: its laws fitted and stored (on a thread), then its
        confirmation sweep made from them and waited for, then the study recorded with both."""
        sweep = self.store.get(row.sweep_id(len(done) + 1))
        if sweep is not None:
            if (report := self._report(row, sweep, "the confirmation's")) is not None:
                self._later(row, self._finish, study, done, report, None)
            return None
        if row.cancel_requested:
            self._end(row, SweepStatus.cancelled, None)
            return None
        if row.laws is None:
            self._later(row, self._fit, study, done)
            return None
        spec = confirm_spec(study, [law for law in _laws(row.laws) if law.against == CONFIRMING])
        if isinstance(spec, str):  # no prediction it could test: the laws alone, and why
            self._later(row, self._finish, study, done, None, spec)
            return None
        return self._create(row, len(done) + 1, spec, "the confirmation's")

    def _create(self, row: StudyRow, number: int, spec: SweepSpec, what: str) -> str | None:
        sweep_id = row.sweep_id(number)
        try:
            self.store.create(
                sweep_id=sweep_id,
                owner=row.owner,
                spec=spec.model_dump(mode="json"),
                max_active=self.settings.max_concurrent_per_owner,
                gpu_hours=capped_price(spec),
                budget=owner_budget(self.settings),
            )
        except TooManyActive:
            return None  # the owner's other sweeps hold every slot: the next pass tries again
        except OverBudget as exc:
            self._end(row, SweepStatus.failed, f"{what} sweep {sweep_id} was refused: {exc}")
            return None
        except IntegrityError:
            return None  # made by a pass before this one (another service process): nothing to do
        log.info("study %s: %s sweep %s queued", row.id, what, sweep_id)
        return sweep_id

    def _end(self, row: StudyRow, status: SweepStatus, error: str | None) -> None:
        log.info("study %s: %s%s", row.id, status.value, f" ({error})" if error else "")
        self.store.update_study(row.id, status=status.value, error=error, finished_at=utcnow())

    def _later(self, row: StudyRow, work: Callable[..., None], *args: Any) -> None:
        """`work(row, *args)` on a thread of its own, unless the study has one running or failed too recently;
        a failure (MLflow away) is tried again RETRY_S later, on a pass."""
        with self._lock:
            if row.id in self._finishing or time.monotonic() < self._retry_at.get(row.id, 0.0):
                return
            self._finishing.add(row.id)
        thread = threading.Thread(target=self._run, args=(work, row, *args), name=f"study-{row.id}", daemon=True)
        self._threads = [t for t in self._threads if t.is_alive()] + [thread]
        thread.start()

    def _run(self, work: Callable[..., None], row: StudyRow, *args: Any) -> None:
        try:
            work(row, *args)
        except Exception:
            log.exception("study %s: the law could not be fitted or recorded; trying again in %d s", row.id, RETRY_S)
            with self._lock:
                self._retry_at[row.id] = time.monotonic() + RETRY_S
        finally:
            with self._lock:
                self._finishing.discard(row.id)

    def _fit(self, row: StudyRow, study: StudySpec, done: list[tuple[SweepSpec, Any]]) -> None:
        """A confirming study's laws, stored: the next pass makes its confirmation sweep from them."""
        laws = self._laws_of(row, study, done)
        self.store.update_study(row.id, laws=[law.model_dump(mode="json") for law in laws])
        log.info("study %s: its laws fitted; its confirmation at the target comes next", row.id)

    def _laws_of(self, row: StudyRow, study: StudySpec, done: list[tuple[SweepSpec, Any]]) -> list[OptimizerLaw]:
        """The laws the study stored, or fitted to its scales against each of REFERENCES."""
        if row.laws is not None:
            return _laws(row.laws)
        from sweeps.study import fit_laws

        return [law for ref in REFERENCES for law in fit_laws(study.target_spec(), done, ref)]

    def _finish(
        self,
        row: StudyRow,
        study: StudySpec,
        done: list[tuple[SweepSpec, Any]],
        confirmed: Report | None,
        note: str | None,
    ) -> None:
        """Record and store the study's laws, judged by its confirmation sweep's report `confirmed` where it
        has one (`note`: why it has none), and end it succeeded."""
        from dashboards.study import ConfirmationState, publish_study
        from sweeps.law import confirm_laws
        from sweeps.study_record import record_study

        laws = self._laws_of(row, study, done)
        confirmations = confirm_laws(laws, confirmed) if confirmed is not None else []
        named = study.model_copy(update={"name": row.id})  # its MLflow experiment: one per study submitted
        scales = [(row.sweep_id(i), report) for i, (_, report) in enumerate(done, 1)]
        run_id = record_study(self.settings.tracking_uri, named, scales, laws, confirmations)
        confirming = None
        if study.confirm:  # judged by its sweep, or not run (`note` says why)
            state = "succeeded" if confirmed is not None else "not_run"
            confirming = ConfirmationState(state, row.sweep_id(len(done) + 1), note, tuple(confirmations))
        try:
            publish_study(self.settings.tracking_uri, run_id, laws, row.id, confirming)
        except Exception:  # a figure is a view, never a reason to hold the study's answer back
            log.exception("study %s: its figure could not be drawn or logged", row.id)
        self.store.update_study(
            row.id,
            status=SweepStatus.succeeded.value,
            laws=[law.model_dump(mode="json") for law in laws],
            confirmations=[c.model_dump(mode="json") for c in confirmations] if confirmed is not None else None,
            confirm_note=note,
            run_id=run_id,
            finished_at=utcnow(),
        )
        log.info("study %s: succeeded; its law in MLflow run %s", row.id, run_id)

    def join(self, timeout_s: float = 30.0) -> None:
        """Wait for the laws being recorded (a stopping service)."""
        for thread in list(self._threads):
            thread.join(timeout_s)


def _laws(stored: list[dict[str, Any]]) -> list[OptimizerLaw]:
    from sweeps.law import OptimizerLaw

    return [OptimizerLaw.model_validate(law) for law in stored]
