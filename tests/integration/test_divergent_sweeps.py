"""Real sweeps whose trials diverge in their first steps, before their first evaluation: an lr range far
too high, and no gradient clipping at batch sizes where the first steps explode. Each ends `succeeded`
with a report, every trial once in Optuna and once in MLflow with the status it really ended with,
nothing left RUNNING, and the cells that no lr could train say why.

(A result without `val_loss` once ended the whole sweep in Tune's metric check, and every relaunch
replayed it.)"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
from harness import tiny_spec
from mlflow.tracking import MlflowClient

from sweeps.analysis import validate_report
from sweeps.driver import SweepOutcome, run_sweep
from sweeps.layout import TRIAL_ROLES, Tag
from sweeps.runtime import SweepRuntime
from sweeps.settings import runtime_from_env
from sweeps.spec import SweepSpec
from sweeps.stores import open_storage, sweep_studies

pytestmark = pytest.mark.slow


def _every_trial_once_with_its_status(outcome: SweepOutcome, runtime: SweepRuntime) -> dict[str, dict[str, Any]]:
    """Tune trial id -> Optuna's attrs of that trial, after checking MLflow holds the same trials once."""
    assert outcome.status == "succeeded"
    validate_report(outcome.report)
    optuna_trials: dict[str, dict[str, Any]] = {}
    for study in sweep_studies(open_storage(runtime.optuna_storage), outcome.sweep_id):
        for t in study.get_trials(deepcopy=False):
            assert t.state.is_finished(), f"{study.study_name} trial {t.number} left {t.state.name}"
            tid = t.user_attrs["tune_trial_id"]
            assert tid not in optuna_trials, f"trial {tid} recorded twice in Optuna"
            optuna_trials[tid] = dict(t.user_attrs, lr=t.params["lr"])
    client = MlflowClient(outcome.tracking_uri)
    runs = client.search_runs([outcome.experiment_id], max_results=1000)
    assert [r.info.run_name for r in runs if r.info.status == "RUNNING"] == []
    trial_runs = [r for r in runs if r.data.tags.get(Tag.role) in TRIAL_ROLES]
    by_id = {r.data.tags[Tag.tune_trial_id]: r for r in trial_runs}
    assert len(by_id) == len(trial_runs), "a trial recorded twice in MLflow"
    assert set(by_id) == set(optuna_trials)
    for tid, attrs in optuna_trials.items():
        assert by_id[tid].data.tags[Tag.status] == attrs["status"], tid
    return optuna_trials


def test_an_lr_range_that_diverges_at_the_first_step_still_ends_in_an_answer(ray_session: str, tmp_path: Path) -> None:
    spec = SweepSpec.from_mapping(
        tiny_spec(
            "too-hot",
            batch_sizes=[4, 8],
            lr={"min": 0.5, "max": 50.0, "trials_per_batch_size": 2},
            grad_clip=None,
            pruning={"enabled": False},
        )
    )
    runtime = runtime_from_env(tmp_path)
    outcome = run_sweep(spec, runtime=runtime)
    trials = _every_trial_once_with_its_status(outcome, runtime)
    # most trials diverged before their first evaluation (1,536 tokens): at their first steps
    early = [a for a in trials.values() if a["status"] == "diverged" and a["tokens"] < spec.evaluation.every_tokens]
    assert len(early) > len(trials) / 2, trials
    # a cell no lr could train says so, with the lrs; one with an lr has its loss
    for cell in outcome.report.optimizers["adamw"].cells:
        if cell.best_lr is None:
            assert cell.unstable_reason is not None and "diverged" in cell.unstable_reason
        else:
            assert cell.val_loss_mean is not None or cell.unstable_reason is not None


def test_no_clipping_at_sizes_whose_first_steps_explode_still_ends_in_an_answer(
    ray_session: str, tmp_path: Path
) -> None:
    spec = SweepSpec.from_mapping(
        tiny_spec(
            "unclipped",
            batch_sizes=[4, 8, 16],
            lr={"min": 1e-2, "max": 3.0, "trials_per_batch_size": 2},
            grad_clip=None,
            resources={"max_concurrent_trials": 2},
        )
    )
    runtime = runtime_from_env(tmp_path)
    outcome = run_sweep(spec, runtime=runtime)
    trials = _every_trial_once_with_its_status(outcome, runtime)
    statuses = {a["status"] for a in trials.values()}
    assert "diverged" in statuses, statuses
    assert any(a["status"] == "diverged" and a["tokens"] < spec.evaluation.every_tokens for a in trials.values())
    # a diverged trial's curve holds only its real evaluations (none at the tokens where it stopped)
    for a in trials.values():
        if a["status"] == "diverged":
            assert all(tokens < a["tokens"] and math.isfinite(v) for tokens, v in _curve(a))
    assert outcome.report.optimizers["adamw"].cells, "the report has the cells"


def _curve(attrs: dict[str, Any]) -> list[tuple[int, float]]:
    import json

    return [(int(t), float(v)) for t, v in json.loads(attrs.get("curve", "[]"))]
