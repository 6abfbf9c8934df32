"""The real thing: `python -m service` under uvicorn on a loopback port, a real local Ray cluster
(`ray start --head`), real sweep drivers training gpt2-nano. Slow: run under the Ray lock.

Covers the issue's "done when": submit, watch to success (SSE), report; cancel mid-run; restart the
service mid-sweep (PostgreSQL store) and find the sweep still running, then succeeded; 401, 404, 409,
413, 422, 429; idempotent submit.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from harness import PostgresServer, ServiceProcess, tiny_spec
from svc_helpers import BOB, auth, live_client, start_service

pytestmark = pytest.mark.ray

FINAL = ("succeeded", "failed", "cancelled")


def longer_spec(name: str, searched: int = 4) -> dict[str, Any]:
    """A sweep that runs long enough to be interrupted: 2 x `searched` + 1 unpruned search trials of 16k tokens
    and 2 confirmation runs, one at a time, evaluated 4 times each (tiny_spec's 10 would score 2.5x the tokens
    each trial trains)."""
    return tiny_spec(
        name,
        token_budget=16000,
        eval_every_tokens=4096,
        lr={"min": 1e-3, "max": 1e-2, "trials_per_batch_size": searched},
        resources={"max_concurrent_trials": 1},
        pruning={"enabled": False},
    )


@pytest.fixture(scope="module")
def live(ray_head: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceProcess]:
    """One service for the module: alice may run one sweep at a time; bodies up to 16 KiB."""
    svc = start_service(
        ray_head,
        tmp_path_factory.mktemp("live"),
        "service",
        SWEEPS_MAX_CONCURRENT_PER_OWNER="1",
        SWEEPS_MAX_BODY_BYTES="16384",
    )
    yield svc
    svc.stop()


@pytest.fixture
def alice(live: ServiceProcess) -> Iterator[httpx.Client]:
    with live_client(live) as c:
        yield c


def get(client: httpx.Client, sweep_id: str) -> dict[str, Any]:
    resp = client.get(f"/sweeps/{sweep_id}")
    assert resp.status_code == 200, resp.text
    return resp.json()  # type: ignore[no-any-return]


def wait_for(
    client: httpx.Client,
    sweep_id: str,
    predicate: Callable[[dict[str, Any]], bool],
    timeout_s: float,
    svc: ServiceProcess,
) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while True:
        s = get(client, sweep_id)
        if predicate(s):
            return s
        if s["status"] in FINAL or time.monotonic() > deadline:
            raise AssertionError(
                f"sweep {sweep_id} ended or timed out before the condition: {json.dumps(s)[:3000]}\n"
                f"--- service log ---\n{svc.tail()}"
            )
        time.sleep(0.5)


def watch(client: httpx.Client, sweep_id: str, timeout_s: float) -> list[tuple[str, dict[str, Any]]]:
    """Every event of the sweep's SSE stream until `end`."""
    events: list[tuple[str, dict[str, Any]]] = []
    deadline = time.monotonic() + timeout_s
    with client.stream("GET", f"/sweeps/{sweep_id}/events", timeout=httpx.Timeout(10, read=60)) as resp:
        assert resp.status_code == 200
        assert resp.headers["content-type"].startswith("text/event-stream")
        kind, data = None, []
        for line in resp.iter_lines():
            if time.monotonic() > deadline:
                raise AssertionError(f"no end event within {timeout_s} s; last: {events[-1:]}")
            if line.startswith("event:"):
                kind = line.split(":", 1)[1].strip()
            elif line.startswith("data:"):
                data.append(line[5:].strip())
            elif not line and kind:
                events.append((kind, json.loads("\n".join(data))))
                if kind == "end":
                    break
                kind, data = None, []
    return events


# ---- refusals: cheap, no training -----------------------------------------------------------------


