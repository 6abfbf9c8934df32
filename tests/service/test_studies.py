"""A study over HTTP (in-process app, drivers faked, no Ray; each scale's sweep "trained" by `sweeps.simulate`
against a model whose critical batch size doubles with every 4x of tokens, so its report is a real one):
`POST /studies` stores it, the supervisor runs its scales' sweeps one at a time, smallest first, each only
after the one before succeeded, then fits the law, with `confirm: true` runs the confirmation sweep at the
target that the law implies and judges the law by it, and records it in MLflow with its figure; a cancel
cancels the sweep running (a scale's or the confirmation's) and starts no other; a failed scale fails the
study naming it; a restarted service goes on where the last one stopped; another owner sees nothing; what is
not a study, or is over a cap (its confirmation priced at the most it can cost), is refused whole, naming
why."""

from __future__ import annotations

import json
import math
import re
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from harness import tiny_spec
from httpx_sse import ServerSentEvent, connect_sse
from svc_helpers import ALICE, BOB, FakeLauncher, auth, wait_until

from sweeps.simulate import Run, simulate
from sweeps.spec import SweepSpec

BUDGETS = (8192, 32768, 131072)  # B* = 8 sqrt(tokens / 8192): 8, 16, 32
CONFIRMED_AT = 196_608  # a target of B* 39, which the law of law=True's brackets predicts inside 4..64


def study(
    name: str = "lawful",
    budgets: tuple[int, ...] = BUDGETS,
    *,
    law: bool = False,
    target_tokens: int = 2_097_152,
    **overrides: Any,
) -> dict[str, Any]:
    """`law`: sizes and seeds enough to bracket B* at every budget (its simulation costs ~1 s a scale); else the
    smallest study whose scales still have reports."""
    sizes, seeds = ([4, 8, 16, 32, 64], 4) if law else ([4, 8], 2)
    sweep = tiny_spec(
        name,
        batch_sizes=sizes,
        eval_every_tokens=None,
        lr={"min": 1e-4, "max": 3e-2, "trials_per_batch_size": 3},
        seeds=seeds,
        degradation={"tolerance": 0.01, "baseline": "adamw"},
    )
    model = sweep.pop("model")
    sweep.pop("token_budget")
    return sweep | {
        "scales": {"models": [model], "token_budgets": list(budgets)},
        "target": {"model": dict(model), "token_budget": target_tokens},
    } | overrides  # fmt: skip


def trained(client: TestClient, launcher: FakeLauncher, sweep_id: str) -> None:
    """The sweep `sweep_id` (as the service stored it) run by the simulation, its report handed to its driver."""
    spec = SweepSpec.from_mapping(client.get(f"/sweeps/{sweep_id}", headers=auth()).json()["spec"])
    critical = 8 * math.sqrt(spec.trained_tokens / 8192)

    def objective(run: Run) -> list[float]:
        u = math.log(run.lr / 3e-3)
        final = 3.0 + 0.02 * u * u + 0.1 * max(0.0, math.log(run.batch_size / critical)) + 0.002 * run.seed
        return [final * (1 + 0.2 * (1 - t / run.eval_tokens[-1])) for t in run.eval_tokens]

    launcher.finish(sweep_id, report=simulate(spec, objective).report.model_dump(mode="json"))


def watch_events(client: TestClient, study_id: str, events: list[ServerSentEvent]) -> None:
    """The study's event stream to its end, as the CLI's parser reads it (named events only)."""
    with connect_sse(client, "GET", f"/studies/{study_id}/events", headers=auth()) as source:
        assert source.response.status_code == 200
        events.extend(e for e in source.iter_sse() if e.event in ("progress", "end"))


def home_row(client: TestClient, study_id: str) -> str:
    """The study's row in the signed-in home page's list of studies (the client signed in as alice)."""
    signed = client.post("/login", data={"token": ALICE}, follow_redirects=False)
    assert signed.status_code == 303, signed.text
    page = client.get("/", headers={"Accept": "text/html"})
    assert page.status_code == 200 and 'id="studies"' in page.text, page.text[:500]
    found = re.search(rf'<tr data-study="{re.escape(study_id)}".*?</tr>', page.text, re.S)
    assert found is not None, page.text
    return found.group(0)


def status_of(client: TestClient, study_id: str) -> dict[str, Any]:
    resp = client.get(f"/studies/{study_id}", headers=auth())
    assert resp.status_code == 200, resp.text
    return resp.json()  # type: ignore[no-any-return]


