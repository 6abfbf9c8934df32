"""The recorder waits out an MLflow outage instead of dropping what it had to write.

The retry rule exactly, on a fake clock (`OutageRetries`), and each write run twice records nothing
twice (a retry after a partial success). A real sweep through a real `mlflow server` that is down for
20 s, with the MLflow client's own retries turned off so that the recorder's must carry the outage, is
tests/faults/test_mlflow_outage.py.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from harness import tiny_spec
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from sweeps import layout
from sweeps.analysis import TrialResult, build_report
from sweeps.layout import Tag
from sweeps.record import TRIES_WHILE_ANSWERING, MlflowAway, OutageRetries, SweepRecorder
from sweeps.spec import SweepSpec

SWEEP = "outage"


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.slept.append(s)
        self.now += s


def failing(times: int, exc: Exception, calls: list[float], clock: FakeClock):
    def write() -> None:
        calls.append(clock.now)
        if len(calls) <= times:
            raise exc

    return write


AWAY = MlflowException("API request to http://mlflow/api/2.0/mlflow/runs/create failed with exception ...")


def test_a_write_is_retried_with_doubling_pauses_until_mlflow_is_back() -> None:
    clock, calls = FakeClock(), []
    retries = OutageRetries(60, first_s=0.5, max_s=2.0, clock=clock, sleep=clock.sleep)
    assert retries.run(failing(4, AWAY, calls, clock)) is True
    assert clock.slept == [0.5, 1.0, 2.0, 2.0]  # doubling, capped at max_s
    assert len(calls) == 5 and retries.dropped == 0 and retries.away_since is None


def test_a_write_mlflow_refuses_is_dropped_at_once() -> None:
    clock, calls = FakeClock(), []
    retries = OutageRetries(60, clock=clock, sleep=clock.sleep)
    refused = MlflowException.invalid_parameter_value("Invalid value for param")  # a 400
    assert retries.run(failing(1, refused, calls, clock)) is False
    assert len(calls) == 1 and clock.slept == [] and retries.dropped == 1


def test_a_write_that_fails_while_mlflow_answers_is_dropped_after_3_tries() -> None:
    """A 500 that MLflow gives every time for this write: retried while a read of MLflow (the probe) fails
    too, then tried TRIES_WHILE_ANSWERING (3) times in all once the probe answers, and dropped, so that it
    does not hold up every write behind it for the whole outage limit."""
    clock, calls, up = FakeClock(), [], [False]

    def probe() -> None:
        if not up[0]:
            raise AWAY

    def write() -> None:
        calls.append(clock.now)
        if len(calls) == 2:
            up[0] = True  # MLflow is back, and this write still fails
        raise AWAY

    assert TRIES_WHILE_ANSWERING == 3
    retries = OutageRetries(60, probe=probe, first_s=1, max_s=4, clock=clock, sleep=clock.sleep)
    assert retries.run(write) is False
    assert [t - 100 for t in calls] == [0, 1, 3, 7] and clock.slept == [1, 2, 4]
    assert retries.dropped == 1 and retries.away_since is None


def test_a_write_that_fails_once_as_mlflow_comes_back_goes_through() -> None:
    """A server coming back answers a read before every worker of it takes writes (a clean-clone run of the
    outage test lost a trial's first point that way): the write is tried again, not dropped."""
    clock, calls = FakeClock(), []
    retries = OutageRetries(60, probe=lambda: None, first_s=0.5, max_s=4, clock=clock, sleep=clock.sleep)
    assert retries.run(failing(2, ConnectionError("connection reset"), calls, clock)) is True
    assert len(calls) == 3 and clock.slept == [0.5, 1.0] and retries.dropped == 0


def test_past_outage_s_writes_are_dropped_with_a_probe_every_max_s_and_the_first_success_ends_it() -> None:
    clock, calls = FakeClock(), []
    retries = OutageRetries(10, first_s=1, max_s=4, clock=clock, sleep=clock.sleep)
    assert retries.run(failing(99, AWAY, calls, clock)) is False  # tried at 0, 1, 3, 7, 11 s: 11 >= 10
    assert [t - 100 for t in calls] == [0, 1, 3, 7, 11] and retries.dropped == 1
    later: list[float] = []
    assert retries.run(failing(99, AWAY, later, clock)) is False  # within max_s of the last try: not tried
    assert later == [] and retries.dropped == 2
    clock.now += 4
    assert retries.run(failing(0, AWAY, later, clock)) is True  # the probe goes through: the outage is over
    assert len(later) == 1 and retries.away_since is None
    assert retries.run(failing(1, AWAY, later, clock)) is True  # and a new failure is retried again
    assert retries.dropped == 2


def test_call_returns_the_value_once_mlflow_is_back_and_raises_past_the_limit() -> None:
    clock, calls = FakeClock(), []
    retries = OutageRetries(10, first_s=1, max_s=4, clock=clock, sleep=clock.sleep)

    def read() -> str:
        failing(2, AWAY, calls, clock)()
        return "runs"

    assert retries.call(read) == "runs" and clock.slept == [1, 2] and retries.away_since is None
    with pytest.raises(MlflowAway, match=r"away for 11 s"):  # tried at 0, 1, 3, 7, 11 s: 11 >= 10
        retries.call(failing(99, AWAY, [], clock))
    assert retries.dropped == 0  # `call` drops nothing: its caller decides
    refused = MlflowException.invalid_parameter_value("Invalid value for param")
    with pytest.raises(MlflowException, match="Invalid value"):  # a refusal is raised at once
        retries.call(failing(1, refused, [], clock))


def test_outage_retries_validate_their_config() -> None:
    with pytest.raises(ValueError, match=r"outage_s=0"):
        OutageRetries(0)
    with pytest.raises(ValueError, match=r"first_s=5.*max_s=1"):
        OutageRetries(10, first_s=5, max_s=1)


def trial(trial_id: str, lr: float, *, status: str | None = None) -> Any:
    """What the recorder reads of a Ray Tune trial: its id, config and last result."""
    config = {
        "train": {"optimizer": {"name": "adamw", "lr": lr}, "batch_size": 4, "seed": 0},
        "optimizer": "adamw", "batch_size": 4, "lr": lr, "seed": 0, "role": "search", "cell": "adamw-bs4",
    }  # fmt: skip
    return SimpleNamespace(trial_id=trial_id, config=config, last_result={"status": status} if status else {})


def recorder_at(uri: str, **kw: Any) -> SweepRecorder:
    spec = SweepSpec.from_mapping(tiny_spec(SWEEP, batch_sizes=[4]))
    return SweepRecorder(tracking_uri=uri, artifact_root=None, sweep_id=SWEEP, spec=spec, **kw)


def test_each_write_run_twice_records_nothing_twice(tmp_path: Path) -> None:
    """What a retry after a partial success does (the outage fell between two calls of one write)."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    recorder = recorder_at(uri)
    t = trial("t1", 1e-3, status="completed")
    recorder._start_trial("t1", t.config, restart=False)
    recorder._start_trial("t1", t.config, restart=False)
    recorder._end_trial("t1", "completed")
    recorder._end_trial("t1", "completed")
    recorder.close()
    runs = layout.trial_runs(MlflowClient(uri), recorder.experiment_id)
    assert len(runs) == 1
    run = runs[0]
    assert run.data.params["optimizer.lr"] == "0.001" and run.info.status == "FINISHED"
    assert Tag.restarts not in run.data.tags


class Flaky:
    """An MlflowClient whose every call fails once with a connection error before it goes through;
    create_run fails after the run was created (the answer lost on the way back)."""

    def __init__(self, client: MlflowClient) -> None:
        self.client, self.failed = client, set()

    def __getattr__(self, name: str) -> Any:
        method = getattr(self.client, name)

        def call(*args: Any, **kwargs: Any) -> Any:
            first = name not in self.failed
            self.failed.add(name)
            if first and name != "create_run":
                raise ConnectionError(f"{name}: connection refused")
            value = method(*args, **kwargs)
            if first:
                raise ConnectionError(f"{name}: connection reset")
            return value

        return call


def test_the_summary_is_written_once_through_an_outage_and_again_by_a_relaunched_driver(tmp_path: Path) -> None:
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    recorder = recorder_at(uri)
    recorder.close()
    clock = FakeClock()
    recorder.retries = OutageRetries(60, clock=clock, sleep=clock.sleep)
    recorder.client = Flaky(recorder.client)  # type: ignore[assignment]
    spec = recorder.spec
    results = [
        TrialResult("adamw", 4, 1e-3, seed, "confirm" if seed else "search", "completed", 3.0 + seed / 100, 4096, 256)
        for seed in range(spec.seeds_min + 1)
    ]
    report = build_report(results, spec=spec)

    first = recorder.write_summary(report, status="succeeded")
    assert clock.slept, "the outage was waited out"
    again = recorder_at(uri).write_summary(report, status="succeeded")  # a relaunched driver writes it again

    client = MlflowClient(uri)
    summaries = layout.runs_of(client, recorder.experiment_id, layout.Role.summary)
    assert [r.info.run_id for r in summaries] == [first] == [again]
    run = client.get_run(first)
    assert run.data.params["optimizers"] == "adamw" and run.data.tags[Tag.status] == "succeeded"
    assert run.info.status == "FINISHED"
    assert {a.path for a in client.list_artifacts(first)} >= {layout.REPORT_FILE, layout.SPEC_FILE}
    (cell,) = layout.runs_of(client, recorder.experiment_id, layout.Role.cell)
    assert cell.data.metrics["val_loss_mean"] == pytest.approx(report.optimizers["adamw"].cells[0].val_loss_mean)
