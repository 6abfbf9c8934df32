"""sweeps.analysis: hand-made result tables with answers worked out by hand (in the comments)."""

from __future__ import annotations

import json
import math
import pickle
import random
import statistics
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, ValidationError
from spec_helpers import spec_for

from sweeps import report as report_models
from sweeps.analysis import (
    LR_EDGE_FACTOR,
    CellReport,
    Report,
    TrialResult,
    build_report,
    read_report,
    report_to_json,
    upgrade_report,
    validate_report,
)
from sweeps.spec import SweepSpec
from sweeps.stats import mean_ci95, sample_variance, t_quantile, welch_diff_ci95

BATCHES = (16, 32, 64, 128)
SEQ_LEN = 128
TOL = 0.01
NUMBERS: dict[str, Any] = {
    "name": "merit-vs-adamw",
    "batch_sizes": BATCHES,
    "optimizers": ("adamw", "merit"),
    "tolerance": TOL,
    "lr": (1e-4, 3e-2),
    "seeds": 3,
    "seq_len": SEQ_LEN,
}
SPEC = spec_for(**NUMBERS)
LR = 1e-3  # a best lr well inside [1e-4, 3e-2]


def search(opt, b, loss, *, lr=LR, seed=0, status="completed", curve=()):
    return TrialResult(
        optimizer=opt,
        batch_size=b,
        lr=lr,
        seed=seed,
        role="search",
        status=status,
        val_loss=loss,
        tokens=1000,
        steps=10,
        curve=curve,
    )


def seed_run(opt, b, loss, seed, *, lr=LR, status="completed", curve=()):
    return TrialResult(
        optimizer=opt,
        batch_size=b,
        lr=lr,
        seed=seed,
        role="confirm",
        status=status,
        val_loss=loss,
        tokens=1000,
        steps=10,
        curve=curve,
    )


def cell(opt, b, samples, *, lr=LR, worse=3.9):
    """A cell whose best lr is `lr`: a search trial there (its loss a little below the samples: the
    minimum of a search is biased low, and must not be a sample), a worse search trial at another
    lr (never the best), and one completed confirmation run per sample, seeds 1..n."""
    rows = [search(opt, b, min(samples) - 0.05, lr=lr), search(opt, b, worse, lr=lr * 2, seed=1)]
    rows += [seed_run(opt, b, s, seed=i + 1, lr=lr) for i, s in enumerate(samples)]
    return rows


def table(losses: dict[str, list[float | None]]) -> list[TrialResult]:
    """One flat cell (three equal seeds) per (optimizer, batch size); None: no trials at all."""
    rows = []
    for opt, row in losses.items():
        for b, loss in zip(BATCHES, row):
            if loss is not None:
                rows += cell(opt, b, [loss, loss, loss])
    return rows


def answer(report, opt):
    return report.optimizers[opt].largest_degradation_free_batch_size.model_dump()


# ---- statistics -----------------------------------------------------------------------------------


def test_t_quantile_known_values():
    # df=1 is the Cauchy distribution: t = tan(pi x 0.475); df=2 has t = (2p-1)/sqrt(2p(1-p)) exactly,
    # = 0.95 / sqrt(0.04875) = 4.3026527297494638... (the oft-quoted 4.302652729911275 is off in the
    # 11th digit; both agree to rel 1e-9 below). The others are textbook table values.
    assert t_quantile(0.975, 1) == pytest.approx(12.706204736174707, rel=1e-12)
    assert t_quantile(0.975, 2) == pytest.approx(4.302652729749464, rel=1e-12)
    assert t_quantile(0.975, 2) == pytest.approx(4.302652729911275, rel=1e-9)
    assert t_quantile(0.975, 3) == pytest.approx(3.182446305284263, rel=1e-11)
    assert t_quantile(0.975, 4) == pytest.approx(2.776445105197793, rel=1e-11)
    assert t_quantile(0.975, 10) == pytest.approx(2.228138851986274, rel=1e-11)
    assert t_quantile(0.975, 30) == pytest.approx(2.042272456301238, rel=1e-11)
    # symmetry, and the median is 0
    assert t_quantile(0.025, 3) == pytest.approx(-3.182446305284263, rel=1e-11)
    assert t_quantile(0.5, 7.3) == 0.0
    # non-integer df (Welch) lies between its integer neighbours: t decreases with df
    assert t_quantile(0.975, 4) < t_quantile(0.975, 3.5) < t_quantile(0.975, 3)


def test_sample_variance_exact_and_as_statistics_computes_it():
    # [1, 2, 3, 4]: mean 2.5, squared deviations 2.25 + 0.25 + 0.25 + 2.25 = 5, / (n - 1) = 5 / 3
    assert sample_variance([1.0, 2.0, 3.0, 4.0]) == 5 / 3
    assert sample_variance([0.1, 0.1, 0.1]) == 0.0  # all equal: exactly 0, whatever the rounding of the mean
    rng = random.Random(0)
    for n in (2, 3, 7, 40):  # losses of the size a sweep sees, to round-off of the exact value
        xs = [3.2 + rng.gauss(0, 0.01) for _ in range(n)]
        assert sample_variance(xs) == pytest.approx(statistics.variance(xs), rel=1e-9)
    with pytest.raises(ValueError, match="at least 2 samples, got 1"):
        sample_variance([3.0])


