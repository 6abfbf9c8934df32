"""The service on a 1-head + 2-worker-node cluster, as a cluster runs it: MLflow as a tracking server
(PostgreSQL backend store, S3 artifact store), Optuna in PostgreSQL, trial storage in S3. The driver
runs on the head, trials on the worker nodes; everything lands in the shared stores and nothing on
the MLflow server's disk; the dashboard renders from them. Also on that cluster: a node-local trial
storage is refused, and a 2-worker DDP trial spans both worker nodes (1 CPU each, so it cannot fit on
one) with the loss curve of the trial on one worker, to float tolerance (DDP sums gradients in another
order)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from harness import (
    AWS_ENV,
    MlflowServer,
    MotoS3,
    MultiNodeRay,
    PostgresServer,
    ServiceProcess,
    assert_ddp_matches_one_worker,
    create_database,
    postgres_server,
    tiny_spec,
    venv_env,
)

from sweeps.layout import Role, Tag

pytestmark = [pytest.mark.ray, pytest.mark.slow]

TOKEN = "cluster-token-0123456789"
SPEC = tiny_spec("on-cluster", token_budget=6144)  # 4 trials of gpt2-nano


@pytest.fixture(scope="module")
def pg() -> Iterator[PostgresServer]:
    with postgres_server() as server:
        yield server


def test_a_sweep_through_the_service_runs_across_the_cluster_into_shared_stores(
    multinode: MultiNodeRay, s3: MotoS3, pg: PostgresServer, tmp_path: Path, token_cache: Path
) -> None:
    optuna_url = create_database(pg.url, "optuna")
    mlflow = MlflowServer(
        backend_uri=create_database(pg.url, "mlflow"),
        artifacts_uri=f"s3://{s3.bucket}/mlflow",
        s3_endpoint=s3.endpoint,
        workdir=tmp_path / "mlflow-server",
    ).start()
    ray_token = (Path.home() / ".ray" / "auth_token").read_text().strip()
    svc = ServiceProcess(
        env={
            **AWS_ENV,
            "RAY_ADDRESS": multinode.address,
            "RAY_AUTH_MODE": "token",
            "RAY_AUTH_TOKEN": ray_token,
            "SWEEPS_TOKENS": f"ops={TOKEN}",
            "SWEEPS_DATA_DIR": str(tmp_path / "service"),
            "MLFLOW_TRACKING_URI": mlflow.url,
            "SWEEPS_OPTUNA_STORAGE": optuna_url,
            "SWEEPS_STORAGE_URI": s3.uri("trials"),
            "BATCHSWEEP_CACHE": str(token_cache),
        },
        log_path=tmp_path / "service.log",
    )
    try:
        svc.start()
        auth = {"Authorization": f"Bearer {TOKEN}"}
        with httpx.Client(base_url=svc.url, headers=auth, timeout=30) as api:
            r = api.post("/sweeps", json=SPEC)
            assert r.status_code == 201, r.text
            sweep_id = r.json()["id"]
            deadline = time.monotonic() + 420
            while (state := api.get(f"/sweeps/{sweep_id}").json())["status"] not in ("succeeded", "failed"):
                assert time.monotonic() < deadline, f"not finished: {state}\n{svc.tail()}"
                time.sleep(1)
            assert state["status"] == "succeeded", f"{state}\n{svc.tail()}"
            page = api.get(f"/sweeps/{sweep_id}/dashboard")
        # the dashboard, drawn from what the tracking server (PostgreSQL + S3) holds
        assert page.status_code == 200 and "largest degradation-free batch size" in page.text.lower()
        assert page.text.count("js-plotly-plot") + page.text.count("Plotly.newPlot") >= 6

        from mlflow.tracking import MlflowClient

        client = MlflowClient(mlflow.url)
        runs = client.search_runs([state["experiment_id"]], max_results=100)
        trials = [r for r in runs if r.data.tags.get(Tag.role) in (Role.search, Role.confirm)]
        assert len(trials) == 7  # 2 cells x (2 search trials + 1 confirmation run) + the reference's one more
        workers = {n.node_id for n in multinode.worker_nodes()}
        # every trial ran on a worker node, and both worker nodes trained
        assert {r.data.tags[Tag.node_id] for r in trials} == workers
        assert all(len(client.get_metric_history(r.info.run_id, "val_loss")) >= 2 for r in trials)
        summary = next(r for r in runs if r.data.tags.get(Tag.role) == Role.summary)
        assert summary.data.tags[Tag.driver_node_id] == multinode.head_id, (workers, multinode.head_id, svc.tail())

        # the report, cells.csv and the figures in S3 (through the server's artifact proxy), none on its disk
        keys = s3.keys("mlflow/")
        names = {k.rsplit("/", 1)[-1] for k in keys}
        assert {"report.json", "cells.csv", "scaling.png", "dashboard.html"} <= names, sorted(names)
        assert sorted(p.name for p in mlflow.workdir.iterdir()) == ["server.log"]
        # the trials' results in S3, their checkpoints deleted once they ended
        trial_keys = s3.keys("trials/")
        assert any(k.endswith("result.json") for k in trial_keys)
        assert not [k for k in trial_keys if "/checkpoint_" in k]
        # Optuna in PostgreSQL: one study per cell, every trial finished
        import optuna

        names = [n for n in optuna.get_all_study_names(optuna_url) if n.startswith(f"{sweep_id}/")]
        assert sorted(names) == [f"{sweep_id}/adamw/bs4", f"{sweep_id}/adamw/bs8"]
        for name in names:
            study = optuna.load_study(study_name=name, storage=optuna_url)
            planned = 4 if name.endswith("/bs4") else 3  # 2 search + 1 seed, + 1 search at the reference
            assert [t.state.name for t in study.trials] == ["COMPLETE"] * planned
    finally:
        svc.stop()
        mlflow.stop()


def test_a_local_path_every_node_sees_is_shared_storage(
    multinode: MultiNodeRay, tmp_path: Path, token_cache: Path
) -> None:
    """No SWEEPS_STORAGE_URI on a 3-node cluster, and a local data dir: every node of this one-machine
    cluster reads the same disk, as the nodes of a cluster do through an NFS, EFS or Lustre mount. The
    service starts (the check asks each node to read a marker back, it does not judge the path by its
    form) and says so; the marker is gone afterwards. A node that cannot see the path is refused by name
    (tests/service/test_service_settings.py: no node can be made blind to a path on one machine)."""
    ray_token = (Path.home() / ".ray" / "auth_token").read_text().strip()
    env = {
        "RAY_ADDRESS": multinode.address,
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN": ray_token,
        "SWEEPS_TOKENS": f"ops={TOKEN}",
        "SWEEPS_DATA_DIR": str(tmp_path / "service"),
        "BATCHSWEEP_CACHE": str(token_cache),
    }
    svc = ServiceProcess(env=env, log_path=tmp_path / "service.log", unset=("SWEEPS_STORAGE_URI",))
    svc.start(timeout_s=120)
    try:
        assert httpx.get(f"{svc.url}/healthz", timeout=30).status_code == 200
        assert "is shared: all 3 nodes read it" in svc.tail()
        results = tmp_path / "service" / "ray_results"
        assert results.is_dir() and not list(results.glob(".batchsweep-shared-*"))
        refused_where_no_node_can_run_the_trials(svc.url)
    finally:
        svc.stop()


def refused_where_no_node_can_run_the_trials(url: str) -> None:
    """Admission against what Ray reports of this cluster (no GPUs, 1 CPU a worker node, the machine's memory
    each, no autoscaler): each spec it cannot run is a 422 naming its field; nothing is stored."""
    auth = {"Authorization": f"Bearer {TOKEN}"}
    cannot = {
        "resources.gpus_per_worker": tiny_spec("gpu", resources={"gpus_per_worker": 1}),
        "resources.cpus_per_worker": tiny_spec("cpus", resources={"cpus_per_worker": 2}),
        "resources.workers_per_trial": tiny_spec("ddp", resources={"workers_per_trial": 4}),
        # ~36 GiB a worker (gpt2-large, micro-batches of 8 x 1024 tokens): more than this machine has
        "model": tiny_spec("large", model={"preset": "gpt2-large", "seq_len": 1024}, token_budget=65_536),
    }
    with httpx.Client(base_url=url, headers=auth, timeout=30) as api:
        for field, spec in cannot.items():
            r = api.post("/sweeps", json=spec)
            assert r.status_code == 422, (field, r.text)
            error = r.json()["error"]
            assert error["code"] == "cluster_cannot_run" and error["details"][0]["field"] == field, error
            assert "node 127.0.0.1: 1 CPUs, 0 GPUs" in error["message"], error["message"]
        assert api.get("/sweeps").json()["total"] == 0
        dry = api.post("/sweeps", params={"dry_run": "true"}, json=tiny_spec()).json()["cluster"]
        assert dry["checked"] and dry["passes"], dry


AUTOSCALER = """
import json, sys
import ray
from ray._raylet import GCS_AUTOSCALER_CLUSTER_CONFIG_KEY, GCS_AUTOSCALER_STATE_NAMESPACE
from ray.core.generated import autoscaler_pb2
from ray.experimental.internal_kv import _internal_kv_put

