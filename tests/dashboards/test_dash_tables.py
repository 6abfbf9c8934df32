"""The tidy tables behind the figures, on hand-made sweeps with exact expected values."""

from __future__ import annotations

import math

import pytest
from dash_helpers import make_sweep, rich_sweep, trial

from dashboards.data import (
    PowerLaw,
    attention_curves,
    best_lr_fit,
    best_runs,
    fit_power_law,
    loss_curves,
    lr_points,
    noise_scale,
    sample_runs,
    scaling_points,
    steps_to_target,
)

# --------------------------------------------------------------------------------------------------
# The power law
# --------------------------------------------------------------------------------------------------


def test_power_law_recovers_an_exact_law() -> None:
    law = fit_power_law([(4, 0.01), (16, 0.02), (64, 0.04)])
    assert law is not None
    assert law.exponent == pytest.approx(0.5, abs=1e-12)
    assert law.prefactor == pytest.approx(0.005, rel=1e-12)  # 0.01 / sqrt(4)
    assert law.r2 == pytest.approx(1.0, abs=1e-12)
    assert law.n == 3
    assert law(256) == pytest.approx(0.08, rel=1e-12)


def test_power_law_least_squares_by_hand() -> None:
    # In units of ln 2: X = 0, 1, 2 and Y = 0, 2, 3. Slope = Sxy / Sxx = 3 / 2; intercept = 5/3 - 3/2 = 1/6,
    # so prefactor = 2^(1/6). Residuals -1/6, 1/3, -1/6: SS_res = 1/6, SS_tot = 14/3, R^2 = 1 - 1/28.
    law = fit_power_law([(1, 1), (2, 4), (4, 8)])
    assert law is not None
    assert law.exponent == pytest.approx(1.5, abs=1e-12)
    assert law.prefactor == pytest.approx(2 ** (1 / 6), rel=1e-12)
    assert law.r2 == pytest.approx(27 / 28, abs=1e-12)


def test_power_law_degenerate_inputs() -> None:
    # one distinct batch size has no slope
    assert fit_power_law([(8, 0.01), (8, 0.02)]) is None
    assert fit_power_law([]) is None
    # equal lrs: a flat law, R^2 undefined rather than a division by zero
    flat = fit_power_law([(4, 0.01), (8, 0.01)])
    assert flat == PowerLaw(exponent=0.0, prefactor=pytest.approx(0.01), r2=None, n=2)
    with pytest.raises(ValueError, match="x > 0 and y > 0"):
        fit_power_law([(4, 0.01), (0, 0.02)])
    with pytest.raises(ValueError):
        fit_power_law([(4, 0.01), (8, -0.02)])


# --------------------------------------------------------------------------------------------------
# Best runs and sample runs
# --------------------------------------------------------------------------------------------------


def test_best_run_follows_the_report_and_breaks_ties_by_seed() -> None:
    lr = 0.01
    ts = [
        trial("adamw", 4, lr, val=[(100, 3.0)]),
        trial("adamw", 4, lr * 2, val=[(100, 3.2)]),
        trial("adamw", 4, lr, seed=1, role="seed", val=[(100, 2.9)]),  # lower, but a seed run: never "best"
        trial("adamw", 4, lr * 3, status="pruned", val=[(50, 2.5)]),  # lower, but pruned: never "best"
        trial("adamw", 8, lr, val=[(100, 3.1)]),
    ]
    s = make_sweep(ts, optimizers=("adamw",))
    best = best_runs(s)
    assert best[("adamw", 4)].lr == lr and best[("adamw", 4)].role == "search"
    # the cell mean is over the best run and the seed run at its lr (the report's samples)
    assert [t.final_val_loss for t in sample_runs(s)[("adamw", 4)]] == [3.0, 2.9]
    assert s.cell("adamw", 4).val_losses == [3.0, 2.9]  # type: ignore[union-attr]
    assert [t.final_val_loss for t in sample_runs(s)[("adamw", 8)]] == [3.1]