def test_mean_ci95_n3_exact():
    # [1, 2, 3]: mean 2, sd 1, half width = t(0.975, 2) x 1 / sqrt(3) = 4.3026527297 / 1.7320508076 = 2.4841377118
    mean, lo, hi, available = mean_ci95([1.0, 2.0, 3.0])
    half = 4.302652729749464 / math.sqrt(3)
    assert half == pytest.approx(2.4841377118, abs=1e-9)
    assert mean == 2.0
    assert (lo, hi) == (pytest.approx(2.0 - half, rel=1e-12), pytest.approx(2.0 + half, rel=1e-12))
    assert available is True


def test_mean_ci95_n2_exact():
    # [1, 3]: mean 2, sd sqrt(2), se = sqrt(2)/sqrt(2) = 1, half width = t(0.975, 1) = 12.706204736174707
    mean, lo, hi, available = mean_ci95([1.0, 3.0])
    assert mean == 2.0
    assert lo == pytest.approx(2.0 - 12.706204736174707, rel=1e-12)
    assert hi == pytest.approx(2.0 + 12.706204736174707, rel=1e-12)
    assert available is True


def test_mean_ci95_single_sample_is_a_point():
    # rule: n = 1 gives [mean, mean] and ci_available false
    assert mean_ci95([3.5]) == (3.5, 3.5, 3.5, False)


def test_welch_diff_ci95_exact():
    # x = [1, 3], y = [0, 2], scale 1: d = 2 - 1 = 1; s_x^2/n = 2/2 = 1, s_y^2/n = 1; var = 2;
    # Welch df = 2^2 / (1^2/1 + 1^2/1) = 2; half = t(0.975, 2) x sqrt(2) = 4.3026527297 x 1.4142135624 = 6.0848...
    d, lo, hi = welch_diff_ci95([1.0, 3.0], [0.0, 2.0])
    half = 4.302652729749464 * math.sqrt(2)
    assert d == 1.0
    assert lo == pytest.approx(1.0 - half, rel=1e-12)
    assert hi == pytest.approx(1.0 + half, rel=1e-12)
    # scale multiplies the reference: d = 2 - 1.5 x 1 = 0.5, var = 1 + 1.5^2 x 1 = 3.25,
    # df = 3.25^2 / (1 + 2.25^2) = 10.5625 / 6.0625 = 1.7423...
    d, lo, hi = welch_diff_ci95([1.0, 3.0], [0.0, 2.0], scale=1.5)
    half = t_quantile(0.975, 10.5625 / 6.0625) * math.sqrt(3.25)
    assert d == 0.5
    assert (lo, hi) == (pytest.approx(0.5 - half, rel=1e-12), pytest.approx(0.5 + half, rel=1e-12))
    # fewer than 2 samples on either side: no interval
    assert welch_diff_ci95([1.0], [0.0, 2.0]) is None


# ---- the answer -----------------------------------------------------------------------------------


def test_flat_losses_give_the_largest_batch():
    # every cell 3.0 (3 equal seeds): 3.0 <= 1.01 x 3.0 everywhere, for self and baseline -> 128
    report = build_report(table({"adamw": [3.0] * 4, "merit": [3.0] * 4}), spec=SPEC)
    for opt in ("adamw", "merit"):
        assert answer(report, opt) == {"self": 128, "baseline": 128}
        # boundary = the answer 128 only (no larger batch); its samples have sd 0 on both sides, so the
        # interval is the point d = 3.0 - 1.01 x 3.0 = -0.03 < 0: not within noise
        assert report.optimizers[opt].within_noise.model_dump() == {"self": False, "baseline": False}
        [check] = report.optimizers[opt].noise_checks.self
        assert check.batch_size == 128
        assert check.diff_ci95 == (pytest.approx(-0.03), pytest.approx(-0.03))
    c = report.optimizers["merit"].cells[0]
    assert c.best_lr == LR and c.val_loss_mean == 3.0 and c.val_loss_ci95 == (3.0, 3.0)
    assert c.seeds == 3 and c.ci_available is True
    # 2 search trials (one worse at 2 x lr) + 3 confirmation runs; the search minimum is reported apart
    assert c.trials == 5 and c.trial_status.model_dump() == {"completed": 5, "pruned": 0, "diverged": 0, "failed": 0}
    assert c.search_best_val_loss == pytest.approx(2.95) and c.stable is True and c.unstable_reason is None


def test_degradation_at_the_third_batch_size():
    # merit: reference 3.00, threshold 1.01 x 3.00 = 3.03; 32: 3.02 ok; 64: 3.10 fails; 128: 3.00 is
    # below 64, which the monotone fit cannot be: both pooled to 3.05 (equal seeds), over 3.03 -> answer 32
    report = build_report(table({"adamw": [3.0] * 4, "merit": [3.00, 3.02, 3.10, 3.00]}), spec=SPEC)
    merit = report.optimizers["merit"]
    assert answer(report, "merit")["self"] == 32
    assert [c.degradation_free.self for c in merit.cells] == [True, True, False, False]
    fitted = [c.val_loss_fitted.self for c in merit.cells]
    # the reference's fitted value: its optimizer's first fitted value, 3.00 (no larger size reads lower)
    assert fitted == [pytest.approx(3.0), pytest.approx(3.02), pytest.approx(3.05), pytest.approx(3.05)]
    assert merit.reference_val_loss.self == 3.0
    # boundary cells: 32 (answer) and 64 (first failure); both intervals are points (sd 0):
    # 3.02 - 3.03 = -0.01 and 3.10 - 3.03 = 0.07, neither straddles 0
    assert [c.batch_size for c in merit.noise_checks.self] == [32, 64]
    assert merit.within_noise.self is False


