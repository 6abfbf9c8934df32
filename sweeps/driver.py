"""Run one sweep end to end: spec -> per-cell searches on Ray Tune -> MLflow -> report.

`run_sweep` is resumable: calling it again with the same sweep id continues from the Optuna storage
(finished trials are never run again) and appends to the same MLflow experiment.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ray import tune
from ray.tune.logger import JsonLoggerCallback

from sweeps.admission import admission_problems, capacity_from_ray
from sweeps.analysis import Report, lr_edge_warnings
from sweeps.detached import DriverOnly
from sweeps.progress import DriverProgress
from sweeps.runtime import SweepRuntime, alive_nodes, check_storage
from sweeps.scheduler import METRIC, MODE, make_scheduler
from sweeps.search import TRIAL_RETRIES, CellSearcher, collect_results
from sweeps.settings import runtime_from_env
from sweeps.spec import SweepSpec
from sweeps.status import SweepStatus
from sweeps.stores import close_running_trials, open_storage, recorded_results
from sweeps.trial import run_trial

log = logging.getLogger(__name__)

# a running trial's new evaluation reports progress (its curve) at most this often
RESULT_PROGRESS_S = 5.0


class TrialsCannotRun(RuntimeError):
    """The cluster cannot run the sweep's trials: no node holds them, or no cell trained (its trials ran out
    of memory, or their processes kept dying)."""


@dataclass
class SweepOutcome:
    sweep_id: str
    status: str  # succeeded | cancelled
    report: Report
    experiment_id: str
    summary_run_id: str
    tracking_uri: str
    wall_time_s: float
    trial_train_time_s: list[float] = field(default_factory=list)  # each trial's own training time
    warnings: list[str] = field(default_factory=list)


def run_sweep(
    spec: SweepSpec,
    *,
    sweep_id: str | None = None,
    runtime: SweepRuntime | None = None,
    on_progress: Callable[[DriverProgress], None] | None = None,
    on_experiment: Callable[[str], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
    trial_fn: Callable[[dict[str, Any]], None] | None = None,
) -> SweepOutcome:
    """Run (or resume) a sweep on the current Ray cluster; returns the report and where it is recorded.
    `on_progress` gets the searcher's progress as it moves; `on_experiment` the MLflow experiment id as
    soon as it exists (before any trial), so that a running sweep's runs can be linked. `trial_fn`
    replaces the trial function (`sweeps.trial.run_trial`, training) with another that reports as it
    does, such as `sweeps.simulate.objective_trial`: the same sweep against a model of the problem."""
    from sweeps.record import SweepRecorder
    from worker.data import prepare_data  # torch: imported by the driver's run only
    from worker.launch import init_ray

    started = time.perf_counter()
    sweep_id = sweep_id or spec.name
    runtime = runtime or runtime_from_env()
    runtime.ensure()

    # the data first, in the driver: a bad source fails here, before any trial, and trials share the cache
    warnings = _data_warnings(spec, prepare_data(spec.data))

    init_ray(runtime.ray_address)
    # a spec no node can hold fails here, saying why, rather than waiting or being killed for memory (the
    # service refused it at submit already; `sweeps run` has only this check)
    if problems := admission_problems(spec, capacity_from_ray()):
        raise TrialsCannotRun("this cluster cannot run the sweep: " + "; ".join(p["message"] for p in problems))
    check_storage(runtime, nodes=alive_nodes())
    storage = open_storage(runtime.optuna_storage)
    searcher = CellSearcher(spec, sweep_id, storage)
    recorder = SweepRecorder(
        tracking_uri=runtime.tracking_uri,
        artifact_root=runtime.artifact_root,
        sweep_id=sweep_id,
        spec=spec,
        cancelling=lambda: searcher.cancelling,
        outage_s=runtime.mlflow_outage_s,
        results=recorded_results([c.study for c in searcher.cells]),  # every stored cell is open by now
    )
    if on_experiment:
        on_experiment(recorder.experiment_id)  # the live runs are there from now on: link them at once

    res = spec.resources
    if res.workers_per_trial == 1:
        resources: dict[str, float] = {"cpu": res.cpus_per_worker, "gpu": res.gpus_per_worker}
    else:  # the trial function only drives a TorchTrainer, whose workers ask for the real resources
        resources = {"cpu": 0.01}
    # Tune's own per-trial log: result.json in the trial's storage (JsonLoggerCallback below). Its other default
    # loggers are off on the clusters this project starts (worker.local_ray.TRAIN_ENV)
    tuner = tune.Tuner(
        tune.with_resources(trial_fn or run_trial, resources),
        tune_config=tune.TuneConfig(
            search_alg=searcher,
            scheduler=make_scheduler(spec),
            metric=METRIC,
            mode=MODE,
            num_samples=-1,
            max_concurrent_trials=res.max_concurrent_trials,
            reuse_actors=True,
        ),
        run_config=tune.RunConfig(
            name=f"{sweep_id}-{int(time.time())}",
            storage_path=runtime.trial_storage,
            callbacks=[recorder, _Progress(searcher, on_progress), _DropCheckpoints(), JsonLoggerCallback()],
            stop=_Cancel(searcher, should_stop),
            verbose=0,
            # a trial whose worker died is restarted; training errors are results (`run_trial`)
            failure_config=tune.FailureConfig(max_failures=TRIAL_RETRIES),
            # the trial function reports its checkpoints (spec.checkpoints); only the last is kept
            checkpoint_config=tune.CheckpointConfig(num_to_keep=1, checkpoint_at_end=False),
        ),
    )
    if on_progress:
        on_progress(searcher.progress())
    if not searcher.all_finished() or searcher.grow():
        tuner.fit()
    cancelled = searcher.cancelling
    # Tune's stop-all at a cancel tells neither the searcher nor the callbacks about the trials in flight,
    # so they are still RUNNING in Optuna (the soak found one). A started one has an MLflow run, which
    # `mark_cancelled` ends `cancelled`: Optuna records it the same, with its tune trial id. One never
    # started has no run and is closed as after a lost driver. Either is run again on resume.
    if ended := searcher.end_cancelled(recorder.started_trials()):
        log.info("%d trial(s) stopped by the cancel without a last result: recorded as cancelled", ended)
    for cell in searcher.cells:
        close_running_trials(cell.study)
    if cancelled:
        recorder.mark_cancelled()

    stopped = searcher.stopped_cells()
    if not cancelled and stopped and len(stopped) == len(searcher.cells):
        # not one cell trained: no report to write, and the sweep fails saying why (each cell's reason)
        raise TrialsCannotRun(
            "every cell stopped with no result: " + "; ".join(f"{key}: {why}" for key, why in stopped.items())
        )
    run_ids = recorder.trial_run_ids()
    _, train_times = collect_results(searcher, run_ids)
    report = searcher.report(run_ids)
    report.warnings = [*report.warnings, *warnings, *lr_edge_warnings(report)]
    status = SweepStatus.cancelled if cancelled else SweepStatus.succeeded
    summary_run_id = recorder.write_summary(report, status=status)
    if on_progress:
        on_progress(searcher.progress())
    return SweepOutcome(
        sweep_id=sweep_id,
        status=status,
        report=report,
        experiment_id=recorder.experiment_id,
        summary_run_id=summary_run_id,
        tracking_uri=runtime.tracking_uri,
        wall_time_s=time.perf_counter() - started,
        trial_train_time_s=train_times,
        warnings=report.warnings,
    )


def _data_warnings(spec: SweepSpec, data: Any) -> list[str]:
    """What the report should say of the data: a budget rounded down to whole steps, repeated epochs."""
    from worker.data import train_sequences_available

    warnings: list[str] = []
    available = train_sequences_available(data, spec.model.seq_len) * spec.model.seq_len
    trained = spec.trained_tokens
    if trained != spec.token_budget:
        warnings.append(
            f"token_budget={spec.token_budget} was rounded down to {trained} tokens, a multiple of "
            f"lcm({'the lattice' if spec.batch_search else 'batch_sizes'}) x seq_len, so that every batch size "
            f"trains on exactly the same tokens"
        )
    if trained > available:
        warnings.append(
            f"token budget {trained} exceeds the {available} training tokens of {data.description}: "
            f"trials repeat data ({trained / available:.2f} epochs), which favours small batches"
        )
        log.warning(warnings[-1])
    return warnings


class _Progress(DriverOnly, tune.Callback):
    """The searcher's progress to `on_progress` at each trial's start and end, and with the curves of
    running trials at most every RESULT_PROGRESS_S."""

    def __init__(self, searcher: CellSearcher, on_progress: Callable[[DriverProgress], None] | None) -> None:
        self.searcher, self.on_progress = searcher, on_progress
        self.last_result = 0.0

    def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        if self.on_progress:
            self.on_progress(self.searcher.progress())

    def on_trial_result(self, iteration: int, trials: list, trial: Any, result: dict, **info: Any) -> None:
        if self.on_progress and time.monotonic() - self.last_result >= RESULT_PROGRESS_S:
            self.last_result = time.monotonic()
            self.on_progress(self.searcher.progress())

    on_trial_error = on_trial_complete
    on_trial_start = on_trial_complete


class _DropCheckpoints(DriverOnly, tune.Callback):
    """While a trial runs Tune keeps its last checkpoint (num_to_keep=1), for a restart after a lost
    worker or node; once it has ended (or is given up, to be run again whole) they are deleted."""

    def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        drop_checkpoints(trial)

    on_trial_error = on_trial_complete


class _Cancel(DriverOnly, tune.Stopper):
    """Stops every trial once `should_stop()` says so, and marks the searcher cancelling."""

    def __init__(self, searcher: CellSearcher, should_stop: Callable[[], bool] | None) -> None:
        self.searcher, self.should_stop = searcher, should_stop

    def __call__(self, trial_id: str, result: dict[str, Any]) -> bool:
        return False

    def stop_all(self) -> bool:
        stop = bool(self.should_stop and self.should_stop())
        if stop:
            self.searcher.cancelling = True
        return stop


def drop_checkpoints(trial: Any) -> int:
    """Delete the checkpoints of a Tune trial from the trial storage (local or s3://); the count deleted."""
    from pyarrow.fs import FileSelector, FileType

    storage = trial.storage
    fs = storage.storage_filesystem
    deleted = 0
    try:
        for info in fs.get_file_info(FileSelector(storage.trial_fs_path, allow_not_found=True)):
            if info.type == FileType.Directory and info.base_name.startswith("checkpoint_"):
                fs.delete_dir(info.path)
                deleted += 1
    except OSError:  # the storage is unreachable: the checkpoints stay (space, not correctness)
        log.warning("could not delete the checkpoints of trial %s", trial.trial_id, exc_info=True)
    return deleted
