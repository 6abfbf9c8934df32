"""`sweeps.simulate` and the real driver agree, failures included: the same spec and one objective, run
through `simulate` and through `sweeps.driver.run_sweep` (a real `tune.Tuner` on the session's Ray
cluster, the recorder writing MLflow, Optuna in SQLite) with `sweeps.simulate.objective_trial` in place
of training, one trial at a time. Both must finish, with the same trials (lr, seed, role, status, tokens),
the same verdicts and the same answers.

The objective diverges the way real training does: at its first evaluation above a cliff (a run that
diverges before it reports any val loss: a real sweep once ended in Tune's metric check there), half-way
through just below the cliff, and only from 16 on does the batch size cost loss, so the answer is known.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any

import pytest
from harness import tiny_spec
from mlflow.tracking import MlflowClient

import sweeps.simulate
from sweeps.driver import run_sweep
from sweeps.layout import TRIAL_ROLES, Tag
from sweeps.settings import runtime_from_env
from sweeps.simulate import Run, simulate
from sweeps.spec import SweepSpec
from sweeps.stores import open_storage, sweep_studies

LR_STAR, CLIFF = 3e-3, 2e-2  # the loss bowl's centre; above the cliff a run diverges at its first evaluation


def cliff_objective(run: Run) -> list[float]:
    """A bowl in ln lr around LR_STAR, flat up to batch 8, 4 % worse per doubling past it; above CLIFF
        the run diverges at once (so does seed 2 at batch 16 above 2.5e-3), and within a factor 3 below the
    cliff after half its evaluations (the losses stop there)."""
    n = len(run.eval_tokens)
    if run.lr > CLIFF or (run.seed == 2 and run.batch_size == 16 and run.lr > 2.5e-3):
        return [math.inf]  # and one confirmation run at 16 diverges: the cell retreats to a lower lr
    floor = 4.0 * (1.0 + 0.04 * max(0.0, math.log2(run.batch_size / 8)))
    u = math.log(run.lr / LR_STAR)
    # seeds differ by a fixed offset, so confirmation runs are paired the way real seeds are
    final = floor + 0.05 * u * u + 0.002 * run.seed
    losses = [final * (1 + 0.3 * (1 - t / run.eval_tokens[-1])) for t in run.eval_tokens]
    if run.lr > CLIFF / 3 and n > 1:
        return [*losses[: n // 2], math.nan]
    return losses


def _spec() -> SweepSpec:
    return SweepSpec.from_mapping(
        tiny_spec(
            "sim-vs-tune",
            batch_sizes=[4, 8, 16],
            token_budget=4096,
            eval_every_tokens=1024,
            lr={"min": 1e-3, "max": 1e-1, "trials_per_batch_size": 3},
            seeds=2,
            degradation={"tolerance": 0.02, "baseline": "adamw"},
            resources={"max_concurrent_trials": 1},  # one at a time: Tune's order is the simulation's
        )
    )


def _trial_key(optimizer: str, batch_size: int, role: str, seed: int, lr: float, status: str, tokens: int) -> tuple:
    return (optimizer, batch_size, role, seed, f"{lr:.6g}", status, tokens)


def _cells(report: Any) -> dict[tuple[str, int], tuple]:
    out = {}
    for opt, o in report.optimizers.items():
        for c in o.cells:
            out[(opt, c.batch_size)] = (
                f"{c.best_lr:.6g}" if c.best_lr else None,
                c.seeds,
                c.stable,
                c.degradation_free,
                c.trial_status,
            )
    return out


def test_the_driver_on_tune_and_the_simulation_agree_on_every_trial_verdict_and_answer(
    ray_session: str, tmp_path: Path
) -> None:
    spec = _spec()
    simulated = simulate(spec, cliff_objective, seed=0)
    sim_trials = sorted(
        _trial_key(r.optimizer, r.batch_size, r.role, r.seed, r.lr, r.status, r.tokens) for r in simulated.results
    )
    # the objective reaches every kind of end: diverged before its first evaluation, diverged later, completed
    statuses = {(k[5], k[6]) for k in sim_trials}
    assert ("diverged", 1024) in statuses and any(s == "diverged" and t > 1024 for s, t in statuses)
    assert any(s == "completed" for s, _ in statuses)

    from ray import cloudpickle  # Ray's own copy pickles the trial function

    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the objective travels by value to Ray's workers
    runtime = runtime_from_env(tmp_path)
    outcome = run_sweep(spec, runtime=runtime, trial_fn=sweeps.simulate.objective_trial(spec, cliff_objective))
    assert outcome.status == "succeeded"

    # Optuna: every trial ended, with the status and tokens the simulation gave it
    real_trials = []
    for study in sweep_studies(open_storage(runtime.optuna_storage), outcome.sweep_id):
        opt, bs = study.user_attrs["optimizer"], study.user_attrs["batch_size"]
        for t in study.get_trials(deepcopy=False):
            assert t.state.is_finished(), f"{study.study_name} trial {t.number} is {t.state.name}"
            a = t.user_attrs
            real_trials.append(
                _trial_key(
                    opt, bs, a.get("role", "search"), int(a.get("seed", 0)), t.params["lr"], a["status"], a["tokens"]
                )
            )
    assert sorted(real_trials) == sim_trials

    # MLflow: each trial once, with its real status; nothing left RUNNING
    client = MlflowClient(outcome.tracking_uri)
    runs = client.search_runs([outcome.experiment_id], max_results=1000)
    assert not [r.info.run_name for r in runs if r.info.status == "RUNNING"]
    trial_runs = [r for r in runs if r.data.tags.get(Tag.role) in TRIAL_ROLES]
    assert len(trial_runs) == len(sim_trials) == len({r.data.tags[Tag.tune_trial_id] for r in trial_runs})
    assert sorted(r.data.tags[Tag.status] for r in trial_runs) == sorted(k[5] for k in sim_trials)

    # the same verdicts and answers; batch 16 is 4 % worse than 8, past the 2 % tolerance
    assert _cells(outcome.report) == _cells(simulated.report)
    for opt in spec.optimizer_names:
        real = outcome.report.optimizers[opt]
        assert (
            real.largest_degradation_free_batch_size
            == simulated.report.optimizers[opt].largest_degradation_free_batch_size
        )
    assert outcome.report.optimizers["adamw"].largest_degradation_free_batch_size.self == 8


def check_objective(run: Run) -> list[float]:
    """At batch size 8 the search's seed favours a lower lr (2e-3) than the confirmation seeds (8e-3): the
    confirmation runs read degraded at the search's choice, and the sweep confirms them at the lr above."""
    best = 3e-3 if run.batch_size == 4 else (2e-3 if run.seed == 0 else 8e-3)
    final = 3.0 + 0.02 * math.log(run.lr / best) ** 2 + 0.01 * run.seed
    return [final * (1 + 0.2 * (1 - t / run.eval_tokens[-1])) for t in run.eval_tokens]