def test_one_noisy_cell_is_pooled_with_its_neighbour_instead_of_ending_the_walk():
    # merit: threshold 3.03; 32 reads 3.04 (noise), 64 reads 3.01, 128 3.10. Walking the means stopped at
    # 32; the monotone fit pools 32 and 64 to 3.025 <= 3.03 -> answer 64, 128 degraded
    report = build_report(table({"adamw": [3.0] * 4, "merit": [3.00, 3.04, 3.01, 3.10]}), spec=SPEC)
    merit = report.optimizers["merit"]
    assert answer(report, "merit")["self"] == 64
    assert [c.val_loss_fitted.self for c in merit.cells][1:] == [
        pytest.approx(3.025),
        pytest.approx(3.025),
        pytest.approx(3.10),
    ]
    assert [c.degradation_free.self for c in merit.cells] == [True, True, True, False]
    # the means stay the cells' own
    assert [c.val_loss_mean for c in merit.cells] == [pytest.approx(v) for v in (3.00, 3.04, 3.01, 3.10)]


def test_a_reference_that_noise_made_high_is_pooled_with_the_sizes_above_it():
    # merit reads 3.04 at its reference 16 and 3.00 at 32: a monotone curve cannot fall, so the reference's
    # value is their pooled mean 3.02 (equal seeds), the threshold 1.01 x 3.02 = 3.0502, and 64 at 3.06 is
    # degraded. Against its plain mean (threshold 1.01 x 3.04 = 3.0704) 64 passed: answer 64, not 32.
    report = build_report(table({"adamw": [3.0] * 4, "merit": [3.04, 3.00, 3.06, 3.10]}), spec=SPEC)
    merit = report.optimizers["merit"]
    assert answer(report, "merit") == {"self": 32, "baseline": 32}
    assert merit.cells[0].val_loss_fitted.self == pytest.approx(3.02)
    assert [c.degradation_free.self for c in merit.cells] == [True, True, False, False]
    assert merit.reference_val_loss.self == pytest.approx(3.04)  # the reported mean stays the cell's own
    # against the baseline: adamw's flat 3.00 is its own fitted value, and merit's 16 is judged as any cell
    assert report.optimizers["adamw"].cells[0].val_loss_fitted.baseline == pytest.approx(3.0)
    assert [c.val_loss_fitted.baseline for c in merit.cells] == [pytest.approx(v) for v in (3.02, 3.02, 3.06, 3.10)]
    # a reference that reads low is not raised: 3.00 then 3.04 keep 3.00
    low = build_report(table({"adamw": [3.0] * 4, "merit": [3.00, 3.04, 3.06, 3.10]}), spec=SPEC)
    assert low.optimizers["merit"].cells[0].val_loss_fitted.self == pytest.approx(3.0)


def test_the_monotone_fit_weighs_cells_by_their_samples():
    from sweeps.analysis import monotone_fit

    assert monotone_fit([], []) == []
    assert monotone_fit([1.0, 2.0, 3.0], [1, 1, 1]) == [1.0, 2.0, 3.0]  # already non-decreasing: unchanged
    # 3.04 with 2 samples and 3.01 with 6 pool to their weighted mean (2 x 3.04 + 6 x 3.01) / 8 = 3.0175
    assert monotone_fit([3.0, 3.04, 3.01], [4, 2, 6]) == [
        pytest.approx(3.0),
        pytest.approx(3.0175),
        pytest.approx(3.0175),
    ]


def test_baseline_is_stricter_than_self():
    # adamw at 16: 2.98 -> baseline threshold 1.01 x 2.98 = 3.0098
    # merit: 3.000, 3.020, 3.025, 3.500; self threshold 3.03 -> 16, 32, 64 ok, 128 fails -> self 64
    # against the baseline: 16 (3.000 <= 3.0098) ok, 32 (3.020 > 3.0098) fails -> baseline 16
    report = build_report(table({"adamw": [2.98, 2.98, 2.98, 2.98], "merit": [3.000, 3.020, 3.025, 3.500]}), spec=SPEC)
    assert answer(report, "merit") == {"self": 64, "baseline": 16}
    assert report.optimizers["merit"].reference_val_loss.model_dump() == {"self": 3.0, "baseline": 2.98}
    # the baseline optimizer judged against itself: the same answer twice
    assert answer(report, "adamw") == {"self": 128, "baseline": 128}


def test_baseline_answer_null_when_the_smallest_batch_already_fails():
    # merit at 16: 3.10 > 1.01 x 2.98 = 3.0098 -> nothing is degradation-free against the baseline,
    # while against itself the reference cell is degradation-free by definition
    report = build_report(table({"adamw": [2.98] * 4, "merit": [3.10, 3.50, 3.50, 3.50]}), spec=SPEC)
    assert answer(report, "merit") == {"self": 16, "baseline": None}
    assert report.optimizers["merit"].cells[0].degradation_free.model_dump() == {"self": True, "baseline": False}


