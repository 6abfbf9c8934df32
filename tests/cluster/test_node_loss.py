"""A sweep on a 1-head + 2-worker-node cluster with its trial storage in S3 loses the node of a running
trial (kill -9 of its raylet and workers): the trial resumes from its last checkpoint on the other
node, ends with the val loss of an unbroken run, and is recorded once; a new node is used again.

The driver is `sweeps run` (the command line, its own process) on the cluster; MLflow and Optuna are
SQLite stores in the sweep's data dir (the multi-node service test uses servers)."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from harness import AWS_ENV, MotoS3, MultiNodeRay, venv_env

from sweeps.layout import Role, Tag
from sweeps.spec import SweepSpec

pytestmark = [pytest.mark.ray, pytest.mark.slow]

SPEC = """
name: node-loss
model: {preset: gpt2-nano, seq_len: 64}
optimizers: [{name: adamw}]
batch_sizes: [8]
token_budget: 32768          # 64 steps at batch 8: seconds of training, long enough to lose a node in
lr: {min: 1.0e-3, max: 1.0e-2, trials_per_batch_size: 1}
seeds: 1
degradation: {tolerance: 0.02, baseline: adamw}
resources: {workers_per_trial: 1, cpus_per_worker: 1, max_concurrent_trials: 1, max_micro_batch: 8}
eval_every_tokens: 4096      # an evaluation and a checkpoint every 8 steps
checkpoint_min_interval_s: 0 # (the default, 300 s, would write none in a trial of seconds)
eval_tokens: 1024            # a quarter of what it trains between evaluations
"""

SECOND = """
name: after-node-loss
model: {preset: gpt2-nano, seq_len: 64}
optimizers: [{name: adamw}]
batch_sizes: [8]             # 3 search trials and a confirmation run, 2 at a time: one on each worker node
token_budget: 16384
lr: {min: 1.0e-3, max: 1.0e-2, trials_per_batch_size: 2}
seeds: 1
degradation: {tolerance: 0.02, baseline: adamw}
resources: {workers_per_trial: 1, cpus_per_worker: 1, max_concurrent_trials: 2, max_micro_batch: 8}
eval_every_tokens: 4096
eval_tokens: 1024
"""


def sweep_command(spec: Path, sweep_id: str, report: Path) -> list[str]:
    return [str(Path(sys.executable).parent / "sweeps"), "run", str(spec), "--id", sweep_id, "--report", str(report)]


def mlflow_rows(db: Path, sql: str, *args: object) -> list[tuple]:
    try:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5) as conn:
            return conn.execute(sql, args).fetchall()
    except sqlite3.OperationalError:  # not created yet, or busy
        return []


def running_search_trial(db: Path) -> tuple[str, str, int] | None:
    """(run id, node id, evaluations so far) of the search trial, once it has reported from a node."""
    rows = mlflow_rows(
        db,
        "SELECT r.run_uuid, n.value, (SELECT COUNT(*) FROM metrics m WHERE m.run_uuid = r.run_uuid AND m.key = 'val_loss') "
        "FROM runs r JOIN tags t ON t.run_uuid = r.run_uuid AND t.key = ? AND t.value = ? "
        "JOIN tags n ON n.run_uuid = r.run_uuid AND n.key = ?",
        Tag.role.value,
        Role.search.value,
        Tag.node_id.value,
    )
    return rows[0] if rows else None


def test_a_trial_survives_losing_its_node_and_a_new_node_is_used(
    multinode: MultiNodeRay, s3: MotoS3, tmp_path: Path
) -> None:
    spec_path = tmp_path / "spec.yaml"
    spec_path.write_text(SPEC)
    data = tmp_path / "data"
    env = venv_env(
        {
            **AWS_ENV,
            "RAY_ADDRESS": multinode.address,
            "SWEEPS_DATA_DIR": str(data),
            "SWEEPS_STORAGE_URI": s3.uri("node-loss"),
        }
    )
    env.pop("MLFLOW_TRACKING_URI", None)
    env.pop("SWEEPS_OPTUNA_STORAGE", None)
    log = open(tmp_path / "driver.log", "wb")  # noqa: SIM115 (closed below)
    driver = subprocess.Popen(
        sweep_command(spec_path, "node-loss", tmp_path / "report.json"), env=env, stdout=log, stderr=subprocess.STDOUT
    )
    killed: dict[str, object] = {}
    try:
        # the search trial has reported 3 evaluations (3 checkpoints) from a worker node: kill that node,
        # then a new node joins (from this, the main thread: Ray nodes die with the thread that started them)
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and driver.poll() is None and not killed:
            trial = running_search_trial(data / "mlflow.db")
            if trial is not None and trial[2] >= 3:
                killed["node"], killed["evals"] = trial[1], trial[2]
                killed["pids"] = multinode.kill_node(trial[1])
                killed["new"] = multinode.add_node().node_id
            time.sleep(0.2)
        rc = driver.wait(timeout=420)
    finally:
        if driver.poll() is None:
            driver.kill()
        log.close()
    out = (tmp_path / "driver.log").read_text(errors="replace")
    assert rc == 0, out[-4000:]
    assert killed.get("node"), f"the trial never reported from a node; driver log:\n{out[-3000:]}"
    worker_ids = {n.node_id for n in multinode.worker_nodes()} | {killed["node"]}
    assert killed["node"] != multinode.head_id and killed["node"] in worker_ids

    # MLflow: one run per trial (the two search trials of the reference size, 1 + its one more, and the
    # confirmation run); the first search trial was restarted once, on the other node, and its curve goes
    # on from its checkpoint (no token count twice)
    db = data / "mlflow.db"
    runs = mlflow_rows(
        db,
        "SELECT r.run_uuid, t.value FROM runs r JOIN tags t ON t.run_uuid = r.run_uuid AND t.key = ?",
        Tag.role.value,
    )
    trial_runs = [r for r in runs if r[1] in (Role.search, Role.confirm)]
    assert sorted(r[1] for r in trial_runs) == ["confirm", "search", "search"], runs
    tags_of = {r[0]: dict(mlflow_rows(db, "SELECT key, value FROM tags WHERE run_uuid = ?", r[0])) for r in trial_runs}
    (search_run,) = [run for run, t in tags_of.items() if t.get(Tag.restarts, "0") != "0"]  # the one restarted
    tags = tags_of[search_run]
    assert tags[Tag.restarts] == "1" and tags[Tag.status] == "completed"
    nodes = tags[Tag.node_ids].split(",")
    assert nodes[0] == killed["node"] and len(nodes) == 2 and nodes[1] != killed["node"]
    assert multinode.head_id not in nodes  # trials run on the nodes with the trial resource only
    steps = [
        s
        for (s,) in mlflow_rows(
            db, "SELECT step FROM metrics WHERE run_uuid = ? AND key = 'val_loss' ORDER BY timestamp, step", search_run
        )
    ]
    assert steps == sorted(set(steps)), steps  # resumed at its checkpoint: no evaluation repeated
    assert steps[-1] == 32768 and len(steps) == 32768 // 4096

    # Optuna: the trial once, completed, with the final loss of an unbroken run of the same seed and lr
    from optuna.trial import TrialState

    from sweeps.search import CellSearcher
    from sweeps.stores import open_storage
    from worker.loop import train
    from worker.session import LocalSession

    spec = SweepSpec.from_yaml(SPEC)
    searcher = CellSearcher(spec, "node-loss", open_storage(f"sqlite:///{data / 'optuna.db'}"))
    trials = searcher.cells[0].study.get_trials(deepcopy=False)
    assert [(t.user_attrs["role"], t.state) for t in trials] == [
        ("search", TrialState.COMPLETE),
        ("search", TrialState.COMPLETE),
        ("confirm", TrialState.COMPLETE),
    ]
    search = trials[0]  # the first, the one that lost its node (one trial at a time)
    assert tags[Tag.optuna_number] == str(search.number)
    unbroken = train(spec.train_config("adamw", 8, search.params["lr"], 0), LocalSession())
    assert search.value == pytest.approx(unbroken["val_loss"], abs=1e-6)
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["optimizers"]["adamw"]["cells"][0]["trial_status"]["completed"] == 3

    # S3 held the trial results and checkpoints; a finished trial's checkpoints are deleted
    keys = s3.keys("node-loss/")
    assert any(k.endswith("result.json") for k in keys), keys[:20]
    assert not [k for k in keys if "/checkpoint_" in k], [k for k in keys if "/checkpoint_" in k][:10]

    # a second sweep with two trials at a time runs on the surviving node and on the new one
    second = tmp_path / "second.yaml"
    second.write_text(SECOND)
    done = subprocess.run(
        sweep_command(second, "after-node-loss", tmp_path / "second.json"),
        env=env | {"SWEEPS_STORAGE_URI": s3.uri("after-node-loss")},
        capture_output=True,
        text=True,
        timeout=420,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    used = {
        v
        for (v,) in mlflow_rows(
            db,
            "SELECT t.value FROM tags t JOIN runs r ON r.run_uuid = t.run_uuid "
            "JOIN experiments e ON e.experiment_id = r.experiment_id WHERE t.key = ? AND e.name = ?",
            Tag.node_id.value,
            "after-node-loss",
        )
    }
    assert killed["new"] in used and killed["node"] not in used, (used, killed)
