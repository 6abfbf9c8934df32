"""Helpers of the fault-injection tests: the token, waiting, and what a sweep must have recorded."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from typing import Any

TOKEN = "fault-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
# what the README's `sweeps serve` does not set: the embedded defaults stand
EMBEDDED = ("RAY_ADDRESS", "MLFLOW_TRACKING_URI", "SWEEPS_OPTUNA_STORAGE", "SWEEPS_DATABASE_URL")


def wait(predicate: Callable[[], Any], timeout_s: float, what: str, interval_s: float = 0.5) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval_s)
    raise AssertionError(f"{what} not reached within {timeout_s} s")


def describe_runs(runs: list[Any]) -> str:
    """One line per MLflow trial run, oldest first: what a failed count needs to be understood."""
    keys = ("cell", "role", "seed", "status", "tune_trial_id", "restarts", "optuna_number", "node_ids")
    rows = sorted(runs, key=lambda r: r.info.start_time or 0)
    return "\n".join(
        f"{r.info.run_name} {r.info.status} start={r.info.start_time} end={r.info.end_time} "
        + " ".join(f"{k}={r.data.tags.get(f'batchsweep.{k}')}" for k in keys)
        for r in rows
    )


def assert_recorded_once(
    optuna_url: str, tracking_uri: str, sweep_id: str, *, cells: int, search: int, seeds: int
) -> list[Any]:
    """Optuna and MLflow hold every planned trial of the sweep exactly once and agree on them, and
    nothing is left RUNNING in either: `search` trials per cell (`trials_per_batch_size`; an optimizer's
    smallest batch size runs `cell_search_trials` of it, one more), `seeds` confirmation runs. Returns the
    MLflow runs of the kept trials."""
    import optuna
    from mlflow.tracking import MlflowClient

    from sweeps.spec import cell_search_trials
    from sweeps.status import RERUN_STATUSES

    storage = optuna.storages.RDBStorage(optuna_url)
    names = [n for n in optuna.get_all_study_names(storage) if n.startswith(f"{sweep_id}/")]
    assert len(names) == cells
    smallest = min(int(n.rsplit("/bs", 1)[1]) for n in names)  # study names end in <optimizer>/bs<size>
    planned = 0
    optuna_trials: Counter[tuple[str, str, int]] = Counter()
    for name in names:
        study = optuna.load_study(study_name=name, storage=storage)
        states = Counter(t.state.name for t in study.trials)
        assert states["RUNNING"] == 0 and states["WAITING"] == 0, (name, states)
        kept = [t for t in study.trials if t.user_attrs.get("status") not in RERUN_STATUSES]
        roles = Counter(t.user_attrs["role"] for t in kept)
        searched = cell_search_trials(search, reference=int(name.rsplit("/bs", 1)[1]) == smallest)
        assert roles == {"search": searched, "seed": seeds}, (name, roles)
        planned += searched + seeds
        for t in kept:
            optuna_trials[(name.split("/", 1)[1], t.user_attrs["role"], int(t.user_attrs["seed"]))] += 1

    client = MlflowClient(tracking_uri)
    exp = client.get_experiment_by_name(sweep_id)
    runs = client.search_runs([exp.experiment_id], max_results=1000)
    assert [r.info.run_name for r in runs if r.info.status == "RUNNING"] == []
    trial_runs = [r for r in runs if r.data.tags.get("batchsweep.role") in ("search", "seed")]
    kept_runs = [r for r in trial_runs if r.data.tags.get("batchsweep.status") not in RERUN_STATUSES]
    assert len(kept_runs) == planned, describe_runs(trial_runs)
    # one MLflow run per kept Optuna trial, each Tune trial once (a restarted trial keeps its run)
    assert len({r.data.tags["batchsweep.tune_trial_id"] for r in kept_runs}) == len(kept_runs)
    mlflow_trials = Counter(
        (r.data.tags["batchsweep.cell"], r.data.tags["batchsweep.role"], int(r.data.tags["batchsweep.seed"]))
        for r in kept_runs
    )
    assert mlflow_trials == optuna_trials
    return kept_runs