def test_live_health_and_refusals(live: ServiceProcess, alice: httpx.Client) -> None:
    health = httpx.get(f"{live.url}/healthz", timeout=30)
    assert health.status_code == 200, health.text
    assert {k: v["ok"] for k, v in health.json()["checks"].items()} == {"store": True, "ray": True, "mlflow": True}

    r = httpx.get(f"{live.url}/sweeps", timeout=30)
    assert r.status_code == 401 and r.json()["error"]["code"] == "unauthorized"
    r = httpx.get(f"{live.url}/sweeps", headers={"Authorization": "Bearer guess"}, timeout=30)
    assert r.status_code == 401

    r = alice.get("/sweeps/no-such-sweep")
    assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"

    big = tiny_spec(optimizers=[{"name": "adamw", "extra": {"pad": "x" * 20000}}])
    r = alice.post("/sweeps", json=big)
    assert r.status_code == 413 and r.json()["error"]["code"] == "payload_too_large"

    r = alice.post("/sweeps", json=tiny_spec(lr={"min": 1e-2, "max": 1e-3}))
    assert r.status_code == 422
    # a bad spec names the field and the value
    detail = r.json()["error"]["details"][0]
    assert (detail["field"], detail["value"]) == ("lr.min", {"min": 1e-2, "max": 1e-3})
    r = alice.post("/sweeps", content=yaml.safe_dump(tiny_spec(seeds=0)), headers={"Content-Type": "application/yaml"})
    assert r.status_code == 422 and r.json()["error"]["details"][0]["field"] == "seeds"

    r = alice.post("/sweeps", params={"dry_run": "true"}, json=tiny_spec())
    # 2 cells x (2 search + 1 confirmation), and one more search trial at the reference, batch size 4
    assert r.status_code == 200 and r.json()["total_trials"] == 7
    assert alice.get("/sweeps").json()["total"] == 0  # a dry run stores nothing


# ---- submit, watch, report ------------------------------------------------------------------------


def test_live_submit_watch_to_success_and_report(live: ServiceProcess, alice: httpx.Client) -> None:
    started = time.monotonic()
    r = alice.post("/sweeps", json=tiny_spec(), headers={"Idempotency-Key": "live-1"})
    assert r.status_code == 201, r.text
    # the answer comes at once: no waiting for Ray, let alone training
    assert time.monotonic() - started < 5
    sweep_id = r.json()["id"]

    again = alice.post("/sweeps", json=tiny_spec(), headers={"Idempotency-Key": "live-1"})
    assert again.status_code == 201 and again.json() == {
        "id": sweep_id,
        "status": again.json()["status"],
        "replayed": True,
    }

    r = alice.get(f"/sweeps/{sweep_id}/report")
    assert r.status_code == 409 and r.json()["error"]["code"] == "not_finished"
    assert alice.get(f"/sweeps/{sweep_id}/dashboard").status_code == 409
    r = alice.post("/sweeps", json=tiny_spec("second"))
    # alice may run one sweep at a time on this service
    assert r.status_code == 429 and r.json()["error"]["code"] == "too_many_sweeps"
    with live_client(live, BOB) as bob:
        assert bob.get(f"/sweeps/{sweep_id}").status_code == 404
        assert bob.post(f"/sweeps/{sweep_id}/cancel").status_code == 404

    events = watch(alice, sweep_id, timeout_s=480)
    kinds = [k for k, _ in events]
    assert kinds[-1] == "end" and "progress" in kinds
    # events come when the sweep changed, not on every poll (a 6-trial sweep changes under two dozen times)
    assert len(events) <= 30, kinds
    final = events[-1][1]
    assert final["status"] == "succeeded", f"{json.dumps(final)[:3000]}\n{live.tail()}"
    # the MLflow experiment is linked while the sweep runs, not only at its end
    running = [s for k, s in events if k == "progress" and s["status"] == "running" and s["progress"]["trials_done"]]
    assert running and all(s["experiment_id"] == final["experiment_id"] for s in running), running
    p = final["progress"]
    # 2 cells x (2 search trials + 1 confirmation run) + the reference's one more search trial
    assert p["trials_done"] == p["trials_total"] == 7 and p["cells_done"] == 2
    assert all(c["search_best_val_loss"] is not None and c["search_best_val_loss"] > 0 for c in p["cells"])
    assert all(c["confirmed_val_loss_mean"] is not None and c["seeds_done"] == 1 for c in p["cells"])
    assert final["started_at"] and final["finished_at"] and final["experiment_id"]

    report = alice.get(f"/sweeps/{sweep_id}/report")
    assert report.status_code == 200
    cells = report.json()["optimizers"]["adamw"]["cells"]
    assert [c["batch_size"] for c in cells] == [4, 8]

    # the driver recorded where the service reads: the MLflow store of its data dir
    from mlflow.tracking import MlflowClient

    mlflow_uri = f"sqlite:///{Path(live.env['SWEEPS_DATA_DIR']).resolve() / 'mlflow.db'}"
    assert MlflowClient(mlflow_uri).get_experiment(final["experiment_id"]).name == sweep_id

    r = alice.post(f"/sweeps/{sweep_id}/cancel")
    assert r.status_code == 409 and r.json()["error"]["code"] == "already_finished"

    # the dashboard: the answer on top, then the figures the driver published before finishing
    page = alice.get(f"/sweeps/{sweep_id}/dashboard")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "largest degradation-free batch size" in page.text.lower()
    assert page.text.count("js-plotly-plot") + page.text.count("Plotly.newPlot") >= 6
    artifacts = MlflowClient(mlflow_uri).list_artifacts(
        MlflowClient(mlflow_uri)
        .search_runs([final["experiment_id"]], "tags.`batchsweep.role` = 'summary'")[0]
        .info.run_id,
        "figures",
    )
    assert {"figures/scaling.png", "figures/dashboard.html"} <= {a.path for a in artifacts}
    with live_client(live, BOB) as bob:
        assert bob.get(f"/sweeps/{sweep_id}/dashboard").status_code == 404


