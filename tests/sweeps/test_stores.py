"""Closing what a lost driver left RUNNING, on a real Optuna storage and a real MLflow store (SQLite).

The searcher writes a trial's result to Optuna when it ends; the recorder writes its MLflow run a moment
later from a queue. A driver killed in between must not turn a kept result into an "interrupted" MLflow
run: the two records would disagree on what the sweep holds."""

from __future__ import annotations

import json
from pathlib import Path

import optuna
from harness import tiny_spec
from mlflow.entities import Metric
from mlflow.tracking import MlflowClient

from sweeps import layout
from sweeps.layout import Tag
from sweeps.record import SweepRecorder
from sweeps.spec import SweepSpec
from sweeps.stores import close_sweep_runs, open_storage, recorded_results, sweep_studies

SWEEP = "lost-driver"


def trial_run(client: MlflowClient, experiment_id: str, tune_trial_id: str, logged: dict[int, float]) -> str:
    """A trial run as the recorder leaves it while the trial trains: status running, some evaluations."""
    run = client.create_run(
        experiment_id,
        run_name=f"adamw bs=4 {tune_trial_id}",
        tags=layout.trial_tags(
            sweep_id=SWEEP,
            parent_run_id="",
            role="search",
            cell="adamw-bs4",
            optimizer="adamw",
            batch_size=4,
            lr=1e-3,
            seed=0,
            status="running",
            optuna_number=0,
            tune_trial_id=tune_trial_id,
        ),  # fmt: skip
    )
    client.log_batch(run.info.run_id, metrics=[Metric(layout.VAL_LOSS, v, 0, t) for t, v in logged.items()])
    return run.info.run_id


def stores(tmp_path: Path) -> tuple[optuna.storages.BaseStorage, str, MlflowClient, str]:
    storage = open_storage(f"sqlite:///{tmp_path / 'optuna.db'}")
    study = optuna.create_study(study_name=f"{SWEEP}/adamw-bs4", storage=storage)
    # "kept": its result reached Optuna (the driver died before the recorder wrote MLflow)
    study.add_trial(
        optuna.trial.create_trial(
            params={"lr": 1e-3},
            distributions={"lr": optuna.distributions.FloatDistribution(1e-4, 1e-2, log=True)},
            value=2.5,
            user_attrs={
                "status": "completed",
                "tune_trial_id": "kept",
                "curve": json.dumps([[1000, 3.0], [2000, 2.5]]),
            },
        )
    )
    # "lost": it was training when the driver died (the searcher closes it as interrupted)
    study.add_trial(
        optuna.trial.create_trial(
            params={"lr": 2e-3},
            distributions={"lr": optuna.distributions.FloatDistribution(1e-4, 1e-2, log=True)},
            state=optuna.trial.TrialState.FAIL,
            user_attrs={"status": "interrupted", "tune_trial_id": "lost"},
        )
    )
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri)
    return storage, uri, client, client.create_experiment(SWEEP)


def test_a_run_whose_result_optuna_kept_ends_as_that_result_with_its_missed_evaluations(tmp_path: Path) -> None:
    storage, uri, client, exp = stores(tmp_path)
    kept = trial_run(client, exp, "kept", {1000: 3.0})
    lost = trial_run(client, exp, "lost", {1000: 3.1})

    results = recorded_results(sweep_studies(storage, SWEEP))
    assert set(results) == {"kept"} and results["kept"].curve == ((1000, 3.0), (2000, 2.5))
    assert close_sweep_runs(uri, SWEEP, results) == 2

    run = client.get_run(kept)
    assert (run.data.tags[Tag.status], run.info.status) == ("completed", "FINISHED")
    assert [(m.step, m.value) for m in client.get_metric_history(kept, layout.VAL_LOSS)] == [(1000, 3.0), (2000, 2.5)]
    run = client.get_run(lost)
    assert (run.data.tags[Tag.status], run.info.status) == ("interrupted", "KILLED")
    assert [m.step for m in client.get_metric_history(lost, layout.VAL_LOSS)] == [1000]


def test_a_relaunched_drivers_recorder_closes_the_runs_its_predecessor_left(tmp_path: Path) -> None:
    storage, uri, client, exp = stores(tmp_path)
    spec = SweepSpec.from_mapping(tiny_spec(SWEEP, batch_sizes=[4]))
    kept = trial_run(client, exp, "kept", {})
    lost = trial_run(client, exp, "lost", {})
    recorder = SweepRecorder(
        tracking_uri=uri,
        artifact_root=None,
        sweep_id=SWEEP,
        spec=spec,
        results=recorded_results(sweep_studies(storage, SWEEP)),
    )
    recorder.close()
    assert client.get_run(kept).data.tags[Tag.status] == "completed"
    assert client.get_run(lost).data.tags[Tag.status] == "interrupted"
    assert [r.info.run_name for r in client.search_runs([exp]) if r.info.status == "RUNNING"] == ["adamw bs=4"]