def test_missing_cell_breaks_the_chain():
    # merit has no trial at 32; 64 and 128 pass on their own, but the chain stops at 32 -> answer 16
    report = build_report(table({"adamw": [3.0] * 4, "merit": [3.0, None, 3.0, 3.0]}), spec=SPEC)
    merit = report.optimizers["merit"]
    assert answer(report, "merit") == {"self": 16, "baseline": 16}
    c32 = merit.cells[1]
    assert c32.batch_size == 32 and c32.trials == 0
    assert c32.best_lr is None and c32.val_loss_mean is None and c32.val_loss_ci95 == (None, None)
    assert c32.degradation_free.model_dump() == {"self": None, "baseline": None} and c32.lr_at_edge is None
    # boundary cells 16 and 32: 16 is the self reference cell (skipped), 32 has no mean (skipped)
    # -> no check -> within_noise null; against the baseline 16 is merit's own cell, so it is checked
    assert merit.noise_checks.self == [] and merit.within_noise.self is None
    assert [c.batch_size for c in merit.noise_checks.baseline] == [16]


def test_diverged_only_cell_has_no_result_and_breaks_the_chain():
    rows = table({"adamw": [3.0] * 4, "merit": [3.0, 3.0, None, 3.0]})
    rows += [search("merit", 64, None, lr=lr, seed=i, status="diverged") for i, lr in enumerate((1e-2, 2e-2, 3e-2))]
    report = build_report(rows, spec=SPEC)
    c64 = report.optimizers["merit"].cells[2]
    assert c64.trial_status.model_dump() == {"completed": 0, "pruned": 0, "diverged": 3, "failed": 0}
    assert c64.trials == 3 and c64.seeds == 0
    assert c64.best_lr is None and c64.val_loss_mean is None and c64.ci_available is False
    assert answer(report, "merit") == {"self": 32, "baseline": 32}
    # the report says why the cell cannot be judged, with the lrs
    assert c64.stable is None
    assert c64.unstable_reason == "unstable: every lr tried diverged (lr=0.01, 0.02, 0.03); no lr trained to the end"


def test_a_cell_whose_search_trained_no_lr_to_the_end_says_what_happened_to_each():
    rows = table({"adamw": [3.0] * 4, "merit": [3.0, 3.0, None, 3.0]})
    rows += [search("merit", 64, None, lr=2e-2, status="diverged"), search("merit", 64, 3.5, lr=1e-4, status="pruned")]
    report = build_report(rows, spec=SPEC)
    c64 = report.optimizers["merit"].cells[2]
    assert c64.best_lr is None and c64.degradation_free.model_dump() == {"self": None, "baseline": None}
    assert c64.unstable_reason == "no lr trained to the end (1 diverged, 1 pruned; diverged at lr=0.02)"


def test_missing_reference_cell_nulls_everything_judged_against_it():
    # adamw (the baseline) has nothing at 16: every baseline verdict of every optimizer is null
    report = build_report(table({"adamw": [None, 3.0, 3.0, 3.0], "merit": [3.0] * 4}), spec=SPEC)
    merit = report.optimizers["merit"]
    assert merit.reference_val_loss.model_dump() == {"self": 3.0, "baseline": None}
    assert answer(report, "merit") == {"self": 128, "baseline": None}
    assert merit.within_noise.baseline is None
    assert answer(report, "adamw") == {"self": None, "baseline": None}


# ---- best lr and seeds ----------------------------------------------------------------------------


def test_best_lr_ignores_pruned_diverged_and_failed_trials():
    rows = [
        search("merit", 16, 3.0, lr=1e-3),
        search("merit", 16, 2.0, lr=2e-3, seed=1, status="pruned"),  # lower loss, but pruned early
        search("merit", 16, None, lr=4e-3, seed=2, status="diverged"),
        search("merit", 16, None, lr=8e-3, seed=3, status="failed"),
    ]
    rows += [seed_run("merit", 16, 3.1, seed=1, lr=1e-3)]
    report = build_report(rows, spec=spec_for(**{**NUMBERS, "seeds": 1}))
    c = report.optimizers["merit"].cells[0]
    # the search only chose the lr: the one sample is the confirmation run's
    assert c.best_lr == 1e-3 and c.val_losses == [3.1] and c.search_best_val_loss == 3.0
    assert c.trial_status.model_dump() == {"completed": 2, "pruned": 1, "diverged": 1, "failed": 1}
    # seeds: 1 -> one confirmation run: the interval collapses to the mean, and says so
    assert c.val_loss_ci95 == (3.1, 3.1) and c.ci_available is False and c.stable is True


def test_cell_samples_are_the_completed_runs_at_the_best_lr():
    rows = [
        search("merit", 16, 3.0, lr=1e-3, seed=0),
        search("merit", 16, 3.3, lr=5e-3, seed=1),
        seed_run("merit", 16, 3.2, seed=2, lr=1e-3),
        seed_run("merit", 16, 3.1, seed=1, lr=1e-3),
        seed_run("merit", 16, 9.9, seed=3, lr=5e-3),  # another lr: not a sample
        seed_run("merit", 16, None, seed=4, lr=1e-3, status="failed"),  # not completed: not a sample
    ]
    rows += [seed_run("merit", 16, 3.0, seed=3, lr=1e-3)]
    c = build_report(rows, spec=spec_for(**{**NUMBERS, "seeds": 4})).optimizers["merit"].cells[0]
    # confirmation runs at the best lr by seed: [3.1, 3.2, 3.0], mean 3.1; the search trial's 3.0 is not one
    assert c.val_losses == [3.1, 3.2, 3.0] and c.search_best_val_loss == 3.0
    assert c.seeds == 3 and c.trials == 7
    assert c.val_loss_mean == pytest.approx(3.1, rel=1e-12)
    # sd 0.1, half = t(0.975, 2) x 0.1 / sqrt(3)
    half = 4.302652729749464 * 0.1 / math.sqrt(3)
    assert c.val_loss_ci95 == (pytest.approx(3.1 - half, rel=1e-9), pytest.approx(3.1 + half, rel=1e-9))
    # seed 4 failed at the chosen lr: 3 of 4 planned confirmations completed -> unstable
    assert c.stable is False and "3 of 4 confirmation runs" in c.unstable_reason
    assert "1 failed" in c.unstable_reason