def started(launcher: FakeLauncher, sweep_id: str) -> bool:
    return sweep_id in launcher.started


def test_a_study_runs_its_scales_one_at_a_time_smallest_first_then_confirms_and_records_its_law(
    client: TestClient, launcher: FakeLauncher, mlflow_uri: str, tmp_path: Path
) -> None:
    from sweeps.law import OptimizerLaw
    from sweeps.study import StudySpec, confirm_spec

    submitted = study(law=True, confirm=True, target_tokens=CONFIRMED_AT)
    resp = client.post("/studies", json=submitted, headers=auth())
    assert resp.status_code == 201, resp.text
    body = resp.json()
    study_id = body["id"]
    assert resp.headers["Location"] == f"/studies/{study_id}" and body["status"] == "running"
    assert [s["trained_tokens"] for s in body["scales"]] == list(BUDGETS)
    ids = [f"{study_id}-s{i}" for i in (1, 2, 3)]
    assert [s["sweep_id"] for s in body["scales"]] == ids
    confirming = f"{study_id}-s4"  # the study's sweep after its scales
    assert body["confirmation"] == {"sweep_id": confirming, "status": "pending", "note": None, "laws": None}
    # its event stream, watched from the start to its end
    assert client.get(f"/studies/{study_id}/events", headers=auth(BOB)).status_code == 404
    events: list[ServerSentEvent] = []
    watcher = threading.Thread(target=watch_events, args=(client, study_id, events), daemon=True)
    watcher.start()
    for i, sweep_id in enumerate(ids):
        wait_until(lambda sweep_id=sweep_id: started(launcher, sweep_id), 10, what=f"{sweep_id} started")
        # running in the store before it ends: its stream has that state to show (a sweep that ends before the
        # supervisor's next poll goes from queued to succeeded)
        wait_until(lambda i=i: status_of(client, study_id)["scales"][i]["status"] == "running", 10, what="running")
        # one at a time: the next scale's sweep does not exist before this one succeeded
        assert launcher.started.count(sweep_id) == 1 and all(not started(launcher, later) for later in ids[i + 1 :])
        got = status_of(client, study_id)
        assert [s["status"] for s in got["scales"]][i + 1 :] == ["pending"] * (2 - i) and got["laws"] is None
        assert client.get(f"/studies/{study_id}/law", headers=auth()).status_code == 409  # no law yet
        assert client.get(f"/sweeps/{sweep_id}", headers=auth()).json()["spec"]["token_budget"] == BUDGETS[i]
        trained(client, launcher, sweep_id)
    # the laws first, then the confirmation sweep they imply at the target: the reference and the sizes on each
    # side of the baseline law's prediction, on the target's trained tokens
    wait_until(lambda: started(launcher, confirming), 30, what="the confirmation sweep started")
    got = status_of(client, study_id)
    assert got["status"] == "running" and got["laws"] is not None and got["confirmation"]["laws"] is None
    assert got["confirmation"]["status"] in ("queued", "running")
    plan = StudySpec.model_validate(submitted)
    laws = [OptimizerLaw.model_validate(law) for law in got["laws"] if law["against"] == "baseline"]
    want = confirm_spec(plan, laws)
    assert not isinstance(want, str) and want.batch_sizes == [4, 32, 64]
    spec = client.get(f"/sweeps/{confirming}", headers=auth()).json()["spec"]
    assert spec["batch_sizes"] == want.batch_sizes and spec["token_budget"] == plan.target_spec().trained_tokens
    assert launcher.started.count(confirming) == 1
    # the law's page while the confirmation runs: the laws drawn, the confirmation pending, no bracket of it
    page = client.get(f"/studies/{study_id}/law", headers=auth())
    assert page.status_code == 200 and f"confirmation at the target: pending (sweep {confirming})" in page.text
    assert "adamw against adamw: confirmation pending" in page.text and "confirmation (held)" not in page.text
    trained(client, launcher, confirming)
    final = wait_until(lambda: (s := status_of(client, study_id))["status"] != "running" and s, 60, what="the law")
    assert final["status"] == "succeeded", final
    assert [s["status"] for s in final["scales"]] == ["succeeded"] * 3
    # the confirmation judged both laws (B* 39 at the target, predicted 55): held, in the sweep's bracket
    confirmation = final["confirmation"]
    assert confirmation["status"] == "succeeded" and confirmation["note"] is None
    judged = {(c["optimizer"], c["against"]): c for c in confirmation["laws"]}
    assert sorted(judged) == [("adamw", "baseline"), ("adamw", "self")]
    for c in judged.values():
        assert c["outcome"] == "held" and c["tested"] == [4, 32, 64] and c["miss"] == 1.0
        assert (c["largest_fine"], c["smallest_degraded"]) == (32, 64) and c["says"].startswith("held: B* in [32, 64)")
        assert 32 < c["predicted"]["value"] < 64 and c["lr_at"] in (32, 64) and c["lr_found"] is not None
    watcher.join(timeout=30)
    assert not watcher.is_alive(), "the study's stream did not end"
    # a progress event each time a scale's status moved, then one end, with the law
    assert [e.event for e in events[:-1]] == ["progress"] * (len(events) - 1) and events[-1].event == "end"
    assert events[-1].json()["status"] == "succeeded" and events[-1].json()["laws"] == final["laws"]
    assert events[-1].json()["confirmation"] == confirmation
    steps = [tuple(int(part) for part in e.id.split(".")) for e in events]
    assert steps == sorted(set(steps))  # each event's id grows: it speaks only when something moved
    seen = [[scale["status"] for scale in e.json()["scales"]] for e in events]
    assert ["running", "pending", "pending"] in seen or ["queued", "pending", "pending"] in seen
    assert any(states[:2] == ["succeeded", "running"] for states in seen)
    # the home page links each scale's sweep and the law
    row = home_row(client, study_id)
    assert all(f'href="/sweeps/{sweep_id}/dashboard"' in row for sweep_id in ids) and "pending" not in row
    assert f'href="/studies/{study_id}/law"' in row
    assert f'href="/sweeps/{confirming}/dashboard" data-scale="confirmation"' in row
    assert "adamw against baseline: held" in row and "adamw against self: held" in row
    # the law from the three brackets, against the baseline and against each optimizer itself
    laws = {(law["optimizer"], law["against"]): law for law in final["laws"]}
    assert sorted(laws) == [("adamw", "baseline"), ("adamw", "self")]
    law = laws[("adamw", "baseline")]
    assert [(b["largest_fine"], b["smallest_degraded"]) for b in law["scales"]] == [(8, 16), (16, 32), (32, 64)]
    assert law["tokens_exponent"] == pytest.approx(0.5, abs=0.15) and law["predicted"]["value"] > 32
    # recorded in MLflow: the study's run, its three sweeps nested under it, law.json and the figure
    from mlflow.tracking import MlflowClient

    from sweeps.layout import LAW_FILE, Role, Tag, runs_of, study_experiment

    mlflow = MlflowClient(mlflow_uri)
    experiment = mlflow.get_experiment_by_name(study_experiment(study_id))
    assert experiment is not None
    (parent,) = runs_of(mlflow, experiment.experiment_id, Role.study)
    assert parent.info.run_id == final["run_id"]
    assert sorted(r.data.tags[Tag.sweep_id] for r in runs_of(mlflow, experiment.experiment_id, Role.scale)) == ids
    recorded = json.loads(Path(mlflow.download_artifacts(final["run_id"], LAW_FILE, str(tmp_path))).read_text())
    assert recorded["laws"] == final["laws"]
    assert [(c["optimizer"], c["against"], c["held"]) for c in recorded["confirmations"]] == [
        (c["optimizer"], c["against"], True) for c in confirmation["laws"]
    ]
    assert mlflow.get_run(final["run_id"]).data.metrics["adamw.baseline.confirmation_held"] == 1.0
    figures = {a.path for a in mlflow.list_artifacts(final["run_id"], "figures")}
    assert {"figures/law.png", "figures/law.html"} <= figures
    # the figure there draws the confirmation and says its outcome
    drawn = Path(mlflow.download_artifacts(final["run_id"], "figures/law.html", str(tmp_path))).read_text()
    data = json.loads(Path(mlflow.download_artifacts(final["run_id"], "figures/law.json", str(tmp_path))).read_text())
    assert "adamw against adamw: held — held: B* in [32, 64)" in drawn and "confirmation (held)" in drawn
    assert [x["confirmation"]["held"] for x in data] == [True, True]
    # its page: the figure from the laws it stored, plotly.js from the service, under the pages' policy; the
    # confirmation's bracket and outcome drawn now that it succeeded
    from service.web.pages import PLOTLYJS_URL

    page = client.get(f"/studies/{study_id}/law", headers=auth())
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert f'src="{PLOTLYJS_URL}"' in page.text and "adamw against adamw: confirmation held" in page.text
    assert "confirmation at the target: done" in page.text and "adamw against adamw: held — held" in page.text
    assert "script-src" in page.headers["Content-Security-Policy"]
    # the owner's list has it; nothing more is started
    listed = client.get("/studies", headers=auth()).json()
    assert listed["total"] >= 1 and study_id in [s["id"] for s in listed["items"]]
    assert sorted(x for x in launcher.started if x.startswith(study_id)) == [*ids, confirming]


