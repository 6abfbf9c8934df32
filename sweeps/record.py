"""A sweep's MLflow record, written from one place (the sweep driver) so workers never contend, in
the layout `sweeps/layout.py` owns (experiment per sweep, cell runs, trial runs nested under them, a
summary run with spec.yaml, report.json, cells.csv and figures/).

All MLflow calls run on one background thread fed by a queue: the Tune event loop only enqueues, so
recording never delays scheduling. `close()` drains the queue. A write that does not go through because
MLflow is away (unreachable, or answering 5xx after the client's own retries) is retried in order, every
few seconds, for as long as the outage lasts up to `outage_s` (`OutageRetries`); each write is
idempotent, so a retry after a partial success records nothing twice. A write MLflow refuses (4xx) is
logged and dropped at once, one that fails while MLflow answers a read after 3 tries: sending it again
cannot help, and it would hold up every write behind it.
"""

from __future__ import annotations

import csv
import io
import json
import logging
import math
import queue
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from mlflow.entities import Metric, Param, Run, RunTag
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient
from ray.tune import Callback
from ray.tune.experiment import Trial

from sweeps import layout
from sweeps.analysis import CellReport, Report, report_to_json
from sweeps.detached import DriverOnly
from sweeps.layout import MLFLOW_STATUS, Role, Tag
from sweeps.plan import cell_key, run_name
from sweeps.runtime import MLFLOW_OUTAGE_S
from sweeps.spec import SweepSpec
from sweeps.status import TrialStatus, trial_status
from sweeps.stores import Recorded, close_running_runs
from worker.session import NODE_ID

T = TypeVar("T")

log = logging.getLogger(__name__)

# what the worker reports, as opposed to the keys Ray Tune adds to every result
NOT_METRICS = {"tokens", "done", "status", "step"}
TUNE_KEYS = {
    "time_this_iter_s",
    "time_total_s",
    "timestamp",
    "training_iteration",
    "iterations_since_restore",
    "time_since_restore",
    "pid",
    "node_ip",
    "checkpoint_dir_name",
    "timesteps_total",
    "episodes_total",
    "timesteps_since_restore",
    "should_checkpoint",
    "date",
    "hostname",
    "trial_id",
    "experiment_tag",
}


def ensure_store(tracking_uri: str) -> None:
    """Create (migrate) the SQLite store once, before any concurrent writer: the first client of an empty
    store creates its schema, and several first clients at once race to create the same tables."""
    if tracking_uri.startswith("sqlite:"):
        MlflowClient(tracking_uri).search_experiments(max_results=1)


def flatten(prefix: str, value: Any) -> dict[str, str]:
    if isinstance(value, dict):
        out: dict[str, str] = {}
        for k, v in value.items():
            out |= flatten(f"{prefix}.{k}" if prefix else str(k), v)
        return out
    return {prefix: json.dumps(value) if isinstance(value, (list, tuple)) else str(value)}


def _mlflow_away(exc: Exception) -> bool:
    """Whether a failed write may go through later: MLflow unreachable or failing on its side (5xx, or a
    connection error, which the client reports as INTERNAL_ERROR), not a write it refused (4xx)."""
    if isinstance(exc, MlflowException):
        return exc.get_http_status_code() >= 500
    return isinstance(exc, OSError)


TRIES_WHILE_ANSWERING = 3  # of a call that fails while a read of MLflow goes through (OutageRetries.call)


class MlflowAway(RuntimeError):
    """MLflow has been away for longer than the outage limit (`OutageRetries.outage_s`)."""