def test_best_lr_tie_breaks_on_the_smaller_lr_whatever_the_order():
    a = search("merit", 16, 3.0, lr=2e-3, seed=0)
    b = search("merit", 16, 3.0, lr=1e-3, seed=1)
    for rows in ([a, b], [b, a]):
        assert build_report(rows, spec=SPEC).optimizers["merit"].cells[0].best_lr == 1e-3


# ---- within noise ---------------------------------------------------------------------------------


def _noise_rows(ref_samples, next_samples):
    return table({"adamw": [3.0] * 4}) + cell("merit", 16, ref_samples) + cell("merit", 32, next_samples)


def test_within_noise_true_when_the_boundary_interval_straddles_zero():
    # ref 16: [3.0, 3.2, 3.4] mean 3.2, sd 0.2 -> threshold 1.01 x 3.2 = 3.232
    # 32: [3.1, 3.3, 3.5] mean 3.3 > 3.232 -> fails -> answer 16; boundary = 16 (reference, skipped) and 32
    # d = 3.3 - 3.232 = 0.068; var = 0.04/3 + 1.01^2 x 0.04/3 = 0.013333 + 0.013601 = 0.026935, se 0.1641
    # df = 0.026935^2 / (0.013333^2/2 + 0.013601^2/2) = 3.9997, t ~ 2.7765, half ~ 0.4557 -> [-0.388, 0.524]
    report = build_report(_noise_rows([3.0, 3.2, 3.4], [3.1, 3.3, 3.5]), spec=SPEC)
    merit = report.optimizers["merit"]
    assert merit.largest_degradation_free_batch_size.self == 16
    [check] = merit.noise_checks.self
    assert check.batch_size == 32
    assert check.diff_mean == pytest.approx(0.068, abs=1e-12)
    assert check.diff_ci95 == (pytest.approx(-0.388, abs=1e-3), pytest.approx(0.524, abs=1e-3))
    assert check.straddles_zero is True
    assert merit.within_noise.self is True


def test_within_noise_false_when_the_gap_is_clear():
    # ref 16: [3.00, 3.01, 3.02] mean 3.01, sd 0.01 -> threshold 3.0401
    # 32: [3.20, 3.21, 3.22] mean 3.21; d = 0.1699; var = 1e-4/3 x (1 + 1.0201) = 6.7337e-5, se 0.008206,
    # df ~ 4, half ~ 2.776 x 0.008206 = 0.0228 -> [0.147, 0.193], clear of 0
    report = build_report(_noise_rows([3.00, 3.01, 3.02], [3.20, 3.21, 3.22]), spec=SPEC)
    merit = report.optimizers["merit"]
    [check] = merit.noise_checks.self
    assert check.diff_ci95 == (pytest.approx(0.147, abs=1e-3), pytest.approx(0.193, abs=1e-3))
    assert check.straddles_zero is False
    assert merit.within_noise.self is False


def test_within_noise_null_without_two_seeds():
    # seeds: 1 -> one sample per cell: no variance, no interval -> within_noise is null, not false
    report = build_report(_noise_rows([3.0], [3.5]), spec=spec_for(**{**NUMBERS, "seeds": 1}))
    merit = report.optimizers["merit"]
    [check] = merit.noise_checks.self
    assert check.diff_ci95 is None and check.straddles_zero is None
    assert check.diff_mean == pytest.approx(3.5 - 3.03)
    assert merit.within_noise.self is None


# ---- lr at edge and steps to reference ------------------------------------------------------------


def test_lr_at_edge():
    # range [1e-4, 3e-2], factor 1.5: at the edge when lr <= 1.5e-4 or lr >= 3e-2 / 1.5 = 2e-2
    assert LR_EDGE_FACTOR == 1.5
    rows = (
        cell("merit", 16, [3.0], lr=1.4e-4)
        + cell("merit", 32, [3.0], lr=1.6e-4)
        + cell("merit", 64, [3.0], lr=1.9e-2)
        + cell("merit", 128, [3.0], lr=2.1e-2, worse=4.0)
    )
    cells = build_report(rows, spec=SPEC).optimizers["merit"].cells
    assert [c.lr_at_edge for c in cells] == [True, False, False, True]


