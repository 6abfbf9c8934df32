"""A sweep's records in Optuna and MLflow as the service needs them: the Optuna storage, and closing
what a driver left RUNNING. Apart from `sweeps.search` and `sweeps.record` (Ray Tune) because the
service imports this when it starts: the first cancelled sweep of a process imported it then, a step
of +86 MiB of RSS minutes after start and 2 s of one supervisor pass (the soak's readings)."""

from __future__ import annotations

from typing import Any

import optuna
from mlflow.tracking import MlflowClient
from optuna.trial import TrialState

from sweeps.layout import Tag
from sweeps.runtime import SweepRuntime
from sweeps.status import TrialStatus

optuna.logging.set_verbosity(optuna.logging.WARNING)


def open_storage(url: str) -> optuna.storages.BaseStorage:
    """An Optuna RDB storage for any SQLAlchemy URL; SQLite waits on a busy file instead of failing."""
    kwargs: dict[str, Any] = {}
    if url.startswith("sqlite"):
        kwargs["engine_kwargs"] = {"connect_args": {"timeout": 60}}
    return optuna.storages.RDBStorage(url, **kwargs)


def close_running_trials(study: optuna.Study) -> int:
    """Trials left RUNNING by a driver that is gone end as FAIL, status `interrupted` (run again on resume)."""
    stale = study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
    for t in stale:
        optuna.trial.Trial(study, t._trial_id).set_user_attr("status", "interrupted")
        study.tell(t.number, state=TrialState.FAIL)
        rerun_design_point(study, t)
    return len(stale)


def rerun_design_point(study: optuna.Study, trial: optuna.trial.FrozenTrial | optuna.trial.Trial) -> None:
    """A lost step of a cell's line search (a coarse, bracket, vertex or step trial cut short by the
    infrastructure or a cancel) is no result but still the lr the search needs: asked again, first."""
    if design := trial.user_attrs.get("design"):
        study.enqueue_trial({"lr": trial.params["lr"]}, user_attrs={"design": design}, skip_if_exists=False)


def close_sweep_trials(storage: optuna.storages.BaseStorage, sweep_id: str) -> int:
    """`close_running_trials` for every cell study of a sweep; the count closed."""
    closed = 0
    for name in optuna.get_all_study_names(storage):
        if name.startswith(f"{sweep_id}/"):
            closed += close_running_trials(optuna.load_study(study_name=name, storage=storage))
    return closed


def close_leftovers(sweep_id: str, runtime: SweepRuntime) -> tuple[int, int]:
    """A sweep that ended without its driver (lost for good, or cancelled while gone) leaves nothing
    RUNNING: its Optuna trials and MLflow runs are closed. Returns (trials, runs) closed."""
    return close_sweep_trials(open_storage(runtime.optuna_storage), sweep_id), close_sweep_runs(
        runtime.tracking_uri, sweep_id
    )


def close_running_runs(client: MlflowClient, experiment_id: str) -> int:
    """Trial runs left RUNNING by a driver that is gone end as KILLED (status interrupted); the count closed."""
    stale = client.search_runs([experiment_id], f"tags.`{Tag.status}` = '{TrialStatus.running}'", max_results=1000)
    for run in stale:
        client.set_tag(run.info.run_id, Tag.status, str(TrialStatus.interrupted))
        client.set_terminated(run.info.run_id, "KILLED")
    return len(stale)


def close_sweep_runs(tracking_uri: str, sweep_id: str) -> int:
    """Everything of a finished sweep still RUNNING in MLflow ends: trial runs KILLED (interrupted), cell
    runs KILLED (a sweep that ended without its driver has no answer for them)."""
    client = MlflowClient(tracking_uri)
    exp = client.get_experiment_by_name(sweep_id)
    if exp is None:
        return 0
    closed = close_running_runs(client, exp.experiment_id)
    for run in client.search_runs([exp.experiment_id], "attributes.status = 'RUNNING'", max_results=1000):
        client.set_terminated(run.info.run_id, "KILLED")
        closed += 1
    return closed
