"""The search: one Optuna study per cell (optimizer, batch size), all cells' trials in one Ray Tune run.

Why not `ray.tune.search.optuna.OptunaSearch`: it drives one study per searcher, hard-codes the
`NopPruner`, records ASHA-stopped trials as COMPLETE with their partial loss and cannot add the seed
re-runs a cell needs after its search. Running one Tuner per cell instead would leave trial slots idle
at every cell's tail. So `CellSearcher` talks to Optuna directly (ask/tell, TPE over log lr, the
studies in a persistent RDB storage) and multiplexes every cell through one Tuner, and
`PerCellASHA` prunes search trials against trials of their own cell only, at equal tokens seen.

A cell's search is a line search in ln lr, with TPE where it has nothing to go on
(`sweeps.plan.next_search_lr`): the smallest batch size starts from three lrs spread over the range
(`coarse_lrs`), every larger one from a bracket around the smaller batch's best lr sqrt-scaled
(`warm_start_lrs`, after that cell's search ended); then each step goes to the vertex of a parabola
through the best lr and its neighbours, or out past the best lr where it lacks a neighbour, one step
at a time, and the search ends when a step would land on a tried lr ("converged", at most
`trials_per_batch_size` trials). A spec with `schedule.warmup_search` then trains each other warm-up
at the best lr (role "warmup", seed 0), and the confirmation runs use the best warm-up
(`sweeps.analysis.pick_warmup`). These design trials run to the end; ASHA stops only TPE's
explorations. Measured on 200 simulated problems (benchmarks/search_efficiency.py, bowls family): with
2 seeds, 0.31 of the tokens of a 12-lr x 2-seed grid, right 0.86 of the time against its 0.84 (with
the default adaptive seeds 0.91 at 0.41; docs/researchers.md has both families).

The Optuna storage is the sweep's source of truth: a re-run of the same sweep id loads the studies,
counts finished trials (never run again), marks trials left RUNNING by an interruption as FAIL and
asks for replacements.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import statistics
import threading
import time
import warnings
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

import optuna
from optuna.distributions import FloatDistribution
from optuna.trial import TrialState
from ray.tune.search import Searcher

from sweeps.analysis import (
    ROLES,
    AnalysisInput,
    Report,
    TrialResult,
    build_report,
    cells_to_check,
    cells_to_extend,
    pick_stable,
    pick_warmup,
)
from sweeps.detached import DriverOnly
from sweeps.logs import log_context
from sweeps.plan import (
    REFERENCE_NARROW,
    cell_key,
    cell_order,
    check_lr,
    coarse_lrs,
    next_search_lr,
    probe_lr,
    study_name,
    warm_start_lrs,
)
from sweeps.scheduler import METRIC, MODE, TIME_ATTR
from sweeps.spec import SweepSpec, cell_search_trials
from sweeps.status import OUT_OF_MEMORY, RERUN_STATUSES, TrialStatus, trial_status
from sweeps.stores import close_running_trials, rerun_design_point

log = logging.getLogger(__name__)
R = TypeVar("R")

FINISHED_STATES = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)
# FAIL trials with these statuses were cut short by the sweep itself or by the infrastructure (a killed
# worker, a lost node, a lost driver): they are no search result and are run again (sweeps/status.py)
# Tune restarts a trial whose worker died this many times before it is given up ("interrupted", re-run)
TRIAL_RETRIES = 2
# A cell stops, with no result, after this many of its trials in a row ran out of memory (no lr changes the
# memory a trial needs) or were lost with their process each time Tune started it (1 + TRIAL_RETRIES
# deaths a trial: a trial killed by the kernel's OOM killer looks like that, and so does any trial this
# cluster cannot run). Trials lost with a driver or a node are not counted: those are run again, unbounded.
CELL_MEMORY_FAILURES = 2
CELL_LOST_TRIALS = 3


LOST_WITH_PROCESS = "process"  # a trial's `lost`: Tune gave it up after its process died each time


GROWTH_PASSES = 64  # looks of `_grow` within one `suggest` at most (see there)


class InfrastructureFailures(RuntimeError):
    """Too many trials were lost to the infrastructure: the cluster is broken, not the trials."""


def spec_fingerprint(spec: SweepSpec, *, given_only: bool = True) -> str:
    """A hash of the spec, to refuse resuming a sweep id under another spec. Of the fields the spec was
    given (`given_only`): the service stores each spec whole at submit, so a field this code added
    since (with its default) leaves the fingerprint of a stored spec as it was, and a sweep relaunched
    across an upgrade resumes. `given_only=False`: of every field, as fingerprints were made before."""
    import hashlib

    data = spec.model_dump(mode="json", exclude_unset=given_only)
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Rerun:
    """A running trial recorded whole when it ends (not asked of Optuna): a confirmation run ("seed")
    or a search run at the best lr with another warm-up ("warmup")."""

    role: str
    seed: int
    lr: float
    warmup: int | float


@dataclass
class Cell:
    optimizer: str
    batch_size: int
    study: optuna.Study
    n_search: int
    n_seeds: int
    lr_min: float
    lr_max: float
    previous: Cell | None = None  # same optimizer, next smaller batch size
    following: Cell | None = None  # same optimizer, next larger batch size (when it was added: a bisection)
    # the spec's own warm-up and the others to try at the best lr (schedule.warmup_choices, in its unit)
    warmups: tuple[int | float, ...] = (0.0,)
    # the confirmation runs a cell may reach (adaptive seeds' max: what the dry run prices every cell at)
    seeds_max: int = 0
    chosen: str = "listed"  # why this batch size is tested (sweeps.batch_axis.Chosen)
    why: str = ""  # the search's decision in words
    order: int = 0  # the order in which the sweep added its cells
    # a speculative size above one that turned out degraded: its runs stop, what ran is kept
    abandoned: bool = False
    # its degraded verdict is to be confirmed at a second lr (`check_lr`; `CellSearcher._check`)
    check: bool = False
    # tune trial id -> the Optuna trial of a search run, or a confirmation or warm-up run
    running: dict[str, optuna.trial.Trial | Rerun] = field(default_factory=dict)
    # Within `CellSearcher.reading_once()`: the study's trials as read once (None: not read yet), so that
    # one `suggest` reads each cell's trials from the storage once, not a dozen times; `changed()` drops it.
    _memo_on: bool = field(default=False, repr=False)
    _memo: list[optuna.trial.FrozenTrial] | None = field(default=None, repr=False)
    # What `trials()`, `best()` and `next_lr()` worked out from the memo's trials, by call; dropped with each
    # new read (the line-search fits behind `best()` and `next_lr()` are most of a `suggest`)
    _derived: dict[tuple[Any, ...], Any] = field(default_factory=dict, repr=False)

    @property
    def key(self) -> str:
        return cell_key(self.optimizer, self.batch_size)

    def all_trials(self) -> list[optuna.trial.FrozenTrial]:
        """The study's trials, every state (one storage read; none again within `reading_once`)."""
        if not self._memo_on:
            return self.study.get_trials(deepcopy=False)
        if self._memo is None:
            self._memo, self._derived = self.study.get_trials(deepcopy=False), {}
        return self._memo

    def _once(self, key: tuple[Any, ...], compute: Callable[[], R]) -> R:
        """`compute()` once per read of the study within `reading_once` (each time outside it)."""
        if not self._memo_on:
            return compute()
        self.all_trials()  # the memo read, if not yet: a new read drops what was worked out from the last
        if key not in self._derived:
            self._derived[key] = compute()
        return self._derived[key]  # type: ignore[no-any-return]

    def changed(self) -> None:
        """The driver wrote to the study (enqueue, ask, tell): the next read goes to the storage."""
        self._memo = None

    def trials(self, role: str, states: tuple[TrialState, ...] = FINISHED_STATES) -> list[optuna.trial.FrozenTrial]:
        """The study's trials of `role` in `states`, but not the ones to run again (a new list each call)."""
        found = self._once(
            ("trials", role, states),
            lambda: [
                t
                for t in self.all_trials()
                if t.state in states
                and t.user_attrs.get("role") == role
                and t.user_attrs.get("status") not in RERUN_STATUSES
            ],
        )
        return list(found)

    def search_finished(self) -> int:
        return len(self.trials("search"))

    def search_asked(self) -> int:
        return self.search_finished() + sum(1 for v in self.running.values() if not isinstance(v, Rerun))

    def best(self) -> optuna.trial.FrozenTrial | None:
        """The search trial whose lr gets the confirmation runs, by the analysis's own rule (`pick_stable`:
        the best, or the best below an lr at which a confirmation run diverged)."""

        def best() -> optuna.trial.FrozenTrial | None:
            return pick_stable(self.trials("search", (TrialState.COMPLETE,)), _score, self.confirmations_diverged())

        return self._once(("best",), best)

    def confirmations_diverged(self) -> list[float]:
        """The lrs of the cell's diverged confirmation runs (a retreat goes below the lowest; a probe below it)."""
        return [float(t.params["lr"]) for t in self.trials("seed") if t.user_attrs.get("status") == "diverged"]

    def best_lr(self) -> float | None:
        best = self.best()
        return float(best.params["lr"]) if best is not None else None

    def warmup_of(self, t: optuna.trial.FrozenTrial) -> int | float:
        """The warm-up a trial trained with (search trials and runs recorded before the warm-up search
        have none recorded: the spec's own)."""
        return t.user_attrs.get("warmup", self.warmups[0])

    def _reruns(self, role: str) -> list[Rerun]:
        return [v for v in self.running.values() if isinstance(v, Rerun) and v.role == role]

    def budget(self, probes: int = 0) -> int:
        """The cell's trials at most: n_search, one per other warm-up, n_seeds, and again the confirmation
        runs spent at an lr the cell retreated from (a diverged run there) and its probes (`probes` more:
        one about to be asked), as far as `seeds_max` leaves room: a retreat is confirmed whole where the
        spec's trial cap (every cell at seeds_max) allows it, and otherwise spends what the search did not."""
        again = min(self._runs_elsewhere() + self.probes() + probes, max(0, self.seeds_max - self.n_seeds))
        return self.n_search + len(self.warmups) - 1 + self.n_seeds + again

    def _runs_elsewhere(self) -> int:
        """Confirmation runs, finished or running, at an lr other than the best (a retreat's, a check's)."""
        lr = self.best_lr()
        at = [float(t.params["lr"]) for t in self.trials("seed")] + [r.lr for r in self._reruns("seed")]
        return sum(1 for x in at if lr is None or not _same_lr(x, lr))

    def headroom(self) -> int:
        """Confirmation runs `seeds_max` still allows at lrs other than the best: a retreat's, a probe's,
        a check's, beyond the `n_seeds` at the best lr."""
        return max(0, self.seeds_max - self.n_seeds - self._runs_elsewhere() - self.probes())

    def check_lr(self) -> float | None:
        """The cell's second lr (`sweeps.plan.check_lr`, the analysis's own rule), or None."""
        lr = self.best_lr()
        if lr is None:
            return None
        completed = [float(t.params["lr"]) for t in self.trials("search", (TrialState.COMPLETE,)) if _score(t)]
        return check_lr(lr, completed, self.confirmations_diverged())

    def checks_wanted(self) -> list[int]:
        """Confirmation seeds wanted at the second lr once a check was asked for (`check`, or runs there
        already: a resumed sweep): the seeds recorded or running at the best lr and not yet there, once
        those at the best lr are all asked, as far as `headroom` allows."""
        lr, second = self.best_lr(), self.check_lr()
        if lr is None or second is None or self.seeds_wanted() or self.warmups_wanted():
            return []
        if any(not isinstance(v, Rerun) for v in self.running.values()):
            return []  # a search trial (a probe) is running: its result may move the best lr
        warmup = self.best_warmup()
        runs = [r for r in self._reruns("seed") if r.warmup == warmup]
        there = self.seeds_recorded(second, warmup) | {r.seed for r in runs if _same_lr(r.lr, second)}
        if not self.check and not there:
            return []
        first = self.seeds_recorded(lr, warmup) | {r.seed for r in runs if _same_lr(r.lr, lr)}
        return sorted(first - there)[: self.headroom()]

    def probes(self) -> int:
        """Search trials asked below a diverged confirmation run (`probe_lr`), finished or running."""
        asked = [*self.trials("search"), *(v for v in self.running.values() if not isinstance(v, Rerun))]
        return sum(1 for t in asked if t.user_attrs.get("design") == "probe")

    def probe_lr(self) -> float | None:
        """The lr of the next probe (`sweeps.plan.probe_lr`) once the search is done and no search trial is
        running, where the budget holds the probe and the confirmation runs after it; else None."""
        if not self.search_done() or any(not isinstance(v, Rerun) for v in self.running.values()):
            return None
        search = self.trials("search")
        lr = probe_lr(
            self.confirmations_diverged(),
            [float(t.params["lr"]) for t in search if t.state == TrialState.COMPLETE and t.value is not None],
            [float(t.params["lr"]) for t in search if t.user_attrs.get("status") == TrialStatus.diverged],
            lr_min=self.lr_min,
        )
        if lr is None or self.spent() + 1 + self.n_seeds > self.budget(probes=1):
            return None
        return lr

    def spent(self) -> int:
        """The cell's trials finished or running, of every role."""
        return len(self.trials("search")) + len(self.trials("warmup")) + len(self.trials("seed")) + len(self.running)

    def best_warmup(self) -> int | float:
        """The warm-up of the confirmation runs, by the analysis's own rule (`pick_warmup`): of the best
        search trial's and the warm-up runs completed at its lr, the lowest loss."""
        best = self.best()
        if best is None or len(self.warmups) == 1:
            return self.warmups[0]
        lr = float(best.params["lr"])
        tried = [
            (float(t.value), t.number, self.warmup_of(t))
            for t in self.trials("warmup", (TrialState.COMPLETE,))
            if t.value is not None and math.isfinite(t.value) and _same_lr(float(t.params["lr"]), lr)
        ]
        return pick_warmup([(float(best.value), -1, self.warmups[0]), *tried])  # type: ignore[arg-type]

    def warmups_wanted(self) -> list[int | float]:
        """The other warm-ups neither recorded nor running at the best lr, as many as the search's share
        of the trial budget still holds (n_search + the other warm-ups: the lr search may have converged
        early; a retreat to a lower lr tries them there again from what is left) with room left in the
        cell's budget for the confirmation runs still wanted there."""
        lr = self.best_lr()
        if lr is None or len(self.warmups) == 1:
            return []
        runs = self._reruns("warmup")
        done = self.trials("warmup")
        tried = {r.warmup for r in runs if _same_lr(r.lr, lr)}
        tried |= {self.warmup_of(t) for t in done if _same_lr(float(t.params["lr"]), lr)}
        wanted = [w for w in self.warmups[1:] if w not in tried]
        searched = self.search_finished() + len(done) + len(runs)
        seeds_due = max(0, self.n_seeds - len(self.seeds_recorded(lr)))
        room = min(
            self.n_search + len(self.warmups) - 1 - searched,  # the search's share
            self.budget() - self.spent() - seeds_due,  # the confirmation runs first
        )
        return wanted[: max(0, room)]

    def confirmed(self) -> list[float]:
        """Final val losses of the completed confirmation runs at the best lr and warm-up."""
        lr, warmup = self.best_lr(), self.best_warmup()
        return [
            float(t.value)
            for t in self.trials("seed", (TrialState.COMPLETE,))
            if t.value is not None
            and lr is not None
            and _same_lr(float(t.params["lr"]), lr)
            and self.warmup_of(t) == warmup
        ]

    def seeds_recorded(self, lr: float | None = None, warmup: int | float | None = None) -> set[int]:
        """Seeds of the finished confirmation runs, at `lr` and `warmup` where given."""
        return {
            int(t.user_attrs["seed"])
            for t in self.trials("seed")
            if (lr is None or _same_lr(float(t.params["lr"]), lr)) and (warmup is None or self.warmup_of(t) == warmup)
        }

    def seeds_wanted(self) -> list[int]:
        """Confirmation seeds 1..n_seeds (the search runs at seed 0) neither recorded nor running at the
        best lr and warm-up, once the warm-ups to try there have ended, as many as the cell's `budget`
        still holds."""
        lr = self.best_lr()
        if lr is None or self.warmups_wanted() or self._reruns("warmup"):
            return []
        if any(not isinstance(v, Rerun) for v in self.running.values()):
            return []  # a search trial (a probe) is running: its result may move the best lr
        warmup = self.best_warmup()
        seeds = self._reruns("seed")
        running = {r.seed for r in seeds if _same_lr(r.lr, lr) and r.warmup == warmup}
        recorded = self.seeds_recorded(lr, warmup)
        wanted = [s for s in range(1, self.n_seeds + 1) if s not in recorded and s not in running]
        return wanted[: max(0, self.budget() - self.spent())]

    def search_done(self) -> bool:
        """All `n_search` trials finished, or the search converged early (`next_lr`), or the cell stopped
        (`stop_reason`: the cells that wait for its search go on without it)."""
        return (
            self.search_finished() >= self.n_search
            or self.next_lr()[0] == "converged"
            or self.stop_reason() is not None
            or self.probes() > 0  # a probe follows a finished search: the line search does not resume
        )

    def next_lr(self) -> tuple[str, float | None]:
        """What the cell's finished search trials say to try next (`sweeps.plan.next_search_lr`), or
        ("wait", None) while a step of that line search is running: its result moves the next step."""
        searching = [v for v in self.running.values() if not isinstance(v, Rerun)]
        if any(v.user_attrs.get("design") for v in searching):
            return ("wait", None)
        running = tuple(k for k, v in self.running.items() if not isinstance(v, Rerun))
        return self._once(("next_lr", running), lambda: self._next_lr(searching))

    def _next_lr(self, searching: list[optuna.trial.Trial]) -> tuple[str, float | None]:
        finished = self.trials("search")
        done = [
            (float(t.params["lr"]), float(t.value))
            for t in finished
            if t.state == TrialState.COMPLETE and t.value is not None and math.isfinite(t.value)
        ]
        diverged = [float(t.params["lr"]) for t in finished if t.user_attrs.get("status") == TrialStatus.diverged]
        tried = [float(t.params["lr"]) for t in finished] + [float(v.params["lr"]) for v in searching]
        narrow = REFERENCE_NARROW if self.previous is None else None  # the coarse start's cell: no warm start
        kind, lr = next_search_lr(done, diverged, tried, lr_min=self.lr_min, lr_max=self.lr_max, narrow=narrow)
        if kind == "converged" and searching:
            return ("explore", None)  # TPE's trials still running could move the optimum
        return kind, lr

    def stop_reason(self) -> str | None:
        """Why the cell stopped without a result (CELL_MEMORY_FAILURES, CELL_LOST_TRIALS), or None: from its
        trials since the last one that trained (completed, pruned or diverged), newest first."""

        def reason() -> str | None:
            memory, lost, error = 0, 0, ""
            for t in sorted(self.all_trials(), key=lambda t: t.number, reverse=True):
                status = t.user_attrs.get("status")
                if status in (TrialStatus.completed, TrialStatus.pruned, TrialStatus.diverged):
                    break
                if status == TrialStatus.failed and t.user_attrs.get("failure") == OUT_OF_MEMORY:
                    memory += 1
                    error = error or str(t.user_attrs.get("error", ""))
                elif status == TrialStatus.interrupted and t.user_attrs.get("lost") == LOST_WITH_PROCESS:
                    lost += 1
            if memory >= CELL_MEMORY_FAILURES:
                return f"{memory} of its trials ran out of memory ({error[:300]})"
            if lost >= CELL_LOST_TRIALS:
                return (
                    f"{lost} of its trials in a row lost their process each of the {1 + TRIAL_RETRIES} times they "
                    "were started, most likely killed for memory (the kernel's OOM killer or Ray's memory "
                    "monitor): see the Ray logs of its node"
                )
            return None

        return self._once(("stop_reason",), reason)

    def finished(self) -> bool:
        if self.stop_reason() is not None:
            return not self.running
        if self.abandoned:
            return not self.running
        if not self.search_done():
            return False
        return self.best() is None or (
            not self.warmups_wanted()
            and not self.seeds_wanted()
            and not self.running
            and self.probe_lr() is None
            and not self.checks_wanted()
        )