def test_best_run_missing_when_a_cell_has_no_completed_search() -> None:
    s = make_sweep(
        [
            trial("adamw", 4, 0.01, val=[(100, 3.0)]),
            trial("adamw", 8, 0.01, status="diverged", val=[(50, 3.5)]),
            trial("adamw", 8, 0.02, status="failed"),
        ],
        optimizers=("adamw",),
    )
    assert set(best_runs(s)) == {("adamw", 4)}
    assert s.cell("adamw", 8).best_lr is None  # type: ignore[union-attr]


# --------------------------------------------------------------------------------------------------
# 1. Scaling
# --------------------------------------------------------------------------------------------------


def test_scaling_points_are_the_report_cells() -> None:
    s = rich_sweep()
    t = scaling_points(s)
    # one point per (optimizer, batch size), including AdamW's empty B=32 cell
    assert [(p.optimizer, p.batch_size) for p in t.points] == [
        (o, b) for o in ("adamw", "merit") for b in (4, 8, 16, 32)
    ]
    for p in t.points:
        cell = s.cell(p.optimizer, p.batch_size)
        assert cell is not None
        assert (p.val_loss_mean, p.ci_low, p.ci_high, p.seeds) == (cell.val_loss_mean, *cell.val_loss_ci95, cell.seeds)
    empty = next(p for p in t.points if (p.optimizer, p.batch_size) == ("adamw", 32))
    assert (empty.val_loss_mean, empty.ci_low, empty.ci_high, empty.seeds) == (None, None, None, 0)
    # the merit means: final val losses of seed 0 and seed 1 (base 3.02 + 0.01 i^2, seed 1 +0.01)
    merit = [p.val_loss_mean for p in t.points if p.optimizer == "merit"]
    assert merit == pytest.approx([3.025, 3.035, 3.065, 3.115])


def test_scaling_bands_and_marks() -> None:
    s = rich_sweep()
    t = scaling_points(s)
    bands = {b.optimizer: b for b in t.bands}
    # band = [reference, (1 + tol) x reference] of each optimizer's own loss at the smallest batch size
    assert bands["adamw"].reference == pytest.approx(3.005)
    assert bands["adamw"].upper == pytest.approx(3.005 * 1.03)
    assert bands["adamw"].is_baseline and not bands["merit"].is_baseline
    marks = {(m.optimizer, m.reference): m for m in t.marks}
    assert marks[("adamw", "self")].batch_size == 8  # 3.245 at B=16 > 3.005 x 1.03
    assert marks[("merit", "self")].batch_size == 32  # 3.115 <= 3.025 x 1.03 = 3.11575
    assert marks[("merit", "baseline")].batch_size == 16  # 3.115 > 3.005 x 1.03 = 3.09515
    assert marks[("merit", "baseline")].val_loss_mean == pytest.approx(3.065)  # the marker sits on the cell mean
    for (opt, ref), m in marks.items():
        assert m.batch_size == getattr(s.report.optimizers[opt].largest_degradation_free_batch_size, ref)


# --------------------------------------------------------------------------------------------------
# 2. LR sensitivity
# --------------------------------------------------------------------------------------------------


def test_lr_points_statuses_and_losses() -> None:
    s = rich_sweep()
    t = lr_points(s)
    shown = [x for x in s.trials if x.status != "cancelled"]
    # every finished trial once; the cancelled ones (re-run on resume) never
    assert len(t.points) == len(shown)
    assert not any(p.status == "cancelled" for p in t.points)
    for p in t.points:
        if p.status == "completed":
            assert p.val_loss is not None
        elif p.status == "pruned":
            assert p.val_loss is not None  # the loss when it was stopped
        else:
            # diverged runs did log a val_loss before diverging: it is not a final loss
            assert p.val_loss is None
    assert t.count("adamw", "diverged") == 3 and t.count("adamw", "failed") == 1
    assert t.count("merit", "pruned") == 1
    # one best per cell with a best run: 3 for AdamW (B=32 all diverged), 4 for MERIT
    assert sum(p.is_best for p in t.points) == 7
    assert {(p.optimizer, p.batch_size, p.lr) for p in t.points if p.is_best} == {
        (o, c.batch_size, c.best_lr) for o, r in s.report.optimizers.items() for c in r.cells if c.best_lr is not None
    }
    assert t.lr_range == (1e-4, 1e-1)