def test_a_cancel_stops_the_sweep_running_and_starts_no_other(client: TestClient, launcher: FakeLauncher) -> None:
    study_id = client.post("/studies", json=study("stopped"), headers=auth()).json()["id"]
    first = f"{study_id}-s1"
    wait_until(lambda: started(launcher, first), 10, what="the first scale started")
    resp = client.post(f"/studies/{study_id}/cancel", headers=auth())
    assert resp.status_code == 202 and resp.json()["cancel_requested"] is True
    assert first in launcher.cancelled  # told to its driver, as a cancel of the sweep itself
    launcher.finish(first, status="cancelled", report=None)
    final = wait_until(lambda: (s := status_of(client, study_id))["status"] != "running" and s, 10, what="the end")
    assert final["status"] == "cancelled" and first in final["error"]
    assert [s["status"] for s in final["scales"]] == ["cancelled", "pending", "pending"]
    assert not any(x.startswith(f"{study_id}-s2") for x in launcher.started)
    again = client.post(f"/studies/{study_id}/cancel", headers=auth())
    assert again.status_code == 409 and "already cancelled" in again.json()["error"]["message"]
    # the home page lists it: its scales, the first linked to its sweep, the others pending, no law
    row = home_row(client, study_id)
    assert 'class="status cancelled"' in row and f'href="/sweeps/{first}/dashboard"' in row
    assert row.count(": pending</span>") == 2 and "/law" not in row and "when every scale succeeded" in row