CURVE_POINTS = 40  # per trial on the live page: a few KB a sweep, at any number of evaluations


def _thin(points: list[list[float]]) -> list[list[float]]:
    """At most CURVE_POINTS of a curve, evenly by index, keeping the first and the last."""
    if len(points) <= CURVE_POINTS:
        return points
    step = (len(points) - 1) / (CURVE_POINTS - 1)
    return [points[round(i * step)] for i in range(CURVE_POINTS)]


def _same_lr(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-9)  # lrs travel through the storage as floats


def _score(t: optuna.trial.FrozenTrial) -> tuple[float, float, int] | None:
    """`pick_best`'s key of an Optuna trial: (final val loss, lr, trial number)."""
    return (float(t.value), float(t.params["lr"]), t.number) if t.value is not None else None


def sampler_seed(seed: int, cell_index: int, trials_so_far: int) -> int:
    """TPE's seed for a cell: a resumed sweep (more trials in the study) continues with other draws
    instead of repeating the lrs of its first start."""
    return (seed * 1_000_003 + cell_index * 10_007 + trials_so_far) % 2**32


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
        self.fingerprint = spec_fingerprint(spec)
        self._accepted = {self.fingerprint, spec_fingerprint(spec, given_only=False)}
        self.cells: list[Cell] = []
        self.search = spec.batch_search
        # a search of the batch axis: per optimizer why it stopped (sweeps.batch_axis.Decision.why)
        self.search_done_why: dict[str, str] = {}
        self._changes, self._grown_at = 0, -1  # trials ended or cells added; `_grow` looked at this count
        if self.search is None:
            for opt, bs in cell_order(spec.optimizer_names, spec.batch_sizes):  # type: ignore[arg-type]
                self._open_cell(opt, bs, "listed", "")
        else:
            # resumed: the cells the search had chosen, in the order it chose them; then each reference
            prefix, stored_cells = f"{sweep_id}/", []
            for name in optuna.get_all_study_names(storage):
                if name.startswith(prefix):
                    attrs = optuna.load_study(study_name=name, storage=storage).user_attrs
                    if attrs.get("optimizer") in spec.optimizer_names and attrs.get("batch_size") in spec.lattice:
                        stored_cells.append(attrs)
            for attrs in sorted(stored_cells, key=lambda a: a.get("order", 0)):
                cell = self._open_cell(
                    attrs["optimizer"], attrs["batch_size"], attrs.get("chosen", "listed"), attrs.get("why", "")
                )
                cell.abandoned = bool(attrs.get("abandoned", False))
            ref = spec.lattice[0]
            for opt in spec.optimizer_names:
                if self._cell(opt, ref) is None:
                    self._open_cell(opt, ref, "reference", f"the reference batch size {ref}")
        self._by_trial: dict[str, Cell] = {}
        self._curves: dict[str, list[tuple[int, float]]] = {}
        self._started: dict[str, float] = {}

    def _cell(self, optimizer: str, batch_size: int) -> Cell | None:
        return next((c for c in self.cells if (c.optimizer, c.batch_size) == (optimizer, batch_size)), None)

    def _open_cell(self, opt: str, bs: int, chosen: str, why: str) -> Cell:
        """The cell's study, made or loaded (a resumed sweep), and the cell in its place in `cell_order`."""
        spec = self.spec
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
        close_running_trials(study)  # left behind by an interrupted driver: replaced, not resumed
        same = sorted((c for c in self.cells if c.optimizer == opt), key=lambda c: c.batch_size)
        previous = next((c for c in reversed(same) if c.batch_size < bs), None)
        cell = Cell(
            opt,
            bs,
            study,
            # the reference (no smaller size, so no warm start: `_next_lr` narrows its search) searches more
            cell_search_trials(spec.lr.trials_per_batch_size, reference=previous is None),
            spec.seeds_min,
            *spec.lr.bounds,
            previous=previous,
            following=next((c for c in same if c.batch_size > bs), None),
            seeds_max=spec.seeds_max,
            warmups=tuple(spec.schedule.warmup_choices),
            chosen=attrs.get("chosen", chosen),
            why=attrs.get("why", why),
            order=order,
        )
        # a resumed sweep keeps the confirmation runs adaptive confirmation had already added
        cell.n_seeds = max(cell.n_seeds, *cell.seeds_recorded(), 0)
        self.cells.append(cell)
        rank = {o: i for i, o in enumerate(spec.optimizer_names)}
        self.cells.sort(key=lambda c: (c.batch_size, rank[c.optimizer]))  # cell_order's priority
        self._changes += 1
        return cell

    # ---- Tune's Searcher interface ---------------------------------------------------------------

    @contextlib.contextmanager
    def reading_once(self) -> Iterator[None]:
        """Each cell's trials read from the storage once in this block (and again only after the driver
        writes to that cell's study): Tune asks `suggest` again and again while slots are free, and each
        call consults every cell a dozen ways."""
        for cell in self.cells:
            cell._memo_on, cell._memo = True, None
        try:
            yield
        finally:
            for cell in self.cells:
                cell._memo_on, cell._memo = False, None

    def suggest(self, trial_id: str) -> dict[str, Any] | str | None:
        with self._lock, self.reading_once():
            if self.lost_trials > self.max_lost_trials:
                raise InfrastructureFailures(
                    f"{self.lost_trials} trials were lost to infrastructure failures (worker processes killed, "
                    f"nodes lost), each after {TRIAL_RETRIES} restarts; the cluster needs attention"
                )
            # Again after each growth (adaptive confirmation added runs, the batch search added or dropped a
            # size), until a cell has a run to give or nothing moves: a plan may move several times before
            # it has a run (a speculative size dropped, then a bisection added), and a None with no trial
            # running would leave the sweep waiting for an event that never comes. Each growth adds seeds
            # (up to seeds.max) or changes the sizes (up to the lattice): finite; the bound guards against
            # a plan that oscillates.
            for _ in range(GROWTH_PASSES):
                for cell in self.cells:
                    config = self._next_of(cell, trial_id)
                    if config is not None:
                        self._by_trial[trial_id] = cell
                        self._curves[trial_id] = []
                        self._started[trial_id] = time.time()
                        return config
                if not self._grow():
                    # waiting (a cell's confirmations need its search to end first), or nothing left
                    return Searcher.FINISHED if all(c.finished() for c in self.cells) else None
            return None

    def report(self, run_ids: dict[str, str] | None = None) -> Report:
        """The report of what has finished so far (`build_report`, with the batch search's steps);
        `run_ids` as `collect_results` takes them."""
        results, _ = collect_results(self, run_ids)
        report = build_report(results, inputs=AnalysisInput.from_spec(self.spec), steps=self.search_steps())
        report.warnings = [*report.warnings, *self.search_warnings()]
        return report

    def grow(self) -> bool:
        """`_grow` under the lock: whether a finished-looking sweep has more to run (a resumed search)."""
        with self._lock, self.reading_once():
            return self._grow()

    def search_warnings(self) -> list[str]:
        """What a reader of a search's answer must know: an optimizer's search stopped at the cap; a cell
        stopped without a result (it ran out of memory, or its trials' processes kept dying)."""
        capped = [f"{opt}: the batch search {why}" for opt, why in self.search_done_why.items() if "cap" in why]
        return capped + [f"{key}: stopped with no result: {why}" for key, why in self.stopped_cells().items()]

    def stopped_cells(self) -> dict[str, str]:
        """Cell key -> why it stopped without a result (`Cell.stop_reason`)."""
        return {c.key: why for c in self.cells if (why := c.stop_reason()) is not None}

    def _grow(self) -> bool:
        """More runs where the verdicts ask for them; True when some were added. Looks again only after
        a trial ended or a cell was added (Tune asks `suggest` over and over while trials run)."""
        if self._grown_at == self._changes:
            return False
        if self.search is None:
            grew = all(c.finished() for c in self.cells) and self._extend_boundary_cells(self.report())
        else:
            grew = self._search_batch_axis()
        if not grew:
            self._grown_at = self._changes
        return grew

    def _extend(self, cells: list[tuple[str, int]]) -> bool:
        spec, extended = self.spec, False
        for opt, bs in cells:
            cell = self._cell(opt, bs)
            if cell is not None and cell.n_seeds < spec.seeds_max:
                cell.n_seeds = min(spec.seeds_max, cell.n_seeds + spec.seeds_step)
                extended = True
                self._changes += 1
                log.info("%s: within noise at the boundary, %d confirmation runs now", cell.key, cell.n_seeds)
        return extended

    def _extend_boundary_cells(self, report: Report) -> bool:
        """Adaptive confirmation (`seeds: {min, max, step}`): every cell has its runs; where a boundary
        verdict is within noise, give the cells it compares `step` more confirmation runs (up to max).
        True when some cell got more. The verdicts are the report's own (`cells_to_extend`)."""
        spec = self.spec
        if spec.seeds_max <= spec.seeds_min:
            return False
        extended = self._extend(cells_to_extend(report, seeds_max=spec.seeds_max))
        return self._check(cells_to_check(report)) or extended

    def _check(self, cells: list[tuple[str, int]]) -> bool:
        """Confirm these cells' degraded verdicts at their second lr where one exists and `headroom` holds
        as many runs there as the cell has at its own lr (a check with fewer seeds would seldom be decided,
        and a degraded verdict needs both lrs decided); True when some cell will."""
        checked = False
        for opt, bs in cells:
            cell = self._cell(opt, bs)
            if cell is None or cell.check or (second := cell.check_lr()) is None:
                continue
            if cell.headroom() < cell.n_seeds:
                continue
            cell.check = True
            checked = True
            self._changes += 1
            log.info("%s: degraded at lr=%.3g, confirmed at lr=%.3g too", cell.key, cell.best_lr(), second)
        return checked

    def _search_batch_axis(self) -> bool:
        """One look of the batch-axis search (sweeps/batch_axis.py) per optimizer whose cells have all
        finished: more seeds where its bracket has undecided sizes (adaptive confirmation, against the
        search's reference), else the next size the plan asks for. An optimizer still running may add
        the next step up speculatively while its largest size confirms (a free trial slot asked)."""
        from sweeps.batch_axis import plan_for_reference

        spec, search = self.spec, self.search
        assert search is not None
        against, ref_b, lattice = search.against, spec.lattice[0], spec.lattice
        cap = spec.sizes_per_optimizer[1]
        report = self.report()
        rows = {(o, c.batch_size): c for o, r in report.optimizers.items() for c in r.cells}
        extend = cells_to_extend(report, seeds_max=spec.seeds_max, references=(against,)) if spec.seeds_step else []
        checks = cells_to_check(report, references=(against,)) if spec.seeds_step else []
        grew = False
        for opt in spec.optimizer_names:
            mine = [c for c in self.cells if c.optimizer == opt]
            ref_cell = self._cell(spec.degradation.baseline if against == "baseline" else opt, ref_b)
            assert ref_cell is not None

            def verdict(c: Cell, ref_cell: Cell = ref_cell) -> str | None:
                if not (c.finished() and ref_cell.finished()):
                    return None
                row = rows.get((c.optimizer, c.batch_size))
                return getattr(row.verdict, against) if row is not None else None

            decided = {c.batch_size: verdict(c) for c in mine if not c.abandoned}
            for c in mine:
                if c.chosen == "speculative" and not c.abandoned and not c.finished():
                    below = [b for b, v in decided.items() if b < c.batch_size and v == "degraded"]
                    if below:
                        c.abandoned, c.why = True, f"{c.why}; not needed: {min(below)} is degraded"
                        c.study.set_user_attr("abandoned", True)
                        c.study.set_user_attr("why", c.why)
                        self._changes += 1
                        grew = True  # nothing to run, but the plan moved
                        log.info("%s: speculative size not needed, %d below it is degraded", c.key, min(below))
            decided = {c.batch_size: verdict(c) for c in mine if not c.abandoned}
            if ref_cell.finished() and all(c.finished() for c in mine):
                ours = [(o, b) for o, b in extend if o == opt or (o, b) == (ref_cell.optimizer, ref_b)]
                if self._extend(ours) | self._check([(o, b) for o, b in checks if o == opt]):
                    grew = True
                    continue
                passes = {
                    c.batch_size: getattr(row.degradation_free, against)
                    if (row := rows.get((opt, c.batch_size))) is not None
                    else None
                    for c in mine
                    if not c.abandoned
                }
                d = plan_for_reference(
                    lattice,
                    decided,  # type: ignore[arg-type]
                    step=search.step,
                    resolution=search.resolution,
                    passes=passes,
                    start=search.start_for(opt),
                )
                if d.kind == "test" and len(mine) >= cap:
                    self.search_done_why[opt] = f"stopped at the cap of {cap} batch sizes; next would be {d.batch_size}"
                elif d.kind == "test" and (old := self._cell(opt, d.batch_size)) is not None:
                    # a speculative size dropped before, needed after all: its runs go on
                    old.abandoned, old.why = False, f"{old.why}; needed after all: {d.why}"
                    old.study.set_user_attr("abandoned", False)
                    old.study.set_user_attr("why", old.why)
                    self._changes += 1
                    grew = True
                elif d.kind == "test":
                    self._open_cell(opt, d.batch_size, d.chosen, d.why)  # type: ignore[arg-type]
                    log.info("%s: batch size %d (%s: %s)", opt, d.batch_size, d.chosen, d.why)
                    grew = True
                elif d.kind == "done":
                    self.search_done_why[opt] = d.why
                continue
            # speculation: the largest sizes confirm, a trial slot is free: step up as if they end fine
            pending = [c for c in mine if not c.abandoned and not c.finished()]
            if len(mine) >= cap or any(c.chosen == "speculative" for c in pending):
                continue
            if not pending or not all(c.search_done() for c in pending) or not ref_cell.search_done():
                continue
            # only where it is likely: every confirming size's search found an lr within the tolerance of
            # the reference (the search's best is biased low, so a size above it will likely be degraded)
            tol = spec.degradation.tolerance
            ref_row = rows.get((ref_cell.optimizer, ref_b))
            ref_loss = None if ref_row is None else ref_row.val_loss_mean or ref_row.search_best_val_loss
            likely = [getattr(rows.get((opt, c.batch_size)), "search_best_val_loss", None) for c in pending]
            if ref_loss is None or any(v is None or v > (1 + tol) * ref_loss for v in likely):
                continue
            hopeful = {b: ("fine" if v is None else v) for b, v in decided.items()}
            d = plan_for_reference(
                lattice, hopeful, step=search.step, resolution=search.resolution, start=search.start_for(opt)
            )  # type: ignore[arg-type]
            if d.kind == "test" and d.chosen in ("step up", "predicted"):
                waiting = ", ".join(str(c.batch_size) for c in pending)
                move = f"x{search.step:g}" if d.chosen == "step up" else d.why  # or "the predicted boundary, N"
                self._open_cell(opt, d.batch_size, "speculative", f"{d.chosen} while {waiting} confirm(s): {move}")  # type: ignore[arg-type]
                log.info("%s: batch size %d speculatively, while %s confirm(s)", opt, d.batch_size, waiting)
                grew = True
        return grew

    def search_steps(self) -> dict[str, list[dict[str, Any]]]:
        """Per optimizer, the batch sizes a search of the batch axis tested, in the order it chose them."""
        if self.search is None:
            return {}
        out: dict[str, list[dict[str, Any]]] = {}
        for c in sorted(self.cells, key=lambda c: c.order):
            out.setdefault(c.optimizer, []).append(
                {
                    "batch_size": c.batch_size,
                    "chosen": c.chosen,
                    "why": c.why,
                    "seeds_added": max(0, c.n_seeds - self.spec.seeds_min),
                }
            )
        return out

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
            handle = cell.running.pop(trial_id)
            self._changes += 1
            result = result or {}
            status = trial_status(result, error, cancelling=self.cancelling)
            if status == TrialStatus.interrupted:
                self.lost_trials += 1
                log.warning("trial %s of %s was lost to the infrastructure; it will be run again", trial_id, cell.key)
            elif status == TrialStatus.failed:
                log.warning("trial %s of %s failed: %s", trial_id, cell.key, result.get("error", "no error given"))
            val = result.get(METRIC)
            # Tune ends a trial on its final ("done") result without passing it to on_trial_result:
            # the final evaluation joins the curve here
            curve = self._curves.get(trial_id, [])
            if val is not None and math.isfinite(val) and TIME_ATTR in result:
                if not curve or int(result[TIME_ATTR]) > curve[-1][0]:
                    curve.append((int(result[TIME_ATTR]), float(val)))
            attrs = {
                "status": status,
                "tokens": int(result.get(TIME_ATTR, 0)),
                "steps": int(result.get("step", 0)),
                "curve": json.dumps(self._curves.pop(trial_id, [])),
                "train_time_s": float(
                    result.get("train_time_s", time.time() - self._started.pop(trial_id, time.time()))
                ),
                "tune_trial_id": trial_id,
            }
            if (
                error
            ):  # its process died each time Tune started it (not lost with a driver: stores.close_running_trials)
                attrs["lost"] = LOST_WITH_PROCESS
            if status == TrialStatus.failed:
                attrs["error"] = str(result.get("error", ""))[:500]
                if result.get("failure"):
                    attrs["failure"] = str(result["failure"])
            if isinstance(handle, Rerun):  # a confirmation or warm-up run: recorded whole at the end
                state = TrialState.COMPLETE if status == "completed" else TrialState.FAIL
                cell.study.add_trial(
                    optuna.trial.create_trial(
                        params={"lr": handle.lr},
                        distributions={"lr": self.distribution},
                        value=float(val) if state == TrialState.COMPLETE and val is not None else None,
                        state=state,
                        user_attrs={"role": handle.role, "seed": handle.seed, "warmup": handle.warmup, **attrs},
                    )
                )
                return
            trial = handle
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

    # ---- internals -----------------------------------------------------------------------------

    def _next_of(self, cell: Cell, trial_id: str) -> dict[str, Any] | None:
        if cell.abandoned or cell.stop_reason() is not None:
            return None
        if cell.search_asked() < cell.n_search and not cell.search_done():
            prev = cell.previous
            if prev is not None and not prev.search_done():
                # the smaller batch's final best lr seeds this cell's search: wait for its search to end
                return None
            if not cell.all_trials():
                if prev is not None and (best := prev.best()) is not None:
                    design = "bracket"  # where the smaller batch's best lr scales to, up to the bounds
                    nxt = cell.following  # a bisection: a larger size was searched too, interpolate
                    upper_best = nxt.best() if nxt is not None and nxt.search_done() else None
                    lrs = warm_start_lrs(
                        best.params["lr"],
                        prev.batch_size,
                        cell.batch_size,
                        lr_min=cell.lr_min,
                        lr_max=cell.lr_max,
                        upper=(float(upper_best.params["lr"]), nxt.batch_size) if upper_best and nxt else None,
                    )
                else:  # nothing to go on: the range the spec gave
                    design, lrs = "coarse", coarse_lrs(self.spec.lr.min, self.spec.lr.max)
                for lr in lrs[: cell.n_search]:
                    cell.study.enqueue_trial({"lr": lr}, user_attrs={"design": design})
            elif not any(t.state == TrialState.WAITING for t in cell.all_trials()):
                kind, lr = cell.next_lr()
                if kind == "wait":
                    return None
                if kind in ("vertex", "step"):
                    cell.study.enqueue_trial({"lr": lr}, user_attrs={"design": kind})
            return self._ask_search(cell, trial_id)
        if (probe := cell.probe_lr()) is not None:
            # a confirmation run diverged with no completed search lr below it: a search trial just below
            cell.study.enqueue_trial({"lr": probe}, user_attrs={"design": "probe"})
            return self._ask_search(cell, trial_id)
        if cell.search_done() and (lr := cell.best_lr()) is not None:
            # first the other warm-ups at the best lr (seed 0, as the search), then the confirmation runs
            # at the best of them
            if warmups := cell.warmups_wanted():
                run = Rerun("warmup", 0, lr, warmups[0])
            elif seeds := cell.seeds_wanted():
                run = Rerun("seed", seeds[0], lr, cell.best_warmup())
            elif (seeds := cell.checks_wanted()) and (second := cell.check_lr()) is not None:
                run = Rerun("seed", seeds[0], second, cell.best_warmup())  # the check at the second lr
            else:
                return None
            cell.running[trial_id] = run
            return self._config(cell, run.lr, seed=run.seed, role=run.role, number=None, warmup=run.warmup)
        return None

    def _ask_search(self, cell: Cell, trial_id: str) -> dict[str, Any]:
        """A search trial of `cell`: the one enqueued (a design point), else TPE's draw; seed 0."""
        cell.changed()
        trial = cell.study.ask({"lr": self.distribution})
        trial.set_user_attr("role", "search")
        trial.set_user_attr("seed", 0)
        cell.running[trial_id] = trial
        # the bracket, vertex, step and probe trials are the search's design, trained to the end; only TPE's
        # explorations may be stopped early by ASHA
        prunable = not trial.user_attrs.get("design")
        return self._config(cell, trial.params["lr"], seed=0, role="search", number=trial.number, prunable=prunable)

    def _config(
        self,
        cell: Cell,
        lr: float,
        *,
        seed: int,
        role: str,
        number: int | None,
        prunable: bool = False,
        warmup: int | float | None = None,
    ) -> dict[str, Any]:
        warmup = cell.warmups[0] if warmup is None else warmup
        train = self.spec.train_config(cell.optimizer, cell.batch_size, lr, seed, warmup=warmup)
        return {
            "sweep_id": self.sweep_id,
            "cell": cell.key,
            "optimizer": cell.optimizer,
            "batch_size": cell.batch_size,
            "lr": lr,
            "seed": seed,
            "role": role,
            "warmup": warmup,  # in the spec's unit (schedule.warmup_unit)
            "warmup_searched": len(cell.warmups) > 1,  # MLflow names the run's warm-up then
            "optuna_number": number,
            "prunable": prunable,
            "chosen": cell.chosen,  # why the batch size is tested: MLflow tags the cell and its trials
            "why": cell.why,
            "train": train.model_dump(mode="json"),
        }

    # ---- progress ------------------------------------------------------------------------------

    def progress(self) -> dict[str, Any]:
        with self._lock, self.reading_once():
            cells = []
            for c in self.cells:
                best = c.best()
                cells.append(
                    {
                        "cell": c.key,
                        "optimizer": c.optimizer,
                        "batch_size": c.batch_size,
                        # the lr search's trials and the other warm-ups' runs at the best lr
                        "search_done": c.search_finished() + (warmed := len(c.trials("warmup"))),
                        # at most n_search: a search that converged early ends with what it ran
                        "search_total": (c.search_finished() if c.search_done() else c.n_search)
                        + max(warmed, len(c.warmups) - 1),
                        "seeds_done": len(c.seeds_recorded(float(best.params["lr"]), c.best_warmup())) if best else 0,
                        "seeds_total": c.n_seeds,
                        "best_lr": float(best.params["lr"]) if best else None,
                        # the search's minimum (biased low: it picked the lr), and what the report will
                        # use: the mean of the confirmation runs completed so far
                        "search_best_val_loss": float(best.value) if best else None,  # type: ignore[arg-type]
                        "confirmed_val_loss_mean": statistics.fmean(confirmed)
                        if (confirmed := c.confirmed())
                        else None,
                        "finished": c.finished(),
                        "stopped": c.stop_reason(),  # why it stopped without a result; None: it did not
                        "running": len(c.running),
                        "chosen": c.chosen,
                        "why": c.why,
                    }
                )
            curves = self._curves_now()
            # confirmation runs at an lr the cell retreated from count as done and as planned
            retired = [len(cell.trials("seed")) - c["seeds_done"] for cell, c in zip(self.cells, cells, strict=True)]
            done = sum(c["search_done"] + c["seeds_done"] for c in cells) + sum(retired)
            return {
                "cells_done": sum(c["finished"] for c in cells),
                "cells_total": len(cells),
                "trials_done": done,
                # the current plan: adaptive confirmation may add runs at boundary cells (at most spec.total_trials)
                "trials_total": sum(c["search_total"] + c["seeds_total"] for c in cells) + sum(retired),
                "cells": cells,
                "curves": curves,
            }

    def _curves_now(self) -> list[dict[str, Any]]:
        """Val loss against tokens of every trial so far, finished (from the storage) and running (as
        reported), for the sweep's live page; each curve cut to CURVE_POINTS points, evenly by index."""
        out: list[dict[str, Any]] = []
        for c in self.cells:
            best = c.best()
            for role in ROLES:
                for t in c.trials(role):
                    points = json.loads(t.user_attrs.get("curve", "[]"))
                    out.append(
                        {
                            "cell": c.key,
                            "lr": float(t.params["lr"]),
                            "seed": int(t.user_attrs.get("seed", 0)),
                            "role": role,
                            "warmup": c.warmup_of(t),
                            "status": str(t.user_attrs.get("status", "failed")),
                            "best": best is not None and role == "search" and t.number == best.number,
                            "points": _thin(points),
                        }
                    )
        for trial_id, cell in self._by_trial.items():
            handle = cell.running.get(trial_id)
            if handle is None:
                continue
            run = (
                handle if isinstance(handle, Rerun) else Rerun("search", 0, float(handle.params["lr"]), cell.warmups[0])
            )
            out.append(
                {
                    "cell": cell.key,
                    "lr": run.lr,
                    "seed": run.seed,
                    "role": run.role,
                    "warmup": run.warmup,
                    "status": "running",
                    "best": False,
                    "points": _thin([list(p) for p in self._curves.get(trial_id, [])]),
                }
            )
        return out


