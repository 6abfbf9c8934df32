"""The tidy tables behind the figures, on hand-made sweeps with exact expected values."""

from __future__ import annotations

import logging
import math
from dataclasses import replace

import pytest
from dash_helpers import confirmations, make_sweep, rich_sweep, trial

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
from sweeps.plan import run_name

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
# The runs the report names: best runs and sample runs
# --------------------------------------------------------------------------------------------------


def test_best_run_and_sample_runs_are_the_runs_the_report_names() -> None:
    lr = 0.01
    search = trial("adamw", 4, lr, val=[(100, 3.0)])
    ts = [
        search,
        trial("adamw", 4, lr * 2, val=[(100, 3.2)]),
        # the confirmation runs, given out of seed order: the report's order (by seed) is the one kept
        trial("adamw", 4, lr, seed=2, role="confirm", val=[(100, 3.05)]),
        trial("adamw", 4, lr, seed=1, role="confirm", val=[(100, 2.9)]),  # lower, but a confirmation run: never "best"
        trial("adamw", 4, lr * 3, status="pruned", val=[(50, 2.5)]),  # lower, but pruned: never "best"
        trial("adamw", 8, lr, val=[(100, 3.1)]),
        *confirmations("adamw", 8, lr, [(100, 3.12)], [(100, 3.14)]),
    ]
    s = make_sweep(ts, optimizers=("adamw",))
    cell = s.cell("adamw", 4)
    assert cell is not None and cell.stable
    best = best_runs(s)
    assert set(best) == {("adamw", 4), ("adamw", 8)}
    assert best[("adamw", 4)].run_id == search.run_id == cell.search_best_run_id
    assert best[("adamw", 4)].number == cell.search_best_trial_number == 0  # numbered by make_sweep, in input order
    assert best[("adamw", 4)].final_val_loss == cell.search_best_val_loss == 3.0
    # the samples are the confirmation runs only (the search trial is none), by seed: the report's val_losses
    samples = sample_runs(s)[("adamw", 4)]
    assert [t.run_id for t in samples] == cell.confirmation_run_ids == [ts[3].run_id, ts[2].run_id]
    assert [(t.role, t.seed) for t in samples] == [("confirm", 1), ("confirm", 2)]
    assert [t.final_val_loss for t in samples] == cell.val_losses == [2.9, 3.05]
    assert [t.final_val_loss for t in sample_runs(s)[("adamw", 8)]] == [3.12, 3.14]


def test_the_named_run_wins_over_a_lower_run_at_the_same_lr() -> None:
    # Two search trials at one lr tie at 3.0 in the analysis: the earlier trial (Optuna number 0) is the
    # report's best. MLflow then holds a lower final loss for the other one (2.95: a loss recorded after
    # the value the analysis got), and a confirmation run lower still. Re-selecting by lr and lowest
    # loss would pick the 2.95 run; the dashboards draw the run the report names.
    lr = 0.01
    named = trial("adamw", 4, lr, val=[(100, 3.0)], attn={0: [(100, 1.0)]}, run_id="named", number=0)
    lower = trial("adamw", 4, lr, val=[(100, 3.0)], attn={0: [(100, 7.0)]}, run_id="lower", number=1)
    ts = [
        lower,  # first in the input: an order-based choice would take it too
        named,
        *confirmations("adamw", 4, lr, [(100, 2.9)], [(100, 3.1)]),
    ]
    s = make_sweep(ts, optimizers=("adamw",), batch_sizes=(4,))
    cell = s.cell("adamw", 4)
    assert cell is not None and cell.search_best_run_id == "named" and cell.search_best_trial_number == 0
    lowered = replace(
        lower, metrics={**lower.metrics, "val_loss": 2.95}, history={**lower.history, "val_loss": ((100, 2.95),)}
    )
    s = replace(s, trials=tuple(lowered if t.run_id == "lower" else t for t in s.trials))
    assert lowered.final_val_loss is not None and lowered.final_val_loss < named.final_val_loss  # type: ignore[operator]
    assert best_runs(s)[("adamw", 4)].run_id == "named"
    # figure 2 stars the named run and no other
    assert [(p.run_name, p.role, p.val_loss) for p in lr_points(s).points if p.is_best] == [
        (named.run_name, "search", 3.0)
    ]
    assert sum(p.is_best for p in lr_points(s).points) == 1
    # figure 4 draws the first confirmation run (seed 1), neither search trial
    assert {p.run_name for p in loss_curves(s)} == {run_name("adamw", 4, lr, 1)}
    # figure 5 draws the named best run's probe (1.0), not the other search trial's (7.0)
    assert [(p.layer, p.tokens, p.value) for p in attention_curves(s).points] == [(0, 100, 1.0)]
    # figure 6's samples are the named confirmation runs
    assert [t.seed for t in sample_runs(s)[("adamw", 4)]] == [1, 2]


