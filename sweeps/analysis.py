"""The answer of a sweep: from trial results to "the largest batch size without degradation".

Pure: no torch, no Ray, no MLflow. `build_report` takes the trials' results (`TrialResult`) and the sweep's
`SweepSpec` (what it reads of it: `build_report`'s docstring) and returns the `Report`, a pydantic model
that `report_to_json` writes and `read_report` reads back: per cell (optimizer, batch size) its best lr, the
mean and interval of its confirmation runs, its stability and its verdicts against two references; per
optimizer the point estimate (the walk of the cell means on the same seeds, fitted non-decreasing), the
bracket (paired verdicts: fine claimed in a fixed sequence, degraded at a Bonferroni level) and the noise
checks at the answer. The search decides by the same rules (`pick_stable` and `pick_warmup`, of
`sweeps.cells`; `cells_to_extend`).

Every rule and formula: docs/researchers.md, "How a verdict is reached".
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sweeps.batch_axis import bracket_of
from sweeps.cells import LR_REL_TOL, Cell, make_cell, pick_best, pick_stable, pick_warmup, search_score
from sweeps.report import (
    BatchSearchReport,
    Bracket,
    ByReference,
    CellReport,
    LrCheck,
    NoiseCheck,
    OptimizerReport,
    Report,
    SearchStep,
    TrialStatusCounts,
    Verdict,
    describe_bracket,
    lr_edge_warnings,
    read_report,
    report_to_json,
    target_loss_of,
    upgrade_report,
    validate_report,
)
from sweeps.results import ROLES, STATUSES, TrialResult
from sweeps.stats import (
    CI_LEVEL,
    mean_ci95,
    monotone_fit,
    paired_diff_ci,
    seed_adjusted_means,
    t_quantile,
    welch_diff_ci95,
)

if TYPE_CHECKING:
    # for the annotations only: the spec imports worker.config, and the dashboards, which import this
    # module, load nothing of worker (tests/dashboards/test_dash_mlflow.py); the spec is read by attribute
    from sweeps.spec import SweepSpec

__all__ = [
    "CI_LEVEL",
    "LR_EDGE_FACTOR",
    "ROLES",
    "SCHEMA_VERSION",
    "STATUSES",
    "CellReport",
    "NoiseCheck",
    "OptimizerReport",
    "Report",
    "TrialResult",
    "BatchSearchReport",
    "Bracket",
    "SearchStep",
    "build_report",
    "describe_bracket",
    "lr_edge_warnings",
    "cells_to_check",
    "cells_to_decide_ends",
    "cells_to_extend",
    "noise_level",
    "paired_diff_ci",
    "pick_best",
    "pick_stable",
    "pick_warmup",
    "mean_ci95",
    "monotone_fit",
    "report_to_json",
    "t_quantile",
    "read_report",
    "upgrade_report",
    "validate_report",
    "fine_in_sequence",
    "verdict_level",
    "welch_diff_ci95",
]

SCHEMA_VERSION = 3
# best lr within this factor of lr_min or lr_max (log distance ln 1.5) is "at the edge" of the search.
LR_EDGE_FACTOR = 1.5


# --------------------------------------------------------------------------------------------------
# The report
# --------------------------------------------------------------------------------------------------


def _lr_at_edge(lr: float, lr_min: float, lr_max: float) -> bool:
    return lr <= lr_min * LR_EDGE_FACTOR or lr >= lr_max / LR_EDGE_FACTOR


def noise_level(looks: int) -> float:
    """Confidence level of each noise check: 95% over `looks` planned looks, split evenly (Bonferroni)."""
    return 1.0 - (1.0 - CI_LEVEL) / looks


def _reference_value(row: Sequence[Cell], means: dict[tuple[str, int], float]) -> float | None:
    """The reference's value for the point estimate: the seed-adjusted mean of the optimizer's first cell,
    fitted non-decreasing together with its larger stable cells (`monotone_fit`, weighted by samples; the
    fit's first value). At the first position the fit is the smallest weighted mean of a leading run of
    cells, so it never exceeds the cell's own mean: a reference that seed noise made high, with larger
    batch sizes reading lower, is pooled with them instead of loosening every threshold of the walk.
    An unstable first cell's plain mean; None without a mean."""
    first = row[0] if row else None
    if first is None or first.mean is None or first.unstable_reason is not None:
        return first.mean if first is not None else None
    stable = [c for c in row if c.mean is not None and c.unstable_reason is None]
    fit = monotone_fit(
        [means.get((c.optimizer, c.batch_size), c.mean) for c in stable],  # type: ignore[misc]
        [len(c.samples) for c in stable],
    )
    return fit[0]


def _judge(
    cells: list[Cell],
    ref: Cell | None,
    tol: float,
    is_ref_cell: Any,
    level: float,
    means: dict[tuple[str, int], float],
    ref_mean: float | None,
) -> tuple[list[bool | None], int | None, bool | None, list[NoiseCheck], list[float | None]]:
    """Per-cell verdicts, the answer, within_noise, the noise checks and the fitted means against one
    reference. `means`: the stable cells' means on the same seeds (`seed_adjusted_means`); a cell
    without one (unstable) has its plain mean. `ref_mean`: the reference's value (`_reference_value`)."""

    def mean_of(c: Cell) -> float | None:
        return means.get((c.optimizer, c.batch_size), c.mean)

    if ref is None or ref_mean is None:
        return [None] * len(cells), None, None, [], [None] * len(cells)
    threshold = (1.0 + tol) * ref_mean
    # the stable cells with a mean other than the reference cell, fitted non-decreasing in batch size
    judged = [i for i, c in enumerate(cells) if c.mean is not None and c.unstable_reason is None and not is_ref_cell(c)]
    fitted: list[float | None] = [None] * len(cells)
    fit = monotone_fit([mean_of(cells[i]) for i in judged], [len(cells[i].samples) for i in judged])  # type: ignore[misc]
    for i, value in zip(judged, fit, strict=True):
        fitted[i] = value
    verdicts: list[bool | None] = []
    for c, value in zip(cells, fitted, strict=True):
        if c.mean is None:
            verdicts.append(None)
        elif c.unstable_reason is not None:
            verdicts.append(False)  # diverged, failed or missing confirmation runs: a degradation
        elif is_ref_cell(c):
            verdicts.append(True)
        else:
            verdicts.append(value <= threshold)  # type: ignore[operator]
    for i, c in enumerate(cells):
        if is_ref_cell(c) and c.mean is not None and c.unstable_reason is None:
            fitted[i] = ref_mean  # the reference's value the thresholds are taken from

    answer_idx: int | None = None
    for i, v in enumerate(verdicts):
        if v is not True:
            break
        answer_idx = i
    answer = cells[answer_idx].batch_size if answer_idx is not None else None

    # Boundary cells: the answer and the next larger batch size (the smallest one when there is no answer).
    boundary = [0] if answer_idx is None else [answer_idx, answer_idx + 1]
    boundary = [i for i in boundary if i < len(cells)]
    checks: list[NoiseCheck] = []
    for i in boundary:
        c = cells[i]
        if c.mean is None or is_ref_cell(c) or c.unstable_reason is not None:
            continue
        ci = welch_diff_ci95(c.samples, ref.samples, 1.0 + tol, level)  # type: ignore[union-attr]
        d = c.mean - (1.0 + tol) * mean_of(ref)  # type: ignore[arg-type,operator]  # not the fitted reference
        if ci is None:
            checks.append(NoiseCheck(batch_size=c.batch_size, diff_mean=d, diff_ci95=None, straddles_zero=None))
        else:
            checks.append(
                NoiseCheck(
                    batch_size=c.batch_size,
                    diff_mean=ci[0],
                    diff_ci95=(ci[1], ci[2]),
                    straddles_zero=ci[1] <= 0.0 <= ci[2],
                )
            )
    if any(ch.straddles_zero is True for ch in checks):
        within: bool | None = True
    elif checks and all(ch.straddles_zero is False for ch in checks):
        within = False
    else:
        within = None
    return verdicts, answer, within, checks, fitted


def verdict_level(looks: int, comparisons: int = 1) -> float:
    """Confidence of a verdict's interval, two-sided: 95% over `looks` planned looks and `comparisons`
    batch sizes (Bonferroni). Its upper end ("fine") is taken at `comparisons` = 1, as the fine claims are
    made in a fixed sequence (`fine_in_sequence`); its lower end ("degraded") at the sizes compared."""
    return 1.0 - (1.0 - CI_LEVEL) / (max(1, looks) * max(1, comparisons))


def fine_in_sequence(verdicts: Sequence[Verdict], tested: Sequence[bool]) -> list[Verdict]:
    """Fixed-sequence testing of the "fine" claims, ordered by batch size, under the monotonicity the answer
    assumes: "fine" is claimed upward from the smallest size and stops at the first size not fine; an
    interval's "fine" past the stop is "undecided". A false "fine" needs the first truly degraded size
    claimed fine: one test, so the fine claims together err with at most its 2.5% (one-sided), whatever the
    number of sizes. `tested[i]`: verdict i came from an interval; the others (a reference, a batch size
    with no lr stable for every seed) stand as they are, and count in the sequence as what they say."""
    out = list(verdicts)
    stopped = False
    for i, v in enumerate(verdicts):
        if v != "fine":
            stopped = True
        elif stopped and tested[i]:
            out[i] = "undecided"
    return out


@dataclass(frozen=True)
class _Judged:
    """One optimizer's cells against one reference: the verdicts claimed, the intervals they rest on, and
    the verdicts each cell's own interval gives (before the fixed sequence: the monotonicity check)."""

    verdicts: list[Verdict | None]
    intervals: list[tuple[float, float] | None]
    own: list[Verdict | None]


def _verdicts(
    cells: list[Cell],
    ref: Cell | None,
    tol: float,
    is_ref_cell: Callable[[Cell], bool],
    looks: int,
    comparisons: int | None = None,
) -> _Judged:
    """Per cell: fine / degraded / undecided against one reference, and the paired interval it rests on (its
    lower end at `verdict_level(looks, comparisons)`, its upper end at `verdict_level(looks)`).
    `comparisons`: the Bonferroni count of the degraded claims (default: the cells compared)."""
    if ref is None or ref.mean is None:
        return _Judged([None] * len(cells), [None] * len(cells), [None] * len(cells))
    if comparisons is None:
        comparisons = sum(1 for c in cells if not is_ref_cell(c))
    # a cell confirmed at a second lr is judged at the better of the two (`sweeps.cells.second_is_better`):
    # its fine claim at the level of two, as the choice may fall on either
    lower_level = verdict_level(looks, comparisons)
    ref_by_seed = ref.by_seed
    verdicts: list[Verdict] = []
    tested: list[bool] = []
    intervals: list[tuple[float, float] | None] = []
    for c in cells:
        ci = None
        # runs that diverged or failed at the cell's lr (after any retreat): no lr stable for every seed.
        # Runs that are only missing (a cancelled sweep, a retreat the budget had no room for) decide nothing.
        broken = c.unstable_reason is not None and any(t.status in ("diverged", "failed") for t in c.confirmations)
        if is_ref_cell(c):
            verdict: Verdict = "degraded" if broken else "fine"
        elif broken and c.untried_below and not any(t.status == "failed" for t in c.confirmations):
            verdict = "undecided"  # diverged at the highest lr that trained, nothing lower tried: lr or size?
        elif broken:
            verdict = "degraded"  # a degradation, whatever the mean
        elif c.mean is None:
            ended = [t.status for t in c.trials]
            verdict = "degraded" if ended and all(s == "diverged" for s in ended) else "undecided"
        else:
            upper_level = verdict_level(looks, 2 if c.check_runs else 1)
            verdict, ci = _paired_verdict(c.by_seed, ref_by_seed, tol, lower_level, upper_level)
        verdicts.append(verdict)
        tested.append(ci is not None)
        intervals.append(ci)
    return _Judged([*fine_in_sequence(verdicts, tested)], intervals, [*verdicts])


def _paired_verdict(
    by_seed: dict[int, float], ref_by_seed: dict[int, float], tol: float, lower_level: float, upper_level: float
) -> tuple[Verdict, tuple[float, float] | None]:
    """Fine, degraded or undecided from the paired interval of loss - (1 + tol) x reference by seed (its
    lower end at `lower_level`, its upper end at `upper_level`), and the interval; None without one."""
    lower = paired_diff_ci(by_seed, ref_by_seed, 1.0 + tol, lower_level)
    upper = paired_diff_ci(by_seed, ref_by_seed, 1.0 + tol, upper_level)
    if lower is None or upper is None:
        return "undecided", None
    ci = (lower[1], upper[2])
    return ("fine" if ci[1] < 0.0 else "degraded" if ci[0] > 0.0 else "undecided"), ci


def _bracket(cells: list[Cell], judged: _Judged) -> Bracket:
    """The answer as a bracket: the largest batch size that is fine with every smaller one fine, and the
    smallest degraded one above it; batch sizes whose own interval says fine above a degraded one
    contradict monotonicity."""
    largest_fine, smallest_degraded = bracket_of({c.batch_size: v for c, v in zip(cells, judged.verdicts, strict=True)})
    first_degraded = next((c.batch_size for c, v in zip(cells, judged.verdicts, strict=True) if v == "degraded"), None)
    contradictions = [
        c.batch_size
        for c, v in zip(cells, judged.own, strict=True)
        if v == "fine" and first_degraded is not None and c.batch_size > first_degraded
    ]
    edge = next((c for c in cells if c.batch_size == smallest_degraded), None)
    return Bracket(
        largest_fine=largest_fine,
        smallest_degraded=smallest_degraded,
        contradictions=contradictions,
        lr_checked=None if edge is None else edge.tried_elsewhere,
    )


def _verdict_rule(looks: int) -> str:
    return (
        "per batch size, the paired differences by seed d_s = loss(B, s) - (1 + tolerance) x loss(reference, s) "
        "(seed s has the same init and data order at every batch size): fine when the upper end of their "
        "Student-t interval is below 0, degraded when the lower end is above 0 or the batch size has no lr "
        "stable for every seed (where runs diverged at its highest lr trained and no lower lr trained to the "
        "end, undecided: the lr may be the cause), else undecided. The interval's lower end is taken at "
        f"1 - 0.05 / (looks x comparisons) (Bonferroni over the batch sizes compared and {looks} planned "
        "look(s)); its upper end at 1 - 0.05 / looks, the fine claims made in a fixed sequence (upward from "
        "the smallest size, stopping at the first size not fine): so that the bracket [largest_fine, "
        "smallest_degraded) holds the answer with at least 95% confidence, assuming that degradation is "
        "monotone in batch size and that each batch size is judged at the lr it confirmed. The size above "
        "the answer, while not fine, and its reference, and a size decided degraded at the edge of the "
        "answer, are confirmed on the same seeds at a second lr (of the nearest lrs the search trained on "
        "each side of its own, the one whose search run read lower; for the degraded edge, where that run "
        "read within seed noise and within the excess; where seeds.max allows: lr_check; a size whose best "
        "lr sits at a stability cliff, at the other of the search's best two lrs, unasked) and judged at the "
        "better of the two lrs (the lower mean on the seeds both ran, every run there completed: its lr, "
        "runs and loss are then that lr's), its fine claim at 1 - 0.05 / (2 x looks). Where none ran, the "
        "bracket says its smallest degraded size holds at its chosen lr"
    )


def _noise_rule(looks: int) -> str:
    if looks == 1:
        return "Welch 95% interval of each boundary difference, one look"
    return (
        f"Welch {noise_level(looks):.2%} interval of each boundary difference: 95% split evenly over {looks} "
        f"planned looks (Bonferroni), as adaptive confirmation looks again after adding runs"
    )


def cells_to_extend(
    report: Report, *, seeds_max: int, references: tuple[str, ...] = ("self", "baseline")
) -> list[tuple[str, int]]:
    """Adaptive confirmation's next step: the (optimizer, batch size) cells that need more runs. For every
    bracket not yet narrow (an undecided batch size above `largest_fine` and below `smallest_degraded`),
    the undecided ones of the two batch sizes that decide the stated answer (the answer, and the next
    larger size tested; the smallest size when there is no answer) and the reference cell they are
    paired with, unless they already have `seeds_max` runs; of the brackets against `references` only (a
    batch search: its `against`). Sorted, unique.

    Only the answer's two sizes: runs at an undecided size away from the answer narrow the bracket but
    seldom move the answer, and cost as much (on the cliffs family of benchmarks/search_efficiency.py, runs
    at every undecided size inside the bracket cost a fifth more tokens for no better answer)."""
    out: set[tuple[str, int]] = set()
    ref_b = report.reference_batch_size
    runs = {
        (name, c.batch_size): len(c.confirmation_run_ids) for name, opt in report.optimizers.items() for c in opt.cells
    }
    for name, opt in report.optimizers.items():
        sizes = sorted(c.batch_size for c in opt.cells)
        for ref, ref_cell in (("self", name), ("baseline", report.baseline)):
            if ref not in references:
                continue
            bracket: Bracket = getattr(opt.bracket, ref)
            lo, hi = bracket.largest_fine, bracket.smallest_degraded
            answer = getattr(opt.largest_degradation_free_batch_size, ref)
            above = next((b for b in sizes if answer is None or b > answer), None)
            deciding = {answer, above} - {None}
            undecided = [
                (name, c.batch_size)
                for c in opt.cells
                if getattr(c.verdict, ref) == "undecided"
                and c.batch_size in deciding
                and (lo is None or c.batch_size > lo)
                and (hi is None or c.batch_size < hi)
            ]
            if undecided:
                undecided.append((ref_cell, ref_b))
            out.update(cell for cell in undecided if runs[cell] < seeds_max)
    return sorted(out)


def cells_to_decide_ends(
    report: Report,
    *,
    seeds_max: int,
    references: tuple[str, ...] = ("self", "baseline"),
    full: Collection[tuple[str, int]] = (),
) -> list[tuple[str, int]]:
    """More runs where a bracket's end, not the answer, rests on an undecided size (a study's law is fitted
    from brackets: `sweeps.law`): against each of `references`, the first size whose verdict is not fine
    where it is undecided and below the answer (it stops the fine claims short of the answer), and, with no
    size decided degraded, the smallest undecided size above the answer and the next size tested whose mean
    is outside the tolerance (degradation_free False) and that can still get runs; each with the reference
    cell it is paired with, unless it already has `seeds_max` runs. `full`: cells that can get no more runs
    whatever they have (the search planned `seeds_max` there, some went to a retreat or a check). The
    verdicts' levels are those of `cells_to_extend`'s runs: the same planned looks a cell. Sorted, unique."""
    out: set[tuple[str, int]] = set()
    ref_b = report.reference_batch_size
    runs = {
        (name, c.batch_size): seeds_max if (name, c.batch_size) in full else len(c.confirmation_run_ids)
        for name, opt in report.optimizers.items()
        for c in opt.cells
    }
    for name, opt in report.optimizers.items():
        cells = sorted(opt.cells, key=lambda c: c.batch_size)
        for ref, ref_cell in (("self", name), ("baseline", report.baseline)):
            if ref not in references:
                continue
            answer = getattr(opt.largest_degradation_free_batch_size, ref)
            wanted = []
            stop = next((c for c in cells if getattr(c.verdict, ref) != "fine"), None)
            if stop is not None and answer is not None and stop.batch_size < answer:
                if getattr(stop.verdict, ref) == "undecided" and runs[(name, stop.batch_size)] < seeds_max:
                    wanted.append((name, stop.batch_size))
            above = next((c.batch_size for c in cells if answer is None or c.batch_size > answer), None)
            if above is not None and getattr(opt.bracket, ref).smallest_degraded is None:
                end = next(
                    (
                        c
                        for c in cells
                        if c.batch_size > above
                        and getattr(c.verdict, ref) == "undecided"
                        and getattr(c.degradation_free, ref) is False
                        and runs[(name, c.batch_size)] < seeds_max
                    ),
                    None,
                )
                if end is not None:
                    wanted.append((name, end.batch_size))
            if wanted:
                wanted.append((ref_cell, ref_b))
            out.update(cell for cell in wanted if runs[cell] < seeds_max)
    return sorted(out)


def cells_to_check(report: Report, *, references: tuple[str, ...] = ("self", "baseline")) -> list[tuple[str, int]]:
    """The (optimizer, batch size) cells whose verdict an answer rests on at one lr, to be confirmed at their
    second lr (`sweeps.plan.check_lr`) on the same seeds, where they have one not tried yet (no runs there,
    no run diverged above their lr). Against each of `references`:
    - the size above the answer (the smallest when there is none) while its interval does not say fine, and
      the reference cell it is paired with, each where one seed cannot tell its two lrs apart
      (`_within_noise`): the search chose both lrs from one seed's runs, and an lr off the optimum makes
      the size read degraded, or the reference too good (on the recorded real runs of
      benchmarks/replay_accuracy.py every miss rests on such a cell);
    - the bracket's smallest degraded size, degraded by its interval (not by runs that diverged or failed),
      where besides the second lr leaves room to read under the line (`_within_reach`).
    The search confirms them there where the seeds' budget allows. Sorted, unique."""
    out: set[tuple[str, int]] = set()
    ref_b = report.reference_batch_size
    ref_cells = {name: c for name, opt in report.optimizers.items() for c in opt.cells if c.batch_size == ref_b}
    for name, opt in report.optimizers.items():
        cells = {c.batch_size: c for c in opt.cells}
        for ref in references:
            answer = getattr(opt.largest_degradation_free_batch_size, ref)
            above = next((b for b in sorted(cells) if answer is None or b > answer), None)
            ref_name = name if ref == "self" else report.baseline
            ref_cell = ref_cells.get(ref_name)
            for b in {above, getattr(opt.bracket, ref).smallest_degraded} - {None}:
                c = cells[b]  # type: ignore[index]
                verdict, interval = getattr(c.verdict, ref), getattr(c.verdict_diff_ci, ref)
                if interval is None or not _may_check(c):
                    continue
                if b == above and verdict in ("degraded", "undecided") and _within_noise(c):
                    out.add((name, b))  # type: ignore[arg-type]
                    if ref_cell is not None and _may_check(ref_cell) and _within_noise(ref_cell):
                        out.add((ref_name, ref_b))
                elif verdict == "degraded" and _within_reach(c, getattr(opt.reference_val_loss, ref), report):
                    out.add((name, b))  # type: ignore[arg-type]
    return sorted(out)


def _may_check(c: CellReport) -> bool:
    """A second lr not tried yet, none of the cell's runs diverged above its lr, and runs to pair with."""
    check = c.lr_check
    return check is not None and check.runs == 0 and c.retreated_from_lr is None and len(c.val_losses) >= 2


def _within_noise(c: CellReport) -> bool:
    """The search's runs at the cell's two lrs (one seed, so its effect cancels) differ by less than one
    seed-to-seed sd of the cell's runs: one seed cannot tell them apart."""
    check = c.lr_check
    if check is None or c.search_best_val_loss is None:
        return False
    return check.search_val_loss - c.search_best_val_loss < statistics.stdev(c.val_losses)


def _within_reach(c: CellReport, ref_loss: float | None, report: Report) -> bool:
    """`_within_noise`, and the search's run at the second lr read worse by less than the cell's excess over
    the line: room for the second lr to read under it."""
    check = c.lr_check
    if check is None or ref_loss is None or c.val_loss_mean is None or c.search_best_val_loss is None:
        return False
    excess = c.val_loss_mean - (1.0 + report.tolerance) * ref_loss
    return _within_noise(c) and check.search_val_loss - c.search_best_val_loss < excess


def _to_reference(cell: Cell, target: float | None, seq_len: int) -> tuple[int | None, int | None]:
    """Steps and tokens until the cell's first confirmation run reached the target loss; None: it never did."""
    if not cell.completed or target is None:
        return None, None
    for tokens, loss in sorted(cell.completed[0].curve, key=lambda p: p[0]):
        if math.isfinite(loss) and loss <= target:
            return tokens // (cell.batch_size * seq_len), tokens
    return None, None


def build_report(
    results: Iterable[TrialResult | dict[str, Any]],
    *,
    spec: SweepSpec,
    steps: dict[str, list[dict[str, Any]]] | None = None,
) -> Report:
    """The sweep's report (rules: this module's docstring).

    What it reads of `spec`: its name, optimizers (in order), degradation (baseline, tolerance), lr range
    and extend, seeds (`seeds_min` planned per cell, `noise_looks`), model.seq_len, `trained_tokens`, the
    schedule's warm-up (in words) and the batch axis (`lattice`, `reference_batch_size`, `batch_search`).
    Results may be `TrialResult`s or their dicts. A result of an optimizer or batch size outside the spec
    is refused (ValueError). `steps` (a search of the batch axis): per optimizer, the sizes in the order the
    search chose them, each {"batch_size", "chosen", "why"} (`sweeps.batch_axis`), reported as they are.
    """
    by_cell = _by_cell(spec, [r if isinstance(r, TrialResult) else TrialResult.from_dict(r) for r in results])
    steps = steps or {}
    chosen = {(o, st["batch_size"]): st["chosen"] for o, sts in steps.items() for st in sts}
    baseline = spec.degradation.baseline
    cells = {
        o: [make_cell(o, b, by_cell[(o, b)], spec.seeds_min) for b in _sizes_of(spec, o, by_cell, chosen)]
        for o in spec.optimizer_names
    }
    # the point estimate compares every stable cell on the same seeds (cells given more runs by adaptive
    # confirmation are the answer's two and their references)
    means = seed_adjusted_means(
        {(c.optimizer, c.batch_size): c.by_seed for row in cells.values() for c in row if c.unstable_reason is None}
    )
    ref_values = {o: _reference_value(row, means) for o, row in cells.items()}
    optimizers = {
        o: _optimizer_report(spec, cells[o], cells[baseline][0], means, ref_values, chosen, steps.get(o, []))
        for o in spec.optimizer_names
    }
    search = spec.batch_search
    return Report(
        schema_version=SCHEMA_VERSION,
        sweep=spec.name,
        reference_batch_size=spec.reference_batch_size,
        baseline=baseline,
        tolerance=spec.degradation.tolerance,
        seq_len=spec.model.seq_len,
        lr_range=(spec.lr.min, spec.lr.max),
        lr_bounds=_lr_reach(spec),
        seeds_planned=spec.seeds_min,
        trained_tokens=spec.trained_tokens,
        noise_rule=_noise_rule(spec.noise_looks),
        verdict_rule=_verdict_rule(spec.noise_looks),
        warmup=spec.schedule.describe_warmup(),
        batch_search=None
        if search is None
        else BatchSearchReport(**search.model_dump(mode="json"), lattice=spec.lattice, assumption=_MONOTONE),
        optimizers=optimizers,
        warnings=[],  # filled by the driver: data repeated, best lr at the edge of the range
    )


def _lr_reach(spec: SweepSpec) -> tuple[float, float]:
    """The report's `lr_bounds`: [lr.min / lr.extend, lr.max x lr.extend], where a best lr counts as at the
    edge (`_lr_at_edge`). Not capped at worker.config.MAX_LR as `LRSearchSpec.bounds` (the lrs the search
    tries) is: the two differ only where lr.max x lr.extend > MAX_LR."""
    return spec.lr.min / spec.lr.extend, spec.lr.max * spec.lr.extend


def _by_cell(spec: SweepSpec, trials: list[TrialResult]) -> dict[tuple[str, int], list[TrialResult]]:
    """The trials of each (optimizer, batch size) the spec may train; ValueError for one outside it."""
    optimizers, sizes = spec.optimizer_names, spec.lattice
    by_cell: dict[tuple[str, int], list[TrialResult]] = {(o, b): [] for o in optimizers for b in sizes}
    stray = sorted({(t.optimizer, t.batch_size) for t in trials if (t.optimizer, t.batch_size) not in by_cell})
    if stray:
        raise ValueError(f"results for cells outside the sweep {stray}; optimizers {optimizers}, batch_sizes {sizes}")
    for t in trials:
        by_cell[(t.optimizer, t.batch_size)].append(t)
    return by_cell


def _sizes_of(
    spec: SweepSpec,
    optimizer: str,
    by_cell: dict[tuple[str, int], list[TrialResult]],
    chosen: dict[tuple[str, int], str],
) -> list[int]:
    """A list sweep judges every batch size; a search the reference and the sizes it tested."""
    if spec.batch_search is None:
        return spec.lattice
    tested = {b for (o, b), ts in by_cell.items() if o == optimizer and ts}
    tested |= {b for o, b in chosen if o == optimizer}
    return sorted(tested | {spec.reference_batch_size})


def _optimizer_report(
    spec: SweepSpec,
    row: list[Cell],
    baseline_ref: Cell,
    means: dict[tuple[str, int], float],
    ref_values: dict[str, float | None],
    chosen: dict[tuple[str, int], str],
    steps: list[dict[str, Any]],
) -> OptimizerReport:
    """One optimizer's cells judged against itself at the smallest batch size and against the baseline."""
    ref_b, tol, o = spec.reference_batch_size, spec.degradation.tolerance, row[0].optimizer
    baseline, looks, listed = spec.degradation.baseline, spec.noise_looks, spec.batch_search is None
    self_ref = row[0]
    level = noise_level(looks)
    # a search chooses the sizes it tests from the verdicts: the level must hold for every size it could test
    comparisons = None if listed else len(spec.lattice) - 1

    def is_self_ref(c: Cell) -> bool:
        return c.batch_size == ref_b

    def is_base_ref(c: Cell) -> bool:
        return c.optimizer == baseline and c.batch_size == ref_b

    v_self, ans_self, noise_self, checks_self, fit_self = _judge(
        row, self_ref, tol, is_self_ref, level, means, ref_values[o]
    )
    v_base, ans_base, noise_base, checks_base, fit_base = _judge(
        row, baseline_ref, tol, is_base_ref, level, means, ref_values[baseline]
    )
    judged_self = _verdicts(row, self_ref, tol, is_self_ref, looks, comparisons)
    target = target_loss_of(ref_values[o], tol)
    judged_base = _verdicts(row, baseline_ref, tol, is_base_ref, looks, comparisons)
    cell_reports = [
        _cell_report(
            spec,
            c,
            target,
            chosen.get((o, c.batch_size), "listed" if listed else None),
            fitted=ByReference(self=fit_self[i], baseline=fit_base[i]),
            degradation_free=ByReference(self=v_self[i], baseline=v_base[i]),
            verdict=ByReference(self=judged_self.verdicts[i], baseline=judged_base.verdicts[i]),
            verdict_diff_ci=ByReference(self=judged_self.intervals[i], baseline=judged_base.intervals[i]),
        )
        for i, c in enumerate(row)
    ]
    brackets = ByReference(self=_bracket(row, judged_self), baseline=_bracket(row, judged_base))
    return OptimizerReport(
        cells=cell_reports,
        reference_val_loss=ByReference(self=self_ref.mean, baseline=baseline_ref.mean),
        target_loss=target,
        largest_degradation_free_batch_size=ByReference(self=ans_self, baseline=ans_base),
        bracket=brackets,
        smallest_degraded_batch_size=ByReference(
            self=brackets.self.smallest_degraded, baseline=brackets.baseline.smallest_degraded
        ),
        search_steps=[SearchStep(**st, order=i + 1) for i, st in enumerate(steps)],
        within_noise=ByReference(self=noise_self, baseline=noise_base),
        noise_checks=ByReference(self=checks_self, baseline=checks_base),
    )


def _cell_report(
    spec: SweepSpec,
    c: Cell,
    target: float | None,
    chosen: str | None,
    *,
    fitted: ByReference[float | None],
    degradation_free: ByReference[bool | None],
    verdict: ByReference[Verdict | None],
    verdict_diff_ci: ByReference[tuple[float, float] | None],
) -> CellReport:
    to_ref_steps, tokens = _to_reference(c, target, spec.model.seq_len)
    if c.samples:
        mean, lo, hi, avail = mean_ci95(c.samples)
        ci: tuple[float | None, float | None] = (lo, hi)
    else:
        mean, ci, avail = None, (None, None), False
    best_lr = c.best.lr if c.best is not None else None
    trained = {t.tokens for t in c.completed}
    return CellReport(
        batch_size=c.batch_size,
        best_lr=best_lr,
        search_best_val_loss=c.best.val_loss if c.best is not None else None,
        search_best_run_id=c.best.run_id if c.best is not None else None,
        search_best_trial_number=c.best.number if c.best is not None else None,
        val_loss_mean=mean,
        val_loss_ci95=ci,
        ci_available=avail,
        val_losses=list(c.samples),
        seeds=len(c.samples),
        confirmation_run_ids=[t.run_id for t in c.confirmations],
        stable=c.unstable_reason is None if c.best is not None else None,
        unstable_reason=c.unstable_reason,
        tokens_trained=max(trained) if trained else None,
        trials=len(c.trials),
        trial_status=TrialStatusCounts(**{s: sum(1 for t in c.trials if t.status == s) for s in STATUSES}),
        lr_at_edge=_lr_at_edge(best_lr, *_lr_reach(spec)) if best_lr is not None else None,
        lr_outside_range=None
        if best_lr is None
        else not spec.lr.min * (1 - LR_REL_TOL) <= best_lr <= spec.lr.max * (1 + LR_REL_TOL),
        val_loss_fitted=fitted,
        degradation_free=degradation_free,
        verdict=verdict,
        verdict_diff_ci=verdict_diff_ci,
        retreated_from_lr=c.retreated_from,
        lr_check=None
        if c.check_lr is None
        else LrCheck(
            lr=c.check_lr,
            search_val_loss=min(
                t.val_loss  # type: ignore[misc]
                for t in c.trials
                if search_score(t) is not None and math.isclose(t.lr, c.check_lr, rel_tol=LR_REL_TOL)
            ),
            val_losses=[t.val_loss for t in c.check_runs if t.status == "completed"],  # type: ignore[misc]
            runs=len(c.check_runs),
            diverged=sum(1 for t in c.check_runs if t.status == "diverged"),
            searched=c.searched_lr is not None,
        ),
        warmup=c.warmup,
        warmups_tried=c.warmups_tried,
        steps_to_reference=to_ref_steps,
        tokens_to_reference=tokens,
        chosen=chosen,
    )


_MONOTONE = (
    "degradation is monotone in batch size: a size above a degraded one is degraded too, and one below a fine "
    "one fine; the search tests only the sizes that move the bracket, so a tested size that contradicts this "
    "(fine above a degraded one) is listed in the bracket's contradictions, and the bracket there is in doubt"
)
