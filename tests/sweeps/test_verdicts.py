"""The answer with error control: paired verdicts by seed, the bracket, and the retreat from a diverged lr.

The statistics are tested with exact values; the confidence statement by simulating sweeps through the
real `build_report` and `cells_to_extend` (adaptive seeds) and counting how often the bracket misses the
truth; the retreat through `sweeps.simulate` (the searcher's own decisions) and `build_report`.
"""

from __future__ import annotations

import math
import statistics
from typing import Any

import numpy as np
import pytest
from harness import tiny_spec
from spec_helpers import spec_for

from sweeps.analysis import (
    Report,
    TrialResult,
    build_report,
    cells_to_check,
    cells_to_extend,
    describe_bracket,
    fine_in_sequence,
    paired_diff_ci,
    pick_stable,
    seed_adjusted_means,
    t_quantile,
    verdict_level,
)
from sweeps.cells import second_is_better
from sweeps.plan import PROBE_STEP, coarse_lrs
from sweeps.simulate import Run, simulate
from sweeps.spec import SweepSpec, cell_search_trials

BATCHES = (8, 16, 32, 64, 128)


def spec_of(*, looks: int = 1, seeds: int = 2, batches: tuple[int, ...] = BATCHES) -> SweepSpec:
    return spec_for(
        name="verdicts", batch_sizes=batches, tolerance=0.01, lr=(1e-4, 1e-1), seeds=seeds, looks=looks, seq_len=2
    )


def rows(samples: dict[int, list[float]], lr: float = 1e-3) -> list[TrialResult]:
    """One search trial and the confirmation runs (seeds 1..n) of each batch size, at one lr."""
    out = []
    for b, losses in samples.items():
        out.append(TrialResult("adamw", b, lr, 0, "search", "completed", min(losses), 1, 1, number=0))
        out += [TrialResult("adamw", b, lr, s + 1, "confirm", "completed", v, 1, 1) for s, v in enumerate(losses)]
    return out


def cells(report: Report, ref: str = "self") -> dict[int, str | None]:
    return {c.batch_size: getattr(c.verdict, ref) for c in report.optimizers["adamw"].cells}


# ---- the statistics, exact ---------------------------------------------------------------------------------


def test_seed_adjusted_means_exact_values() -> None:
    # loss(c, s) = mu_c + alpha_s exactly: mu = (3.0, 3.1, 3.2), alpha = (0, 0.1, 0.3, 0.3) for seeds 1..4
    mu, alpha = {"a": 3.0, "b": 3.1, "c": 3.2}, {1: 0.0, 2: 0.1, 3: 0.3, 4: 0.3}
    runs = {"a": (1, 2), "b": (1, 2, 3, 4), "c": (1, 2, 3, 4)}
    samples = {c: {s: mu[c] + alpha[s] for s in seeds} for c, seeds in runs.items()}
    adjusted = seed_adjusted_means(samples)
    # every cell on seeds 1..4: mu_c + 0.175; a's plain mean (seeds 1, 2 only) is 3.05
    assert adjusted == pytest.approx({"a": 3.175, "b": 3.275, "c": 3.375}, abs=1e-12)
    assert all(type(v) is float for v in adjusted.values())
    # the same seeds everywhere: the plain means, exactly
    same = {"a": {1: 3.0, 2: 3.2}, "b": {1: 3.1, 2: 3.5}}
    assert seed_adjusted_means(same) == {"a": 3.1, "b": 3.3}
    # seeds that do not connect the cells (a: 1, 2; b: 3, 4): nothing to adjust by, the plain means
    apart = {"a": {1: 3.0, 2: 3.2}, "b": {3: 3.1, 4: 3.5}, "c": {1: 3.0, 2: 3.0}}
    assert seed_adjusted_means(apart) == pytest.approx({"a": 3.1, "b": 3.3, "c": 3.0}, abs=1e-12)
    # a chain: a and c share no seed, but b shares one with each (a: 1, 2; b: 2, 3; c: 3, 4), which links
    # all three: the fit still recovers every mu_c, on seeds 1..4
    chain = {"a": (1, 2), "b": (2, 3), "c": (3, 4)}
    linked = {c: {s: mu[c] + alpha[s] for s in seeds} for c, seeds in chain.items()}
    assert seed_adjusted_means(linked) == pytest.approx({"a": 3.175, "b": 3.275, "c": 3.375}, abs=1e-12)


def test_one_run_on_a_loss_spike_barely_moves_its_cells_adjusted_mean() -> None:
    """3 cells x 6 seeds, loss = mu_c + alpha_s + noise of +-0.003 that sums to 0 in every cell: the fit gives
    mu_c exactly. Then seed 3 of cell b ends on a spike of +0.1 (1 in 33 runs did on the cliffs family):
    least squares would move b by 0.1 / 6 = 0.0167, past a 0.5 % tolerance line 0.015 above it; the robust
    fit moves it by less than 0.003 and leaves the other cells where they were."""
    mu = {"a": 3.0, "b": 3.02, "c": 3.05}
    alpha = {s: 0.01 * ((7 * s) % 5 - 2) for s in range(1, 7)}
    wiggle = {"a": (3, -2, 1, -3, 2, -1), "b": (-2, 3, -1, 2, -3, 1), "c": (1, -1, 2, -2, 3, -3)}
    samples = {c: {s: mu[c] + alpha[s] + 0.001 * wiggle[c][s - 1] for s in range(1, 7)} for c in mu}
    assert seed_adjusted_means(samples) == pytest.approx(mu, abs=1e-9)
    samples["b"][3] += 0.1
    spiked = seed_adjusted_means(samples)
    assert statistics.fmean(samples["b"].values()) - mu["b"] == pytest.approx(0.1 / 6)  # the plain mean's shift
    assert 0 < spiked["b"] - mu["b"] < 0.003
    assert spiked["a"] == pytest.approx(mu["a"], abs=1e-6) and spiked["c"] == pytest.approx(mu["c"], abs=1e-6)


def test_the_point_estimate_compares_cells_on_the_same_seeds() -> None:
    """Adaptive seeds gave the reference and batch 32 seeds 3..6, which ran 0.1 high in every cell (the
    same init and data order); batch 16 has seeds 1, 2 only. Its true loss is 1.7% above the reference's,
    past the 1% line: on plain means (3.05 against a line at 1.01 x 3.0667) it passes, on the same
    seeds it does not."""
    alpha = {1: 0.0, 2: 0.0, 3: 0.1, 4: 0.1, 5: 0.1, 6: 0.1}
    mu = {8: 3.0, 16: 3.05, 32: 3.2}
    seeds = {8: range(1, 7), 16: range(1, 3), 32: range(1, 7)}
    report = build_report(
        rows({b: [mu[b] + alpha[s] for s in seeds[b]] for b in mu}), spec=spec_of(looks=3, batches=(8, 16, 32))
    )
    adamw = report.optimizers["adamw"]
    assert adamw.largest_degradation_free_batch_size.self == 8
    fitted = {c.batch_size: c.val_loss_fitted.self for c in adamw.cells}
    assert fitted[16] == pytest.approx(3.05 + 4 / 6 * 0.1, abs=1e-9)
    assert [c.val_loss_mean for c in adamw.cells][1] == pytest.approx(3.05)  # the reported mean stays plain


