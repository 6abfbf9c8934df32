"""Every figure from the real recorded tiny sweep (conftest `tiny_sweep`): the data behind each one
against the report the driver wrote, and the figures published to the summary run."""

from __future__ import annotations

from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from dashboards import build_figures, load_sweep, publish
from dashboards.data import best_runs, fit_power_law, sample_runs
from sweeps.analysis import validate_report

pytestmark = pytest.mark.ray

NAMES = ["scaling", "lr_sensitivity", "best_lr", "loss_curves", "attention_logits", "steps_to_target"]


@pytest.fixture(scope="module")
def tiny(tiny_sweep):  # -> (SweepOutcome, SweepData, {name: FigureSpec})
    outcome, _runtime = tiny_sweep
    sweep = load_sweep(outcome.tracking_uri, outcome.sweep_id)
    figs = build_figures(sweep)
    return outcome, sweep, {f.name: f for f in figs}


def _trial_runs(outcome) -> list:
    client = MlflowClient(outcome.tracking_uri)
    runs = client.search_runs([outcome.experiment_id], max_results=1000)
    return [r for r in runs if r.data.tags.get("batchsweep.role") in ("search", "confirm")]


def test_the_sweep_read_back_is_the_drivers_report(tiny) -> None:
    outcome, sweep, figs = tiny
    assert list(figs) == NAMES
    assert sweep.report == validate_report(outcome.report.model_dump(exclude={"warnings"}))
    assert list(sweep.warnings) == outcome.warnings
    assert sweep.summary_run_id == outcome.summary_run_id and sweep.experiment_id == outcome.experiment_id
    assert len(sweep.trials) == len(_trial_runs(outcome))


def test_scaling_points_ci_bars_and_marked_batch_size(tiny) -> None:
    outcome, _, figs = tiny
    f = figs["scaling"]
    for opt, o in outcome.report.optimizers.items():
        pts = [p for p in f.data.points if p.optimizer == opt]
        # one point per cell of the report, with its mean and CI bar
        assert [p.batch_size for p in pts] == [c.batch_size for c in o.cells]
        assert [p.val_loss_mean for p in pts] == [c.val_loss_mean for c in o.cells]
        assert [[p.ci_low, p.ci_high] for p in pts] == [list(c.val_loss_ci95) for c in o.cells]
        # the marked batch size is the report's answer, against itself and against the baseline
        for ref in ("self", "baseline"):
            (mark,) = [m for m in f.data.marks if m.optimizer == opt and m.reference == ref]
            assert mark.batch_size == getattr(o.largest_degradation_free_batch_size, ref)
        # what plotly draws: the line's points and its error bars
        (line,) = [tr for tr in f.plotly_fig.data if tr.name.startswith(f"{opt} (mean")]
        drawn = [c for c in o.cells if c.val_loss_mean is not None]
        assert list(line.x) == [c.batch_size for c in drawn]
        assert [y + e for y, e in zip(line.y, line.error_y.array, strict=True)] == pytest.approx(
            [c.val_loss_ci95[1] for c in drawn]
        )
        answer = o.largest_degradation_free_batch_size.self
        stars = [
            tr
            for tr in f.plotly_fig.data
            if tr.name.startswith(f"{opt}: largest degradation-free B = ") and "itself" in tr.name
        ]
        assert [list(s.x) for s in stars] == ([[answer]] if answer is not None else [])


def test_lr_points_are_the_trial_runs(tiny) -> None:
    outcome, sweep, figs = tiny
    t = figs["lr_sensitivity"].data
    runs = _trial_runs(outcome)
    completed = [r for r in runs if r.data.tags["batchsweep.status"] == "completed"]
    # one point with a final val loss per completed trial run in MLflow
    assert sum(1 for p in t.points if p.status == "completed" and p.val_loss is not None) == len(completed)
    assert sum(1 for p in t.points if p.val_loss is not None and p.status == "completed") == sum(
        c.trial_status.completed for o in outcome.report.optimizers.values() for c in o.cells
    )
    assert sorted(p.val_loss for p in t.points if p.status == "completed") == pytest.approx(
        sorted(r.data.metrics["val_loss"] for r in completed)
    )
    # diverged/failed trials have no loss to draw; pruned ones keep the loss when they were stopped
    for p in t.points:
        assert (p.val_loss is None) == (p.status in ("diverged", "failed"))
    # the cell means are the means of the recorded final losses of the sample runs (MLflow vs Optuna path)
    for (opt, bs), samples in sample_runs(sweep).items():
        cell = sweep.cell(opt, bs)
        assert [r.final_val_loss for r in samples] == pytest.approx(cell.val_losses, rel=1e-9)  # type: ignore[union-attr]


