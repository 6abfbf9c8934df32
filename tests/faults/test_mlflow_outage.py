"""The MLflow tracking server goes away for 10 s in the middle of a sweep: nothing recorded is lost.

`sweeps serve` on its own Ray head with MLflow as a tracking server (`mlflow server`, SQLite backend,
served artifacts). The test stops the server (its process group, by pid) once trials are running,
keeps it down for 10 s (trials end meanwhile) and starts it again on the same port. The driver's writes wait and retry
meanwhile (the recorder's own retries, `sweeps.record.OutageRetries`: the MLflow client's are turned
off here, so that an outage longer than they last is what the test shows; the recorder writes from its
own thread, so training goes on): the sweep succeeds, every trial's curve is complete in MLflow, and
the summary run holds the report.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from fault_helpers import AUTH, assert_recorded_once, wait
from harness import MlflowServer, ServiceProcess

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.timeout(900)]

BUDGET, EVERY = 16384, 4096  # 9 trials of 2-4 s, 2 at a time: trials end during the 10 s outage
OUTAGE_S = 10
SPEC = f"""
name: outage
model: {{preset: gpt2-nano, seq_len: 32}}
data: {{source: builtin, vocab_size: 512}}
optimizers: [{{name: adamw}}]
batch_sizes: [4, 8]
token_budget: {BUDGET}
eval_every_tokens: {EVERY}
eval_tokens: 4096
lr: {{min: 1.0e-3, max: 3.0e-2, trials_per_batch_size: 2}}
seeds: 2
degradation: {{tolerance: 0.05, baseline: adamw}}
resources: {{max_concurrent_trials: 2}}
pruning: {{enabled: false}}
"""


def _healthy(url: str) -> bool:
    try:
        return httpx.get(f"{url}/health", timeout=2).status_code == 200
    except httpx.TransportError:
        return False


@pytest.fixture
def mlflow_server(tmp_path: Path) -> Iterator[MlflowServer]:
    root = tmp_path / "mlflow"
    server = MlflowServer(
        backend_uri=f"sqlite:///{root / 'mlflow.db'}", artifacts_uri=str(root / "artifacts"), workdir=root
    ).start()
    try:
        yield server
    finally:
        server.stop()


def test_an_mlflow_outage_mid_sweep_loses_nothing(
    serve: Callable[..., tuple[ServiceProcess, Path]], mlflow_server: MlflowServer
) -> None:
    svc, data_dir = serve(MLFLOW_TRACKING_URI=mlflow_server.url, MLFLOW_HTTP_REQUEST_MAX_RETRIES="0")
    client = httpx.Client(base_url=svc.url, headers=AUTH, timeout=30)
    created = client.post("/sweeps", content=SPEC, headers={"Content-Type": "application/yaml"})
    assert created.status_code == 201, created.text
    sweep_id = created.json()["id"]

    def sweep() -> dict:
        return client.get(f"/sweeps/{sweep_id}").json()

    wait(lambda: sweep()["progress"]["trials_done"] >= 1, 300, "a finished trial")
    mlflow_server.stop()
    down_at = time.monotonic()
    done_at_stop = sweep()["progress"]["trials_done"]
    assert not _healthy(mlflow_server.url)
    time.sleep(OUTAGE_S)
    # the sweep cannot have ended while MLflow was away: its summary run is a write it waits for
    s = sweep()
    assert s["status"] == "running"
    # and trials ended while it was away: their last evaluations and their ends were written after it
    assert s["progress"]["trials_done"] > done_at_stop, (done_at_stop, s["progress"])
    mlflow_server.start()
    final = wait(lambda: (s := sweep())["status"] in ("succeeded", "failed", "cancelled") and s, 600, "the end")
    assert final["status"] == "succeeded", final.get("error")
    assert final["progress"]["trials_done"] > 1, "the outage must have been in the middle of the sweep"
    assert time.monotonic() - down_at > OUTAGE_S

    runs = assert_recorded_once(
        f"sqlite:///{data_dir / 'optuna.db'}", mlflow_server.url, sweep_id, cells=2, search=2, seeds=2
    )
    from mlflow.tracking import MlflowClient

    mlflow = MlflowClient(mlflow_server.url)
    for run in runs:
        steps = sorted({m.step for m in mlflow.get_metric_history(run.info.run_id, "val_loss")})
        # every evaluation of every trial is there, those logged while the server was down too
        assert set(range(EVERY, BUDGET + 1, EVERY)) <= set(steps), (run.info.run_name, steps)
    exp = mlflow.get_experiment_by_name(sweep_id)
    (summary,) = mlflow.search_runs([exp.experiment_id], "tags.`batchsweep.role` = 'summary'")
    path = mlflow.download_artifacts(summary.info.run_id, "report.json", str(data_dir))
    assert json.loads(Path(path).read_text()) == client.get(f"/sweeps/{sweep_id}/report").json()