# --------------------------------------------------------------------------------------------------
# 3. Best lr vs batch size
# --------------------------------------------------------------------------------------------------


def test_best_lr_fit_on_a_sweep() -> None:
    s = rich_sweep()  # built with best lr = 1e-3 x (B/4)^0.5 (AdamW) and (B/4)^0.8 (MERIT)
    t = best_lr_fit(s)
    fits = {f.optimizer: f.law for f in t.fits}
    assert fits["adamw"].exponent == pytest.approx(0.5, abs=1e-9)
    assert fits["adamw"].prefactor == pytest.approx(1e-3 / 4**0.5, rel=1e-9)
    assert fits["adamw"].n == 3  # AdamW's B=32 has no best lr
    assert fits["merit"].exponent == pytest.approx(0.8, abs=1e-9)
    assert fits["merit"].n == 4
    rules = {(r.optimizer, r.rule): r for r in t.rules}
    assert rules[("merit", "sqrt")](16) == pytest.approx(1e-3 * 2)  # sqrt(16 / 4) from the B=4 anchor
    assert rules[("merit", "linear")](16) == pytest.approx(1e-3 * 4)
    assert len(t.points) == 7


def test_best_lr_fit_needs_two_batch_sizes() -> None:
    s = make_sweep(
        [trial("adamw", 4, 0.01, val=[(100, 3.0)]), trial("adamw", 8, 0.01, status="diverged")], optimizers=("adamw",)
    )
    t = best_lr_fit(s)
    assert t.fits == ()  # one point: no law
    assert [r.anchor_batch for r in t.rules] == [4, 4]


# --------------------------------------------------------------------------------------------------
# 4, 5. Curves
# --------------------------------------------------------------------------------------------------


def test_loss_curves_are_the_best_runs_histories() -> None:
    s = rich_sweep()
    pts = loss_curves(s)
    best = best_runs(s)
    assert {(p.optimizer, p.batch_size) for p in pts} == set(best)
    for key, run in best.items():
        for metric in ("val_loss", "train_loss"):
            got = [(p.tokens, p.value) for p in pts if (p.optimizer, p.batch_size) == key and p.metric == metric]
            assert got == list(run.history[metric])
            assert all(p.run_name == run.run_name for p in pts if (p.optimizer, p.batch_size) == key)


def test_attention_falls_back_to_the_longest_run_of_the_largest_batch() -> None:
    s = rich_sweep()
    t = attention_curves(s)
    # MERIT's largest cell has a best run; AdamW's B=32 only diverged runs: the one with most tokens,
    # ties by the smaller lr
    assert t.runs["merit"] == (32, best_runs(s)[("merit", 32)].run_name, "completed")
    bs, name, status = t.runs["adamw"]
    assert (bs, status) == (32, "diverged")
    assert name == min((x for x in s.trials_of("adamw", 32)), key=lambda x: x.lr).run_name
    assert sorted({p.layer for p in t.points if p.optimizer == "adamw"}) == [0, 1, 2]
    assert max(p.value for p in t.points if p.optimizer == "adamw") == 60.0  # layer 2 at 2048 tokens
    assert t.missing == ()


def test_attention_missing_probe() -> None:
    s = make_sweep(
        [trial("adamw", 4, 0.01, val=[(100, 3.0)], attn={0: [(100, 1.0)]}), trial("merit", 4, 0.01, val=[(100, 3.0)])]
    )
    t = attention_curves(s)
    assert t.missing == ("merit",)
    assert [(p.layer, p.tokens, p.value) for p in t.points] == [(0, 100, 1.0)]


# --------------------------------------------------------------------------------------------------
# 6. Steps to target, noise scale
# --------------------------------------------------------------------------------------------------


