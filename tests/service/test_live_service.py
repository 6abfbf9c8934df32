"""The real thing: `python -m service` under uvicorn on a loopback port, a real local Ray cluster
(`ray start --head`), real sweep drivers training gpt2-nano. Slow: run under the Ray lock.

Covers: a study of three scales, its first scale's sweep watched to success (SSE), its report and dashboard,
then the study's law; cancel mid-run; restart the service mid-sweep (PostgreSQL store) and find the sweep
still running, then succeeded; 401, 404, 409, 413, 422, 429. (Idempotent submits: tests/service/test_http_api.py.)
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


# ---- a study, and its first scale's sweep followed as any sweep: submit, watch, report ----------------


def test_a_real_study_runs_through_the_service_to_its_law(live: ServiceProcess, alice: httpx.Client) -> None:
    """Three token budgets, two optimizers, gpt2-nano on the built-in corpus: each scale's sweep trains for real,
    one at a time, smallest first. The first scale's sweep is followed as any sweep is: its events to the end, its
    report, its dashboard, its runs in the service's MLflow store. Then the laws (with their intervals, or why
    there is none) are in the study's answer and in MLflow with the figure."""
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
    started = time.monotonic()
    resp = alice.post("/studies", content=yaml.safe_dump(body), headers={"Content-Type": "application/yaml"})
    assert resp.status_code == 201, resp.text
    assert time.monotonic() - started < 5  # the answer comes at once: no waiting for Ray, let alone training
    study_id = resp.json()["id"]
    first = f"{study_id}-s1"
    deadline = time.monotonic() + 30
    while alice.get(f"/sweeps/{first}").status_code == 404:  # made by the supervisor's next pass
        assert time.monotonic() < deadline, live.tail()
        time.sleep(0.2)

    # the study's sweep is alice's one sweep at a time on this service; nobody else sees it
    r = alice.post("/sweeps", json=tiny_spec("second"))
    assert r.status_code == 429 and r.json()["error"]["code"] == "too_many_sweeps"
    r = alice.get(f"/sweeps/{first}/report")
    assert r.status_code == 409 and r.json()["error"]["code"] == "not_finished"
    assert alice.get(f"/sweeps/{first}/dashboard").status_code == 409
    with live_client(live, BOB) as bob:
        assert bob.get(f"/sweeps/{first}").status_code == 404
        assert bob.post(f"/sweeps/{first}/cancel").status_code == 404
        assert bob.get(f"/studies/{study_id}").status_code == 404

    events = watch(alice, first, timeout_s=480)
    kinds = [k for k, _ in events]
    assert kinds[-1] == "end" and "progress" in kinds
    # events come when the sweep changed, not on every poll: under 4 a trial
    final = events[-1][1]
    assert final["status"] == "succeeded", f"{json.dumps(final)[:3000]}\n{live.tail()}"
    p = final["progress"]
    # 2 optimizers x 2 sizes x (1 search trial + 1 confirmation run), and each reference's one more search trial
    assert p["trials_done"] == p["trials_total"] == 10 and p["cells_done"] == 4
    assert len(events) <= 4 * p["trials_total"], kinds
    # the MLflow experiment is linked while the sweep runs, not only at its end
    running = [s for k, s in events if k == "progress" and s["status"] == "running" and s["progress"]["trials_done"]]
    assert running and all(s["experiment_id"] == final["experiment_id"] for s in running), running
    assert all(c["search_best_val_loss"] is not None and c["search_best_val_loss"] > 0 for c in p["cells"])
    assert all(c["confirmed_val_loss_mean"] is not None and c["seeds_done"] == 1 for c in p["cells"])
    assert final["started_at"] and final["finished_at"] and final["experiment_id"]
    report = alice.get(f"/sweeps/{first}/report")
    assert report.status_code == 200
    assert {o: [c["batch_size"] for c in x["cells"]] for o, x in report.json()["optimizers"].items()} == {
        "adamw": [4, 8], "merit": [4, 8],
    }  # fmt: skip
    # the driver recorded where the service reads: the MLflow store of its data dir
    from mlflow.tracking import MlflowClient

    mlflow = MlflowClient(f"sqlite:///{Path(live.env['SWEEPS_DATA_DIR']).resolve() / 'mlflow.db'}")
    assert mlflow.get_experiment(final["experiment_id"]).name == first
    r = alice.post(f"/sweeps/{first}/cancel")
    assert r.status_code == 409 and r.json()["error"]["code"] == "already_finished"
    # the dashboard: the answer on top, then the figures the driver published before finishing
    page = alice.get(f"/sweeps/{first}/dashboard")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "largest degradation-free batch size" in page.text.lower()
    assert page.text.count("js-plotly-plot") + page.text.count("Plotly.newPlot") >= 6
    summary = mlflow.search_runs([final["experiment_id"]], "tags.`batchsweep.role` = 'summary'")[0]
    artifacts = {a.path for a in mlflow.list_artifacts(summary.info.run_id, "figures")}
    assert {"figures/scaling.png", "figures/dashboard.html"} <= artifacts
    with live_client(live, BOB) as bob:
        assert bob.get(f"/sweeps/{first}/dashboard").status_code == 404

    # the study goes on with the next scales, one at a time, to its law
    deadline = time.monotonic() + 420
    while (s := alice.get(f"/studies/{study_id}").json())["status"] == "running":
        # never a later scale's sweep while an earlier one has not succeeded
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
    from sweeps.layout import Role, Tag, runs_of, study_experiment

    experiment = mlflow.get_experiment_by_name(study_experiment(study_id))
    assert experiment is not None
    nested = runs_of(mlflow, experiment.experiment_id, Role.scale)
    assert sorted(r.data.tags[Tag.sweep_id] for r in nested) == [x["sweep_id"] for x in s["scales"]]
    assert {"figures/law.png", "figures/law.html"} <= {a.path for a in mlflow.list_artifacts(s["run_id"], "figures")}
    law_page = alice.get(f"/studies/{study_id}/law")  # its page: the same laws drawn
    assert law_page.status_code == 200 and f"study {study_id}" in law_page.text


# ---- cancel mid-run ---------------------------------------------------------------------------------


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