def test_paired_interval_exact_values() -> None:
    # diffs 0, 0.1, 0.1: mean 1/15, sd 0.057735, t(0.975, 2) = 4.302653
    d, lo, hi, n = paired_diff_ci({1: 3.0, 2: 3.2, 3: 3.1}, {1: 3.0, 2: 3.1, 3: 3.0}, 1.0, 0.95)  # type: ignore[misc]
    half = 4.302652729749464 * 0.05773502691896258 / math.sqrt(3)
    assert (d, n) == (pytest.approx(1 / 15), 3)
    assert (lo, hi) == (pytest.approx(1 / 15 - half), pytest.approx(1 / 15 + half))
    # only the seeds both cells have are paired; the reference is scaled by 1 + tolerance
    d, lo, hi, n = paired_diff_ci({1: 3.03, 2: 3.05, 7: 9.0}, {1: 3.0, 2: 3.0, 3: 1.0}, 1.01, 0.95)  # type: ignore[misc]
    assert n == 2 and d == pytest.approx(0.01)
    assert hi - d == pytest.approx(t_quantile(0.975, 1) * math.sqrt(2e-4) / math.sqrt(2))
    assert paired_diff_ci({1: 3.0}, {1: 3.0, 2: 3.0}, 1.0, 0.95) is None  # one common seed: no interval


def test_verdict_level_splits_5_percent_over_looks_and_comparisons() -> None:
    assert verdict_level(1) == verdict_level(1, 1) == pytest.approx(0.95)
    assert verdict_level(3) == pytest.approx(1 - 0.05 / 3)  # the fine claims' level: looks only
    assert verdict_level(3, 4) == pytest.approx(1 - 0.05 / 12)
    assert verdict_level(0, 0) == pytest.approx(0.95)  # nothing compared: no split


def test_fine_is_claimed_in_a_fixed_sequence_up_to_the_first_size_not_fine() -> None:
    F, D, U = "fine", "degraded", "undecided"
    assert fine_in_sequence([F, F, U, U, D, D], [True] * 6) == [F, F, U, U, D, D]
    # a "fine" past an undecided or a degraded size is not claimed; degraded claims stand
    assert fine_in_sequence([F, U, F, D, F, D], [True] * 6) == [F, U, U, D, U, D]
    # verdicts no interval made (the reference, a size with no lr stable for every seed) stand, and count in
    # the sequence as what they say
    assert fine_in_sequence([F, F, D, F], [False, True, False, True]) == [F, F, D, U]
    assert fine_in_sequence([F, F, F], [False, True, True]) == [F, F, F]


def test_fine_ends_at_a_one_look_level_and_degraded_at_the_bonferroni_one() -> None:
    # 4 sizes compared, 3 seeds: the upper end of each interval at 95%, the lower at 1 - 0.05 / 4
    seed_effect = [0.01, -0.01, 0.0]
    true = {8: 3.0, 16: 3.0, 32: 3.0, 64: 3.0, 128: 3.2}
    report = build_report(rows({b: [m + e for e in seed_effect] for b, m in true.items()}), spec=spec_of(seeds=3))
    intervals = [c.verdict_diff_ci.self for c in report.optimizers["adamw"].cells[1:]]
    ref = [3.0 + e for e in seed_effect]
    for (lo, hi), b in zip(intervals, (16, 32, 64, 128), strict=True):
        d = [true[b] + e - 1.01 * r for e, r in zip(seed_effect, ref, strict=True)]
        mean, sd = statistics.fmean(d), statistics.stdev(d)
        assert hi == pytest.approx(mean + t_quantile(1 - 0.05 / 2, 2) * sd / math.sqrt(3))
        assert lo == pytest.approx(mean - t_quantile(1 - 0.05 / 8, 2) * sd / math.sqrt(3))


# ---- verdicts and the bracket -----------------------------------------------------------------------------


def test_clear_cases_are_decided_and_the_bracket_is_tight() -> None:
    # seed effects shared across batch sizes (same init, same data order) cancel in the pairing
    seed_effect = [0.03, -0.02, 0.01, -0.01]
    true = {8: 3.0, 16: 3.0, 32: 3.005, 64: 3.2, 128: 3.4}
    report = build_report(rows({b: [m + e for e in seed_effect] for b, m in true.items()}), spec=spec_of(seeds=4))
    assert cells(report) == {8: "fine", 16: "fine", 32: "fine", 64: "degraded", 128: "degraded"}
    opt = report.optimizers["adamw"]
    assert opt.bracket.self.model_dump() == {
        "largest_fine": 32,
        "smallest_degraded": 64,
        "contradictions": [],
        "lr_checked": False,  # 64 degraded at its chosen lr; nothing ran at another
    }
    lo, hi = opt.cells[3].verdict_diff_ci.self
    assert lo > 0 and lo < 3.2 - 1.01 * 3.0 < hi
    assert "fixed sequence" in report.verdict_rule and "Bonferroni" in report.verdict_rule
    assert "monotone" in report.verdict_rule


def test_near_the_line_and_with_independent_noise_it_is_undecided_not_guessed() -> None:
    rng = np.random.default_rng(1)
    samples = {b: list(3.0 * (1.01 if b == 16 else 1.0) + rng.normal(0, 0.05, 2)) for b in (8, 16)}
    report = build_report(rows(samples), spec=spec_of(batches=(8, 16)))
    assert cells(report) == {8: "fine", 16: "undecided"}
    assert report.optimizers["adamw"].bracket.self.model_dump() == {
        "largest_fine": 8,
        "smallest_degraded": None,
        "contradictions": [],
        "lr_checked": None,
    }