def test_steps_and_tokens_to_reference():
    # self reference: merit at 16 = mean of its confirmation runs = 3.0 -> threshold 3.03
    # 16: its first confirmation run's curve reaches 3.0 at 40960 tokens -> steps 40960 / (16 x 128) = 20
    # 32: first confirmation (seed 1; curve unsorted on purpose) first <= 3.03 at 81920 -> steps 20;
    #     the search trials' curves reach 3.0 at 4096 tokens, but only the confirmation's counts
    # 64: its first confirmation never gets below 3.1 -> null
    one = spec_for(**{**NUMBERS, "seeds": 1})
    rows = [
        search("merit", 16, 2.9, curve=((4096, 2.9),)),
        seed_run("merit", 16, 3.0, 1, curve=((20480, 3.1), (40960, 3.0))),
        search("merit", 32, 2.9, curve=((4096, 3.0),)),
        search("merit", 32, 3.05, lr=5e-3, seed=1, curve=((4096, 3.0), (122880, 3.05))),
        seed_run("merit", 32, 3.0, 1, curve=((122880, 3.0), (40960, 3.5), (81920, 3.02))),
        search("merit", 64, 2.9, curve=((4096, 3.0),)),
        seed_run("merit", 64, 3.1, 1, curve=((81920, 3.2), (122880, 3.1))),
    ]
    cells = build_report(rows, spec=one).optimizers["merit"].cells
    assert [(c.steps_to_reference, c.tokens_to_reference) for c in cells] == [
        (20, 40960),
        (20, 81920),
        (None, None),
        (None, None),  # no trials at 128
    ]


def test_report_schema_keys_are_stable():
    report = build_report(table({"adamw": [3.0] * 4, "merit": [3.0] * 4}), spec=SPEC)
    written = json.loads(report_to_json(report))  # the keys as report.json holds them, in order
    assert list(written) == [
        "schema_version",
        "sweep",
        "reference_batch_size",
        "baseline",
        "tolerance",
        "seq_len",
        "lr_range",
        "lr_bounds",
        "seeds_planned",
        "trained_tokens",
        "noise_rule",
        "verdict_rule",
        "warmup",
        "batch_search",
        "optimizers",
        "warnings",
    ]
    assert report.batch_search is None  # a list of batch sizes
    assert report.reference_batch_size == 16 and report.sweep == "merit-vs-adamw"
    assert list(report.optimizers) == ["adamw", "merit"]  # spec order
    opt = report.optimizers["merit"]
    assert list(written["optimizers"]["merit"]) == [
        "cells",
        "reference_val_loss",
        "target_loss",
        "largest_degradation_free_batch_size",
        "bracket",
        "smallest_degraded_batch_size",
        "search_steps",
        "within_noise",
        "noise_checks",
    ]
    assert list(written["optimizers"]["merit"]["cells"][0]) == [
        "batch_size",
        "best_lr",
        "search_best_val_loss",
        "search_best_run_id",
        "search_best_trial_number",
        "val_loss_mean",
        "val_loss_ci95",
        "ci_available",
        "val_losses",
        "seeds",
        "confirmation_run_ids",
        "stable",
        "unstable_reason",
        "tokens_trained",
        "trials",
        "trial_status",
        "lr_at_edge",
        "lr_outside_range",
        "val_loss_fitted",
        "degradation_free",
        "verdict",
        "verdict_diff_ci",
        "retreated_from_lr",
        "warmup",
        "warmups_tried",
        "steps_to_reference",
        "tokens_to_reference",
        "chosen",
        "lr_check",
    ]
    assert [c.batch_size for c in opt.cells] == list(BATCHES)
    assert {c.chosen for c in opt.cells} == {"listed"}


def test_report_json_round_trip_and_validation():
    report = build_report(table({"adamw": [3.0] * 4, "merit": [3.0, None, 3.1, 3.0]}), spec=SPEC)
    text = report_to_json(report)
    assert json.loads(text) == report.model_dump(mode="json")
    assert validate_report(json.loads(text)) == report  # read back, the same report
    assert validate_report(json.loads(text)).optimizers["merit"].cells[1].best_lr is None
    with pytest.raises(ValidationError):
        validate_report({**report.model_dump(), "surprise": 1})
    # a Report changed after build_report (the driver adds its warnings) is checked again, not waved through
    report.warnings = ["bs=32: data repeated"]
    assert validate_report(report) == report
    report.warnings = [32]
    with pytest.raises(ValidationError):
        validate_report(report)
    with pytest.raises(ValidationError):
        report_to_json(report)


def same_json(got: Any, want: Any, where: str = "report") -> None:
    """The same JSON: the same keys in the same order, the same types and values (floats to round-off)."""
    assert type(got) is type(want), where
    if isinstance(want, dict):
        assert list(got) == list(want), where
        for k in want:
            same_json(got[k], want[k], f"{where}.{k}")
    elif isinstance(want, list):
        assert len(got) == len(want), where
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            same_json(g, w, f"{where}[{i}]")
    elif isinstance(want, float):
        assert got == pytest.approx(want, rel=1e-12, abs=1e-15), where
    else:
        assert got == want, where


