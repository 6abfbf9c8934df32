"""`CellSearcher`: the search (`sweeps.search`) as Ray Tune's `Searcher`, over Optuna's storage.

It keeps what lives between Tune's calls: each cell's study and plan (`Cell`), its running trials, their
curves. Each call reads every cell's study once into snapshots (`sweeps.search.state`), asks the policy
(`sweeps.search.policy`) and carries out its answer: enqueue and ask (a search trial), a confirmation or
warm-up run (recorded whole at its end), or the changes of a look at the verdicts; on a trial's end, tell.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import threading
import time
import warnings
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

import optuna
from optuna.distributions import FloatDistribution
from optuna.trial import TrialState
from ray.tune.search import Searcher

from sweeps.analysis import Report, TrialResult
from sweeps.detached import DriverOnly
from sweeps.logs import log_context
from sweeps.plan import cell_key, cell_order, study_name
from sweeps.progress import DriverProgress
from sweeps.scheduler import METRIC, MODE, TIME_ATTR
from sweeps.search.policy import Abandon, Ask, Change, Check, MoreSeeds, Open, grow, next_run
from sweeps.search.readout import progress_of, report_of, search_steps, search_warnings, stopped_cells, trial_results
from sweeps.search.state import LOST_WITH_PROCESS, TRIAL_RETRIES, CellState, Run, StudyRead
from sweeps.spec import SweepSpec, cell_search_trials
from sweeps.status import RERUN_STATUSES, TrialStatus, trial_status
from sweeps.stores import close_running_trials, rerun_design_point

log = logging.getLogger("sweeps.search")  # the package's logger: its lines name the search, not a part of it

GROWTH_PASSES = 64  # looks at the verdicts within one `suggest` at most (see there)


class InfrastructureFailures(RuntimeError):
    """Too many trials were lost to the infrastructure: the cluster is broken, not the trials."""


def spec_fingerprint(spec: SweepSpec, *, given_only: bool = True) -> str:
    """A hash of the spec, to refuse resuming a sweep id under another spec. Of the fields the spec was
    given (`given_only`): the service stores each spec whole at submit, so a field this code added
    since (with its default) leaves the fingerprint of a stored spec as it was, and a sweep relaunched
    across an upgrade resumes. `given_only=False`: of every field, as fingerprints were made before."""
    data = spec.model_dump(mode="json", exclude_unset=given_only)
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]


def sampler_seed(seed: int, cell_index: int, trials_so_far: int) -> int:
    """TPE's seed for a cell: a resumed sweep (more trials in the study) continues with other draws
    instead of repeating the lrs of its first start."""
    return (seed * 1_000_003 + cell_index * 10_007 + trials_so_far) % 2**32


@dataclass
class Cell:
    """A cell between Tune's calls: its study, what the plan set so far (`CellState` has the meaning of
    each field) and its running trials."""

    optimizer: str
    batch_size: int
    study: optuna.Study
    n_search: int
    n_seeds: int
    previous: str | None
    following: str | None
    chosen: str
    why: str
    order: int
    abandoned: bool = False
    check: bool = False
    running: dict[str, Run] = field(default_factory=dict)  # tune trial id -> its run
    asked: dict[str, optuna.trial.Trial] = field(default_factory=dict)  # tune trial id -> a search trial to tell

    @property
    def key(self) -> str:
        return cell_key(self.optimizer, self.batch_size)


class CellSearcher(DriverOnly, Searcher):
    """Suggests the next trial of the first cell (in `cell_order`) that has one to give."""

    def __init__(self, spec: SweepSpec, sweep_id: str, storage: optuna.storages.BaseStorage, seed: int = 0) -> None:
        super().__init__(metric=METRIC, mode=MODE)
        self.spec, self.sweep_id = spec, sweep_id
        self.cancelling = False  # set by the driver: trials ending now are re-run on resume
        # trials lost to the infrastructure after Tune's own retries; past the bound the sweep stops
        self.lost_trials = 0
        self.max_lost_trials = max(8, spec.total_trials)
        # the whole range the line search may reach (past [min, max] by lr.extend); TPE draws from it too
        self.distribution = FloatDistribution(*spec.lr.bounds, log=True)
        self._lock = threading.Lock()
        self.storage, self.seed = storage, seed
        # the spec's own warm-up and the others to try at the best lr (schedule.warmup_choices, in its unit)
        self.warmups = tuple(spec.schedule.warmup_choices)
        self.fingerprint = spec_fingerprint(spec)
        self._accepted = {self.fingerprint, spec_fingerprint(spec, given_only=False)}
        self.cells: list[Cell] = []
        self.search = spec.batch_search
        # a search of the batch axis: per optimizer why it stopped (sweeps.batch_axis.Decision.why)
        self.search_done_why: dict[str, str] = {}
        self._changes, self._grown_at = 0, -1  # trials ended or plan changes; `_grow` looked at this count
        if self.search is None:
            for opt, bs in cell_order(spec.optimizer_names, spec.batch_sizes):  # type: ignore[arg-type]
                self._open_cell(opt, bs, "listed", "")
        else:
            self._open_searched_cells()
        self._by_trial: dict[str, Cell] = {}  # running trials, in the order started
        self._curves: dict[str, list[tuple[int, float]]] = {}  # tune trial id -> (tokens, val loss) so far
        self._started: dict[str, float] = {}  # tune trial id -> its start (time.time())

    def _open_searched_cells(self) -> None:
        """A search of the batch axis, resumed: the cells it had chosen, in the order it chose them; then
        each optimizer's reference."""
        prefix, stored = f"{self.sweep_id}/", []
        for name in optuna.get_all_study_names(self.storage):
            if name.startswith(prefix):
                attrs = optuna.load_study(study_name=name, storage=self.storage).user_attrs
                if attrs.get("optimizer") in self.spec.optimizer_names and attrs.get("batch_size") in self.spec.lattice:
                    stored.append(attrs)
        for attrs in sorted(stored, key=lambda a: a.get("order", 0)):
            cell = self._open_cell(
                attrs["optimizer"], attrs["batch_size"], attrs.get("chosen", "listed"), attrs.get("why", "")
            )
            cell.abandoned = bool(attrs.get("abandoned", False))
        ref = self.spec.reference_batch_size
        for opt in self.spec.optimizer_names:
            if self._cell(cell_key(opt, ref)) is None:
                self._open_cell(opt, ref, "reference", f"the reference batch size {ref}")

    def _cell(self, key: str) -> Cell | None:
        return next((c for c in self.cells if c.key == key), None)

    def _study(self, opt: str, bs: int) -> optuna.Study:
        """The cell's study, made or loaded (a resumed sweep: refused under another spec), with nothing left
        RUNNING by an interrupted driver."""
        study = optuna.create_study(
            storage=self.storage,
            study_name=study_name(self.sweep_id, opt, bs),
            direction="minimize",
            load_if_exists=True,
        )
        if study.metric_names != [METRIC]:
            with warnings.catch_warnings():  # "experimental" since Optuna 3.2, and unchanged since
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                study.set_metric_names([METRIC])  # Optuna's dashboard says "val_loss", not "Objective 0"
        study.sampler = optuna.samplers.TPESampler(
            seed=sampler_seed(self.seed, len(self.cells), len(study.trials)), n_startup_trials=2
        )
        attrs = study.user_attrs
        stored = attrs.get("spec_fingerprint")
        if stored is None:
            study.set_user_attr("spec_fingerprint", self.fingerprint)
        elif stored not in self._accepted:
            raise ValueError(
                f"sweep id {self.sweep_id!r} was started with a different spec (fingerprint {stored}, "
                f"now {self.fingerprint}); use a new sweep id"
            )
        close_running_trials(study)  # left behind by an interrupted driver: replaced, not resumed
        return study

    def _open_cell(self, opt: str, bs: int, chosen: str, why: str) -> Cell:
        """The cell (its study made or loaded) in its place in `cell_order`."""
        study = self._study(opt, bs)
        attrs = study.user_attrs
        order = attrs.get("order", max((c.order for c in self.cells), default=0) + 1)
        if "chosen" not in attrs:  # what the searcher rebuilds a search from on resume
            for key, value in {
                "optimizer": opt,
                "batch_size": bs,
                "chosen": chosen,
                "why": why,
                "order": order,
            }.items():
                study.set_user_attr(key, value)
        same = sorted((c for c in self.cells if c.optimizer == opt), key=lambda c: c.batch_size)
        previous = next((c.key for c in reversed(same) if c.batch_size < bs), None)
        cell = Cell(
            opt,
            bs,
            study,
            # the reference (no smaller size, so no warm start: `CellState.next_lr` narrows its search) searches more
            cell_search_trials(self.spec.lr.trials_per_batch_size, reference=previous is None),
            self.spec.seeds_min,
            previous=previous,
            following=next((c.key for c in same if c.batch_size > bs), None),
            chosen=attrs.get("chosen", chosen),
            why=attrs.get("why", why),
            order=order,
        )
        # a resumed sweep keeps the confirmation runs adaptive confirmation had already added
        cell.n_seeds = max(cell.n_seeds, *self._state(cell, StudyRead.of(study)).seeds_recorded(), 0)
        self.cells.append(cell)
        rank = {o: i for i, o in enumerate(self.spec.optimizer_names)}
        self.cells.sort(key=lambda c: (c.batch_size, rank[c.optimizer]))  # cell_order's priority
        self._changes += 1
        return cell

    # ---- snapshots ---------------------------------------------------------------------------------

    def _state(self, cell: Cell, read: StudyRead) -> CellState:
        spec = self.spec
        lr_min, lr_max = spec.lr.bounds
        return CellState(
            cell.optimizer,
            cell.batch_size,
            n_search=cell.n_search,
            n_seeds=cell.n_seeds,
            seeds_max=spec.seeds_max,
            lr_min=lr_min,
            lr_max=lr_max,
            warmups=self.warmups,
            previous=cell.previous,
            following=cell.following,
            chosen=cell.chosen,
            why=cell.why,
            order=cell.order,
            abandoned=cell.abandoned,
            check=cell.check,
            read=read,
            running=tuple(cell.running.values()),
        )

    def states(self, reads: dict[str, StudyRead] | None = None) -> dict[str, CellState]:
        """Cell key -> its snapshot, in `cell_order`; each study read once into `reads` (cell key -> its
        read; a caller passes the same dict to read no study twice while it writes to none)."""
        reads = {} if reads is None else reads
        for c in self.cells:
            if c.key not in reads:
                reads[c.key] = StudyRead.of(c.study)
        return {c.key: self._state(c, reads[c.key]) for c in self.cells}

    def all_finished(self) -> bool:
        return all(c.finished for c in self.states().values())

    # ---- Tune's Searcher interface ---------------------------------------------------------------

    def suggest(self, trial_id: str) -> dict[str, Any] | str | None:
        with self._lock:
            if self.lost_trials > self.max_lost_trials:
                raise InfrastructureFailures(
                    f"{self.lost_trials} trials were lost to infrastructure failures (worker processes killed, "
                    f"nodes lost), each after {TRIAL_RETRIES} restarts; the cluster needs attention"
                )
            # Each cell's study is read once in this call: it writes only when it returns a run. Again after
            # each growth (adaptive confirmation added runs, the batch search added or dropped a size),
            # until a cell has a run to give or nothing moves: a plan may move several times before it has
            # a run (a speculative size dropped, then a bisection added), and a None with no trial running
            # would leave the sweep waiting for an event that never comes. Each growth adds seeds (up to
            # seeds.max) or changes the sizes (up to the lattice): finite; the bound guards against a plan
            # that oscillates.
            reads: dict[str, StudyRead] = {}
            for _ in range(GROWTH_PASSES):
                cells = self.states(reads)
                for cell in self.cells:
                    run = next_run(cells, cell.key, self.spec)
                    if run is not None:
                        return self._start(cell, run, trial_id)
                if not self._grow(cells):
                    # waiting (a cell's confirmations need its search to end first), or nothing left
                    return Searcher.FINISHED if all(c.finished for c in cells.values()) else None
            return None

    def _start(self, cell: Cell, run: Ask | Run, trial_id: str) -> dict[str, Any]:
        """The run's trial started: a search trial asked of Optuna (the design points enqueued first; the
        one enqueued, else TPE's draw; seed 0), or a confirmation or warm-up run; its Tune config."""
        if isinstance(run, Run):
            cell.running[trial_id] = run
            config = self._config(cell, run, number=None)
        else:
            for lr, design in run.points:
                cell.study.enqueue_trial({"lr": lr}, user_attrs={"design": design})
            trial = cell.study.ask({"lr": self.distribution})
            trial.set_user_attr("role", "search")
            trial.set_user_attr("seed", 0)
            design = str(trial.user_attrs.get("design") or "")
            cell.running[trial_id] = search = Run("search", 0, trial.params["lr"], self.warmups[0], design)
            cell.asked[trial_id] = trial
            # the bracket, vertex, step and probe trials are the search's design, trained to the end; only
            # TPE's explorations may be stopped early by ASHA
            config = self._config(cell, search, number=trial.number, prunable=not design)
        self._by_trial[trial_id] = cell
        self._curves[trial_id] = []
        self._started[trial_id] = time.time()
        return config

    def _config(self, cell: Cell, run: Run, *, number: int | None, prunable: bool = False) -> dict[str, Any]:
        train = self.spec.train_config(cell.optimizer, cell.batch_size, run.lr, run.seed, warmup=run.warmup)
        return {
            "sweep_id": self.sweep_id,
            "cell": cell.key,
            "optimizer": cell.optimizer,
            "batch_size": cell.batch_size,
            "lr": run.lr,
            "seed": run.seed,
            "role": run.role,
            "warmup": run.warmup,  # in the spec's unit (schedule.warmup_unit)
            "warmup_searched": len(self.warmups) > 1,  # MLflow names the run's warm-up then
            "optuna_number": number,
            "prunable": prunable,
            "chosen": cell.chosen,  # why the batch size is tested: MLflow tags the cell and its trials
            "why": cell.why,
            "train": train.model_dump(mode="json"),
        }

    def grow(self) -> bool:
        """`_grow` under the lock: whether a finished-looking sweep has more to run (a resumed search)."""
        with self._lock:
            return self._grow(self.states())

    def _grow(self, cells: dict[str, CellState]) -> bool:
        """More runs where the verdicts ask for them (`policy.grow`); True when some were added. Looks
        again only after a trial ended or the plan changed (Tune asks `suggest` over and over while trials
        run)."""
        if self._grown_at == self._changes:
            return False
        growth = grow(cells, self.spec, lambda: report_of(list(cells.values()), self.spec, self.search_done_why))
        self.search_done_why.update(growth.done_why)
        for change in growth.changes:
            self._apply(change)
        if not growth.changes:
            self._grown_at = self._changes
        return bool(growth.changes)

    def _apply(self, change: Change) -> None:
        """A change of plan carried out: on the cell, and in its study where a resume rebuilds it from there."""
        self._changes += 1
        if isinstance(change, Open):
            self._open_cell(change.optimizer, change.batch_size, change.chosen, change.why)
        else:
            cell = self._cell(change.key)
            assert cell is not None
            if isinstance(change, MoreSeeds):
                cell.n_seeds = change.n_seeds
            elif isinstance(change, Check):
                cell.check = True
            elif isinstance(change, Abandon):
                cell.abandoned, cell.why = change.abandoned, change.why
                cell.study.set_user_attr("abandoned", change.abandoned)
                cell.study.set_user_attr("why", change.why)
        if change.note:
            log.info(change.note)

    def report(self, run_ids: dict[str, str] | None = None) -> Report:
        """The report of what has finished so far (`build_report`, with the batch search's steps);
        `run_ids` as `collect_results` takes them."""
        return report_of(list(self.states().values()), self.spec, self.search_done_why, run_ids)

    def search_warnings(self) -> list[str]:
        return search_warnings(self.states().values(), self.search_done_why)

    def stopped_cells(self) -> dict[str, str]:
        return stopped_cells(self.states().values())

    def search_steps(self) -> dict[str, list[dict[str, Any]]]:
        return search_steps(list(self.states().values()), self.spec)

    def on_trial_result(self, trial_id: str, result: dict[str, Any]) -> None:
        if METRIC in result and TIME_ATTR in result and math.isfinite(result[METRIC]):
            curve = self._curves.setdefault(trial_id, [])
            tokens = int(result[TIME_ATTR])
            if curve and tokens <= curve[-1][0]:
                curve.clear()  # Tune restarted the trial after its worker died: the curve starts again
            curve.append((tokens, float(result[METRIC])))

    def on_trial_complete(self, trial_id: str, result: dict[str, Any] | None = None, error: bool = False) -> None:
        with self._lock, log_context(trial=trial_id):
            cell = self._by_trial.pop(trial_id, None)
            if cell is None:
                return
            run = cell.running.pop(trial_id)
            self._changes += 1
            result = result or {}
            status = trial_status(result, error, cancelling=self.cancelling)
            if status == TrialStatus.interrupted:
                self.lost_trials += 1
                log.warning("trial %s of %s was lost to the infrastructure; it will be run again", trial_id, cell.key)
            elif status == TrialStatus.failed:
                log.warning("trial %s of %s failed: %s", trial_id, cell.key, result.get("error", "no error given"))
            val = result.get(METRIC)
            attrs = self._ending(trial_id, result, status, error)
            if run.role != "search":  # a confirmation or warm-up run: recorded whole at the end
                state = TrialState.COMPLETE if status == "completed" else TrialState.FAIL
                cell.study.add_trial(
                    optuna.trial.create_trial(
                        params={"lr": run.lr},
                        distributions={"lr": self.distribution},
                        value=float(val) if state == TrialState.COMPLETE and val is not None else None,
                        state=state,
                        user_attrs={"role": run.role, "seed": run.seed, "warmup": run.warmup, **attrs},
                    )
                )
            else:
                self._tell(cell, cell.asked.pop(trial_id), status, val, attrs)

    def _ending(self, trial_id: str, result: dict[str, Any], status: TrialStatus, error: bool) -> dict[str, Any]:
        """The user attrs a trial ends with: its status, tokens and steps, its curve and training time."""
        # Tune ends a trial on its final ("done") result without passing it to on_trial_result: the final
        # evaluation joins the curve here
        curve = self._curves.pop(trial_id, [])
        val = result.get(METRIC)
        if val is not None and math.isfinite(val) and TIME_ATTR in result:
            if not curve or int(result[TIME_ATTR]) > curve[-1][0]:
                curve.append((int(result[TIME_ATTR]), float(val)))
        started = self._started.pop(trial_id, time.time())
        attrs: dict[str, Any] = {
            "status": status,
            "tokens": int(result.get(TIME_ATTR, 0)),
            "steps": int(result.get("step", 0)),
            "curve": json.dumps(curve),
            "train_time_s": float(result.get("train_time_s", time.time() - started)),
            "tune_trial_id": trial_id,
        }
        if error:  # its process died each time Tune started it (not lost with a driver: stores.close_running_trials)
            attrs["lost"] = LOST_WITH_PROCESS
        if status == TrialStatus.failed:
            attrs["error"] = str(result.get("error", ""))[:500]
            if result.get("failure"):
                attrs["failure"] = str(result["failure"])
        return attrs

    @staticmethod
    def _tell(cell: Cell, trial: optuna.trial.Trial, status: TrialStatus, val: Any, attrs: dict[str, Any]) -> None:
        """A search trial's end told to Optuna; one cut short by the sweep or the infrastructure is asked again."""
        for k, v in attrs.items():
            trial.set_user_attr(k, v)
        if status == "completed" and val is not None and math.isfinite(val):
            cell.study.tell(trial, float(val))
        elif status == "diverged":
            cell.study.tell(trial, math.inf)  # a bad lr, which TPE must learn from
        elif status == "pruned":
            if val is not None:
                trial.report(float(val), step=attrs["tokens"])
            cell.study.tell(trial, state=TrialState.PRUNED)
        else:
            cell.study.tell(trial, state=TrialState.FAIL)
            if status in RERUN_STATUSES:
                rerun_design_point(cell.study, trial)

    def end_cancelled(self, started: Collection[str]) -> int:
        """After a cancelled `fit`: the trials Tune started (`started`, the recorder's view) but stopped
        without passing them to `on_trial_complete` end as that would have ended them (`cancelled`,
        with their tune trial id), so Optuna's record matches the MLflow run the recorder closes. Those
        suggested but never started keep no id and no run (`close_running_trials`). Returns how many."""
        if not self.cancelling:
            return 0
        ended = [t for t in list(self._by_trial) if t in started]
        for trial_id in ended:
            self.on_trial_complete(trial_id, None)
        return len(ended)

    def save(self, checkpoint_path: str) -> None:
        """Nothing to save: the state lives in the Optuna storage."""
        with open(checkpoint_path, "w") as f:
            json.dump({"state": "optuna storage", "sweep_id": self.sweep_id}, f)

    def restore(self, checkpoint_path: str) -> None:  # pragma: no cover - resume reloads from Optuna
        pass

    def progress(self) -> DriverProgress:
        """The live progress (`readout.progress_of`), the running trials' curves as reported so far."""
        with self._lock:
            running = [
                (cell.key, cell.running[trial_id], self._curves.get(trial_id, []))
                for trial_id, cell in self._by_trial.items()
            ]
            return progress_of(list(self.states().values()), running)


def collect_results(
    searcher: CellSearcher, run_ids: dict[str, str] | None = None
) -> tuple[list[TrialResult], list[float]]:
    """Every finished trial of every cell, read back from the Optuna storage, and each one's training
    time (s); `run_ids` (Tune trial id -> MLflow run id) names each trial's MLflow run in the report."""
    return trial_results(searcher.states().values(), run_ids)