def test_live_cancel_mid_run(live: ServiceProcess, alice: httpx.Client) -> None:
    r = alice.post("/sweeps", json=longer_spec("to-cancel"))
    assert r.status_code == 201, r.text
    sweep_id = r.json()["id"]
    wait_for(alice, sweep_id, lambda s: s["progress"]["trials_done"] >= 1, 300, live)

    r = alice.post(f"/sweeps/{sweep_id}/cancel")
    assert r.status_code == 202 and r.json()["cancel_requested"] is True
    deadline = time.monotonic() + 180
    while (s := get(alice, sweep_id))["status"] not in FINAL:
        assert time.monotonic() < deadline, f"not stopped within 180 s:\n{live.tail()}"
        time.sleep(0.5)
    assert s["status"] == "cancelled", f"{json.dumps(s)[:3000]}\n{live.tail()}"
    # Ray work stopped early; what finished is kept
    assert 1 <= s["progress"]["trials_done"] < s["progress"]["trials_total"]
    report = alice.get(f"/sweeps/{sweep_id}/report")
    assert report.status_code == 200 and "adamw" in report.json()["optimizers"]


# ---- restart mid-sweep, PostgreSQL store -------------------------------------------------------------


def test_live_restart_mid_sweep_keeps_the_sweep(
    service_factory: Callable[..., ServiceProcess], postgres: PostgresServer
) -> None:
    svc = service_factory(SWEEPS_DATABASE_URL=postgres.url)
    with live_client(svc) as client:
        # 7 trials: one finished before the restart, the rest after it
        r = client.post("/sweeps", json=longer_spec("restart", searched=2), headers=auth())
        assert r.status_code == 201, r.text
        sweep_id = r.json()["id"]
        wait_for(client, sweep_id, lambda s: s["status"] == "running" and s["progress"]["trials_done"] >= 1, 300, svc)

    svc.restart()  # SIGTERM, then a new process on the same store and port

    with live_client(svc) as client:
        s = get(client, sweep_id)
        # the new process found the driver again on Ray instead of failing or forgetting the sweep
        assert s["status"] == "running", f"{json.dumps(s)[:2000]}\n{svc.tail()}"
        done_before = s["progress"]["trials_done"]
        final = wait_for(client, sweep_id, lambda s: s["status"] == "succeeded", 480, svc)
        assert final["progress"]["trials_done"] == final["progress"]["trials_total"] > done_before
        assert client.get(f"/sweeps/{sweep_id}/report").status_code == 200


# ---- `sweeps serve` ---------------------------------------------------------------------------------


def listening_addresses(port: int) -> set[str]:
    """Local IPv4 addresses listening on `port`, from /proc/net/tcp (state 0A = LISTEN)."""
    out = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        local, state = line.split()[1], line.split()[3]
        hex_ip, hex_port = local.split(":")
        if state == "0A" and int(hex_port, 16) == port:
            out.add(".".join(str(int(hex_ip[i : i + 2], 16)) for i in (6, 4, 2, 0)))
    return out