def _steps_sweep():
    # seq_len 8, tolerance 0.1: the reference is B=4's final loss 3.0, the target 3.3
    return make_sweep(
        [
            trial("adamw", 4, 0.01, val=[(1024, 4.0), (2048, 3.2), (3072, 3.05), (4096, 3.0)]),
            trial("adamw", 8, 0.01, val=[(1024, 4.0), (2048, 3.5), (3072, 3.25), (4096, 3.1)]),
            trial("adamw", 16, 0.01, val=[(1024, 4.2), (2048, 3.9), (3072, 3.6), (4096, 3.4)]),
        ],
        optimizers=("adamw",),
        batch_sizes=(4, 8, 16),
        tolerance=0.1,
        seq_len=8,
    )


def test_steps_to_target_exact() -> None:
    s = _steps_sweep()
    t = steps_to_target(s)
    got = {p.batch_size: (p.tokens, p.steps) for p in t.points}
    # B=4 first <= 3.3 at 2048 tokens: 2048 // (4 x 8) = 64 steps; B=8 at 3072: 3072 // 64 = 48; B=16 never
    assert got == {4: (2048, 64), 8: (3072, 48), 16: (None, None)}
    assert all(p.target_loss == pytest.approx(3.3) for p in t.points)
    (line,) = t.perfect
    assert (line.anchor_batch, line.anchor_steps) == (4, 64)
    assert line(8) == 32 and line(16) == 16  # steps ∝ 1/B
    # the same rule as the report's steps_to_reference
    assert [c.steps_to_reference for c in s.report.optimizers["adamw"].cells] == [64, 48, None]


def test_noise_scale_critical_batch_is_the_mean_final_estimate_at_the_smallest_measured_batch() -> None:
    lr = 0.01
    s = make_sweep(
        [
            trial("adamw", 4, lr, val=[(100, 3.0)]),  # accumulation 1: no B_simple
            trial("adamw", 8, lr, val=[(100, 3.0)], noise=[(50, 20.0), (100, 10.0)]),
            trial("adamw", 8, lr, seed=1, role="seed", val=[(100, 3.01)], noise=[(50, 9.0), (100, 14.0)]),
            trial("adamw", 8, lr * 2, val=[(100, 3.5)], noise=[(100, 99.0)]),  # not a sample run: ignored
            trial("adamw", 16, lr, val=[(100, 3.0)], noise=[(100, 50.0)]),
            trial("merit", 4, lr, val=[(100, 3.0)]),
        ],
        batch_sizes=(4, 8, 16),
    )
    t = noise_scale(s)
    (crit,) = t.critical
    assert (crit.optimizer, crit.batch_size, crit.runs) == ("adamw", 8, 2)
    assert crit.b_crit == pytest.approx(12.0)  # mean of the final estimates 10 and 14
    assert t.missing == ("merit",)
    # the curves: every sample run's B_simple, none of the non-sample run
    assert sorted((p.batch_size, p.seed, p.tokens, p.b_simple) for p in t.points) == [
        (8, 0, 50, 20.0),
        (8, 0, 100, 10.0),
        (8, 1, 50, 9.0),
        (8, 1, 100, 14.0),
        (16, 0, 100, 50.0),
    ]
    assert not any(math.isclose(p.b_simple, 99.0) for p in t.points)


def test_tables_survive_a_sweep_with_nothing_completed() -> None:
    s = make_sweep(
        [trial("adamw", 4, 0.01, status="diverged", val=[(50, 9.0)]), trial("merit", 4, 0.01, status="failed")],
        batch_sizes=(4,),
    )
    assert best_runs(s) == {}
    assert all(p.val_loss_mean is None for p in scaling_points(s).points)
    assert scaling_points(s).bands == ()
    assert [p.val_loss for p in lr_points(s).points] == [None, None]
    assert best_lr_fit(s).fits == () and loss_curves(s) == ()
    assert steps_to_target(s).perfect == ()
    assert noise_scale(s).missing == ("adamw", "merit")