def collect_results(
    searcher: CellSearcher, run_ids: dict[str, str] | None = None
) -> tuple[list[TrialResult], list[float]]:
    """Every finished trial of every cell, read back from the Optuna storage; `run_ids` (Tune trial id
    -> MLflow run id) names each trial's MLflow run in the report."""
    results, times = [], []
    for cell in searcher.cells:
        for role in ROLES:
            for t in cell.trials(role):
                status = TrialStatus(t.user_attrs.get("status", TrialStatus.failed))
                val = t.value if t.value is not None and math.isfinite(t.value) else None
                if status == "pruned" and t.intermediate_values:
                    val = t.intermediate_values[max(t.intermediate_values)]
                results.append(
                    TrialResult(
                        optimizer=cell.optimizer,
                        batch_size=cell.batch_size,
                        lr=float(t.params["lr"]),
                        seed=int(t.user_attrs.get("seed", 0)),
                        role=role,
                        warmup=cell.warmup_of(t),
                        status=status,
                        val_loss=val if status in ("completed", "pruned") else None,
                        tokens=int(t.user_attrs.get("tokens", 0)),
                        steps=int(t.user_attrs.get("steps", 0)),
                        curve=tuple(tuple(p) for p in json.loads(t.user_attrs.get("curve", "[]"))),
                        number=t.number,
                        run_id=(run_ids or {}).get(str(t.user_attrs.get("tune_trial_id"))),
                    )
                )
                times.append(float(t.user_attrs.get("train_time_s", 0.0)))
    return results, times