def test_best_run_missing_when_a_cell_has_no_completed_search(caplog: pytest.LogCaptureFixture) -> None:
    s = make_sweep(
        [
            trial("adamw", 4, 0.01, val=[(100, 3.0)]),
            trial("adamw", 8, 0.01, status="diverged", val=[(50, 3.5)]),
            trial("adamw", 8, 0.02, status="failed"),
        ],
        optimizers=("adamw",),
    )
    with caplog.at_level(logging.WARNING, logger="dashboards.data"):
        assert set(best_runs(s)) == {("adamw", 4)}
    cell = s.cell("adamw", 8)
    assert cell is not None and cell.best_lr is None and cell.search_best_run_id is None
    assert caplog.records == []  # no best lr, no named run: nothing is missing
    # no confirmation runs: no samples (the search trial is not one)
    assert sample_runs(s) == {}


def _named_sweep():
    lr = 0.01
    return make_sweep(
        [
            trial("adamw", 4, lr, val=[(100, 3.0)]),
            *confirmations("adamw", 4, lr, [(100, 3.01)], [(100, 3.02)]),
            trial("adamw", 8, lr, val=[(100, 3.1)]),
            *confirmations("adamw", 8, lr, [(100, 3.11)], [(100, 3.12)]),
        ],
        optimizers=("adamw",),
    )


def test_a_named_run_that_is_not_recorded_leaves_its_cell_out_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    s = _named_sweep()
    c4, c8 = s.report.optimizers["adamw"].cells
    gone = {c4.search_best_run_id, c8.confirmation_run_ids[0]}
    s = replace(s, trials=tuple(t for t in s.trials if t.run_id not in gone))
    with caplog.at_level(logging.WARNING, logger="dashboards.data"):
        best = best_runs(s)
        samples = sample_runs(s)
    # no fallback to another run at the best lr (B=4's confirmation runs are there): absent
    assert set(best) == {("adamw", 8)}
    assert [t.run_id for t in samples[("adamw", 8)]] == c8.confirmation_run_ids[1:]
    assert [t.run_id for t in samples[("adamw", 4)]] == c4.confirmation_run_ids
    messages = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any(
        f"adamw bs=4: the report's best search trial {c4.search_best_run_id} is not among" in m for m in messages
    )
    assert any(
        f"adamw bs=8: the report's confirmation run {c8.confirmation_run_ids[0]} is not among" in m for m in messages
    )
    assert any("adamw bs=8: 1 completed confirmation run(s) found, the report has 2 samples" in m for m in messages)