def test_a_cell_unstable_at_every_lr_trained_is_degraded_and_a_fine_one_above_it_contradicts_monotonicity() -> None:
    samples = {8: [3.0, 3.01, 3.0], 16: [3.0, 3.01, 3.0], 32: [3.0, 3.01, 3.0]}
    results = rows(samples)
    # batch 16: seed 2 diverged at the best lr, and at the lower lr the search also trained (so there was
    # a retreat, and seed 2 diverged there too): no lr stable for every seed, a degradation
    results = [r for r in results if not (r.batch_size == 16 and r.seed == 2)]
    results.append(TrialResult("adamw", 16, 1e-3, 2, "confirm", "diverged", None, 1, 1))
    results.append(TrialResult("adamw", 16, 5e-4, 0, "search", "completed", 3.2, 1, 2))
    results.append(TrialResult("adamw", 16, 5e-4, 2, "confirm", "diverged", None, 1, 3))
    report = build_report(results, spec=spec_of(seeds=3, batches=(8, 16, 32)))
    # 32 is fine by its own interval, but not claimed past the degraded 16: it contradicts monotonicity
    assert cells(report) == {8: "fine", 16: "degraded", 32: "undecided"}
    assert report.optimizers["adamw"].bracket.self.model_dump() == {
        "largest_fine": 8,
        "smallest_degraded": 16,
        "contradictions": [32],
        "lr_checked": True,  # its runs diverged at a lower lr too
    }
    # without the lower lr, nothing measured says whether 16 is worse or its lr too high: undecided
    results = results[:-2]
    report = build_report(results, spec=spec_of(seeds=3, batches=(8, 16, 32)))
    assert cells(report) == {8: "fine", 16: "undecided", 32: "undecided"}  # 32: past the undecided 16
    assert report.optimizers["adamw"].bracket.self.model_dump() == {
        "largest_fine": 8,
        "smallest_degraded": None,
        "contradictions": [],
        "lr_checked": None,
    }


def test_adaptive_seeds_extend_only_the_undecided_sizes_that_decide_the_answer() -> None:
    # 16, 32 and 64 undecided inside the bracket [8, 128); the answer 32 (fitted means 3.023, 3.033 under
    # the line 1.01 x 3.01 = 3.0401, 64's 3.057 above it) rests on 32 and 64: runs at 16 could not move it
    samples = {
        8: [3.00, 3.02, 3.01],
        16: [3.00, 3.05, 3.02],
        32: [3.02, 3.05, 3.03],
        64: [3.04, 3.08, 3.05],
        128: [3.50, 3.52, 3.51],
    }
    report = build_report(rows(samples), spec=spec_of(looks=3, seeds=3))
    opt = report.optimizers["adamw"]
    assert cells(report) == {8: "fine", 16: "undecided", 32: "undecided", 64: "undecided", 128: "degraded"}
    assert opt.largest_degradation_free_batch_size.self == 32
    assert cells_to_extend(report, seeds_max=6) == [("adamw", 8), ("adamw", 32), ("adamw", 64)]
    # no answer at all: the smallest size decides it
    samples = {8: [3.00, 3.02, 3.01], 16: [3.03, 3.08, 3.05], 32: [3.04, 3.10, 3.06], 64: [3.5, 3.52, 3.51]}
    report = build_report(rows(samples), spec=spec_of(looks=3, seeds=3, batches=(8, 16, 32, 64)))
    assert cells(report)[16] == cells(report)[32] == "undecided"
    assert cells_to_extend(report, seeds_max=6) == [("adamw", 8), ("adamw", 16)]


def test_adaptive_seeds_extend_the_undecided_cells_inside_the_bracket_and_their_reference() -> None:
    rng = np.random.default_rng(2)
    true = {8: 3.0, 16: 3.0, 32: 3.03, 64: 3.5}
    samples = {b: list(m + rng.normal(0, 0.02, 2)) for b, m in true.items()}
    report = build_report(rows(samples), spec=spec_of(looks=3, batches=(8, 16, 32, 64)))
    verdicts = cells(report)
    undecided = {b for b, v in verdicts.items() if v == "undecided"}
    assert undecided, verdicts
    bracket = report.optimizers["adamw"].bracket.self
    inside = {
        b
        for b in undecided
        if (bracket.largest_fine is None or b > bracket.largest_fine)
        and (bracket.smallest_degraded is None or b < bracket.smallest_degraded)
    }
    answer = report.optimizers["adamw"].largest_degradation_free_batch_size.self
    deciding = {answer, next(b for b in (8, 16, 32, 64) if answer is None or b > answer)}
    assert inside & deciding, (inside, deciding)
    assert set(cells_to_extend(report, seeds_max=6)) == {("adamw", b) for b in (inside & deciding) | {8}}
    assert cells_to_extend(report, seeds_max=2) == []  # every cell at max


def run_sweep(
    true: dict[int, float], rng: np.random.Generator, *, sigma: float, shared: float
) -> tuple[dict, int | None, int]:
    """One simulated sweep with adaptive seeds {min 2, max 8, step 2}: seed s adds the same effect to
    every batch size (the `shared` share of the variance) plus noise of its own; returns the bracket
    and the point answer of its last look, and the runs spent."""
    looks, seeds_max = 4, 8
    effects = rng.normal(0, sigma * math.sqrt(shared), seeds_max)
    own = math.sqrt(1 - shared) * sigma
    samples = {b: [m + effects[s] + rng.normal(0, own) for s in range(2)] for b, m in true.items()}
    while True:
        report = build_report(rows(samples), spec=spec_of(looks=looks, batches=tuple(true)))
        extend = cells_to_extend(report, seeds_max=seeds_max)
        if not extend:
            opt = report.optimizers["adamw"]
            spent = sum(len(v) for v in samples.values())
            return opt.bracket.self, opt.largest_degradation_free_batch_size.self, spent
        for _, b in extend:
            have = len(samples[b])
            samples[b] += [true[b] + effects[s] + rng.normal(0, own) for s in range(have, min(have + 2, seeds_max))]


@pytest.mark.parametrize("shared", [0.0, 0.7])
def test_the_bracket_holds_the_truth_in_at_least_95_percent_of_sweeps(shared: float) -> None:
    """Random monotone loss curves whose boundary falls anywhere, some batch sizes right at the line: the
    truth is the largest batch size whose true loss is within tolerance (every smaller one too)."""
    rng = np.random.default_rng(7)
    sigma, tol, sweeps, misses, decided, right, runs = 0.02, 0.01, 300, 0, 0, 0, 0
    batches = BATCHES
    for _ in range(sweeps):
        steps = np.cumsum(rng.choice([0.0, 0.005, 0.02, 0.05], size=len(batches) - 1, p=[0.4, 0.2, 0.2, 0.2]))
        true = {b: 3.0 * (1 + x) for b, x in zip(batches, [0.0, *steps], strict=True)}
        truth = max(b for b in batches if all(true[c] <= (1 + tol) * true[8] for c in batches if c <= b))
        bracket, answer, spent = run_sweep(true, rng, sigma=sigma, shared=shared)
        right += answer == truth
        lo, hi = bracket.largest_fine, bracket.smallest_degraded
        holds = (lo is None or lo <= truth) and (hi is None or truth < hi)
        misses += not holds
        decided += lo is not None and hi is not None and batches.index(hi) == batches.index(lo) + 1
        runs += spent
    assert misses / sweeps <= 0.05, f"the bracket missed the truth in {misses} of {sweeps} sweeps"
    # runs go only to the two sizes the answer rests on (and the reference): the answer is right in 289
    # and 280 of 300 sweeps, the bracket narrows to neighbours in 87 and 156, at 22.8 and 21.2 runs a sweep
    # (runs at every undecided size inside the bracket: 289 and 289 right, 96 and 173 narrow, 30.9 and 28.1)
    assert right / sweeps >= 0.9, f"the answer was right in only {right} of {sweeps} sweeps"
    assert decided / sweeps > 0.25, f"only {decided} of {sweeps} brackets narrowed to neighbours"
    assert runs / sweeps < 6 * len(batches)  # well below max seeds (8) everywhere
    print(
        f"shared {shared}: missed {misses}/{sweeps}, right {right}/{sweeps}, tight {decided}/{sweeps}, "
        f"{runs / sweeps:.1f} runs a sweep"
    )


