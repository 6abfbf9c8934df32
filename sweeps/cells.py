"""A cell's runs (one optimizer at one batch size): which search trial's lr gets the confirmation runs
(`pick_best`, `pick_stable`), with which warm-up (`pick_warmup`): the search and the analysis decide by these
same rules; and `make_cell`, the cell as the analysis judges it (its confirmation runs, their mean, why it is
unstable, its second lr). Pure, like `sweeps.analysis`."""

from __future__ import annotations

import functools
import math
import statistics
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TypeVar

from sweeps.plan import PARABOLA_WINDOW, check_lr, cliff_pair, neighbourhood, parabola_vertex
from sweeps.results import TrialResult

LR_REL_TOL = 1e-9  # confirmation runs match the best lr up to float round-off (it travels through JSON/MLflow)

X = TypeVar("X")
W = TypeVar("W")


def pick_best(candidates: Iterable[X], score: Callable[[X], tuple[float, float, int] | None]) -> X | None:
    """The best trial of a cell; the one rule, used by the search (which lr gets the confirmation runs)
    and by the analysis (which lr is reported). `score(trial)` is (final val loss, lr, trial number)
    for a completed trial, None for any other; non-finite losses never count.

    The lowest loss and its nearest neighbours in ln lr (`sweeps.plan.neighbourhood`) are fitted with a
    parabola (`parabola_vertex`); where it has a minimum, the trial nearest that vertex wins, so that
    one run made low by seed noise does not pull the lr away from where its neighbours put the minimum.
    Without a fit (fewer than 3 distinct lrs, not convex) the lowest loss wins. Ties go to the lower
    loss, then the smaller lr, then the earlier trial."""
    scored = {key: c for c in candidates if (key := score(c)) is not None and math.isfinite(key[0])}
    if not scored:
        return None
    points: dict[tuple[float, float], tuple[float, float, int]] = {}  # (lr, loss) -> the earliest trial's key
    for key in sorted(scored):
        points.setdefault((key[1], key[0]), key)
    vertex = parabola_vertex(list(points), reach=0.0, window=PARABOLA_WINDOW)
    if vertex is None:
        return scored[min(scored)]
    near = [points[p] for p in neighbourhood(list(points), window=PARABOLA_WINDOW)]
    return scored[min(near, key=lambda key: (abs(math.log(key[1] / vertex)), key))]


def pick_stable(
    candidates: Iterable[X], score: Callable[[X], tuple[float, float, int] | None], diverged_lrs: Iterable[float]
) -> X | None:
    """The lr whose confirmation runs give the cell's loss; the one rule, for the search and the analysis.

    `pick_best` of the completed search trials, unless a confirmation run diverged at that lr or below:
    then `pick_best` of those below the lowest lr at which one diverged (the tuning playbook's retreat to
    the next lower stable lr: one run diverging near a cliff says the lr is too high, not that the batch
    size is bad). Where no search trial lies below, the plain best stays, and its diverged runs make the
    cell unstable. `diverged_lrs`: the lrs of the cell's diverged confirmation runs."""
    pool = list(candidates)
    best = pick_best(pool, score)
    ceiling = min(diverged_lrs, default=None)
    if best is None or ceiling is None:
        return best
    below = ceiling * (1.0 - LR_REL_TOL)
    if score(best)[1] < below:  # type: ignore[index]
        return best
    lower = pick_best([c for c in pool if (key := score(c)) is not None and key[1] < below], score)
    return lower if lower is not None else best


def pick_warmup(tried: Iterable[tuple[float, int, W]]) -> W:
    """The warm-up of a cell's confirmation runs; the one rule, for the search and the analysis.

    `tried`: (final val loss, order, warm-up) of the best search trial (order -1: it trained with the
    spec's own warm-up) and of each completed warm-up run at its lr (order: the trial number). The lowest
    loss wins, ties to the spec's own, then the earlier run. One seed each, like the lr search: the
    confirmation runs at the winner give the cell's loss, so its pick is never biased low."""
    return min(tried, key=lambda x: (x[0], x[1]))[2]


def search_score(t: TrialResult) -> tuple[float, float, int] | None:
    """`pick_best`'s key of a search trial: (final val loss, lr, trial number); None unless completed."""
    if t.role != "search" or t.status != "completed" or t.val_loss is None:
        return None
    return (t.val_loss, t.lr, t.number if t.number is not None else t.seed)