def test_a_null_or_foreign_run_id_leaves_the_run_out_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    s = _named_sweep()
    report = s.report.model_copy(deep=True)
    c4, c8 = report.optimizers["adamw"].cells
    c4.search_best_run_id = c8.search_best_run_id  # a run of another cell
    c8.search_best_run_id = None  # the driver could not name it
    c8.confirmation_run_ids = [None, c8.confirmation_run_ids[1]]
    s = replace(s, report=report)
    with caplog.at_level(logging.WARNING, logger="dashboards.data"):
        assert best_runs(s) == {}
        assert [t.seed for t in sample_runs(s)[("adamw", 8)]] == [2]
    messages = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any(
        f"adamw bs=4: the report's best search trial {c4.search_best_run_id} is a run of adamw bs=8" in m
        for m in messages
    )
    assert any("adamw bs=8: the report has no run id for its best search trial" in m for m in messages)
    assert any("adamw bs=8: the report has no run id for its confirmation run" in m for m in messages)


def test_diverged_confirmation_runs_are_named_but_are_not_samples(caplog: pytest.LogCaptureFixture) -> None:
    lr = 0.01
    s = make_sweep(
        [
            trial("adamw", 4, lr, val=[(100, 3.0)]),
            trial("adamw", 4, lr, seed=1, role="confirm", status="diverged", val=[(50, 3.4)]),
            trial("adamw", 4, lr, seed=2, role="confirm", val=[(100, 3.02)]),
        ],
        optimizers=("adamw",),
        batch_sizes=(4,),
    )
    cell = s.cell("adamw", 4)
    assert cell is not None and cell.stable is False and len(cell.confirmation_run_ids) == 2
    with caplog.at_level(logging.WARNING, logger="dashboards.data"):
        samples = sample_runs(s)[("adamw", 4)]
    assert [(t.seed, t.final_val_loss) for t in samples] == [(2, 3.02)] and cell.val_losses == [3.02]
    assert caplog.records == []  # what the report has, the tables have: nothing to warn about


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
    # one best per cell with a best run: 3 for AdamW (B=32 all diverged), 4 for MERIT; it is the run the
    # report names (a search trial at the best lr with the search's loss), not a confirmation run at that lr
    by_id = s.runs_by_id()
    cells = [(o, c) for o, r in s.report.optimizers.items() for c in r.cells if c.best_lr is not None]
    assert sum(p.is_best for p in t.points) == 7 == len(cells)
    assert {(p.optimizer, p.batch_size, p.lr, p.role, p.seed, p.val_loss) for p in t.points if p.is_best} == {
        (o, c.batch_size, c.best_lr, "search", 0, c.search_best_val_loss) for o, c in cells
    }
    assert {p.run_name for p in t.points if p.is_best} == {by_id[c.search_best_run_id].run_name for _, c in cells}  # type: ignore[index]
    # every confirmation run is drawn too (figure 2 shows every trial), unstarred
    assert sum(p.role == "confirm" for p in t.points) == 2 * 7 and not any(
        p.is_best and p.role == "confirm" for p in t.points
    )
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


def test_loss_curves_are_the_first_confirmation_runs_histories() -> None:
    s = rich_sweep()
    pts = loss_curves(s)
    by_id = s.runs_by_id()
    cells = {(o, c.batch_size): c for o, r in s.report.optimizers.items() for c in r.cells if c.confirmation_run_ids}
    assert len(cells) == 7  # AdamW's B=32 has no best lr, so no confirmation runs: no curve
    assert {(p.optimizer, p.batch_size) for p in pts} == set(cells)
    for key, cell in cells.items():
        run = by_id[cell.confirmation_run_ids[0]]  # type: ignore[index]
        assert (run.role, run.seed) == ("confirm", 1)
        mine = [p for p in pts if (p.optimizer, p.batch_size) == key]
        for metric in ("val_loss", "train_loss"):
            got = [(p.tokens, p.value) for p in mine if p.metric == metric]
            assert got == list(run.history[metric])
        assert {p.run_name for p in mine} == {run.run_name}
        # it ends at the report's first sample, the curve steps_to_reference was read from
        assert [p.value for p in mine if p.metric == "val_loss"][-1] == cell.val_losses[0]
        # the search best (lower: biased) is not drawn
        best = by_id[cell.search_best_run_id]  # type: ignore[index]
        assert best.final_val_loss is not None and best.final_val_loss < cell.val_losses[0]


