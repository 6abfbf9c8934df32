"""The state of a cell, read once from its study: `StudyRead` (the trials, and what they alone say) and
`CellState` (a frozen snapshot of the cell: its plan, that read and its running trials, with everything the
policy asks of it worked out once, on first use).

The adapter builds the snapshots at the start of each call (`suggest`, `report`, `progress`) from one read
of each cell's study; nothing here writes. Tune asks `suggest` again and again while trial slots are free,
and each call consults every cell a dozen ways: a snapshot answers all of them from one storage read, and
the line-search fits behind `best` and `next_lr` (most of a `suggest`) run once per snapshot.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import cached_property

import optuna
from optuna.trial import FrozenTrial, TrialState

from sweeps import plan
from sweeps.analysis import ROLES, pick_best, pick_stable, pick_warmup
from sweeps.layout import role_of
from sweeps.status import OUT_OF_MEMORY, RERUN_STATUSES, TrialStatus

FINISHED_STATES = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)
# Tune restarts a trial whose worker died this many times before it is given up ("interrupted", re-run)
TRIAL_RETRIES = 2
# A cell stops, with no result, after this many of its trials in a row ran out of memory (no lr changes the
# memory a trial needs) or were lost with their process each time Tune started it (1 + TRIAL_RETRIES
# deaths a trial: a trial killed by the kernel's OOM killer looks like that, and so does any trial this
# cluster cannot run). Trials lost with a driver or a node are not counted: those are run again, unbounded.
CELL_MEMORY_FAILURES = 2
CELL_LOST_TRIALS = 3
LOST_WITH_PROCESS = "process"  # a trial's `lost`: Tune gave it up after its process died each time

Warmup = int | float  # in the spec's unit (schedule.warmup_unit)


def same_lr(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-9)  # lrs travel through the storage as floats


def lr_of(t: FrozenTrial) -> float:
    return float(t.params["lr"])


def score(t: FrozenTrial) -> tuple[float, float, int] | None:
    """`pick_best`'s key of an Optuna trial: (final val loss, lr, trial number)."""
    return (float(t.value), lr_of(t), t.number) if t.value is not None else None


@dataclass(frozen=True)
class Run:
    """A running trial: a search trial (asked of Optuna; `design` is the point it was enqueued as, "" for
    TPE's draw) or a confirmation ("confirm") or warm-up ("warmup") run, recorded whole when it ends."""

    role: str
    seed: int
    lr: float
    warmup: Warmup
    design: str = ""


@dataclass(frozen=True)
class StudyRead:
    """A cell's study as read once (its trials in every state, in trial order) and what they alone say."""

    all_trials: tuple[FrozenTrial, ...]

    @classmethod
    def of(cls, study: optuna.Study) -> StudyRead:
        return cls(tuple(study.get_trials(deepcopy=False)))

    @cached_property
    def _finished(self) -> dict[str, tuple[FrozenTrial, ...]]:
        """Role -> its finished trials, but not the ones to run again (`RERUN_STATUSES`)."""
        out: dict[str, list[FrozenTrial]] = {role: [] for role in ROLES}
        for t in self.all_trials:
            role = role_of(t.user_attrs.get("role"))
            if role in out and t.state in FINISHED_STATES and t.user_attrs.get("status") not in RERUN_STATUSES:
                out[role].append(t)
        return {role: tuple(trials) for role, trials in out.items()}

    def trials(self, role: str) -> tuple[FrozenTrial, ...]:
        """The finished trials of `role`, but not the ones to run again."""
        return self._finished[role]

    def completed(self, role: str) -> tuple[FrozenTrial, ...]:
        return tuple(t for t in self._finished[role] if t.state == TrialState.COMPLETE)

    @cached_property
    def confirmations_diverged(self) -> list[float]:
        """The lrs of the cell's diverged confirmation runs (a retreat goes below the lowest; a probe below it)."""
        return [lr_of(t) for t in self.trials("confirm") if t.user_attrs.get("status") == "diverged"]

    @cached_property
    def best(self) -> FrozenTrial | None:
        """The search trial whose lr gets the confirmation runs, by the analysis's own rule (`pick_stable`:
        the best, or the best below an lr at which a confirmation run diverged)."""
        return pick_stable(list(self.completed("search")), score, self.confirmations_diverged)

    @cached_property
    def stop_reason(self) -> str | None:
        """Why the cell stopped without a result (CELL_MEMORY_FAILURES, CELL_LOST_TRIALS), or None: from its
        trials since the last one that trained (completed, pruned or diverged), newest first."""
        memory, lost, error = 0, 0, ""
        for t in sorted(self.all_trials, key=lambda t: t.number, reverse=True):
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