@pytest.mark.parametrize("case", ["list", "one_seed", "search", "retreat"])
def test_the_json_of_the_report_model_is_the_json_of_the_report_dict(case):
    """data/report_baseline.json holds results and the report.json that `build_report`'s dict made of them
    (json.dumps, indent 2) at commit eae26b3, before the report was a model: a list sweep with adaptive seeds,
    warm-up searched, confirmation runs diverging and lrs past the range; one seed per cell, with a cell where
    everything diverged; a search of the batch axis; a retreat. The model writes the same keys, in the same
    order, with the same values (floats to round-off: a newer scipy may move the last digit). Changed since,
    by intent: 6 `val_loss_fitted` values of the list and search cases, where adaptive seeds gave cells
    different seeds and the point estimate now compares them on the same ones (`seed_adjusted_means`); the
    reference cells' `val_loss_fitted`, null before, now the reference's fitted value (11 values, no answer
    moved); 24 `val_loss_fitted` values of the list and search cases by 2e-5 to 6e-4, where the seed
    adjustment became a robust (Huber) fit (no answer, verdict or other value moved); lion's cells at 16
    and 32 in the list case, unstable at lr 0.06 with no lower lr trained to the end, are undecided rather
    than degraded (their `unstable_reason` says so), so its bracket has no smallest degraded size, and
    every case's `verdict_rule` says so; the upper ends of `verdict_diff_ci` (30 values), now at the fine
    claims' level of a fixed sequence rather than a Bonferroni share (no verdict or bracket moved), and
    `verdict_rule` with them; the search case's `batch_search.start`, new (null: the search stepped up from
    its min); every cell's `lr_check` (its second lr and the search's run there, no runs: null where no
    completed lr lies within reach above), every bracket's `lr_checked`, new, and `verdict_rule` saying how
    a check judges (no verdict moved); `verdict_rule` naming the second lr of a best lr at a cliff (no other
    value moved); the second lr of 5 cells of the search case, now the nearest completed lr on the side whose
    search run read lower (below, in each), every `lr_check`'s `searched` (new, false: no cell swapped), and
    `verdict_rule` naming the cells a check goes to (no verdict, answer or other value moved). The data is of schema 2: the model's report is compared with it as
    `upgrade_report` makes it schema 3 (`token_budget` gone into `trained_tokens`, each optimizer's
    `target_loss` added), every other value as stored. Each case's `spec` (a SweepSpec mapping) gives the
    analysis the numbers the report was made with; the retreat case's `warmup`, empty when it was made, is its
    spec's schedule in words, as every spec's report has it."""
    data = json.loads((Path(__file__).parent / "data" / "report_baseline.json").read_text())[case]
    report = build_report(data["results"], spec=SweepSpec.from_mapping(data["spec"]), steps=data["steps"])
    assert isinstance(report, Report)
    assert data["report"]["schema_version"] == 2
    upgraded = upgrade_report(data["report"])
    same_json(json.loads(report_to_json(report)), upgraded)
    assert pickle.loads(pickle.dumps(report)) == report  # as a process pool or Ray passes it on
    # and the JSON read (schema 2, through the upgrade) writes schema 3 byte for byte (a dict of it passes too)
    assert isinstance(read_report(data["report"]), Report)
    assert report_to_json(read_report(data["report"])) == report_to_json(upgraded) == json.dumps(upgraded, indent=2)


def test_a_report_reads_in_schema_3_or_2_and_nothing_else():
    report = build_report(table({"adamw": [3.0] * 4, "merit": [3.0, 3.0, 3.1, 3.3]}), spec=SPEC)
    written = report.model_dump(mode="json")
    assert read_report(written) == report and written["schema_version"] == 3
    merit = report.optimizers["merit"]
    assert merit.target_loss == pytest.approx((1 + TOL) * 3.0)  # the reference cell's value, fitted
    # as schema 2 wrote it: no target_loss, the tokens under both names (or, earlier, token_budget alone)
    old = {**written, "schema_version": 2, "token_budget": written["trained_tokens"]}
    old["optimizers"] = {
        n: {k: v for k, v in o.items() if k != "target_loss"} for n, o in written["optimizers"].items()
    }
    assert read_report(old) == report
    assert read_report({k: v for k, v in old.items() if k != "trained_tokens"}) == report
    assert upgrade_report(old) == written
    for version in (1, 4, "2", None):
        with pytest.raises(ValidationError):
            read_report({**written, "schema_version": version})
    with pytest.raises(ValidationError):
        read_report({"schema_version": 2})
    with pytest.raises(ValidationError):
        read_report({**old, "schema_version": 3})  # schema 2's keys are not schema 3


def test_the_json_names_are_the_attribute_names():
    """No field of the report has an alias: report.json's keys are the models' attributes ("self" included)."""
    models = [m for m in vars(report_models).values() if isinstance(m, type) and issubclass(m, BaseModel)]
    assert Report in models and CellReport in models
    for model in models:
        for name, f in model.model_fields.items():
            assert f.alias is None and f.serialization_alias is None and f.validation_alias is None, (model, name)


def test_a_spec_read_back_and_results_as_dicts_give_the_same_report():
    rows = table({"adamw": [3.0] * 4, "merit": [3.0] * 4})
    # the spec as the service stores it (its JSON), validated again
    stored = SweepSpec.from_stored(SPEC.model_dump(mode="json"))
    assert build_report(rows, spec=stored) == build_report(rows, spec=SPEC)
    # and results may come as dicts (the wire form)
    assert build_report([r.to_dict() for r in rows], spec=SPEC) == build_report(rows, spec=SPEC)


def test_results_outside_the_sweep_are_refused():
    with pytest.raises(ValueError, match=r"outside the sweep \[\('lion', 16\)\]"):
        build_report([search("lion", 16, 3.0)], spec=SPEC)
    with pytest.raises(ValueError, match=r"\('merit', 24\)"):
        build_report([search("merit", 24, 3.0)], spec=SPEC)


def test_trial_result_checks_itself():
    with pytest.raises(ValueError, match="completed trial needs a finite val_loss, got val_loss=None"):
        search("merit", 16, None)
    with pytest.raises(ValueError, match="status must be one of"):
        search("merit", 16, 3.0, status="done")
    with pytest.raises(ValueError, match="completed trial needs a finite val_loss, got val_loss=nan"):
        search("merit", 16, float("nan"))