def search_pair(trials: list[TrialResult]) -> tuple[float, float] | None:
    """The search's best two lrs where its best sits at a cliff (`sweeps.plan.cliff_pair`), or None: the
    confirmation seeds run at both, and the better judges the cell."""
    best = pick_best(trials, search_score)
    if best is None:
        return None
    done = [(t.lr, t.val_loss) for t in trials if (key := search_score(t)) is not None and math.isfinite(key[0])]
    diverged = [t.lr for t in trials if t.role == "search" and t.status == "diverged"]
    return cliff_pair(best.lr, done, diverged)  # type: ignore[arg-type]


@dataclass
class Cell:
    """One (optimizer, batch size) of a report, built whole by `make_cell` and not changed after: what it
    derives from its runs is worked out once (a simulated sweep builds thousands of reports)."""

    optimizer: str
    batch_size: int
    trials: list[TrialResult]
    best: TrialResult | None = None
    confirmations: list[TrialResult] = field(default_factory=list)  # every run at the best lr, by seed
    planned: int = 0
    retreated_from: float | None = None  # the lowest lr above the best at which a confirmation run diverged
    warmup: int | float | None = None  # of the confirmation runs (None: the spec's own, not searched)
    warmups_tried: list[tuple[int | float | None, float | None]] = field(default_factory=list)  # at the best lr
    # its second lr (`sweeps.plan.check_lr`: the other of the search's best two at a cliff, or the check of
    # a verdict the answer rests on) and the confirmation seeds run there. Where they read better
    # (`second_is_better`) the two swap: the cell's lr, runs and loss are the better lr's, and
    # `searched_lr` says the search had picked the other. Taking the lower of two means biases the loss
    # low, by at most ~0.56 sd of the cell's mean where the two read alike (tests/sweeps/test_estimates.py);
    # one seed's pick, where the optimum is sharp, can miss by several times the tolerance (the measured
    # trade is in docs/researchers.md)
    check_lr: float | None = None
    check_runs: list[TrialResult] = field(default_factory=list)
    searched_lr: float | None = None  # the search's own pick, where the cell is judged at its second lr

    @functools.cached_property
    def completed(self) -> list[TrialResult]:
        return [t for t in self.confirmations if t.status == "completed"]

    @functools.cached_property
    def samples(self) -> list[float]:
        return [t.val_loss for t in self.completed]  # type: ignore[misc]

    @functools.cached_property
    def by_seed(self) -> dict[int, float]:
        """Final val loss of each completed confirmation run, by seed: what pairs cells."""
        return {t.seed: t.val_loss for t in self.completed}  # type: ignore[misc]

    @functools.cached_property
    def mean(self) -> float | None:
        return statistics.fmean(self.samples) if self.samples else None

    @functools.cached_property
    def tried_elsewhere(self) -> bool:
        """Confirmation runs ran at an lr other than the best too: a check (`check_runs`), or a retreat or
        probe's lrs where runs diverged."""
        return self.best is not None and any(
            t.role == "confirm" and not math.isclose(t.lr, self.best.lr, rel_tol=LR_REL_TOL) for t in self.trials
        )

    @functools.cached_property
    def untried_below(self) -> bool:
        """Confirmation runs diverged at the best lr and no lr below it trained to the end (none tried, or
        pruned): the divergence says the lr may be too high, not that the batch size is bad, and nothing
        measured says which."""
        if self.best is None or not any(t.status == "diverged" for t in self.confirmations):
            return False
        below = self.best.lr * (1.0 - LR_REL_TOL)
        return not any(t.lr < below and t.status == "completed" for t in self.trials if t.role == "search")

    @functools.cached_property
    def unstable_reason(self) -> str | None:
        """Why the planned confirmation runs at the best lr did not all complete, or why the cell has no
        best lr although its search ran (every lr tried diverged, with the lrs); None when neither."""
        if self.best is None:
            return _no_lr_reason([t for t in self.trials if t.role == "search"])
        counts = {s: sum(1 for t in self.confirmations if t.status == s) for s in ("diverged", "failed", "pruned")}
        counts["missing"] = max(0, self.planned - len(self.confirmations))
        if len(self.completed) >= self.planned:
            return None
        parts = ", ".join(f"{n} {what}" for what, n in counts.items() if n)
        return (
            f"{len(self.completed)} of {self.planned} confirmation runs at lr={self.best.lr:.3g} completed "
            f"({parts}): unstable at its best lr"
            + ("; no lower lr trained to the end, so the bracket leaves it undecided" if self.untried_below else "")
        )


