"""A sweep's records in Optuna and MLflow as the service needs them: the Optuna storage, and closing
what a driver left RUNNING. Apart from `sweeps.search` and `sweeps.record` (Ray Tune) because the
service imports this when it starts: the first cancelled sweep of a process imported it then, a step
of +86 MiB of RSS minutes after start and 2 s of one supervisor pass (the soak's readings)."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import optuna
from mlflow.entities import Metric, RunTag
from mlflow.tracking import MlflowClient
from optuna.trial import TrialState

from sweeps.layout import MLFLOW_STATUS, VAL_LOSS, Tag, find_experiment, open_runs, running_trial_runs
from sweeps.runtime import SweepRuntime
from sweeps.status import RESULT_STATUSES, TrialStatus

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


def sweep_studies(storage: optuna.storages.BaseStorage, sweep_id: str) -> list[optuna.Study]:
    """The cell studies of a sweep (one per optimizer and batch size, named `<sweep id>/<cell>`)."""
    return [
        optuna.load_study(study_name=name, storage=storage)
        for name in optuna.get_all_study_names(storage)
        if name.startswith(f"{sweep_id}/")
    ]


@dataclass(frozen=True)
class Recorded:
    """A trial's result as Optuna holds it: how it ended and its val-loss curve."""

    status: TrialStatus  # one of RESULT_STATUSES
    curve: tuple[tuple[int, float], ...]  # (tokens, val loss) of each evaluation


def recorded_results(studies: list[optuna.Study]) -> dict[str, Recorded]:
    """Tune trial id -> the result Optuna recorded for it. The searcher writes Optuna when a trial ends
    and the recorder writes MLflow a moment later from its queue, so a driver lost in between leaves a
    kept result whose MLflow run is still RUNNING: `close_running_runs` ends that run with this."""
    out = {}
    for study in studies:
        for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)):
            status, trial_id = t.user_attrs.get("status"), t.user_attrs.get("tune_trial_id")
            if trial_id and status in RESULT_STATUSES:
                curve = tuple((int(k), float(v)) for k, v in json.loads(t.user_attrs.get("curve", "[]")))
                out[str(trial_id)] = Recorded(TrialStatus(status), curve)
    return out


def close_leftovers(sweep_id: str, runtime: SweepRuntime) -> tuple[int, int]:
    """A sweep that ended without its driver (lost for good, or cancelled while gone) leaves nothing
    RUNNING: its Optuna trials and MLflow runs are closed. Returns (trials, runs) closed.

    The Optuna storage it opens is disposed of at the end: one left to the garbage collector keeps its
    pooled connections (two SQLite fds, or PostgreSQL connections) until a full collection, which a
    long-lived service with a large heap seldom runs (each cancelled sweep held two more fds)."""
    storage = open_storage(runtime.optuna_storage)
    try:
        studies = sweep_studies(storage, sweep_id)
        trials = sum(close_running_trials(study) for study in studies)
        return trials, close_sweep_runs(runtime.tracking_uri, sweep_id, recorded_results(studies))
    finally:
        storage.engine.dispose()  # type: ignore[attr-defined]


def prepare_storage(url: str) -> None:
    """Create the Optuna storage's tables and close its connections: called once, before several
    processes open a fresh storage together, which race to create them and all but one fail ("UNIQUE
    constraint failed: alembic_version.version_num", "table studies already exists")."""
    open_storage(url).engine.dispose()  # type: ignore[attr-defined]


def close_running_runs(client: MlflowClient, experiment_id: str, results: Mapping[str, Recorded] | None = None) -> int:
    """Trial runs left RUNNING by a driver that is gone end: as the result Optuna kept for their Tune
    trial (`results`, with the evaluations MLflow missed), else KILLED, status interrupted (run again).
    The count closed."""
    stale = running_trial_runs(client, experiment_id)
    for run in stale:
        run_id = run.info.run_id
        kept = (results or {}).get(run.data.tags.get(Tag.tune_trial_id, ""))
        if kept is None:
            client.set_tag(run_id, Tag.status, str(TrialStatus.interrupted))
            client.set_terminated(run_id, MLFLOW_STATUS[TrialStatus.interrupted])
            continue
        logged = {m.step for m in client.get_metric_history(run_id, VAL_LOSS)}
        now = int(time.time() * 1000)
        missed = [Metric(VAL_LOSS, v, now, tokens) for tokens, v in kept.curve if tokens not in logged]
        client.log_batch(run_id, metrics=missed, tags=[RunTag(Tag.status, str(kept.status))])
        client.set_terminated(run_id, MLFLOW_STATUS[kept.status])
    return len(stale)


def close_sweep_runs(tracking_uri: str, sweep_id: str, results: Mapping[str, Recorded] | None = None) -> int:
    """Everything of a finished sweep still RUNNING in MLflow ends: trial runs as `close_running_runs`
    ends them, cell runs KILLED (a sweep that ended without its driver has no answer for them)."""
    client = MlflowClient(tracking_uri)
    exp = find_experiment(client, sweep_id)
    if exp is None:
        return 0
    closed = close_running_runs(client, exp.experiment_id, results)
    for run in open_runs(client, exp.experiment_id):
        client.set_terminated(run.info.run_id, "KILLED")
        closed += 1
    return closed