def test_a_cancel_during_the_confirmation_cancels_its_sweep_on_a_restarted_service(
    app_client: Callable[..., TestClient], launcher: FakeLauncher
) -> None:
    first_service = app_client()
    submitted = study("doubted", law=True, confirm=True, target_tokens=CONFIRMED_AT)
    study_id = first_service.post("/studies", json=submitted, headers=auth()).json()["id"]
    for i in (1, 2, 3):
        wait_until(lambda i=i: started(launcher, f"{study_id}-s{i}"), 10, what=f"scale {i} started")
        trained(first_service, launcher, f"{study_id}-s{i}")
    confirming = f"{study_id}-s4"
    wait_until(lambda: started(launcher, confirming), 30, what="the confirmation sweep started")
    first_service.__exit__(None, None, None)  # the service stops; the confirmation's driver runs on
    client = app_client()  # a second service over the same store finds the study's sweep running
    got = status_of(client, study_id)
    assert got["status"] == "running" and got["confirmation"]["status"] in ("queued", "running")
    resp = client.post(f"/studies/{study_id}/cancel", headers=auth())
    assert resp.status_code == 202 and resp.json()["cancel_requested"] is True
    assert confirming in launcher.cancelled  # told to its driver, as a cancel of the sweep itself
    launcher.finish(confirming, status="cancelled", report=None)
    final = wait_until(lambda: (s := status_of(client, study_id))["status"] != "running" and s, 10, what="the end")
    assert final["status"] == "cancelled" and f"the confirmation's sweep {confirming} ended cancelled" in final["error"]
    assert final["confirmation"]["status"] == "cancelled" and final["confirmation"]["laws"] is None
    assert final["laws"] is not None  # fitted before its confirmation, kept
    assert [x for x in launcher.started if x.startswith(study_id)] == [f"{study_id}-s{i}" for i in (1, 2, 3, 4)]