def _no_lr_reason(searched: list[TrialResult]) -> str | None:
    """Why a cell whose search ran has no lr: its search trials' ends, the diverged ones' lrs named."""
    if not searched:
        return None
    diverged = sorted(t.lr for t in searched if t.status == "diverged")
    lrs = ", ".join(f"{lr:.3g}" for lr in diverged)
    if len(diverged) == len(searched):
        return f"unstable: every lr tried diverged (lr={lrs}); no lr trained to the end"
    counts = {s: sum(1 for t in searched if t.status == s) for s in ("diverged", "failed", "pruned")}
    parts = ", ".join(f"{n} {what}" for what, n in counts.items() if n)
    return f"no lr trained to the end ({parts}" + (f"; diverged at lr={lrs}" if diverged else "") + ")"


def second_is_better(first: list[TrialResult], second: list[TrialResult]) -> bool:
    """The runs at a cell's second lr judge it: every one completed, and on the seeds both lrs ran (by
    seed, so that what a seed shares cancels) their mean is lower than that of the completed runs at
    the first."""
    if not second or any(t.status != "completed" for t in second):
        return False
    at_first = {t.seed: t.val_loss for t in first if t.status == "completed"}
    both = [(at_first[t.seed], t.val_loss) for t in second if t.seed in at_first]
    return bool(both) and statistics.fmean(b for _, b in both) < statistics.fmean(a for a, _ in both)  # type: ignore[misc]


def make_cell(optimizer: str, batch_size: int, trials: list[TrialResult], planned: int) -> Cell:
    cell = Cell(optimizer, batch_size, trials, planned=planned)
    diverged = [t.lr for t in trials if t.role == "confirm" and t.status == "diverged"]
    cell.best = pick_stable(trials, search_score, diverged)
    if cell.best is not None:
        lr = cell.best.lr
        above = [d for d in diverged if d > lr * (1.0 + LR_REL_TOL)]
        cell.retreated_from = min(above) if above else None
        at_lr = [t for t in trials if t.role == "warmup" and math.isclose(t.lr, lr, rel_tol=LR_REL_TOL)]
        if at_lr:
            cell.warmup = pick_warmup(
                [(cell.best.val_loss, -1, cell.best.warmup)]  # type: ignore[list-item]
                + [
                    (t.val_loss, t.number if t.number is not None else i, t.warmup)
                    for i, t in enumerate(at_lr)
                    if t.status == "completed"
                ]
            )
            cell.warmups_tried = [(cell.best.warmup, cell.best.val_loss)] + [
                (t.warmup, t.val_loss if t.status == "completed" else None) for t in at_lr
            ]
        else:
            cell.warmup = cell.best.warmup

        def runs_at(x: float) -> list[TrialResult]:
            return sorted(
                (
                    t
                    for t in trials
                    if t.role == "confirm"
                    and math.isclose(t.lr, x, rel_tol=LR_REL_TOL)
                    and (t.warmup == cell.warmup or not at_lr)
                ),
                key=lambda t: t.seed,
            )

        cell.confirmations = runs_at(lr)
        searched = [t for t in trials if search_score(t) is not None]
        cell.check_lr = check_lr(lr, [(t.lr, t.val_loss) for t in searched], diverged, search_pair(trials))  # type: ignore[misc]
        cell.check_runs = runs_at(cell.check_lr) if cell.check_lr is not None else []
        if second_is_better(cell.confirmations, cell.check_runs):
            # the cell is judged at the better of its two lrs: its lr, runs, loss and verdicts are those
            # there, and the search's own pick becomes the second lr (the warm-ups tried stay the pick's)
            at = [t for t in searched if math.isclose(t.lr, cell.check_lr, rel_tol=LR_REL_TOL)]  # type: ignore[arg-type]
            cell.best = pick_best(at, search_score)
            cell.check_lr, cell.searched_lr = lr, lr
            cell.confirmations, cell.check_runs = cell.check_runs, cell.confirmations
        # adaptive confirmation may have given this cell more runs than the minimum: all of them count
        cell.planned = max(planned, len(cell.confirmations))
    return cell