# ---- the retreat from a diverged lr -----------------------------------------------------------------------


def score(t: TrialResult) -> tuple[float, float, int] | None:
    return (t.val_loss, t.lr, t.number or 0) if t.role == "search" and t.status == "completed" else None  # type: ignore[return-value]


def test_pick_stable_retreats_below_the_lowest_diverged_lr() -> None:
    search = [
        TrialResult("adamw", 8, lr, 0, "search", "completed", loss, 1, 1, number=i)
        for i, (lr, loss) in enumerate([(1e-3, 3.2), (2e-3, 3.1), (4e-3, 3.0), (8e-3, 3.1)])
    ]
    assert pick_stable(search, score, []).lr == 4e-3  # type: ignore[union-attr]
    assert pick_stable(search, score, [4e-3]).lr == 2e-3  # type: ignore[union-attr]
    assert pick_stable(search, score, [4e-3, 2e-3]).lr == 1e-3  # type: ignore[union-attr]
    assert pick_stable(search, score, [8e-3]).lr == 4e-3  # type: ignore[union-attr]  # above the best: no retreat
    assert pick_stable(search, score, [1e-3]).lr == 4e-3  # type: ignore[union-attr]  # nothing below: stays, unstable


def test_the_report_judges_the_retreated_lr_and_names_where_it_came_from() -> None:
    results = [
        TrialResult("adamw", 8, lr, 0, "search", "completed", loss, 1, 1, number=i)
        for i, (lr, loss) in enumerate([(1e-3, 3.2), (2e-3, 3.1), (4e-3, 3.05)])
    ]
    results += [
        TrialResult("adamw", 8, 4e-3, 1, "confirm", "completed", 3.04, 1, 1),
        TrialResult("adamw", 8, 4e-3, 2, "confirm", "diverged", None, 1, 1),
        TrialResult("adamw", 8, 2e-3, 1, "confirm", "completed", 3.1, 1, 1),
        TrialResult("adamw", 8, 2e-3, 2, "confirm", "completed", 3.11, 1, 1),
    ]
    cell = build_report(results, spec=spec_of(batches=(8,))).optimizers["adamw"].cells[0]
    assert cell.best_lr == 2e-3 and cell.retreated_from_lr == 4e-3
    assert cell.stable is True and cell.val_losses == [3.1, 3.11]
    assert cell.trial_status.diverged == 1


def retreat_sweep(searched: int, seeds: Any) -> tuple[SweepSpec, dict[int, float], Any]:
    """A sweep whose seed 2 has a cliff just below the search's best lr (the search, seed 0, never saw it):
    the spec, the lr each batch size's confirmation runs first went to, and the report."""
    lr_star = 3e-3
    spec = SweepSpec.from_mapping(
        tiny_spec(
            "retreat",
            optimizers=[{"name": "adamw"}],
            batch_sizes=[4, 8],
            token_budget=8 * 32 * 8,
            eval_every_tokens=None,  # a tenth of the budget: the cliff shows after the first evaluation
            lr={"min": 1e-4, "max": 3e-2, "trials_per_batch_size": searched},
            seeds=seeds,
            degradation={"tolerance": 0.01, "baseline": "adamw"},
        )
    )
    chosen: dict[int, float] = {}

    def objective(run: Run) -> list[float]:
        if run.role == "confirm":
            chosen.setdefault(run.batch_size, run.lr)
        u = math.log(run.lr / lr_star)
        final = 3.0 + 0.05 * u * u
        if run.seed == 2 and run.lr >= 0.95 * chosen.get(run.batch_size, math.inf):
            return [final] + [math.inf] * (len(run.eval_tokens) - 1)
        return [final * (1 + 0.2 * (1 - t / run.eval_tokens[-1])) for t in run.eval_tokens]

    return spec, chosen, simulate(spec, objective).report


def test_a_sweep_retreats_when_a_confirmation_seed_diverges_at_the_chosen_lr() -> None:
    spec, chosen, report = retreat_sweep(6, 2)
    for cell in report.optimizers["adamw"].cells:
        b = cell.batch_size
        assert cell.retreated_from_lr == pytest.approx(chosen[b])
        assert cell.best_lr < chosen[b] and cell.stable is True and cell.seeds == 2
        search = cell_search_trials(spec.lr.trials_per_batch_size, reference=b == spec.lattice[0])
        assert cell.trials <= search + spec.seeds_max  # within the cell's budget
    assert report.optimizers["adamw"].largest_degradation_free_batch_size.self == 8


@pytest.mark.parametrize("seeds", [2, {"min": 2, "max": 4, "step": 2}], ids=["fixed", "adaptive"])
def test_a_retreat_is_confirmed_whole_where_the_trial_cap_leaves_room(seeds: Any) -> None:
    """The search spends its whole share (2 trials a size), then seed 2 diverges at the chosen lr: with
    adaptive seeds the retreat's confirmation runs come from what `seeds.max` leaves (the dry run prices every
    cell at it), and the cell is judged at the lower lr; with fixed seeds the cap holds no room, and the
    cell's runs there are missing (undecided, never degraded)."""
    spec, chosen, report = retreat_sweep(2, seeds)
    for cell in report.optimizers["adamw"].cells:
        search = cell_search_trials(spec.lr.trials_per_batch_size, reference=cell.batch_size == spec.lattice[0])
        assert (
            cell.retreated_from_lr == pytest.approx(chosen[cell.batch_size]) and cell.best_lr < chosen[cell.batch_size]
        )
        if isinstance(seeds, int):
            assert cell.trials == search + 2  # the diverged lr's 2 runs: nothing left for the lower lr
            assert not cell.stable and "2 missing" in (cell.unstable_reason or "")
            assert cell.verdict.self != "degraded"
        else:
            assert cell.stable and cell.seeds == 2 and cell.unstable_reason is None
            assert cell.trials == search + 4 <= search + spec.seeds_max  # within what the dry run priced