def test_the_driver_and_the_simulation_agree_on_a_check_at_a_second_lr(ray_session: str, tmp_path: Path) -> None:
    spec = SweepSpec.from_mapping(
        tiny_spec(
            "sim-vs-tune-check",
            batch_sizes=[4, 8],
            token_budget=2048,
            eval_every_tokens=1024,
            lr={"min": 1e-4, "max": 3e-2, "trials_per_batch_size": 6},
            seeds={"min": 2, "max": 8, "step": 2},
            degradation={"tolerance": 0.01, "baseline": "adamw"},
            resources={"max_concurrent_trials": 1},
        )
    )
    simulated = simulate(spec, check_objective, seed=0)
    check = simulated.report.optimizers["adamw"].cells[1].lr_check
    assert check is not None and check.runs >= 2  # the simulation ran the check

    from ray import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    runtime = runtime_from_env(tmp_path)
    outcome = run_sweep(spec, runtime=runtime, trial_fn=sweeps.simulate.objective_trial(spec, check_objective))
    assert outcome.status == "succeeded"
    real, sim = outcome.report.optimizers["adamw"], simulated.report.optimizers["adamw"]
    assert _cells(outcome.report) == _cells(simulated.report)
    assert [c.lr_check for c in real.cells] == [c.lr_check for c in sim.cells]
    assert [c.verdict for c in real.cells] == [c.verdict for c in sim.cells]
    assert real.bracket == sim.bracket and real.cells[1].verdict.self == "fine"


def test_a_simulated_result_without_the_metric_fails_as_tune_fails_it() -> None:
    # the simulation checks each result with Tune's own code: what would end a real sweep ends it too
    checks = sweeps.simulate._ResultChecks(*_asha_and_searcher())
    with pytest.raises(ValueError, match="did not include the specified metric"):
        checks({"tokens": 512, "step": 1, "status": "diverged", "done": True, "trial_id": "t"})
    assert checks({"tokens": 512, "step": 1, "status": "diverged", "done": True, "val_loss": math.nan})["done"]


def _asha_and_searcher() -> tuple[Any, Any]:
    import optuna

    from sweeps.scheduler import METRIC, MODE, make_scheduler
    from sweeps.search import CellSearcher

    spec = _spec()
    searcher = CellSearcher(spec, "checks", optuna.storages.InMemoryStorage())
    scheduler = make_scheduler(spec)
    assert scheduler is not None
    scheduler.set_search_properties(METRIC, MODE)
    return scheduler, searcher
