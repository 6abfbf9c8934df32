"""A real tiny sweep on a local Ray cluster: what it records in MLflow and Optuna, its report, and
resume after an interruption with no finished trial run again."""

from __future__ import annotations

import json
import math
from pathlib import Path

import optuna
import pytest
from mlflow.tracking import MlflowClient
from optuna.trial import TrialState

from sweeps.analysis import validate_report
from sweeps.driver import run_sweep
from sweeps.layout import TRIAL_ROLES
from sweeps.plan import study_name
from sweeps.settings import runtime_from_env
from sweeps.spec import SweepSpec
from sweeps.stores import open_storage

pytestmark = pytest.mark.ray


def _trial_runs(client: MlflowClient, experiment_id: str) -> list:
    runs = client.search_runs([experiment_id], max_results=1000)
    return [r for r in runs if r.data.tags.get("batchsweep.role") in TRIAL_ROLES]


def test_sweep_records_every_trial_and_answers(tiny_sweep) -> None:
    outcome, runtime = tiny_sweep
    # 2 optimizers x 2 batch sizes x (2 search + 2 confirmation runs), and one more search trial at each
    # optimizer's reference, batch size 4
    spec_trials = 2 * 2 * (2 + 2) + 2
    assert outcome.status == "succeeded"
    report = outcome.report
    validate_report(report)  # the stable schema of the README
    assert set(report.optimizers) == {"adamw", "merit"}
    assert report.reference_batch_size == 4 and report.baseline == "adamw"
    for opt in report.optimizers.values():
        assert [c.batch_size for c in opt.cells] == [4, 8]
        for cell in opt.cells:
            # every cell was searched with its 2 trials (the reference, batch size 4, with 3: it has no warm
            # start), then confirmed by 2 runs at its best lr
            assert cell.trials == (5 if cell.batch_size == 4 else 4)
            assert cell.best_lr is not None and 1e-3 <= cell.best_lr <= 3e-2
            assert cell.seeds == 2 and cell.stable is True
            # the search's own minimum is not one of the samples
            assert cell.search_best_val_loss is not None
            lo, hi = cell.val_loss_ci95
            assert lo <= cell.val_loss_mean <= hi

    client = MlflowClient(outcome.tracking_uri)
    exp = client.get_experiment_by_name(outcome.sweep_id)
    assert exp is not None and exp.experiment_id == outcome.experiment_id
    runs = client.search_runs([exp.experiment_id], max_results=1000)
    cells = {r.info.run_id: r for r in runs if r.data.tags.get("batchsweep.role") == "cell"}
    trials = _trial_runs(client, exp.experiment_id)
    assert len(cells) == 4
    assert len(trials) == spec_trials
    # every cell trained on exactly the same tokens, and the report says how many
    trained = {c.tokens_trained for o in report.optimizers.values() for c in o.cells}
    assert trained == {report.trained_tokens} == {4096}
    # the report names its runs: the search best and the confirmation runs at its lr
    by_id = {r.info.run_id: r for r in trials}
    for opt in report.optimizers.values():
        for cell in opt.cells:
            best = by_id[cell.search_best_run_id]
            assert best.data.tags["batchsweep.role"] == "search"
            assert float(best.data.tags["batchsweep.lr"]) == cell.best_lr
            assert best.data.tags["batchsweep.optuna_number"] == str(cell.search_best_trial_number)
            confirmations = [by_id[i] for i in cell.confirmation_run_ids]
            assert [r.data.tags["batchsweep.seed"] for r in confirmations] == ["1", "2"]
            assert all(float(r.data.tags["batchsweep.lr"]) == cell.best_lr for r in confirmations)
            assert [r.data.metrics["val_loss"] for r in confirmations] == cell.val_losses
    for run in trials:
        tags = run.data.tags
        # each trial nests under its cell's run, and is named for a person to read
        parent = cells[tags["mlflow.parentRunId"]]
        assert parent.data.tags["batchsweep.cell"] == tags["batchsweep.cell"]
        assert run.info.run_name == (
            f"{tags['batchsweep.optimizer']} bs={tags['batchsweep.batch_size']} "
            f"lr={float(tags['batchsweep.lr']):.1e} seed={tags['batchsweep.seed']}"
        )
        assert tags["batchsweep.status"] in ("completed", "pruned", "diverged")
        assert run.data.params["optimizer.name"] == tags["batchsweep.optimizer"]
    # metrics are logged against tokens seen (the same axis at every batch size)
    completed = [r for r in trials if r.data.tags["batchsweep.status"] == "completed"]
    history = client.get_metric_history(completed[0].info.run_id, "val_loss")
    assert [m.step for m in history] == [1024, 2048, 3072, 4096]
    assert {"attn_logit_max/layer_0", "tokens_per_s", "grad_norm", "lr"} <= set(completed[0].data.metrics)

    summary = [r for r in runs if r.data.tags.get("batchsweep.role") == "summary"]
    assert len(summary) == 1
    names = {a.path for a in client.list_artifacts(summary[0].info.run_id)}
    assert {"spec.yaml", "report.json", "cells.csv"} <= names
    local = client.download_artifacts(summary[0].info.run_id, "report.json")
    assert json.loads(Path(local).read_text())["optimizers"] == report.model_dump(mode="json")["optimizers"]

    # Optuna holds one study per cell with the trials of the searches (and the seed re-runs)
    storage = open_storage(runtime.optuna_storage)
    for opt in ("adamw", "merit"):
        for bs in (4, 8):
            study = optuna.load_study(study_name=study_name(outcome.sweep_id, opt, bs), storage=storage)
            finished = [t for t in study.trials if t.state != TrialState.RUNNING]
            assert len(finished) == (5 if bs == 4 else 4)  # the reference searches one lr more
            # pruning compares trials at equal tokens: a pruned trial stopped before the budget
            for t in finished:
                if t.state == TrialState.PRUNED:
                    assert t.user_attrs["tokens"] < 4096