def test_attention_falls_back_to_the_longest_run_of_the_largest_batch() -> None:
    s = rich_sweep()
    t = attention_curves(s)
    # MERIT's largest cell has a best run (the report's named search trial); AdamW's B=32 only diverged
    # runs: the one with most tokens, ties by the smaller lr
    named = s.runs_by_id()[s.cell("merit", 32).search_best_run_id]  # type: ignore[union-attr,index]
    assert best_runs(s)[("merit", 32)] is named and named.role == "search"
    assert t.runs["merit"] == (32, named.run_name, "completed")
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
    # seq_len 8, tolerance 0.1: the reference is B=4's mean over its confirmation runs, 3.0; the target 3.3.
    # Each search best is lower (biased) and reaches 3.3 earlier than the confirmation runs: steps read from
    # it instead of the first confirmation run would be 32, 32 and 32.
    lr = 0.01
    return make_sweep(
        [
            trial("adamw", 4, lr, val=[(1024, 3.25), (2048, 3.1), (3072, 3.0), (4096, 2.95)]),
            *confirmations(
                "adamw",
                4,
                lr,
                [(1024, 4.0), (2048, 3.2), (3072, 3.05), (4096, 3.0)],
                [(1024, 4.1), (2048, 3.4), (3072, 3.1), (4096, 3.0)],
            ),
            trial("adamw", 8, lr, val=[(1024, 4.0), (2048, 3.3), (3072, 3.1), (4096, 3.05)]),
            *confirmations(
                "adamw",
                8,
                lr,
                [(1024, 4.0), (2048, 3.5), (3072, 3.25), (4096, 3.1)],
                [(1024, 3.9), (2048, 3.31), (3072, 3.2), (4096, 3.12)],
            ),
            trial("adamw", 16, lr, val=[(1024, 4.1), (2048, 3.6), (3072, 3.4), (4096, 3.28)]),
            *confirmations(
                "adamw",
                16,
                lr,
                [(1024, 4.2), (2048, 3.9), (3072, 3.6), (4096, 3.4)],
                [(1024, 4.2), (2048, 3.9), (3072, 3.3), (4096, 3.42)],
            ),
        ],
        optimizers=("adamw",),
        batch_sizes=(4, 8, 16),
        tolerance=0.1,
        seq_len=8,
    )


def test_steps_to_target_are_the_reports() -> None:
    s = _steps_sweep()
    t = steps_to_target(s)
    got = {p.batch_size: (p.tokens, p.steps) for p in t.points}
    # the first confirmation run (seed 1) of B=4 is first <= 3.3 at 2048 tokens: 2048 // (4 x 8) = 64 steps;
    # B=8's at 3072: 3072 // 64 = 48; B=16's never (its seed 2 dips to 3.3 at 3072: only seed 1 counts)
    assert got == {4: (2048, 64), 8: (3072, 48), 16: (None, None)}
    cells = s.report.optimizers["adamw"].cells
    assert got == {c.batch_size: (c.tokens_to_reference, c.steps_to_reference) for c in cells}
    assert all(p.target_loss == pytest.approx(3.3) for p in t.points)
    (line,) = t.perfect
    assert (line.anchor_batch, line.anchor_steps) == (4, 64)
    assert line(8) == 32 and line(16) == 16  # steps ∝ 1/B
    # read from the report, never from the curves: without any curve the table is the same
    bare = replace(s, trials=tuple(replace(x, history={}) for x in s.trials))
    assert steps_to_target(bare) == t
    # and the report is what the table draws: another report value is drawn as it is
    report = s.report.model_copy(deep=True)
    report.optimizers["adamw"].cells[2].steps_to_reference = 7
    report.optimizers["adamw"].cells[2].tokens_to_reference = 7 * 128
    assert {p.batch_size: p.steps for p in steps_to_target(replace(s, report=report)).points}[16] == 7