@pytest.mark.parametrize("seeds", [2, {"min": 2, "max": 6, "step": 2}], ids=["fixed", "adaptive"])
def test_a_cell_probes_just_below_a_diverged_confirmation_lr_where_the_search_left_nothing_near(seeds: Any) -> None:
    """The search's three coarse lrs, 1.9 ln-units apart, and a step up that diverges: the loss falls with
    the lr up to the stability edge, at 2e-2 for seed 0 and at 1e-2 for the confirmation seeds. Both
    confirmation runs at the best lr (1.16e-2) diverge; the next lr the search tried is far below. With room
    in `seeds.max`, the cell probes PROBE_STEP below the diverged lr and is judged there; without, it stays
    unconfirmed (undecided, never degraded)."""
    spec = SweepSpec.from_mapping(
        tiny_spec(
            "probe",
            optimizers=[{"name": "adamw"}],
            batch_sizes=[4],
            token_budget=8 * 32 * 8,
            eval_every_tokens=None,  # a tenth of the budget: a divergence shows after the first evaluation
            lr={"min": 1e-4, "max": 3e-2, "trials_per_batch_size": 3},
            seeds=seeds,
            degradation={"tolerance": 0.01, "baseline": "adamw"},
        )
    )

    def objective(run: Run) -> list[float]:
        final = 3.0 - 0.1 * math.log(run.lr / 1e-4)  # lower with every step up to the edge
        if run.lr > (2e-2 if run.seed == 0 else 1e-2):
            return [final] + [math.inf] * (len(run.eval_tokens) - 1)
        return [final * (1 + 0.2 * (1 - t / run.eval_tokens[-1])) for t in run.eval_tokens]

    result = simulate(spec, objective)
    cell = result.report.optimizers["adamw"].cells[0]
    _, far, best = coarse_lrs(1e-4, 3e-2)  # 1.7e-3, 1.16e-2
    probes = [t for t in result.results if t.role == "search" and math.isclose(t.lr, best * math.exp(-PROBE_STEP))]
    assert cell.retreated_from_lr == pytest.approx(best)
    assert cell.trials <= cell_search_trials(3, reference=True) + spec.seeds_max  # what the dry run priced
    if isinstance(seeds, int):
        assert probes == [] and cell.best_lr == pytest.approx(far)  # no room: the far lr
        assert not cell.stable and "2 missing" in (cell.unstable_reason or "")
    else:
        assert len(probes) == 1 and probes[0].status == "completed"
        assert cell.best_lr == pytest.approx(probes[0].lr) and cell.stable and cell.seeds == 2
        # no confirmation run went to the far lr while the probe ran: 4 search, 2 diverged, the probe, 2 seeds
        assert cell.trials == 9 and all(t.lr > 5e-3 for t in result.results if t.role == "confirm")


def test_a_degraded_verdict_checked_at_a_second_lr_is_judged_by_the_better_of_the_two() -> None:
    """32 reads 2.5 % worse than the reference at its chosen lr 1e-3, degraded by its own interval; the search
    also trained 1.3e-3 (within reach above). 32 is the size above the answer: the report names it for a
    check where the search's one run there read worse by less than the sd of 32's runs (one seed cannot
    tell the two lrs apart), whatever its excess over the line. With the same
    seeds run at 1.3e-3 it is judged at the lr with the lower mean: where that is 1.3e-3 the two swap (its
    lr, runs and loss are 1.3e-3's; `searched` marks 1e-3 as the search's pick), fine there, its fine claim
    at the level of two lrs, or degraded where 1.3e-3 reads better but still over the line; degraded at
    1e-3 where 1.3e-3 reads worse."""
    seed_effect = [0.03, -0.02, 0.01, -0.01]
    base = {8: 3.0, 16: 3.0, 32: 3.075}
    results = rows({b: [m + e for e in seed_effect] for b, m in base.items()})
    report = build_report(results, spec=spec_of(seeds=4, batches=(8, 16, 32)))
    assert cells(report) == {8: "fine", 16: "fine", 32: "degraded"}
    assert report.optimizers["adamw"].bracket.self.lr_checked is False  # no second lr ran
    assert cells_to_check(report) == []  # no second lr within reach
    far = TrialResult("adamw", 32, 1.3e-3, 0, "search", "completed", 3.2, 1, 1, number=1)
    report = build_report([*results, far], spec=spec_of(seeds=4, batches=(8, 16, 32)))
    # the search's run there read 0.145 worse than at 1e-3 (3.055), past the sd of 32's runs (0.022): no check
    assert report.optimizers["adamw"].cells[2].lr_check.search_val_loss == 3.2  # type: ignore[union-attr]
    assert cells_to_check(report) == []
    near = TrialResult("adamw", 32, 1.3e-3, 0, "search", "completed", 3.078, 1, 1, number=1)
    report = build_report([*results, near], spec=spec_of(seeds=4, batches=(8, 16, 32)))
    assert cells_to_check(report) == []  # 0.023 worse: just past the sd
    results.append(TrialResult("adamw", 32, 1.3e-3, 0, "search", "completed", 3.07, 1, 1, number=1))
    report = build_report(results, spec=spec_of(seeds=4, batches=(8, 16, 32)))
    # 0.015 worse: within the sd; the reference (8) has no second lr, so it gets no check
    assert cells_to_check(report) == [("adamw", 32)]

    def checked(second: float) -> Any:
        runs = [
            TrialResult("adamw", 32, 1.3e-3, s + 1, "confirm", "completed", second + e, 1, 1)
            for s, e in enumerate(seed_effect)
        ]
        return build_report(results + runs, spec=spec_of(seeds=4, batches=(8, 16, 32)))

    ref = {s + 1: 3.0 + e for s, e in enumerate(seed_effect)}
    better = checked(3.0)  # fine at the second lr: the two swap
    cell = better.optimizers["adamw"].cells[2]
    assert cells(better) == {8: "fine", 16: "fine", 32: "fine"}
    assert cell.best_lr == 1.3e-3 and cell.val_loss_mean == pytest.approx(3.0025)
    assert cell.val_losses == pytest.approx([3.0 + e for e in seed_effect])
    assert cell.search_best_val_loss == 3.07  # the search's own run at the lr that judges
    assert cell.lr_check is not None and cell.lr_check.lr == 1e-3 and cell.lr_check.searched
    assert cell.lr_check.val_losses == pytest.approx([3.075 + e for e in seed_effect]) and cell.lr_check.runs == 4
    upper = paired_diff_ci(ref, ref, 1.01, verdict_level(1, 2))  # the fine claim at the level of two
    assert cell.verdict_diff_ci.self[1] == pytest.approx(upper[2])  # type: ignore[index]
    assert cells_to_check(better) == []

    worse = checked(3.09)  # worse than at 1e-3: 1e-3 judges, degraded, its interval at the level of 2 sizes
    cell = worse.optimizers["adamw"].cells[2]
    assert cells(worse) == {8: "fine", 16: "fine", 32: "degraded"}
    assert cell.best_lr == 1e-3 and not cell.lr_check.searched and cell.lr_check.lr == 1.3e-3  # type: ignore[union-attr]
    at_first = {s + 1: 3.075 + e for s, e in enumerate(seed_effect)}
    lower = paired_diff_ci(at_first, ref, 1.01, verdict_level(1, 2))
    assert cell.verdict_diff_ci.self[0] == pytest.approx(lower[1])  # type: ignore[index]
    assert worse.optimizers["adamw"].bracket.self.lr_checked is True
    assert cells_to_check(worse) == []

    still = checked(3.06)  # better than at 1e-3 and still over the line: degraded, judged at 1.3e-3
    cell = still.optimizers["adamw"].cells[2]
    assert cells(still) == {8: "fine", 16: "fine", 32: "degraded"}
    at_second = {s + 1: 3.06 + e for s, e in enumerate(seed_effect)}
    lower = paired_diff_ci(at_second, ref, 1.01, verdict_level(1, 2))
    assert cell.verdict_diff_ci.self[0] == pytest.approx(lower[1])  # type: ignore[index]
    assert cell.best_lr == 1.3e-3 and cell.val_loss_mean == pytest.approx(3.0625)