def test_a_study_whose_laws_predict_no_size_it_could_test_ends_without_its_confirmation(
    client: TestClient, launcher: FakeLauncher
) -> None:
    # sizes 4 and 8 decide no bracket from below (B* 8, 16, 32): no law, no prediction, nothing to confirm
    plain = client.post("/studies", json=study("plain"), headers=auth()).json()
    doubted = client.post("/studies", json=study("doubted", confirm=True), headers=auth()).json()
    assert plain["confirmation"] is None and doubted["confirmation"]["status"] == "pending"
    assert doubted["gpu_hours"] > plain["gpu_hours"]  # its confirmation priced at the most it can cost
    for i in (1, 2, 3):
        for study_id in (plain["id"], doubted["id"]):
            wait_until(lambda i=i, s=study_id: started(launcher, f"{s}-s{i}"), 10, what=f"{study_id}'s scale {i}")
            trained(client, launcher, f"{study_id}-s{i}")
    for study_id in (plain["id"], doubted["id"]):
        final = wait_until(lambda s=study_id: (x := status_of(client, s))["status"] != "running" and x, 60, what="end")
        assert final["status"] == "succeeded" and all(law["predicted"] is None for law in final["laws"])
    final = status_of(client, doubted["id"])
    assert final["confirmation"]["status"] == "not_run" and final["confirmation"]["laws"] is None
    assert final["confirmation"]["note"].startswith("no law predicts a B* inside 4..8")
    assert status_of(client, plain["id"])["confirmation"] is None
    assert not started(launcher, f"{doubted['id']}-s4")
    assert "confirmation at the target: not run" in home_row(client, doubted["id"])
    page = client.get(f"/studies/{doubted['id']}/law", headers=auth()).text
    assert "confirmation at the target: not run: no law predicts a B* inside 4..8" in page
    assert "confirmation at the target" not in client.get(f"/studies/{plain['id']}/law", headers=auth()).text


def test_a_failed_scale_fails_the_study_naming_its_sweep(client: TestClient, launcher: FakeLauncher) -> None:
    study_id = client.post("/studies", json=study("broken"), headers=auth()).json()["id"]
    first = f"{study_id}-s1"
    wait_until(lambda: started(launcher, first), 10, what="the first scale started")
    trained(client, launcher, first)
    second = f"{study_id}-s2"
    wait_until(lambda: started(launcher, second), 10, what="the second scale started")
    launcher.set(second, status="failed", error="RuntimeError: the cluster caught fire", finished_at=1.0)
    final = wait_until(lambda: (s := status_of(client, study_id))["status"] != "running" and s, 10, what="the end")
    assert final["status"] == "failed"
    assert f"scale 2's sweep {second} ended failed: RuntimeError: the cluster caught fire" in final["error"]
    assert final["laws"] is None and not started(launcher, f"{study_id}-s3")


def test_a_restarted_service_goes_on_with_the_study(
    app_client: Callable[..., TestClient], launcher: FakeLauncher
) -> None:
    first_service = app_client()
    study_id = first_service.post("/studies", json=study("resumed"), headers=auth()).json()["id"]
    wait_until(lambda: started(launcher, f"{study_id}-s1"), 10, what="the first scale started")
    first_service.__exit__(None, None, None)  # the service stops; the sweep's driver runs on and finishes
    trained(app_client(), launcher, f"{study_id}-s1")  # read through a second service over the same store
    wait_until(lambda: started(launcher, f"{study_id}-s2"), 10, what="the next scale, by the service after it")
    assert launcher.started.count(f"{study_id}-s1") == 1


def test_what_is_not_a_study_or_not_its_owner_s_is_refused(app_client: Callable[..., TestClient]) -> None:
    client = app_client(max_gpu_hours_per_sweep=1e-9)
    resp = client.post("/studies", json=tiny_spec(), headers=auth())
    assert resp.status_code == 422 and "not a study" in resp.json()["error"]["message"]
    resp = client.post("/studies", json=study(lr={"min": -1.0, "max": 1e-2}), headers=auth())
    assert resp.status_code == 422 and "lr" in resp.text
    # each scale's sweep is judged as its own submit would be: here over the cap per sweep
    resp = client.post("/studies", json=study(), headers=auth())
    assert resp.status_code == 422 and "lawful-s1" in resp.json()["error"]["message"]
    assert client.get("/studies", headers=auth()).json()["total"] == 0  # nothing stored
    # the confirmation runs at the target: its sweep is judged as a submit of it would be, the target's not
    limited = app_client(max_token_budget=BUDGETS[-1])
    resp = limited.post("/studies", json=study(confirm=True), headers=auth())
    assert resp.status_code == 422, resp.text
    assert [d["field"] for d in resp.json()["error"]["details"]] == ["lawful-confirm.token_budget"]
    assert f"max_token_budget={BUDGETS[-1]}" in resp.text
    assert limited.post("/studies", json=study(), headers=auth()).status_code == 201
    open_client = app_client()
    study_id = open_client.post("/studies", json=study("mine"), headers=auth()).json()["id"]
    for resp in (
        open_client.get(f"/studies/{study_id}", headers=auth(BOB)),
        open_client.post(f"/studies/{study_id}/cancel", headers=auth(BOB)),
    ):
        assert resp.status_code == 404 and "no study" in resp.json()["error"]["message"]
    assert open_client.get("/studies", headers=auth(BOB)).json()["total"] == 0