def test_the_target_loss_is_the_reports() -> None:
    s = _steps_sweep()
    assert s.report.optimizers["adamw"].reference_val_loss.self == pytest.approx(3.0)
    target = s.report.optimizers["adamw"].target_loss
    assert target == pytest.approx(3.3)  # (1 + 0.1) x 3.0
    # figure 1's band top and figure 6's target are that one number
    (band,) = scaling_points(s).bands
    assert band.upper == target
    assert {p.target_loss for p in steps_to_target(s).points} == {target}
    # without a self reference there is no target, and no band
    empty = make_sweep([trial("adamw", 4, 0.01, status="failed")], optimizers=("adamw",), batch_sizes=(4,))
    assert empty.report.optimizers["adamw"].target_loss is None
    assert scaling_points(empty).bands == () and [p.target_loss for p in steps_to_target(empty).points] == [None]


def test_noise_scale_critical_batch_is_the_mean_final_estimate_at_the_smallest_measured_batch() -> None:
    lr = 0.01
    s = make_sweep(
        [
            # accumulation 1 at B=4: no B_simple
            trial("adamw", 4, lr, val=[(100, 3.0)]),
            *confirmations("adamw", 4, lr, [(100, 3.0)], [(100, 3.01)]),
            # B=8: the search trials' B_simple is not a sample (their lr was chosen by them): ignored
            trial("adamw", 8, lr, val=[(100, 3.0)], noise=[(100, 99.0)]),
            trial("adamw", 8, lr, seed=1, role="confirm", val=[(100, 3.0)], noise=[(50, 20.0), (100, 10.0)]),
            trial("adamw", 8, lr, seed=2, role="confirm", val=[(100, 3.01)], noise=[(50, 9.0), (100, 14.0)]),
            trial("adamw", 8, lr * 2, val=[(100, 3.5)], noise=[(100, 98.0)]),
            trial("adamw", 16, lr, val=[(100, 3.0)], noise=[(100, 97.0)]),
            trial("adamw", 16, lr, seed=1, role="confirm", val=[(100, 3.0)], noise=[(100, 50.0)]),
            trial("adamw", 16, lr, seed=2, role="confirm", val=[(100, 3.02)]),
            trial("merit", 4, lr, val=[(100, 3.0)]),
            *confirmations("merit", 4, lr, [(100, 3.0)], [(100, 3.01)]),
        ],
        batch_sizes=(4, 8, 16),
    )
    t = noise_scale(s)
    (crit,) = t.critical
    assert (crit.optimizer, crit.batch_size, crit.runs) == ("adamw", 8, 2)
    assert crit.b_crit == pytest.approx(12.0)  # mean of the confirmation runs' final estimates 10 and 14
    assert t.missing == ("merit",)
    # the curves: every sample run's B_simple, none of the search trials'
    assert sorted((p.batch_size, p.seed, p.tokens, p.b_simple) for p in t.points) == [
        (8, 1, 50, 20.0),
        (8, 1, 100, 10.0),
        (8, 2, 50, 9.0),
        (8, 2, 100, 14.0),
        (16, 1, 100, 50.0),
    ]
    assert not any(p.b_simple > 90.0 for p in t.points)
    assert not any(math.isclose(p.b_simple, v) for p in t.points for v in (97.0, 98.0, 99.0))


def test_tables_survive_a_sweep_with_nothing_completed() -> None:
    s = make_sweep(
        [trial("adamw", 4, 0.01, status="diverged", val=[(50, 9.0)]), trial("merit", 4, 0.01, status="failed")],
        batch_sizes=(4,),
    )
    assert best_runs(s) == {} and sample_runs(s) == {}
    assert all(p.val_loss_mean is None for p in scaling_points(s).points)
    assert scaling_points(s).bands == ()
    assert [p.val_loss for p in lr_points(s).points] == [None, None]
    assert best_lr_fit(s).fits == () and loss_curves(s) == ()
    assert steps_to_target(s).perfect == ()
    assert noise_scale(s).missing == ("adamw", "merit")