def test_the_size_above_the_answer_and_its_reference_are_checked_and_a_smallest_degraded_edge_within_reach() -> None:
    """The size above the answer is checked while its interval does not say fine (degraded or undecided)
    and the search's one run at its second lr read worse by less than the sd of its runs, with the
    reference it is paired with where that has a second lr the same holds for; the bracket's smallest
    degraded size, when it is not the one above the answer, where the search's run there read worse by
    less than the runs' sd and its excess over the line."""
    seed_effect = [0.03, -0.02, 0.01, -0.01]
    spec = spec_of(seeds=4, batches=(8, 16, 32, 64))
    # 16 undecided (1.5 % over the reference, with noise), 32 and 64 degraded
    noisy = [0.03, -0.05, 0.04, -0.01]
    results = rows({8: [3.0 + e for e in seed_effect], 16: [3.045 + e for e in noisy]})
    results += rows({32: [3.2 + e for e in seed_effect], 64: [3.3 + e for e in seed_effect]})
    second = [
        TrialResult("adamw", b, 1.3e-3, 0, "search", "completed", loss, 1, 1, number=1)
        for b, loss in ((8, 2.99), (16, 3.02), (32, 3.19), (64, 3.5))
    ]
    report = build_report(results + second, spec=spec)
    assert cells(report) == {8: "fine", 16: "undecided", 32: "degraded", 64: "degraded"}
    bracket = report.optimizers["adamw"].bracket.self
    assert (bracket.largest_fine, bracket.smallest_degraded) == (8, 32)
    # the search's runs at the first lrs: 8 at 2.98, 16 at 2.995, 32 at 3.18 (the lowest of each cell's runs)
    # 16: undecided above the answer, its second lr's run 0.025 worse (its runs' sd 0.041), with its reference
    # 8 (0.01 worse, sd 0.022); 32: the smallest degraded, 0.01 worse: within its sd and its excess (0.17)
    assert cells_to_check(report) == [("adamw", 8), ("adamw", 16), ("adamw", 32)]
    # the search's run at 32's second lr 0.05 worse: past its runs' sd, no check there
    second[2] = TrialResult("adamw", 32, 1.3e-3, 0, "search", "completed", 3.23, 1, 1, number=1)
    assert cells_to_check(build_report(results + second, spec=spec)) == [("adamw", 8), ("adamw", 16)]
    # the reference's second run 0.03 worse, past its sd; or no second lr there: the size above alone
    second[0] = TrialResult("adamw", 8, 1.3e-3, 0, "search", "completed", 3.01, 1, 1, number=1)
    assert cells_to_check(build_report(results + second, spec=spec)) == [("adamw", 16)]
    assert cells_to_check(build_report(results + second[1:], spec=spec)) == [("adamw", 16)]
    second[1] = TrialResult("adamw", 16, 1.3e-3, 0, "search", "completed", 3.045, 1, 1, number=1)
    assert cells_to_check(build_report(results + second, spec=spec)) == []  # 16's 0.05 worse: past its sd (0.041)


@pytest.mark.parametrize("seeds", [2, {"min": 2, "max": 8, "step": 2}], ids=["fixed", "adaptive"])
def test_a_sweep_confirms_a_degraded_boundary_at_the_lr_above_where_its_seeds_allow(seeds: Any) -> None:
    """At batch size 8 the search's seed favours a lower lr (its optimum 2e-3) than every other seed (8e-3):
    the confirmation runs at the search's choice read 1.5 % worse than the reference, over the 1 % line. The
    search also trained 2.57e-3, within reach above. With room in `seeds.max` the sweep runs the same seeds
    there, where the cell is fine, and judges it by the better lr (the two swap: its lr, runs and loss are
    2.57e-3's); without, the verdict holds at its chosen lr and the bracket says so."""
    spec = SweepSpec.from_mapping(
        tiny_spec(
            "check",
            optimizers=[{"name": "adamw"}],
            batch_sizes=[4, 8],
            token_budget=8 * 32 * 8,
            eval_every_tokens=None,
            lr={"min": 1e-4, "max": 3e-2, "trials_per_batch_size": 6},
            seeds=seeds,
            degradation={"tolerance": 0.01, "baseline": "adamw"},
        )
    )

    def objective(run: Run) -> list[float]:
        best = 3e-3 if run.batch_size == 4 else (2e-3 if run.seed == 0 else 8e-3)
        final = 3.0 + 0.02 * math.log(run.lr / best) ** 2 + 0.01 * run.seed
        return [final * (1 + 0.2 * (1 - t / run.eval_tokens[-1])) for t in run.eval_tokens]

    report = simulate(spec, objective).report
    opt = report.optimizers["adamw"]
    cell = opt.cells[1]
    assert cell.lr_check is not None
    if isinstance(seeds, int):
        assert cell.best_lr == pytest.approx(2e-3) and cell.val_loss_mean > 1.01 * opt.reference_val_loss.self  # type: ignore[operator]
        assert cell.lr_check.lr == pytest.approx(2.5733e-3, rel=1e-4)
        assert cell.lr_check.runs == 0 and cell.verdict.self == "degraded"
        assert (
            describe_bracket(opt.bracket.self) == "fine up to 4, degraded from 8 (at its chosen lr; no second lr tried)"
        )
    else:
        assert cell.best_lr == pytest.approx(2.5733e-3, rel=1e-4) and cell.lr_check.searched
        assert cell.lr_check.lr == pytest.approx(2e-3)  # the search's pick, over the line
        assert cell.lr_check.runs == cell.seeds >= 2 and cell.lr_check.diverged == 0  # the same seeds, paired
        assert statistics.fmean(cell.lr_check.val_losses) > 1.01 * opt.reference_val_loss.self  # type: ignore[operator]
        ref = opt.cells[0].val_losses  # by seed, as the cell's runs
        assert all(v < 1.01 * r for v, r in zip(cell.val_losses, ref, strict=True))  # under the line by seed
        assert cell.verdict.self == "fine" and opt.bracket.self.largest_fine == 8
        assert cell.trials <= cell_search_trials(6, reference=False) + spec.seeds_max  # within what the dry run priced