RESUME = """
name: resume
model: {preset: gpt2-nano, seq_len: 32}
optimizers: [{name: adamw}]
batch_sizes: [4, 8]
token_budget: 3072
lr: {min: 1.0e-3, max: 3.0e-2, trials_per_batch_size: 2}
seeds: 2
degradation: {tolerance: 0.05, baseline: adamw}
resources: {max_concurrent_trials: 2}
pruning: {enabled: false}
eval_every_tokens: 1024
eval_tokens: 4096
schedule: {warmup_fraction: 0.05, warmup_search: [0.25]}  # one warm-up run per cell at its best lr
"""


def test_interrupted_sweep_resumes_without_repeating_a_trial(ray_session: str, tmp_path: Path) -> None:
    spec = SweepSpec.from_yaml(RESUME)
    runtime = runtime_from_env(tmp_path / "data")
    done: list[int] = []

    first = run_sweep(
        spec,
        runtime=runtime,
        on_progress=lambda p: done.append(p.trials_done),
        should_stop=lambda: bool(done) and done[-1] >= 2,
    )
    assert first.status == "cancelled"
    storage = open_storage(runtime.optuna_storage)
    # a cancel leaves nothing RUNNING in Optuna, trials Tune stopped before they reported included
    for bs in spec.batch_sizes:
        study = optuna.load_study(study_name=study_name("resume", "adamw", bs), storage=storage)
        assert [t.number for t in study.trials if t.state == TrialState.RUNNING] == []

    def finished_trials() -> dict[tuple[str, int, str, int], float]:
        out = {}
        for bs in spec.batch_sizes:
            study = optuna.load_study(study_name=study_name("resume", "adamw", bs), storage=storage)
            for t in study.trials:
                if t.state in (TrialState.COMPLETE, TrialState.PRUNED) and t.user_attrs.get("status") != "cancelled":
                    out[(f"bs{bs}", t.number, t.user_attrs["role"], t.user_attrs["seed"])] = t.params["lr"]
        return out

    before = finished_trials()
    assert 2 <= len(before) < spec.total_trials

    # a driver killed hard leaves a RUNNING trial behind: the resumed sweep must replace it
    study = optuna.load_study(study_name=study_name("resume", "adamw", 8), storage=storage)
    stale = study.ask({"lr": optuna.distributions.FloatDistribution(1e-3, 3e-2, log=True)})
    stale.set_user_attr("role", "search")

    second = run_sweep(spec, runtime=runtime)
    assert second.status == "succeeded"
    after = finished_trials()
    # finished trials are never run again: they keep their number and lr, and the sweep ends with
    # exactly the planned number of finished trials
    assert {k: after[k] for k in before} == before
    assert len(after) == spec.total_trials
    stale_now = optuna.load_study(study_name=study_name("resume", "adamw", 8), storage=storage).trials[stale.number]
    assert stale_now.state == TrialState.FAIL and stale_now.user_attrs["status"] == "interrupted"

    client = MlflowClient(second.tracking_uri)
    runs = _trial_runs(client, second.experiment_id)
    finished_runs = [r for r in runs if r.data.tags["batchsweep.status"] in ("completed", "pruned", "diverged")]
    # MLflow agrees: one finished run per planned trial, no duplicate (lr, seed) within a cell
    assert len(finished_runs) == spec.total_trials
    keys = [
        (
            r.data.tags["batchsweep.cell"],
            r.data.tags["batchsweep.lr"],
            r.data.tags["batchsweep.seed"],
            r.data.tags["batchsweep.role"],
        )
        for r in finished_runs
    ]
    assert len(set(keys)) == len(keys)
    # Optuna and MLflow agree on how every trial ended, those cut short by the cancel included
    optuna_status = {
        t.user_attrs["tune_trial_id"]: t.user_attrs["status"]
        for bs in spec.batch_sizes
        for t in optuna.load_study(study_name=study_name("resume", "adamw", bs), storage=storage).trials
        if "tune_trial_id" in t.user_attrs
    }
    mlflow_status = {r.data.tags["batchsweep.tune_trial_id"]: r.data.tags["batchsweep.status"] for r in runs}
    assert optuna_status == mlflow_status and len(optuna_status) >= spec.total_trials
    for cell in second.report.optimizers["adamw"].cells:
        assert cell.seeds == 2 and math.isfinite(cell.val_loss_mean)
        # warm-up searched with the lr: the other warm-up trained once at the best lr, with seed 0, and the
        # confirmation runs trained with the better of the two (the workers got it in their configs)
        assert [w for w, _ in cell.warmups_tried] == [0.05, 0.25] and cell.warmup in (0.05, 0.25)
        by_id = {r.info.run_id: r for r in finished_runs}
        warm = [
            r
            for r in finished_runs
            if r.data.tags["batchsweep.role"] == "warmup"
            and r.data.tags["batchsweep.batch_size"] == str(cell.batch_size)
        ]
        assert len(warm) == 1 and float(warm[0].data.tags["batchsweep.lr"]) == cell.best_lr
        assert warm[0].data.params["schedule.warmup_fraction"] == "0.25" and warm[0].info.run_name.endswith(
            "warmup=0.25"
        )
        assert warm[0].data.metrics["val_loss"] == cell.warmups_tried[1][1]
        for run_id in cell.confirmation_run_ids:
            assert float(by_id[run_id].data.params["schedule.warmup_fraction"]) == cell.warmup