def test_a_real_study_runs_through_the_service_to_its_law(live: ServiceProcess, alice: httpx.Client) -> None:
    """Three token budgets, two optimizers, gpt2-nano on the built-in corpus: each scale's sweep trains for real,
    one at a time, smallest first; then the laws (with their intervals, or why there is none) are in the study's
    answer and in MLflow with the figure."""
    sweep = tiny_spec(
        "study-live",
        optimizers=[{"name": "adamw"}, {"name": "merit"}],
        eval_every_tokens=1024,
        eval_tokens=1024,
        lr={"min": 1e-3, "max": 1e-2, "trials_per_batch_size": 1},
    )
    model = sweep.pop("model")
    sweep.pop("token_budget")
    budgets = [2048, 4096, 8192]
    body = sweep | {
        "scales": {"models": [model], "token_budgets": budgets},
        "target": {"model": dict(model), "token_budget": 65536},
    }
    resp = alice.post("/studies", content=yaml.safe_dump(body), headers={"Content-Type": "application/yaml"})
    assert resp.status_code == 201, resp.text
    study_id = resp.json()["id"]
    deadline = time.monotonic() + 420
    while (s := alice.get(f"/studies/{study_id}").json())["status"] == "running":
        # one scale at a time: never a later scale's sweep while an earlier one has not succeeded
        states = [x["status"] for x in s["scales"]]
        first_open = next((i for i, x in enumerate(states) if x != "succeeded"), len(states))
        assert all(x == "pending" for x in states[first_open + 1 :]), states
        assert time.monotonic() < deadline, f"{json.dumps(s)[:2000]}\n{live.tail()}"
        time.sleep(1)
    assert s["status"] == "succeeded", f"{json.dumps(s)[:3000]}\n{live.tail()}"
    runs = [get(alice, x["sweep_id"]) for x in s["scales"]]
    assert [r["spec"]["token_budget"] for r in runs] == budgets and all(r["status"] == "succeeded" for r in runs)
    assert sorted((law["optimizer"], law["against"]) for law in s["laws"]) == [
        ("adamw", "baseline"), ("adamw", "self"), ("merit", "baseline"), ("merit", "self"),
    ]  # fmt: skip
    for law in s["laws"]:
        assert [b["tokens"] for b in law["scales"]] == budgets
        if law["no_law"] is None:  # whatever the law turns out to be: a fit with its interval, or why not
            low, high = law["tokens_interval"]
            assert low <= law["tokens_exponent"] <= high and law["predicted"]["low"] <= law["predicted"]["high"]
        else:
            assert law["tokens_exponent"] is None and law["no_law"]
    from mlflow.tracking import MlflowClient

    from sweeps.layout import Role, Tag, runs_of, study_experiment

    mlflow = MlflowClient(f"sqlite:///{live.env['SWEEPS_DATA_DIR']}/mlflow.db")
    experiment = mlflow.get_experiment_by_name(study_experiment(study_id))
    assert experiment is not None
    nested = runs_of(mlflow, experiment.experiment_id, Role.scale)
    assert sorted(r.data.tags[Tag.sweep_id] for r in nested) == [x["sweep_id"] for x in s["scales"]]
    assert {"figures/law.png", "figures/law.html"} <= {a.path for a in mlflow.list_artifacts(s["run_id"], "figures")}


def test_sweeps_serve_binds_to_loopback_by_default(
    ray_head: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import sys

    from harness import free_port
    from svc_helpers import TOKENS

    monkeypatch.delenv("SWEEPS_HOST", raising=False)  # the subprocess inherits this environment
    port = free_port()
    sweeps_bin = str(Path(sys.executable).parent / "sweeps")
    svc = ServiceProcess(
        env=ray_head.client_env | {"SWEEPS_DATA_DIR": str(tmp_path / "data"), "SWEEPS_TOKENS": TOKENS},
        log_path=tmp_path / "serve.log",
        port=port,
        command=[sweeps_bin, "serve", "--port", str(port)],
    )
    try:
        svc.start()
        assert httpx.get(f"{svc.url}/healthz", timeout=30).status_code == 200
        # no --host and no SWEEPS_HOST: loopback only, never all interfaces
        assert listening_addresses(port) == {"127.0.0.1"}
    finally:
        svc.stop()