def test_a_cell_at_a_cliff_is_judged_at_the_better_of_the_search_s_best_two_lrs() -> None:
    """32's search trained 7e-4 (3.07) and 1e-3 (3.06) and diverged at 2e-3, the next lr it tried above:
    its best lr sits at a cliff, and the same seeds run at both lrs. The cell is judged at the lower mean
    (fine at 7e-4 where 1e-3 reads degraded: its lr, runs and loss are 7e-4's), its fine claim at the level
    of two lrs. Where a seed diverges at 1e-3, the cell retreats to 7e-4, whose seeds all ran: stable,
    judged there."""
    seed_effect = [0.03, -0.02, 0.01, -0.01]
    results = rows({b: [3.0 + e for e in seed_effect] for b in (8, 16)})
    results += [
        TrialResult("adamw", 32, lr, 0, "search", status, loss, 1, 1, number=i)
        for i, (lr, status, loss) in enumerate(
            [(7e-4, "completed", 3.07), (1e-3, "completed", 3.06), (2e-3, "diverged", None)]
        )
    ]

    def seeds(lr: float, mean: float, diverged: int | None = None) -> list[TrialResult]:
        return [
            TrialResult("adamw", 32, lr, s, "confirm", "diverged", None, 1, 1)
            if s == diverged
            else TrialResult("adamw", 32, lr, s, "confirm", "completed", mean + e, 1, 1)
            for s, e in enumerate(seed_effect, start=1)
        ]

    report = build_report(results + seeds(1e-3, 3.075), spec=spec_of(seeds=4, batches=(8, 16, 32)))
    cell = report.optimizers["adamw"].cells[2]
    assert cell.lr_check is not None and cell.lr_check.lr == 7e-4 and cell.lr_check.runs == 0
    assert cells(report) == {8: "fine", 16: "fine", 32: "degraded"}
    report = build_report(results + seeds(1e-3, 3.075) + seeds(7e-4, 3.0), spec=spec_of(seeds=4, batches=(8, 16, 32)))
    cell = report.optimizers["adamw"].cells[2]
    assert cells(report) == {8: "fine", 16: "fine", 32: "fine"}
    assert cell.best_lr == 7e-4 and cell.val_loss_mean == pytest.approx(3.0025) and cell.lr_check.runs == 4  # type: ignore[union-attr]
    assert cell.lr_check.lr == 1e-3 and cell.lr_check.searched  # type: ignore[union-attr]
    ref = {s: 3.0 + e for s, e in enumerate(seed_effect, start=1)}
    upper = paired_diff_ci(ref, ref, 1.01, verdict_level(1, 2))  # 7e-4 reads as the reference, by seed
    assert cell.verdict_diff_ci.self[1] == pytest.approx(upper[2])  # type: ignore[index]
    assert cells_to_check(report) == []
    # seed 2 diverged at 1e-3: the cell retreats to 7e-4, where its 4 seeds ran; no second lr is left
    report = build_report(
        results + seeds(1e-3, 3.0, diverged=2) + seeds(7e-4, 3.0), spec=spec_of(seeds=4, batches=(8, 16, 32))
    )
    cell = report.optimizers["adamw"].cells[2]
    assert cell.best_lr == 7e-4 and cell.retreated_from_lr == 1e-3 and cell.stable and cell.seeds == 4
    assert cell.lr_check is None and cells(report) == {8: "fine", 16: "fine", 32: "fine"}


@pytest.mark.parametrize("edge", [6e-3, 5e-3], ids=["stable", "seed-2-diverges"])
def test_a_sweep_whose_best_lr_sits_at_a_cliff_runs_its_seeds_at_the_search_s_best_two(edge: float) -> None:
    """The loss falls with the lr up to a stability edge at 6e-3 (seed 2's at `edge`): the search's best,
    5.68e-3, has the next lr it tried above, 7.21e-3, diverged, and the same seeds run at it and at the
    search's second best, 4.48e-3, within `seeds.max`. Where every seed completes at 5.68e-3 the cell stays
    there with 4.48e-3 as its second lr; where seed 2 diverges there, the cell retreats to 4.48e-3, whose
    seeds all ran: stable, with no run beyond the ones the cliff asked for (its second lr is then the
    nearest one below, 2.79e-3, not run: the only size is the reference, with no verdict to check)."""
    spec = SweepSpec.from_mapping(
        tiny_spec(
            "cliff",
            optimizers=[{"name": "adamw"}],
            batch_sizes=[4],
            token_budget=8 * 32 * 8,
            eval_every_tokens=None,
            lr={"min": 1e-4, "max": 3e-2, "trials_per_batch_size": 6},
            seeds={"min": 2, "max": 4, "step": 2},
            degradation={"tolerance": 0.01, "baseline": "adamw"},
        )
    )

    def objective(run: Run) -> list[float]:
        final = 3.0 - 0.02 * math.log(run.lr / 1e-4)
        if run.lr > (edge if run.seed == 2 else 6e-3):
            return [final] + [math.inf] * (len(run.eval_tokens) - 1)
        return [final * (1 + 0.2 * (1 - t / run.eval_tokens[-1])) for t in run.eval_tokens]

    result = simulate(spec, objective)
    cell = result.report.optimizers["adamw"].cells[0]
    best, second = 5.68365e-3, 4.4814e-3
    diverged = sorted(t.lr for t in result.results if t.role == "search" and t.status == "diverged")
    assert diverged == [pytest.approx(7.20843e-3, rel=1e-5), pytest.approx(1.15949e-2, rel=1e-5)]
    seeds = sorted((round(t.lr, 8), t.seed, t.status) for t in result.results if t.role == "confirm")
    stable = edge == 6e-3
    assert seeds == [
        (round(second, 8), 1, "completed"),
        (round(second, 8), 2, "completed"),
        (round(best, 8), 1, "completed"),
        (round(best, 8), 2, "completed" if stable else "diverged"),
    ]
    assert cell.stable and cell.seeds == 2 and cell.trials == 11  # 7 search + 2 seeds at each of the two
    if stable:
        assert cell.best_lr == pytest.approx(best, rel=1e-5) and cell.retreated_from_lr is None
        assert cell.lr_check is not None and cell.lr_check.lr == pytest.approx(second, rel=1e-5)
        assert cell.lr_check.runs == 2 and cell.lr_check.diverged == 0
    else:
        assert cell.best_lr == pytest.approx(second, rel=1e-5) and cell.lr_check is not None
        assert cell.lr_check.lr == pytest.approx(2.78604e-3, rel=1e-5) and cell.lr_check.runs == 0
        assert cell.retreated_from_lr == pytest.approx(best, rel=1e-5)