@dataclass(frozen=True)
class CellState:
    """One cell at one moment: what the plan set (its seeds, a check, abandoned), one read of its study and
    its running trials. Frozen: every derived value is worked out on first use and kept; a change of plan
    is a new snapshot over the same read (`with_plan`)."""

    optimizer: str
    batch_size: int
    n_search: int  # search trials at most (`sweeps.spec.cell_search_trials`)
    n_seeds: int  # confirmation runs wanted at the best lr (adaptive confirmation raises it)
    # the confirmation runs a cell may reach (adaptive seeds' max: what the dry run prices every cell at)
    seeds_max: int
    lr_min: float  # the whole range the line search may reach (past [min, max] by lr.extend)
    lr_max: float
    # the spec's own warm-up and the others to try at the best lr (schedule.warmup_choices, in its unit)
    warmups: tuple[Warmup, ...]
    previous: str | None  # the key of the same optimizer's next smaller batch size when this one was added
    following: str | None  # ... and of the next larger one (when it was added: a bisection)
    chosen: str  # why this batch size is tested (sweeps.batch_axis.Chosen)
    why: str  # the search's decision in words
    order: int  # the order in which the sweep added its cells
    abandoned: bool  # a speculative size above one that turned out degraded: its runs stop, what ran is kept
    check: bool  # its degraded verdict is to be confirmed at a second lr (`check_lr`)
    read: StudyRead
    running: tuple[Run, ...]

    @property
    def key(self) -> str:
        return plan.cell_key(self.optimizer, self.batch_size)

    def with_plan(self, **plan_fields: object) -> CellState:
        """This snapshot with its plan changed (n_seeds, check, abandoned, why): the same read, its fits kept."""
        return replace(self, **plan_fields)  # type: ignore[arg-type]

    # ---- what the study holds ----------------------------------------------------------------------

    def trials(self, role: str) -> tuple[FrozenTrial, ...]:
        """The finished trials of `role`, but not the ones to run again."""
        return self.read.trials(role)

    @property
    def best(self) -> FrozenTrial | None:
        return self.read.best

    @property
    def best_lr(self) -> float | None:
        return lr_of(self.read.best) if self.read.best is not None else None

    @property
    def stop_reason(self) -> str | None:
        return self.read.stop_reason

    @property
    def search_finished(self) -> int:
        return len(self.trials("search"))

    def warmup_of(self, t: FrozenTrial) -> Warmup:
        """The warm-up a trial trained with (search trials and runs recorded before the warm-up search
        have none recorded: the spec's own)."""
        return t.user_attrs.get("warmup", self.warmups[0])  # type: ignore[no-any-return]

    def seeds_recorded(self, lr: float | None = None, warmup: Warmup | None = None) -> set[int]:
        """Seeds of the finished confirmation runs, at `lr` and `warmup` where given."""
        return {
            int(t.user_attrs["seed"])
            for t in self.trials("confirm")
            if (lr is None or same_lr(lr_of(t), lr)) and (warmup is None or self.warmup_of(t) == warmup)
        }

    @cached_property
    def confirmed(self) -> list[float]:
        """Final val losses of the completed confirmation runs at the best lr and warm-up."""
        lr, warmup = self.best_lr, self.best_warmup
        if lr is None:
            return []
        return [
            float(t.value)  # type: ignore[arg-type]
            for t in self.read.completed("confirm")
            if t.value is not None and same_lr(lr_of(t), lr) and self.warmup_of(t) == warmup
        ]

    @cached_property
    def best_warmup(self) -> Warmup:
        """The warm-up of the confirmation runs, by the analysis's own rule (`pick_warmup`): of the best
        search trial's and the warm-up runs completed at its lr, the lowest loss."""
        best = self.best
        if best is None or len(self.warmups) == 1:
            return self.warmups[0]
        lr = lr_of(best)
        tried = [
            (float(t.value), t.number, self.warmup_of(t))
            for t in self.read.completed("warmup")
            if t.value is not None and math.isfinite(t.value) and same_lr(lr_of(t), lr)
        ]
        return pick_warmup([(float(best.value), -1, self.warmups[0]), *tried])  # type: ignore[arg-type]

    # ---- what runs -----------------------------------------------------------------------------------

    @cached_property
    def searching(self) -> tuple[Run, ...]:
        """The running search trials (a probe among them)."""
        return tuple(r for r in self.running if r.role == "search")

    def running_as(self, role: str) -> list[Run]:
        """The running confirmation ("confirm") or warm-up ("warmup") runs."""
        return [r for r in self.running if r.role == role]

    @property
    def search_asked(self) -> int:
        return self.search_finished + len(self.searching)

    @cached_property
    def spent(self) -> int:
        """The cell's trials finished or running, of every role."""
        return sum(len(self.trials(role)) for role in ROLES) + len(self.running)

    @cached_property
    def probes(self) -> int:
        """Search trials asked below a diverged confirmation run (`plan.probe_lr`), finished or running."""
        finished = sum(1 for t in self.trials("search") if t.user_attrs.get("design") == "probe")
        return finished + sum(1 for r in self.searching if r.design == "probe")

    @cached_property
    def _runs_elsewhere(self) -> int:
        """Confirmation runs, finished or running, at an lr other than the best (a retreat's, a check's)."""
        lr = self.best_lr
        at = [lr_of(t) for t in self.trials("confirm")] + [r.lr for r in self.running_as("confirm")]
        return sum(1 for x in at if lr is None or not same_lr(x, lr))

    def budget(self, probes: int = 0) -> int:
        """The cell's trials at most: n_search, one per other warm-up, n_seeds, and again the confirmation
        runs spent at an lr the cell retreated from (a diverged run there) and its probes (`probes` more:
        one about to be asked), as far as `seeds_max` leaves room: a retreat is confirmed whole where the
        spec's trial cap (every cell at seeds_max) allows it, and otherwise spends what the search did not."""
        again = min(self._runs_elsewhere + self.probes + probes, max(0, self.seeds_max - self.n_seeds))
        return self.n_search + len(self.warmups) - 1 + self.n_seeds + again

    @cached_property
    def headroom(self) -> int:
        """Confirmation runs `seeds_max` still allows at lrs other than the best: a retreat's, a probe's,
        a check's, beyond the `n_seeds` at the best lr."""
        return max(0, self.seeds_max - self.n_seeds - self._runs_elsewhere - self.probes)

    # ---- the search's next step --------------------------------------------------------------------

    @cached_property
    def next_lr(self) -> tuple[str, float | None]:
        """What the cell's finished search trials say to try next (`plan.next_search_lr`), or
        ("wait", None) while a step of that line search is running: its result moves the next step."""
        if any(r.design for r in self.searching):
            return ("wait", None)
        finished = self.trials("search")
        done = [
            (lr_of(t), float(t.value))
            for t in finished
            if t.state == TrialState.COMPLETE and t.value is not None and math.isfinite(t.value)
        ]
        diverged = [lr_of(t) for t in finished if t.user_attrs.get("status") == TrialStatus.diverged]
        tried = [lr_of(t) for t in finished] + [r.lr for r in self.searching]
        narrow = plan.REFERENCE_NARROW if self.previous is None else None  # the coarse start's cell: no warm start
        kind, lr = plan.next_search_lr(done, diverged, tried, lr_min=self.lr_min, lr_max=self.lr_max, narrow=narrow)
        if kind == "converged" and self.searching:
            return ("explore", None)  # TPE's trials still running could move the optimum
        return kind, lr

    @cached_property
    def search_done(self) -> bool:
        """All `n_search` trials finished, or the search converged early (`next_lr`), or the cell stopped
        (`stop_reason`: the cells that wait for its search go on without it)."""
        return (
            self.search_finished >= self.n_search
            or self.next_lr[0] == "converged"
            or self.stop_reason is not None
            or self.probes > 0  # a probe follows a finished search: the line search does not resume
        )

    @cached_property
    def probe_lr(self) -> float | None:
        """The lr of the next probe (`plan.probe_lr`) once the search is done and no search trial is
        running, where the budget holds the probe and the confirmation runs after it; else None."""
        if not self.search_done or self.searching:
            return None
        search = self.trials("search")
        lr = plan.probe_lr(
            self.read.confirmations_diverged,
            [lr_of(t) for t in search if t.state == TrialState.COMPLETE and t.value is not None],
            [lr_of(t) for t in search if t.user_attrs.get("status") == TrialStatus.diverged],
            lr_min=self.lr_min,
        )
        if lr is None or self.spent + 1 + self.n_seeds > self.budget(probes=1):
            return None
        return lr

    @cached_property
    def cliff_pair(self) -> tuple[float, float] | None:
        """The search's best two lrs where its best sits at a cliff (`plan.cliff_pair`), once the search is
        done; else None."""
        if not self.search_done or self.searching:
            return None
        done = [(lr_of(t), float(t.value)) for t in self.read.completed("search") if t.value is not None]
        best = pick_best(self.read.completed("search"), score)
        if best is None:
            return None
        done = [(lr, loss) for lr, loss in done if math.isfinite(loss)]
        diverged = [lr_of(t) for t in self.trials("search") if t.user_attrs.get("status") == TrialStatus.diverged]
        return plan.cliff_pair(lr_of(best), done, diverged)

    @cached_property
    def check_lr(self) -> float | None:
        """The cell's second lr (`plan.check_lr`, the analysis's own rule), or None."""
        lr = self.best_lr
        if lr is None:
            return None
        completed = [(lr_of(t), float(t.value)) for t in self.read.completed("search") if score(t)]  # type: ignore[arg-type]
        return plan.check_lr(lr, completed, self.read.confirmations_diverged, self.cliff_pair)

    @property
    def at_cliff(self) -> bool:
        """The second lr is the other of the search's best two at a cliff: its seeds run unasked."""
        pair, lr, second = self.cliff_pair, self.best_lr, self.check_lr
        return pair is not None and lr is not None and second is not None and plan.cliff_other(lr, pair) == second

    # ---- the runs wanted at the best lr ------------------------------------------------------------

    @cached_property
    def warmups_wanted(self) -> tuple[Warmup, ...]:
        """The other warm-ups neither recorded nor running at the best lr, as many as the search's share
        of the trial budget still holds (n_search + the other warm-ups: the lr search may have converged
        early; a retreat to a lower lr tries them there again from what is left) with room left in the
        cell's budget for the confirmation runs still wanted there."""
        lr = self.best_lr
        if lr is None or len(self.warmups) == 1:
            return ()
        runs, done = self.running_as("warmup"), self.trials("warmup")
        tried = {r.warmup for r in runs if same_lr(r.lr, lr)}
        tried |= {self.warmup_of(t) for t in done if same_lr(lr_of(t), lr)}
        wanted = [w for w in self.warmups[1:] if w not in tried]
        searched = self.search_finished + len(done) + len(runs)
        seeds_due = max(0, self.n_seeds - len(self.seeds_recorded(lr)))
        room = min(
            self.n_search + len(self.warmups) - 1 - searched,  # the search's share
            self.budget() - self.spent - seeds_due,  # the confirmation runs first
        )
        return tuple(wanted[: max(0, room)])

    @cached_property
    def seeds_wanted(self) -> tuple[int, ...]:
        """Confirmation seeds 1..n_seeds (the search runs at seed 0) neither recorded nor running at the
        best lr and warm-up, once the warm-ups to try there have ended, as many as the cell's `budget`
        still holds."""
        lr = self.best_lr
        if lr is None or self.warmups_wanted or self.running_as("warmup"):
            return ()
        if self.searching:
            return ()  # a search trial (a probe) is running: its result may move the best lr
        warmup = self.best_warmup
        running = {r.seed for r in self.running_as("confirm") if same_lr(r.lr, lr) and r.warmup == warmup}
        recorded = self.seeds_recorded(lr, warmup)
        wanted = [s for s in range(1, self.n_seeds + 1) if s not in recorded and s not in running]
        return tuple(wanted[: max(0, self.budget() - self.spent)])

    @cached_property
    def checks_wanted(self) -> tuple[int, ...]:
        """Confirmation seeds wanted at the second lr at a cliff (`at_cliff`) or once a check was asked for
        (`check`, or runs there already: a resumed sweep): the seeds recorded or running at the best lr and
        not yet there, once those at the best lr are all asked, as far as `headroom` allows."""
        lr, second = self.best_lr, self.check_lr
        if lr is None or second is None or self.seeds_wanted or self.warmups_wanted:
            return ()
        if self.searching:
            return ()  # a search trial (a probe) is running: its result may move the best lr
        warmup = self.best_warmup
        runs = [r for r in self.running_as("confirm") if r.warmup == warmup]
        there = self.seeds_recorded(second, warmup) | {r.seed for r in runs if same_lr(r.lr, second)}
        if not self.check and not self.at_cliff and not there:
            return ()
        first = self.seeds_recorded(lr, warmup) | {r.seed for r in runs if same_lr(r.lr, lr)}
        return tuple(sorted(first - there)[: self.headroom])

    @cached_property
    def finished(self) -> bool:
        """Nothing more to run: stopped or abandoned (once its running trials end), or searched with no
        result, or searched and every run wanted at its best lr recorded."""
        if self.stop_reason is not None or self.abandoned:
            return not self.running
        if not self.search_done:
            return False
        return self.best is None or (
            not self.warmups_wanted
            and not self.seeds_wanted
            and not self.running
            and self.probe_lr is None
            and not self.checks_wanted
        )