def test_the_report_of_the_demo_spec_carries_its_numbers():
    from pathlib import Path

    import sweeps

    spec = SweepSpec.load(Path(sweeps.__file__).parent / "examples" / "demo.yaml")
    # with no results at all every cell is empty and every answer null
    report = build_report([], spec=spec)
    assert answer(report, "merit") == {"self": None, "baseline": None}
    assert (report.sweep, report.baseline, report.tolerance) == ("demo", "adamw", 0.02)
    assert list(report.optimizers) == ["adamw", "merit"]
    assert [c.batch_size for c in report.optimizers["merit"].cells] == [8, 32, 128]
    assert report.reference_batch_size == 8 and report.batch_search is None
    assert report.lr_range == (1e-4, 3e-2)
    assert report.lr_bounds == (1e-4 / 4.0, 3e-2 * 4.0)  # lr.extend 4
    assert (report.seeds_planned, report.seq_len, report.trained_tokens) == (4, 64, 81920)
    assert report.noise_rule == "Welch 95% interval of each boundary difference, one look"  # one look
    assert report.warmup == (
        "linear warm-up over 5% of each trial's steps: the same tokens at every batch size, fewer steps at a "
        "larger one; only the peak lr is searched"
    )


# ---- every failure at the chosen lr counts --------------------------------------------------------


def test_confirmation_runs_that_diverge_at_the_chosen_lr_break_the_chain():
    # merit at 32: its search found lr 1e-3 at a fine 3.0, but both planned confirmation runs there
    # diverged (SPEC plans 3: the third is missing). The cell is unstable at its best lr: a
    # degradation, whatever the search sample says; the chain stops at 16.
    rows = table({"adamw": [3.0] * 4, "merit": [3.0, None, 3.0, 3.0]})
    rows += [search("merit", 32, 3.0), search("merit", 32, 3.5, lr=2e-3, seed=1)]
    rows += [seed_run("merit", 32, None, s, status="diverged") for s in (1, 2)]
    report = build_report(rows, spec=SPEC)
    c32 = report.optimizers["merit"].cells[1]
    assert c32.best_lr == LR and c32.search_best_val_loss == 3.0
    assert c32.val_loss_mean is None and c32.seeds == 0 and c32.stable is False
    assert c32.unstable_reason == (
        "0 of 3 confirmation runs at lr=0.001 completed (2 diverged, 1 missing): unstable at its best lr; "
        "no lower lr trained to the end, so the bracket leaves it undecided"
    )
    assert answer(report, "merit") == {"self": 16, "baseline": 16}
    # the divergence says lr 1e-3 may be too high for 32, not that 32 is worse: no lower lr trained, so
    # the verdict is undecided (the point estimate's walk still stops there)
    assert c32.verdict.model_dump() == {"self": "undecided", "baseline": "undecided"}

    # a lower lr trained to the end, and the confirmation runs of the retreat there diverged too: no lr
    # stable for every seed (nothing lies below the lowest divergence, so the cell stays at its best lr)
    rows += [search("merit", 32, 3.1, lr=LR / 2, seed=0)]
    rows += [seed_run("merit", 32, None, s, lr=LR / 2, status="diverged") for s in (1, 2, 3)]
    c32 = build_report(rows, spec=SPEC).optimizers["merit"].cells[1]
    assert c32.best_lr == LR and c32.retreated_from_lr is None
    assert "no lower lr" not in c32.unstable_reason
    assert c32.verdict.model_dump() == {"self": "degraded", "baseline": "degraded"}


def test_a_cell_with_fewer_confirmations_than_planned_is_a_degradation_even_with_a_good_mean():
    # merit at 32: 2 of 3 confirmation runs completed at 3.0 (a mean well inside the tolerance) and one
    # failed: unstable -> degradation-free false, answer 16; the other cells are as before
    rows = table({"adamw": [3.0] * 4, "merit": [3.0, None, 3.0, 3.0]}) + cell("merit", 32, [3.0, 3.0])
    rows += [seed_run("merit", 32, None, 3, status="failed")]
    merit = build_report(rows, spec=SPEC).optimizers["merit"]
    c32 = merit.cells[1]
    assert c32.val_loss_mean == 3.0 and c32.stable is False and "1 failed" in c32.unstable_reason
    assert [c.degradation_free.self for c in merit.cells] == [True, False, True, True]
    assert merit.largest_degradation_free_batch_size.self == 16
    # an unstable cell's verdict is not a matter of noise: it gets no noise check
    assert [ch.batch_size for ch in merit.noise_checks.self] == []


def test_the_report_names_the_runs_it_is_about():
    rows = [
        TrialResult("merit", 16, 1e-3, 0, "search", "completed", 3.0, 1000, 10, number=4, run_id="run-best"),
        TrialResult("merit", 16, 2e-3, 0, "search", "completed", 3.2, 1000, 10, number=5, run_id="run-other"),
        TrialResult("merit", 16, 1e-3, 2, "confirm", "completed", 3.1, 1000, 10, number=7, run_id="run-s2"),
        TrialResult("merit", 16, 1e-3, 1, "confirm", "completed", 3.1, 1000, 10, number=6, run_id="run-s1"),
    ]
    c = build_report(rows, spec=spec_for(**{**NUMBERS, "seeds": 2})).optimizers["merit"].cells[0]
    assert (c.search_best_run_id, c.search_best_trial_number) == ("run-best", 4)
    assert c.confirmation_run_ids == ["run-s1", "run-s2"]
    assert c.tokens_trained == 1000