def test_the_bracket_in_words() -> None:
    assert describe_bracket({"largest_fine": 32, "smallest_degraded": 64}) == "fine up to 32, degraded from 64"
    assert describe_bracket({"largest_fine": 8}) == "fine up to 8; nothing larger decided degraded"
    assert describe_bracket({"smallest_degraded": 8}) == "degraded from 8; nothing decided fine"
    assert describe_bracket({}) == "undecided: more seeds would decide it"
    assert (
        describe_bracket({"largest_fine": 32, "smallest_degraded": 64, "lr_checked": False})
        == "fine up to 32, degraded from 64 (at its chosen lr; no second lr tried)"
    )
    assert describe_bracket({"largest_fine": 32, "smallest_degraded": 64, "lr_checked": True}) == (
        "fine up to 32, degraded from 64"
    )
    assert describe_bracket({"largest_fine": 8, "smallest_degraded": 16, "contradictions": [32, 64]}) == (
        "fine up to 8, degraded from 16 (not monotone: fine again at 32, 64)"
    )


def test_missing_confirmation_runs_leave_a_batch_size_undecided_not_degraded() -> None:
    """A retreat the cell's budget had no room for (or a cancelled sweep): no evidence either way."""
    samples = {8: [3.0, 3.01, 3.0], 16: [3.0, 3.01, 3.0]}
    results = [r for r in rows(samples) if not (r.batch_size == 16 and r.role == "confirm")]
    # batch 16: its confirmation at 1e-3 diverged; the search's lower lr is where it retreated, unconfirmed
    results += [
        TrialResult("adamw", 16, 5e-4, 0, "search", "completed", 3.2, 1, 1, number=1),
        TrialResult("adamw", 16, 1e-3, 1, "confirm", "diverged", None, 1, 1),
    ]
    report = build_report(results, spec=spec_of(seeds=3, batches=(8, 16)))
    cell = report.optimizers["adamw"].cells[1]
    assert cell.best_lr == 5e-4 and cell.retreated_from_lr == 1e-3 and cell.stable is False
    assert cells(report) == {8: "fine", 16: "undecided"}


def test_an_answer_within_noise_names_the_sizes_the_seeds_cannot_tell_apart() -> None:
    from sweeps.report import describe_noise, noise_allows

    clear = {8: [3.000, 3.001, 3.002, 3.000], 16: [3.000, 3.001, 3.002, 3.001], 32: [3.50, 3.50, 3.51, 3.50]}
    # 32's mean 3.04 is past the line 1.01 x 3.00075 = 3.0308, but its four seeds spread 0.06: it may be fine
    near_above = {**clear, 32: [3.02, 3.06, 3.01, 3.07]}
    # 16's two seeds straddle the line: the estimate 16 may be degraded, so 8 may be the answer
    near_below = {8: [3.00, 3.02], 16: [3.00, 3.05], 32: [3.10, 3.12]}
    expected = [
        (clear, 4, None, None),
        (near_above, 4, [16, 32], "16 or 32, within noise"),
        (near_below, 2, [8, 16], "8 or 16, within noise"),
    ]
    for samples, seeds, sizes, words in expected:
        opt = build_report(rows(samples), spec=spec_of(batches=tuple(samples), seeds=seeds)).optimizers["adamw"]
        assert opt.largest_degradation_free_batch_size.self == 16
        assert opt.within_noise.self is (sizes is not None)
        assert noise_allows(opt, "self") == sizes
        assert describe_noise(opt, "self") == words


def test_the_terminal_and_the_page_say_what_the_noise_allows(tmp_path: Any) -> None:
    import json as json_

    from typer.testing import CliRunner

    from cli.main import app
    from dashboards.page import answer_list
    from sweeps.analysis import report_to_json

    samples = {8: [3.000, 3.001, 3.002, 3.000], 16: [3.000, 3.001, 3.002, 3.001], 32: [3.02, 3.06, 3.01, 3.07]}
    report = build_report(rows(samples), spec=spec_of(batches=(8, 16, 32), seeds=4))
    path = tmp_path / "report.json"
    path.write_text(report_to_json(report))
    out = CliRunner().invoke(app, ["show", str(path)], env={"COLUMNS": "200"})
    assert out.exit_code == 0, out.output
    assert "adamw vs itself: 16 or 32, within noise" in out.output
    assert "adamw vs adamw" not in out.output  # the baseline against itself says nothing twice
    assert "(estimate B = 16; 16 or 32, within noise)" in answer_list(report, steps=False)
    assert json_.loads(path.read_text())["optimizers"]["adamw"]["within_noise"]["self"] is True


def test_the_second_lr_judges_where_every_run_there_completed_lower_on_the_seeds_both_ran() -> None:
    def runs(lr: float, losses: dict[int, float | None]) -> list[TrialResult]:
        return [
            TrialResult("adamw", 8, lr, s, "confirm", "completed" if v is not None else "diverged", v, 1, 1)
            for s, v in losses.items()
        ]

    first = runs(1e-3, {1: 3.10, 2: 3.00, 3: 3.20})
    assert second_is_better(first, runs(2e-3, {1: 3.05, 2: 3.04}))  # 3.045 against 3.05 on seeds 1 and 2
    assert not second_is_better(first, runs(2e-3, {1: 3.06, 2: 3.04}))  # a tie is no better
    assert not second_is_better(first, runs(2e-3, {1: 2.9, 2: None}))  # a run there diverged
    assert not second_is_better(first, runs(2e-3, {4: 2.9, 5: 2.9}))  # no seed in common
    assert not second_is_better(first, [])