class OutageRetries:
    """Runs the recorder's MLflow calls one at a time, retrying one that failed because MLflow is away
    (`_mlflow_away`, and `probe`, a read of MLflow, fails too) after `first_s`, then twice as long each
    time up to `max_s`, until it goes through or MLflow has been away for `outage_s` in all. A call that
    failed while `probe` succeeds is tried `TRIES_WHILE_ANSWERING` times in all, then given up: MLflow
    answers, so the call itself is what fails (a 500 it gives every time), and retrying it for the whole
    outage limit would hold up every call behind it.

    `run` is for the writes of running trials: one given up is dropped (counted, logged), and past the
    limit they are dropped untried except one every `max_s`: the first that goes through ends the outage.
    `call` is for what the sweep cannot end without (its summary): it raises where `run` drops."""

    def __init__(
        self,
        outage_s: float,
        *,
        probe: Callable[[], object] | None = None,
        first_s: float = 0.5,
        max_s: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        """Without a `probe`, every failure `_mlflow_away` names is taken as an outage."""
        if not (outage_s > 0 and 0 < first_s <= max_s):
            raise ValueError(f"need outage_s > 0 and 0 < first_s <= max_s, got {outage_s=}, {first_s=}, {max_s=}")
        self.outage_s, self.first_s, self.max_s = outage_s, first_s, max_s
        self._probe, self._clock, self._sleep = probe, clock, sleep
        self.away_since: float | None = None  # when the current outage began (clock seconds)
        self._next_probe = -math.inf
        self.dropped = 0  # writes given up by `run`: refused by MLflow, or past the outage's limit

    def run(self, write: Callable[[], None]) -> bool:
        """Run `write` until it goes through (True) or is given up (False, logged)."""
        now = self._clock()
        if self._given_up(now) and now < self._next_probe:
            self.dropped += 1  # logged with the next tried write's failure: a line per max_s, not per write
            return False
        try:
            self.call(write)
        except MlflowAway as away:
            self.dropped += 1
            log.error("%s: %d writes dropped so far", away, self.dropped)
            return False
        except Exception:
            self.dropped += 1
            log.exception("an MLflow write MLflow refused, or that failed while it answers: dropped")
            return False
        return True

    def call(self, fn: Callable[[], T]) -> T:
        """`fn`'s value once it goes through. Raises its error where retrying cannot help (MLflow refused
        it, or answered while it failed `TRIES_WHILE_ANSWERING` times), and `MlflowAway` once MLflow has
        been away for `outage_s` (past that, one try)."""
        pause, answered = self.first_s, 0
        while True:
            try:
                value = fn()
            except Exception as exc:
                if not _mlflow_away(exc):
                    self.away_since = None  # refused: MLflow answers, no outage
                    raise
                if self._answers():
                    # a server coming back answers a read before every worker of it takes writes: a few
                    # tries, not one, before the call itself is taken to be what fails
                    answered += 1
                    if answered >= TRIES_WHILE_ANSWERING:
                        self.away_since = None
                        raise
                    why = "failed while MLflow answers"
                else:
                    now = self._clock()
                    if self.away_since is None:
                        self.away_since = now
                    if self._given_up(now):
                        self._next_probe = now + self.max_s
                        away = now - self.away_since
                        raise MlflowAway(f"MLflow away for {away:.0f} s, past mlflow_outage_s") from exc
                    why = "MLflow away"
                log.warning("%s (%s): the call is retried in %.1f s", why, exc, pause)
                self._sleep(pause)
                pause = min(2 * pause, self.max_s)
                continue
            if self.away_since is not None:
                log.warning("MLflow back after %.0f s: recording goes on", self._clock() - self.away_since)
            self.away_since = None
            return value

    def _answers(self) -> bool:
        if self._probe is None:
            return False
        try:
            self._probe()
        except Exception:
            return False
        return True

    def _given_up(self, now: float) -> bool:
        return self.away_since is not None and now - self.away_since >= self.outage_s


class SweepRecorder(DriverOnly, Callback):
    """Tune callback that mirrors trials into MLflow, plus the cell and summary runs."""

    def __init__(
        self,
        *,
        tracking_uri: str,
        artifact_root: Path | None,
        sweep_id: str,
        spec: SweepSpec,
        cancelling: Callable[[], bool] = lambda: False,
        outage_s: float = MLFLOW_OUTAGE_S,
        results: Mapping[str, Recorded] | None = None,
    ) -> None:
        """`results`: what Optuna holds of ended trials (`sweeps.stores.recorded_results`), for the runs an
        earlier driver of the sweep left RUNNING. `outage_s`: how long a write waits for MLflow to come
        back (`OutageRetries`)."""
        ensure_store(tracking_uri)
        self._cancelling = cancelling  # trials cut short by a cancel are "cancelled", not "pruned"
        self.client = MlflowClient(tracking_uri)
        self.tracking_uri, self.sweep_id, self.spec = tracking_uri, sweep_id, spec
        exp = layout.find_experiment(self.client, sweep_id)
        if exp is None:
            location = None
            if artifact_root is not None and not tracking_uri.startswith("http"):
                location = (artifact_root / sweep_id).resolve().as_uri()
            self.experiment_id = self.client.create_experiment(
                sweep_id,
                artifact_location=location,
                tags=layout.experiment_tags(sweep_id, spec.name),
            )
        else:
            self.experiment_id = exp.experiment_id
        self._cells: dict[str, str] = {}  # cell key -> run id
        self._trials: dict[str, str] = {}  # tune trial id -> run id
        self._nodes: dict[str, list[str]] = {}  # tune trial id -> the Ray nodes it reported from
        for run in layout.runs_of(self.client, self.experiment_id, Role.cell):
            self._cells[run.data.tags[Tag.cell]] = run.info.run_id
        # a list sweep's cells exist from the start; a search's when it chooses their batch size (_cell_run)
        for opt, bs in spec.cells() if spec.batch_search is None else []:
            if cell_key(opt, bs) not in self._cells:
                run = self.client.create_run(
                    self.experiment_id,
                    run_name=run_name(opt, bs),
                    tags=layout.cell_tags(sweep_id, cell_key(opt, bs), opt, bs),
                )
                self._cells[cell_key(opt, bs)] = run.info.run_id
        close_running_runs(self.client, self.experiment_id, results)
        self._started: set[str] = set()  # trials started and not ended (the Tune thread's own view)
        self.retries = OutageRetries(outage_s, probe=lambda: self.client.get_experiment(self.experiment_id))
        self._queue: queue.Queue[Callable[[], None] | None] = queue.Queue()
        self._thread = threading.Thread(target=self._drain, name="mlflow-recorder", daemon=True)
        self._thread.start()

    # ---- Tune callback ---------------------------------------------------------------------------

    def on_trial_start(self, iteration: int, trials: list[Trial], trial: Trial, **info: Any) -> None:
        c = trial.config
        # decided here, not by the writer: a write retried after an outage must not read as a restart
        restart = trial.trial_id in self._started
        self._started.add(trial.trial_id)
        self._queue.put(lambda: self._start_trial(trial.trial_id, c, restart=restart))

    def on_trial_result(
        self, iteration: int, trials: list[Trial], trial: Trial, result: dict[str, Any], **info: Any
    ) -> None:
        metrics = _metrics_of(result)
        self._queue.put(lambda: self._log(trial.trial_id, metrics))
        node = result.get(NODE_ID)
        nodes = self._nodes.setdefault(trial.trial_id, [])
        if isinstance(node, str) and (not nodes or nodes[-1] != node):
            nodes.append(node)
            tags = {Tag.node_id: node, Tag.node_ids: ",".join(nodes)}
            self._queue.put(lambda: self._tag(trial.trial_id, tags))

    def on_trial_complete(self, iteration: int, trials: list[Trial], trial: Trial, **info: Any) -> None:
        status = trial_status(trial.last_result, error=False, cancelling=self._cancelling())
        self._started.discard(trial.trial_id)
        self._queue.put(lambda: self._end_trial(trial.trial_id, status))

    def on_trial_error(self, iteration: int, trials: list[Trial], trial: Trial, **info: Any) -> None:
        # Tune's restarts are spent: the infrastructure lost it (sweeps.status.trial_status), it is run again
        status = trial_status(trial.last_result, error=True)
        self._started.discard(trial.trial_id)
        self._queue.put(lambda: self._end_trial(trial.trial_id, status))

    # ---- driver-side calls -----------------------------------------------------------------------

    def started_trials(self) -> frozenset[str]:
        """Tune trial ids started and not yet ended (each has an open MLflow run, or will have one)."""
        return frozenset(self._started)

    def mark_cancelled(self) -> None:
        """Trials still open when a sweep is cancelled end as KILLED (they re-run on resume)."""
        self._queue.put(lambda: [self._end_trial(t, TrialStatus.cancelled) for t in list(self._trials)])

    def trial_run_ids(self) -> dict[str, str]:
        """Tune trial id -> MLflow run id of every trial run of the sweep (after every write is done)."""
        self.close()
        runs = self.retries.call(lambda: layout.trial_runs(self.client, self.experiment_id))
        return {r.data.tags[Tag.tune_trial_id]: r.info.run_id for r in runs if Tag.tune_trial_id in r.data.tags}

    def write_summary(self, report: Report, *, status: str) -> str:
        """Cell runs get their answer; one summary run holds spec, report and tables. Returns its id.

        Each call waits out an MLflow outage (`OutageRetries.call`) and may run twice (a retry, or a
        relaunched driver after one past the limit): it records nothing twice that a reader would see."""
        self.close()
        mlflow = self.retries.call
        for name, opt in report.optimizers.items():
            for cell in opt.cells:
                run_id = self._cells.get(cell_key(name, cell.batch_size))
                if run_id is None:
                    continue
                named = {"val_loss_mean": cell.val_loss_mean, "best_lr": cell.best_lr}
                metrics = {k: v for k, v in named.items() if v is not None}
                if cell.val_loss_mean is not None:  # then its interval is two numbers
                    metrics["val_loss_ci95_low"], metrics["val_loss_ci95_high"] = cell.val_loss_ci95
                now = int(time.time() * 1000)
                curve = mlflow(lambda cell=cell: self._confirmation_curve(cell))
                answer = [Metric(k, float(v), now, 0) for k, v in metrics.items()] + curve
                mlflow(lambda run_id=run_id, answer=answer: self.client.log_batch(run_id, metrics=answer))
                mlflow(lambda run_id=run_id: self.client.set_terminated(run_id, "FINISHED"))

        def summary_run() -> Run:  # found, not created again, where an earlier try created it
            found = layout.summary_run(self.client, self.experiment_id)
            return found or self.client.create_run(
                self.experiment_id, run_name=layout.SUMMARY_RUN_NAME, tags=layout.summary_tags(self.sweep_id)
            )

        summary = mlflow(summary_run)
        run_id = summary.info.run_id
        params = flatten("", {k: v for k, v in self.spec.model_dump(mode="json").items() if k != "optimizers"})
        params["optimizers"] = ",".join(self.spec.optimizer_names)
        # params once (MLflow refuses to change one): an earlier try may have created the run and failed
        # before logging them
        new_params = [] if summary.data.params else [Param(k, v[:6000]) for k, v in params.items()]
        now = int(time.time() * 1000)
        mlflow(
            lambda: self.client.log_batch(
                run_id,
                params=new_params,
                tags=[RunTag(Tag.status, str(status)), RunTag(Tag.driver_node_id, _node_id())],
                metrics=[
                    Metric(f"largest_degradation_free_bs/{name}/{ref}", float(bs), now, 0)
                    for name, opt in report.optimizers.items()
                    for ref, bs in opt.largest_degradation_free_batch_size.model_dump().items()
                    if bs is not None
                ],
            )
        )
        with tempfile.TemporaryDirectory() as d:
            (Path(d) / layout.SPEC_FILE).write_text(self.spec.to_yaml())
            (Path(d) / layout.REPORT_FILE).write_text(report_to_json(report))
            (Path(d) / layout.CELLS_FILE).write_text(cells_csv(report))
            mlflow(lambda: self.client.log_artifacts(run_id, d))
        mlflow(lambda: self.client.set_terminated(run_id, "FINISHED"))
        return run_id

    def _confirmation_curve(self, cell: CellReport) -> list[Metric]:
        """The val-loss curve (step = tokens) of the cell's first confirmation run, for its cell run: the
        MLflow UI then charts val loss against tokens per cell without opening the nested trials."""
        run_id = next((r for r in cell.confirmation_run_ids if r), None)
        if run_id is None:
            return []
        return [
            Metric("val_loss", m.value, m.timestamp, m.step) for m in self.client.get_metric_history(run_id, "val_loss")
        ]

    def close(self) -> None:
        if self._thread.is_alive():
            self._queue.put(None)
            self._thread.join()

    # ---- the writer thread ---------------------------------------------------------------------

    def _drain(self) -> None:
        # every write is retried while MLflow is away; a failed write never takes the sweep down
        while (job := self._queue.get()) is not None:
            self.retries.run(job)

    # Each write below is idempotent: run again after a partial success (an outage between two calls), it
    # makes no second run and counts no second restart.

    def _start_trial(self, trial_id: str, c: dict[str, Any], *, restart: bool) -> None:
        if restart:
            # Tune restarted the trial after its worker died: one run per trial, with its restarts counted
            if (run_id := self._trials.get(trial_id)) is not None:  # None: its first start was dropped
                restarts = int(self.client.get_run(run_id).data.tags.get(Tag.restarts, "0")) + 1
                self.client.set_tag(run_id, Tag.restarts, str(restarts))
            return
        train = c["train"]
        if trial_id not in self._trials:
            self._trials[trial_id] = self._create_trial_run(trial_id, c)
        # the run config (worker.config.TrainConfig) flattened: each param named by its path in the config's
        # sections (optimizer.lr, schedule.warmup_fraction, resources.max_micro_batch, ...)
        params = flatten("", train)
        self.client.log_batch(self._trials[trial_id], params=[Param(k, v[:6000]) for k, v in params.items()])

    def _create_trial_run(self, trial_id: str, c: dict[str, Any]) -> str:
        run = self.client.create_run(
            self.experiment_id,
            run_name=run_name(
                c["optimizer"],
                c["batch_size"],
                c["lr"],
                c["seed"],
                c.get("warmup") if c.get("warmup_searched") else None,
            ),
            tags=layout.trial_tags(
                sweep_id=self.sweep_id,
                parent_run_id=self._cell_run(c),
                role=c["role"],
                cell=c["cell"],
                optimizer=c["optimizer"],
                batch_size=c["batch_size"],
                lr=c["lr"],
                seed=c["seed"],
                status=TrialStatus.running,
                optuna_number=c.get("optuna_number"),
                tune_trial_id=trial_id,
                chosen=c.get("chosen", "listed"),
            ),  # fmt: skip
        )
        return run.info.run_id

    def _cell_run(self, c: dict[str, Any]) -> str:
        """The run id of a trial's cell; a search's cell run is made with its first trial, tagged with why
        its batch size was chosen."""
        if c["cell"] not in self._cells:
            tags = layout.cell_tags(
                self.sweep_id, c["cell"], c["optimizer"], c["batch_size"], c.get("chosen", "listed"), c.get("why", "")
            )
            run = self.client.create_run(
                self.experiment_id, run_name=run_name(c["optimizer"], c["batch_size"]), tags=tags
            )
            self._cells[c["cell"]] = run.info.run_id
        return self._cells[c["cell"]]

    def _log(self, trial_id: str, metrics: list[tuple[str, float, int]]) -> None:
        run_id = self._trials.get(trial_id)
        if run_id is None or not metrics:
            return
        now = int(time.time() * 1000)
        self.client.log_batch(run_id, metrics=[Metric(k, v, now, step) for k, v, step in metrics])

    def _tag(self, trial_id: str, tags: dict[str, str]) -> None:
        if (run_id := self._trials.get(trial_id)) is not None:
            self.client.log_batch(run_id, tags=[RunTag(k, v) for k, v in tags.items()])

    def _end_trial(self, trial_id: str, status: str) -> None:
        run_id = self._trials.get(trial_id)
        if run_id is None:
            return
        self.client.set_tag(run_id, Tag.status, str(status))
        self.client.set_terminated(run_id, MLFLOW_STATUS[status])
        del self._trials[trial_id]  # last: a retry after a partial end ends the run again


def _node_id() -> str:
    import ray

    return ray.get_runtime_context().get_node_id() if ray.is_initialized() else ""


def _metrics_of(result: dict[str, Any]) -> list[tuple[str, float, int]]:
    step = int(result.get("tokens", 0))  # tokens seen: curves at different batch sizes line up
    out = []
    for key, value in result.items():
        if key in NOT_METRICS or key in TUNE_KEYS or isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        if math.isfinite(value):
            out.append((key, float(value), step))
    return out


def cells_csv(report: Report) -> str:
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(
        [
            "optimizer",
            "batch_size",
            "best_lr",
            "val_loss_mean",
            "ci95_low",
            "ci95_high",
            "seeds",
            "trials",
            "lr_at_edge",
            "warmup",
        ]
    )
    for name, opt in report.optimizers.items():
        for c in opt.cells:
            w.writerow(
                [
                    name,
                    c.batch_size,
                    c.best_lr,
                    c.val_loss_mean,
                    *c.val_loss_ci95,
                    c.seeds,
                    c.trials,
                    c.lr_at_edge,
                    c.warmup,  # of the confirmation runs, in the spec's unit (schedule.warmup_unit)
                ]
            )
    return buf.getvalue()