def test_best_lr_points_and_fit(tiny) -> None:
    outcome, _, figs = tiny
    t = figs["best_lr"].data
    for opt, o in outcome.report.optimizers.items():
        pts = [(p.batch_size, p.best_lr) for p in t.points if p.optimizer == opt]
        assert pts == [(c.batch_size, c.best_lr) for c in o.cells if c.best_lr is not None]
        law = next((f.law for f in t.fits if f.optimizer == opt), None)
        assert law == fit_power_law(pts)


def test_curves_of_the_runs_the_report_names(tiny) -> None:
    _, sweep, figs = tiny
    cells = {(o, c.batch_size): c for o, r in sweep.report.optimizers.items() for c in r.cells}
    # the driver names every cell's best search trial by its MLflow run id, and the dashboards find it
    best = best_runs(sweep)
    assert set(best) == {k for k, c in cells.items() if c.best_lr is not None}
    for key, run in best.items():
        assert (run.run_id, run.role, run.lr) == (cells[key].search_best_run_id, "search", cells[key].best_lr)
    curves = figs["loss_curves"].data
    budget = 4096  # token_budget of the tiny spec: every completed run ends there
    samples = sample_runs(sweep)
    assert {(p.optimizer, p.batch_size) for p in curves} == set(samples)
    by_id = sweep.runs_by_id()
    for (opt, bs), runs in samples.items():
        named = cells[(opt, bs)].confirmation_run_ids
        assert [r.run_id for r in runs] == [i for i in named if i in by_id and by_id[i].final_val_loss is not None]
        run = runs[0]  # figure 4 draws the first completed confirmation run
        assert run.role == "confirm"
        val = [(p.tokens, p.value) for p in curves if (p.optimizer, p.batch_size, p.metric) == (opt, bs, "val_loss")]
        assert val and val[-1] == (budget, pytest.approx(run.final_val_loss))
        assert val[-1][1] == pytest.approx(cells[(opt, bs)].val_losses[0], rel=1e-9)
        assert [s for s, _ in val] == sorted(s for s, _ in val)
    att = figs["attention_logits"].data
    for opt in sweep.optimizers:
        bs, _name, _status = att.runs[opt]
        assert bs == 8  # the largest batch size of the tiny spec
        # gpt2-nano has two layers, each probed at every evaluation
        assert sorted({p.layer for p in att.points if p.optimizer == opt}) == [0, 1]


def test_steps_to_target_equal_the_reports(tiny) -> None:
    outcome, sweep, figs = tiny
    steps = figs["steps_to_target"].data.steps
    for opt, o in outcome.report.optimizers.items():
        got = [(p.batch_size, p.steps, p.tokens) for p in steps.points if p.optimizer == opt]
        assert got == [(c.batch_size, c.steps_to_reference, c.tokens_to_reference) for c in o.cells]
    noise = figs["steps_to_target"].data.noise
    recorded = {(r.data.tags["batchsweep.optimizer"]) for r in _trial_runs(outcome) if "noise_scale" in r.data.metrics}
    # B_crit for exactly the optimizers whose runs logged B_simple (tiny: batches fit one micro-batch)
    assert {c.optimizer for c in noise.critical} <= recorded
    assert set(noise.missing) | {c.optimizer for c in noise.critical} == set(sweep.optimizers)


def test_publish_logs_the_figures_to_the_summary_run(tiny, tmp_path: Path) -> None:
    outcome, _, _ = tiny
    paths = publish(outcome.tracking_uri, outcome.sweep_id, tmp_path)
    names = sorted(p.name for p in paths)
    assert names == sorted(
        [f"{n}{e}" for n in NAMES for e in (".png", ".html", ".json")] + ["dashboard.html", "plotly.min.js"]
    )
    client = MlflowClient(outcome.tracking_uri)
    assert sorted(Path(a.path).name for a in client.list_artifacts(outcome.summary_run_id, "figures")) == names