from sweeps.admission import admission_problems, capacity_from_ray
from sweeps.spec import SweepSpec

ray.init(address=sys.argv[1])
gpu = SweepSpec.model_validate(json.loads(sys.argv[2]))
before = [p["field"] for p in admission_problems(gpu, capacity_from_ray())]
config = autoscaler_pb2.ClusterConfig()
group = config.node_group_configs.add(name="gpu-workers", max_count=2)
group.resources.update({"CPU": 8, "GPU": 1, "memory": 64 * 2**30, "accelerator_type:H100": 1})
_internal_kv_put(GCS_AUTOSCALER_CLUSTER_CONFIG_KEY, config.SerializeToString(), namespace=GCS_AUTOSCALER_STATE_NAMESPACE)
after = admission_problems(gpu, capacity_from_ray())
_internal_kv_put(GCS_AUTOSCALER_CLUSTER_CONFIG_KEY, b"", namespace=GCS_AUTOSCALER_STATE_NAMESPACE)
print(json.dumps({"before": before, "after": after, "nodes": capacity_from_ray().describe()}))
"""


def test_gpus_the_autoscaler_can_add_count_as_the_cluster_s(multinode: MultiNodeRay) -> None:
    """The node groups of the autoscaler's cluster config, as the autoscaler stores them in Ray's GCS (the key
    Ray Train's own resource check reads): a GPU group there admits a GPU spec the live nodes cannot run."""
    spec = json.dumps(tiny_spec("gpu", resources={"gpus_per_worker": 1}))
    done = subprocess.run(
        [sys.executable, "-c", AUTOSCALER, multinode.address, spec],
        env=venv_env({"RAY_ADDRESS": multinode.address}),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["before"] == ["resources.gpus_per_worker"] and out["after"] == [], out


def test_a_ddp_trial_spans_both_worker_nodes_and_matches_one_worker(multinode: MultiNodeRay) -> None:
    script = Path(__file__).with_name("ddp_across_nodes.py")
    done = subprocess.run(
        [sys.executable, str(script), multinode.address],
        env=venv_env({"RAY_ADDRESS": multinode.address}),
        capture_output=True,
        text=True,
        timeout=480,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    workers = {n.node_id for n in multinode.worker_nodes()}
    # the DDP workers' nodes: both worker nodes (and the single-worker run's, one of them), never the head
    assert set(out["worker_nodes"]) == workers and multinode.head_id not in out["worker_nodes"]
    assert out["statuses"] == ["completed", "completed"]
    assert_ddp_matches_one_worker(out["single"], out["ddp"], out["ddp_final"])