def test_the_cap_per_owner_counts_a_study_whole_and_the_sweeps_it_has_still_to_make(
    app_client: Callable[..., TestClient],
) -> None:
    from service.policy import capped_price
    from sweeps.study import StudySpec

    hours = [capped_price(s) for s in StudySpec.model_validate(study()).sweep_specs()]
    # each scale's sweep alone passes the cap per owner, the three together do not: never, on any retry
    client = app_client(max_gpu_hours_per_owner=max(hours) * 1.05)
    assert sum(hours) > max(hours) * 1.05
    resp = client.post("/studies", json=study(), headers=auth())
    assert resp.status_code == 422, resp.text
    assert resp.json()["error"]["code"] == "gpu_hours_per_owner" and "cap per owner" in resp.text
    # room for one study: a second is refused while the first has sweeps still to make (429, with when)
    client = app_client(max_gpu_hours_per_owner=sum(hours) * 1.5)
    first = client.post("/studies", json=study("first"), headers=auth())
    assert first.status_code == 201, first.text
    second = client.post("/studies", json=study("second"), headers=auth())
    assert second.status_code == 429, second.text
    assert second.json()["error"]["code"] == "gpu_hours_per_owner" and int(second.headers["Retry-After"]) >= 1
    assert [s["name"] for s in client.get("/studies", headers=auth()).json()["items"]] == ["first"]
    # a confirming study: its confirmation priced at the most it can cost (the target's spec at its reference
    # and the two sizes on each side of one prediction: here every size, 4 and 8), judged as its scales are
    from service.policy import _hours
    from sweeps.study import confirm_bound_spec

    bound = confirm_bound_spec(StudySpec.model_validate(study(confirm=True)))
    assert bound is not None and bound.batch_sizes == [4, 8]
    most, total = capped_price(bound), sum(hours) + capped_price(bound)
    # alone over the cap per sweep, as a submit of it would be
    client = app_client(max_gpu_hours_per_sweep=most * 0.95)
    assert max(hours) < most * 0.95
    resp = client.post("/studies", json=study("doubted", confirm=True), headers=auth(BOB))
    assert resp.status_code == 422 and resp.json()["error"]["code"] == "gpu_hours_per_sweep", resp.text
    assert resp.json()["error"]["message"].startswith("doubted-confirm: ")
    # with the scales over the cap per owner, which each alone and the scales together pass
    client = app_client(max_gpu_hours_per_owner=total - min(sum(hours), most) / 2)
    resp = client.post("/studies", json=study("doubted", confirm=True), headers=auth(BOB))
    assert resp.status_code == 422 and resp.json()["error"]["code"] == "gpu_hours_per_owner", resp.text
    assert f"priced at {_hours(total)} GPU-hours" in resp.json()["error"]["message"]
    assert client.post("/studies", json=study("plain"), headers=auth(BOB)).status_code == 201


def test_a_study_at_the_owner_s_limit_of_active_sweeps_is_429_saying_when(
    app_client: Callable[..., TestClient], launcher: FakeLauncher
) -> None:
    client = app_client(max_concurrent_per_owner=1)
    running = client.post("/sweeps", json=tiny_spec(), headers=auth())
    assert running.status_code == 201, running.text
    resp = client.post("/studies", json=study(), headers=auth())
    assert resp.status_code == 429 and int(resp.headers["Retry-After"]) >= 1, resp.text
    error = resp.json()["error"]
    assert error["code"] == "too_many_sweeps"
    assert "1 sweeps queued or running; the limit is 1, and a study runs one at a time" in error["message"]
    assert client.get("/studies", headers=auth()).json()["total"] == 0
    assert client.post("/studies", json=study(), headers=auth(BOB)).status_code == 201  # per owner
