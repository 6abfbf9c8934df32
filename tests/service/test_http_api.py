"""The HTTP API in-process (TestClient), drivers faked: shapes, auth, limits, idempotency, cancel, SSE."""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest
import yaml
from fastapi.testclient import TestClient
from harness import free_port, tiny_spec
from httpx_sse import ServerSentEvent, connect_sse
from svc_helpers import ALICE, BOB, FakeLauncher, auth, wait_until

from service.app import create_app
from service.settings import Settings


def assert_error(resp: Any, status: int, code: str) -> dict[str, Any]:
    """Every error answers {"error": {"code", "message", "details"}}."""
    assert resp.status_code == status, resp.text
    assert resp.headers["content-type"].startswith("application/json")
    body = resp.json()
    assert set(body) == {"error"}
    assert set(body["error"]) == {"code", "message", "details"}
    assert body["error"]["code"] == code
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]
    return body["error"]  # type: ignore[no-any-return]


def submit(client: TestClient, spec: dict[str, Any] | None = None, token: str = ALICE, **headers: str) -> str:
    resp = client.post("/sweeps", json=spec or tiny_spec(), headers=auth(token) | headers)
    assert resp.status_code == 201, resp.text
    return str(resp.json()["id"])


def status_of(client: TestClient, sweep_id: str) -> str:
    return str(client.get(f"/sweeps/{sweep_id}", headers=auth()).json()["status"])


# ---- auth --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer nope"}, {"Authorization": f"Basic {ALICE}"}])
def test_every_sweep_endpoint_needs_a_token(client: TestClient, headers: dict[str, str]) -> None:
    for method, path in [
        ("GET", "/sweeps"),
        ("POST", "/sweeps"),
        ("GET", "/sweeps/x"),
        ("GET", "/sweeps/x/report"),
        ("POST", "/sweeps/x/cancel"),
        ("GET", "/sweeps/x/events"),
    ]:
        resp = client.request(method, path, headers=headers)
        assert_error(resp, 401, "unauthorized")
        assert resp.headers["www-authenticate"] == "Bearer"


def test_healthz_needs_no_token(client: TestClient) -> None:
    resp = client.get("/healthz")
    assert resp.status_code == 200
    assert resp.json()["status"] == "ok"
    assert set(resp.json()["checks"]) == {"store", "ray", "mlflow"}


def test_healthz_is_503_when_a_check_fails(client: TestClient, launcher: FakeLauncher) -> None:
    launcher.healthy = False
    resp = client.get("/healthz")
    assert resp.status_code == 503
    checks = resp.json()["checks"]
    assert checks["ray"]["ok"] is False and "ray check failed" in checks["ray"]["error"]
    # no token is needed here: the exception's own text (paths, addresses) stays in the log
    assert "cluster gone" not in resp.text
    assert checks["store"]["ok"] and checks["mlflow"]["ok"]


def test_owners_see_only_their_own_sweeps(client: TestClient) -> None:
    sweep_id = submit(client)
    # another owner's sweep is indistinguishable from a missing one
    assert_error(client.get(f"/sweeps/{sweep_id}", headers=auth(BOB)), 404, "not_found")
    assert_error(client.post(f"/sweeps/{sweep_id}/cancel", headers=auth(BOB)), 404, "not_found")
    assert_error(client.get(f"/sweeps/{sweep_id}/report", headers=auth(BOB)), 404, "not_found")
    assert_error(client.get(f"/sweeps/{sweep_id}/events", headers=auth(BOB)), 404, "not_found")
    assert client.get("/sweeps", headers=auth(BOB)).json()["total"] == 0
    assert client.get(f"/sweeps/{sweep_id}", headers=auth()).status_code == 200


# ---- submit --------------------------------------------------------------------------------------


def test_submit_answers_at_once_and_launches_in_the_background(client: TestClient, launcher: FakeLauncher) -> None:
    launcher.start_delay_s = 1.0  # a slow driver start must not hold the answer
    resp = client.post("/sweeps", json=tiny_spec(), headers=auth())
    assert resp.status_code == 201
    body = resp.json()
    assert body["status"] == "queued" and body["replayed"] is False
    assert body["id"].startswith("tiny-") and len(body["id"]) == len("tiny-") + 8
    assert resp.headers["location"] == f"/sweeps/{body['id']}"
    assert launcher.started == []
    wait_until(lambda: launcher.started == [body["id"]], 10, what="driver start")
    wait_until(lambda: status_of(client, body["id"]) == "running", 10, what="running")


def test_each_submit_gets_its_own_id(client: TestClient) -> None:
    ids = {submit(client) for _ in range(2)}
    assert len(ids) == 2  # the id names the MLflow experiment and Optuna studies: never shared


def test_yaml_submit(client: TestClient) -> None:
    resp = client.post(
        "/sweeps", content=yaml.safe_dump(tiny_spec("from-yaml")), headers=auth() | {"Content-Type": "application/yaml"}
    )
    assert resp.status_code == 201
    detail = client.get(f"/sweeps/{resp.json()['id']}", headers=auth()).json()
    assert detail["spec"]["name"] == "from-yaml"
    assert detail["spec"]["pruning"]["enabled"] is True  # stored normalised, defaults filled in


def test_bad_spec_is_422_naming_field_and_value(client: TestClient) -> None:
    spec = tiny_spec(
        batch_sizes=[8, 4], lr={"min": 1e-3, "max": 1e-2, "trials_per_batch_size": 2, "trails_per_batch_size": 3}
    )
    err = assert_error(client.post("/sweeps", json=spec, headers=auth()), 422, "invalid_spec")
    by_field = {d["field"]: d for d in err["details"]}
    assert by_field["batch_sizes"]["value"] == [8, 4]
    assert "strictly increasing" in by_field["batch_sizes"]["message"]
    assert "did you mean 'trials_per_batch_size'" in by_field["lr.trails_per_batch_size"]["message"]
    assert client.get("/sweeps", headers=auth()).json()["total"] == 0


def test_bad_yaml_spec_is_422_too(client: TestClient) -> None:
    body = yaml.safe_dump(tiny_spec(optimizers=[{"name": "adamz"}]))
    err = assert_error(
        client.post("/sweeps", content=body, headers=auth() | {"Content-Type": "application/yaml"}), 422, "invalid_spec"
    )
    assert err["details"][0]["field"] == "optimizers.0.name"
    assert err["details"][0]["value"] == "adamz"


def test_unsupported_media_type_is_415(client: TestClient) -> None:
    assert_error(
        client.post("/sweeps", content=b"x", headers=auth() | {"Content-Type": "text/plain"}),
        415,
        "unsupported_media_type",
    )


def test_oversized_body_is_413(make_settings: Any, launcher: FakeLauncher) -> None:
    settings = make_settings(max_body_bytes=2048)
    with TestClient(create_app(settings, launcher=launcher)) as client:
        big = tiny_spec(optimizers=[{"name": "adamw", "extra": {"pad": "x" * 4000}}])
        # declared length over the cap: refused before reading
        assert_error(client.post("/sweeps", json=big, headers=auth()), 413, "payload_too_large")

        # no length declared (chunked): counted while read
        def chunks() -> Any:
            data = json.dumps(big).encode()
            for i in range(0, len(data), 512):
                yield data[i : i + 512]

        assert_error(client.post("/sweeps", content=chunks(), headers=auth()), 413, "payload_too_large")
        assert client.get("/sweeps", headers=auth()).json()["total"] == 0
        assert client.post("/sweeps", json=tiny_spec(), headers=auth()).status_code == 201


def test_dry_run_validates_and_stores_nothing(client: TestClient, launcher: FakeLauncher) -> None:
    resp = client.post("/sweeps?dry_run=true", json=tiny_spec(), headers=auth())
    assert resp.status_code == 200
    body = resp.json()
    # 2 cells x (2 search + 1 confirmation), and one more search trial at the reference (batch size 4)
    assert (body["valid"], body["total_trials"], body["cells"]) == (True, 7, 2)
    assert body["spec"]["schedule"] == {
        "warmup_fraction": 0.05,
        "warmup_tokens": None,
        "warmup_steps": None,
        "min_lr_ratio": 0.1,
        "warmup_search": [],
    }
    assert client.get("/sweeps", headers=auth()).json()["total"] == 0
    assert launcher.started == []
    assert_error(client.post("/sweeps?dry_run=true", json=tiny_spec(seeds=0), headers=auth()), 422, "invalid_spec")


def test_too_many_active_sweeps_is_429(make_settings: Any, launcher: FakeLauncher) -> None:
    settings = make_settings(max_concurrent_per_owner=1)
    with TestClient(create_app(settings, launcher=launcher)) as client:
        first = submit(client)
        err = assert_error(client.post("/sweeps", json=tiny_spec(), headers=auth()), 429, "too_many_sweeps")
        assert "limit is 1" in err["message"]
        submit(client, token=BOB)  # per owner
        wait_until(lambda: first in launcher.drivers, 10)
        launcher.finish(first)
        wait_until(lambda: status_of(client, first) == "succeeded", 10)
        submit(client)  # a finished sweep frees the slot


def test_idempotent_submit(client: TestClient, launcher: FakeLauncher) -> None:
    first = client.post("/sweeps", json=tiny_spec(), headers=auth() | {"Idempotency-Key": "abc"})
    again = client.post("/sweeps", json=tiny_spec(), headers=auth() | {"Idempotency-Key": "abc"})
    assert first.status_code == again.status_code == 201
    assert again.json()["id"] == first.json()["id"]
    assert (first.json()["replayed"], again.json()["replayed"]) == (False, True)
    assert again.headers["idempotent-replayed"] == "true"
    assert client.get("/sweeps", headers=auth()).json()["total"] == 1
    wait_until(lambda: launcher.started, 10)
    assert launcher.started == [first.json()["id"]]  # launched once
    # the same key for another spec is a client error, not a silent replay
    err = assert_error(
        client.post("/sweeps", json=tiny_spec(seeds=2), headers=auth() | {"Idempotency-Key": "abc"}),
        422,
        "idempotency_key_reused",
    )
    assert err["details"][0]["field"] == "Idempotency-Key"


# ---- read ------------------------------------------------------------------------------------------


def test_detail_has_progress_times_and_mlflow_link(make_settings: Any, launcher: FakeLauncher) -> None:
    settings = make_settings(mlflow_ui_url="http://127.0.0.1:5000")
    with TestClient(create_app(settings, launcher=launcher)) as client:
        sweep_id = submit(client)
        queued = client.get(f"/sweeps/{sweep_id}", headers=auth()).json()
        # before the driver reports, the totals come from the spec
        assert queued["progress"]["trials_total"] == 7 and queued["progress"]["cells_total"] == 2
        # planned before the driver reports: the reference cell searches one lr more
        assert {c["batch_size"]: c["search_total"] for c in queued["progress"]["cells"]} == {4: 3, 8: 2}
        assert [c["cell"] for c in queued["progress"]["cells"]] == ["adamw/bs4", "adamw/bs8"]
        assert queued["mlflow_url"] is None
        wait_until(lambda: sweep_id in launcher.drivers, 10)
        progress = {
            "cells_done": 1,
            "cells_total": 2,
            "trials_done": 3,
            "trials_total": 4,
            "future_field": 1,
            "cells": [
                {
                    "cell": "adamw/bs4",
                    "optimizer": "adamw",
                    "batch_size": 4,
                    "search_best_val_loss": 5.5,
                    "finished": True,
                },
                {"cell": "adamw/bs8", "optimizer": "adamw", "batch_size": 8, "search_best_val_loss": None},
            ],
        }
        launcher.set(sweep_id, progress=progress, experiment_id="12")
        d = wait_until(
            lambda: (
                (r := client.get(f"/sweeps/{sweep_id}", headers=auth()).json())["progress"]["trials_done"] == 3 and r
            ),
            10,
        )
        assert d["status"] == "running" and d["started_at"] is not None and d["finished_at"] is None
        assert d["progress"]["cells"][0]["search_best_val_loss"] == 5.5
        assert "future_field" not in d["progress"]  # the API promises its own fields only
        assert (d["experiment_id"], d["mlflow_url"]) == (
            "12",
            "http://127.0.0.1:5000/#/experiments/12/runs?workflowType=machine_learning",
        )


def test_curves_are_the_drivers_and_stay_out_of_the_sweep_json(client: TestClient, launcher: FakeLauncher) -> None:
    sweep_id = submit(client)
    empty = client.get(f"/sweeps/{sweep_id}/curves", headers=auth())
    assert empty.status_code == 200 and empty.json()["trials"] == []
    wait_until(lambda: sweep_id in launcher.drivers, 10)
    curve = {"cell": "adamw/bs4", "lr": 3e-3, "seed": 0, "role": "search", "status": "running", "best": False,
             "points": [[512, 5.1], [1024, 4.7]], "warmup": 0.05}  # fmt: skip
    launcher.set(sweep_id, progress={"trials_done": 0, "cells": [], "curves": [curve]})
    got = wait_until(lambda: (r := client.get(f"/sweeps/{sweep_id}/curves", headers=auth()).json())["trials"] and r, 10)
    assert got["trials"] == [curve] and got["status"] == "running" and got["revision"] >= 2
    # the sweep's JSON (polled, streamed, listed) does not carry them
    assert "curves" not in client.get(f"/sweeps/{sweep_id}", headers=auth()).json()["progress"]
    assert client.get(f"/sweeps/{sweep_id}/curves", headers=auth(BOB)).status_code == 404


def test_list_paginates_newest_first_and_filters(client: TestClient, launcher: FakeLauncher) -> None:
    ids = [submit(client, tiny_spec(f"s{i}")) for i in range(3)]
    wait_until(lambda: len(launcher.drivers) == 3, 10)
    launcher.finish(ids[1])
    wait_until(lambda: status_of(client, ids[1]) == "succeeded", 10)
    page = client.get("/sweeps?limit=2", headers=auth()).json()
    assert (page["total"], page["limit"], page["offset"]) == (3, 2, 0)
    assert [s["id"] for s in page["items"]] == [ids[2], ids[1]]
    assert "spec" not in page["items"][0]  # summaries; the detail has the spec
    assert [s["id"] for s in client.get("/sweeps?limit=2&offset=2", headers=auth()).json()["items"]] == [ids[0]]
    done = client.get("/sweeps?status=succeeded", headers=auth()).json()
    assert [s["id"] for s in done["items"]] == [ids[1]]
    both = client.get("/sweeps?status=succeeded&status=running", headers=auth()).json()
    assert both["total"] == 3
    err = assert_error(client.get("/sweeps?status=bogus", headers=auth()), 422, "invalid_request")
    assert err["details"][0]["field"] == "query.status.0"
    assert_error(client.get("/sweeps?limit=1000", headers=auth()), 422, "invalid_request")


def test_unknown_sweep_is_404_and_unknown_path_keeps_the_shape(client: TestClient) -> None:
    assert_error(client.get("/sweeps/nope", headers=auth()), 404, "not_found")
    assert_error(client.get("/nothing-here"), 404, "not_found")
    assert_error(client.delete("/sweeps", headers=auth()), 405, "method_not_allowed")


# ---- report and cancel -----------------------------------------------------------------------------


def test_report_is_409_until_finished_then_the_analysis(client: TestClient, launcher: FakeLauncher) -> None:
    sweep_id = submit(client)
    assert_error(client.get(f"/sweeps/{sweep_id}/report", headers=auth()), 409, "not_finished")
    wait_until(lambda: sweep_id in launcher.drivers, 10)
    launcher.finish(sweep_id, report={"optimizers": {"adamw": {}}, "tolerance": 0.05})
    wait_until(lambda: status_of(client, sweep_id) == "succeeded", 10)
    assert client.get(f"/sweeps/{sweep_id}/report", headers=auth()).json() == {
        "optimizers": {"adamw": {}},
        "tolerance": 0.05,
    }
    # the result is stored, so the driver actor is let go
    assert launcher.killed == [sweep_id]


def test_failed_sweep_has_no_report(client: TestClient, launcher: FakeLauncher) -> None:
    sweep_id = submit(client)
    wait_until(lambda: sweep_id in launcher.drivers, 10)
    launcher.set(sweep_id, status="failed", error="ValueError: bad data", finished_at=1.0)
    wait_until(lambda: status_of(client, sweep_id) == "failed", 10)
    err = assert_error(client.get(f"/sweeps/{sweep_id}/report", headers=auth()), 409, "no_report")
    assert "bad data" in err["message"]
    assert client.get(f"/sweeps/{sweep_id}", headers=auth()).json()["error"] == "ValueError: bad data"


def test_cancel_running_sweep_tells_its_driver(client: TestClient, launcher: FakeLauncher) -> None:
    sweep_id = submit(client)
    wait_until(lambda: status_of(client, sweep_id) == "running", 10)
    resp = client.post(f"/sweeps/{sweep_id}/cancel", headers=auth())
    assert resp.status_code == 202
    assert resp.json()["cancel_requested"] is True and resp.json()["status"] == "running"
    assert sweep_id in launcher.cancelled
    # the driver stops Tune, keeps finished trials and ends as cancelled with a partial report
    launcher.finish(sweep_id, status="cancelled", report={"partial": True})
    wait_until(lambda: status_of(client, sweep_id) == "cancelled", 10)
    assert client.get(f"/sweeps/{sweep_id}/report", headers=auth()).json() == {"partial": True}
    assert_error(client.post(f"/sweeps/{sweep_id}/cancel", headers=auth()), 409, "already_finished")


def test_cancel_before_the_driver_started(client: TestClient, launcher: FakeLauncher) -> None:
    launcher.start_delay_s = 0.5
    sweep_id = submit(client)
    resp = client.post(f"/sweeps/{sweep_id}/cancel", headers=auth())
    assert resp.status_code == 202
    # the cancel is passed on as soon as the driver is up
    wait_until(lambda: sweep_id in launcher.cancelled, 10, what="cancel forwarded")


def test_launch_failure_fails_the_sweep_without_naming_the_cluster(client: TestClient, launcher: FakeLauncher) -> None:
    launcher.fail_start = "no resources on ray://head.internal.example:10001"
    sweep_id = submit(client)
    wait_until(lambda: status_of(client, sweep_id) == "failed", 10)
    error = client.get(f"/sweeps/{sweep_id}", headers=auth()).json()["error"]
    assert error == "driver failed to start (RuntimeError); the service log says why"
    assert "internal" not in error  # the exception's text (hosts, files) stays in the log


# ---- events -----------------------------------------------------------------------------------------


def read_events(client: TestClient, sweep_id: str, on_first: Any = None) -> list[ServerSentEvent]:
    """The stream's events as httpx-sse parses them (the CLI's parser), all of them: the `retry` hint first."""
    events: list[ServerSentEvent] = []
    with connect_sse(client, "GET", f"/sweeps/{sweep_id}/events", headers=auth()) as source:
        assert source.response.status_code == 200
        assert source.response.headers["content-type"].startswith("text/event-stream")
        assert source.response.headers["cache-control"] == "no-cache"
        for sse in source.iter_sse():
            events.append(sse)
            if on_first and sse.event == "progress" and len(named(events)) == 1:
                on_first()
    return events


def named(events: list[ServerSentEvent]) -> list[ServerSentEvent]:
    # httpx-sse 0.4 also hands out a nameless empty event for a blank line after a comment once an
    # `id:` was seen (the heartbeats); the stream's own events all have a name
    return [e for e in events if e.event != "message"]


def test_events_stream_progress_then_end(client: TestClient, launcher: FakeLauncher) -> None:
    sweep_id = submit(client)
    wait_until(lambda: status_of(client, sweep_id) == "running", 10)

    def advance() -> None:
        launcher.set(
            sweep_id, progress={"cells_done": 1, "cells_total": 2, "trials_done": 2, "trials_total": 4, "cells": []}
        )
        launcher.finish(sweep_id)

    events = read_events(client, sweep_id, on_first=advance)
    assert events[0].retry == 2000 and events[0].data == ""  # the reconnect hint comes first, alone
    kinds = [e.event for e in named(events)]
    assert kinds[0] == "progress" and kinds[-1] == "end"
    assert kinds.count("end") == 1 and set(kinds) == {"progress", "end"}
    final = events[-1].json()
    assert events[-1].event == "end"
    assert final["id"] == sweep_id and final["status"] == "succeeded"
    # the stream only speaks when the sweep changed: revisions strictly increase, each its event's id
    revisions = [e.json()["revision"] for e in named(events)]
    assert revisions == sorted(set(revisions))
    assert [e.id for e in named(events)] == [str(r) for r in revisions]


def test_events_of_a_finished_sweep_end_at_once(client: TestClient, launcher: FakeLauncher) -> None:
    sweep_id = submit(client)
    wait_until(lambda: sweep_id in launcher.drivers, 10)
    launcher.finish(sweep_id)
    wait_until(lambda: status_of(client, sweep_id) == "succeeded", 10)
    assert [e.event for e in named(read_events(client, sweep_id))] == ["end"]


def test_event_stream_slots_follow_the_streams_open(make_settings: Any, launcher: FakeLauncher) -> None:
    with TestClient(create_app(make_settings(max_event_streams_per_owner=1), launcher=launcher)) as client:
        sweep_id = submit(client)
        wait_until(lambda: status_of(client, sweep_id) == "running", 10)
        assert_error(client.get("/sweeps/nope/events", headers=auth()), 404, "not_found")
        with connect_sse(client, "GET", f"/sweeps/{sweep_id}/events", headers=auth()) as source:
            assert source.response.status_code == 200
            limits = client.app.state.limits  # type: ignore[attr-defined]
            assert limits.streams.held("alice") == 1  # a 404 took none; the open stream holds one
            assert_error(client.get(f"/sweeps/{sweep_id}/events", headers=auth()), 429, "too_many_streams")
            launcher.finish(sweep_id)
            assert [e.event for e in named(list(source.iter_sse()))][-1] == "end"
        # a stream that ended by itself gave its slot back: the owner may open the next one
        wait_until(lambda: limits.streams.held("alice") == 0, 5, what="slot released at `end`")
        assert [e.event for e in named(read_events(client, sweep_id))] == ["end"]


def test_events_send_heartbeats_while_nothing_changes(client: TestClient, launcher: FakeLauncher) -> None:
    sweep_id = submit(client)
    wait_until(lambda: status_of(client, sweep_id) == "running", 10)
    seen: list[str] = []
    # the wire itself: an SSE parser (httpx-sse, a browser's EventSource) drops comment lines by design
    with client.stream("GET", f"/sweeps/{sweep_id}/events", headers=auth()) as resp:
        started = time.monotonic()
        for line in resp.iter_lines():
            seen.append(line)
            if line == ": heartbeat" or time.monotonic() - started > 10:
                break
    # sse_heartbeat_s is 0.2 s in these tests: ours comes long before FastAPI's own `: ping` (15 s)
    assert ": heartbeat" in seen, seen


# ---- docs ------------------------------------------------------------------------------------------


def test_openapi_documents_the_spec_body(client: TestClient) -> None:
    schema = client.get("/openapi.json").json()
    body = schema["paths"]["/sweeps"]["post"]["requestBody"]["content"]
    assert body["application/json"]["schema"] == {"$ref": "#/components/schemas/SweepSpec"}
    assert "application/yaml" in body
    assert "token_budget" in schema["components"]["schemas"]["SweepSpec"]["properties"]
    assert "LRSearchSpec" in schema["components"]["schemas"]
    assert client.get("/docs").status_code == 200


def test_the_api_docs_load_nothing_from_another_origin(client: TestClient) -> None:
    # /docs (Swagger UI) and /redoc work on a machine that reaches no CDN: their scripts, styles and
    # the schema they read are the service's own, and it serves them
    for path in ("/docs", "/redoc"):
        page = client.get(path)
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        assets = re.findall(r'(?:src|href)="([^"]+)"', page.text)
        assert any(a.endswith(".js") for a in assets), assets
        assert all(a.startswith("/") and not a.startswith("//") for a in assets), assets
        for asset in assets:
            served = client.get(asset)
            assert served.status_code == 200 and len(served.content) > 1000, asset
        assert "/openapi.json" in page.text
    assert "SwaggerUIBundle" in client.get("/docs").text
    assert "cdn" not in (client.get("/docs").text + client.get("/redoc").text).lower()


# ---- the read cache of GET /sweeps/{id} -----------------------------------------------------------


def test_own_writes_show_at_once_other_processes_writes_within_the_ttl(
    make_settings: Any, launcher: FakeLauncher
) -> None:
    from service.store.database import Store

    settings = make_settings(read_cache_s=0.5, poll_interval_s=60)  # no poller interference
    with TestClient(create_app(settings, launcher=launcher)) as client:
        sweep_id = submit(client)
        first = client.get(f"/sweeps/{sweep_id}", headers=auth()).json()
        # a write by this process (cancel) is visible on the next read: it dropped the cached render
        client.post(f"/sweeps/{sweep_id}/cancel", headers=auth())
        assert client.get(f"/sweeps/{sweep_id}", headers=auth()).json()["cancel_requested"] is True

        other = Store(settings.database)  # another process's store client: no listener here
        other.update(sweep_id, error="written elsewhere")
        other.dispose()
        cached = client.get(f"/sweeps/{sweep_id}", headers=auth()).json()
        assert cached["error"] is None  # served from the cache...
        time.sleep(0.6)
        # ...but an expired entry is renewed: the change shows within read_cache_s and one store read
        started = time.monotonic()
        wait_until(
            lambda: client.get(f"/sweeps/{sweep_id}", headers=auth()).json()["error"] == "written elsewhere",
            2,
            what="renewed view",
        )
        assert time.monotonic() - started < 1.0
        assert first["revision"] < cached["revision"]


def test_cached_sweep_is_still_404_for_another_owner(client: TestClient) -> None:
    sweep_id = submit(client)
    assert client.get(f"/sweeps/{sweep_id}", headers=auth()).status_code == 200  # now cached
    assert_error(client.get(f"/sweeps/{sweep_id}", headers=auth(BOB)), 404, "not_found")


def test_both_ways_in_answer_byte_for_byte_the_same(make_settings: Any, launcher: FakeLauncher) -> None:
    from test_pages import sign_in

    # one endpoint, two ways in: a bearer request is answered before routing (HotReads), a session cookie's
    # by the route; both through SweepReader.detail_json, so clients must not be able to tell them apart.
    # No poller: its write between two reads would drop the cached entry and make a hit a miss.
    with TestClient(create_app(make_settings(poll_interval_s=60), launcher=launcher)) as bearer:
        # two browsers on the same app (not entered: the app's lifespan runs once, in `bearer`)
        alices_browser, bobs_browser = TestClient(bearer.app), TestClient(bearer.app)
        sign_in(alices_browser)
        sign_in(bobs_browser, BOB)
        sweep_id = submit(bearer)
        views = bearer.app.state.reader.views  # type: ignore[attr-defined]
        mine, none = f"/sweeps/{sweep_id}", "/sweeps/nope-12345678"
        views.invalidate(sweep_id)
        answers = {"miss": bearer.get(mine, headers=auth())}
        assert views.get(sweep_id) is not None  # the miss cached it: the next bearer read is a hit
        answers |= {
            "hit": bearer.get(mine, headers=auth()),
            "routed": alices_browser.get(mine),
            "another owner's": bearer.get(mine, headers=auth(BOB)),
            "another owner's, routed": bobs_browser.get(mine),
            "none such": bearer.get(none, headers=auth()),
            "none such, routed": alices_browser.get(none),
        }
    alike = [
        ("miss", "hit", "routed"),
        ("another owner's", "another owner's, routed"),
        ("none such", "none such, routed"),
    ]
    for cases in alike:
        first = answers[cases[0]]
        for case in cases:
            resp = answers[case]
            assert (resp.status_code, resp.content) == (first.status_code, first.content), case
            assert sorted(resp.headers.raw) == sorted(first.headers.raw), case
    assert answers["hit"].status_code == 200 and answers["hit"].json()["id"] == sweep_id
    # another owner's sweep is answered as one that does not exist
    assert answers["another owner's"].json() == {
        "error": {"code": "not_found", "message": f"no sweep '{sweep_id}'", "details": []}
    }
    assert answers["none such"].status_code == 404


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer nope"}, {"Authorization": f"Basic {ALICE}"}])
def test_cached_sweep_still_needs_a_valid_token(client: TestClient, headers: dict[str, str]) -> None:
    sweep_id = submit(client)
    assert client.get(f"/sweeps/{sweep_id}", headers=auth()).status_code == 200  # now cached
    assert_error(client.get(f"/sweeps/{sweep_id}", headers=headers), 401, "unauthorized")


def test_hot_reads_answers_a_bearers_read_and_passes_on_the_rest() -> None:
    from types import SimpleNamespace

    from service.api.auth import TokenTable
    from service.api.middleware import HotReads
    from service.settings import Settings
    from service.views import SweepReader, ViewCache

    cache = ViewCache(ttl_s=60)
    cache.put("s-1", cache.generation("s-1"), "alice", b'{"id": "s-1"}')
    fetched: list[str] = []

    def get(sweep_id: str) -> None:  # the store: no other sweep
        fetched.append(sweep_id)

    state = SimpleNamespace(
        tokens=TokenTable(Settings(tokens=f"alice={ALICE},bob={BOB}")),
        reader=SweepReader(store=SimpleNamespace(get=get), settings=None, views=cache),  # type: ignore[arg-type]
    )
    passed_on: list[str] = []

    async def route(scope: Any, receive: Any, send: Any) -> None:
        passed_on.append(f"{scope['method']} {scope['path']}")

    async def request(method: str, path: str, headers: dict[str, str], app_state: Any = state) -> list[Any]:
        sent: list[Any] = []

        async def send(message: Any) -> None:
            sent.append(message)

        scope = {
            "type": "http",
            "method": method,
            "path": path,
            "root_path": "",
            "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()],
        }
        await HotReads(route, app_state)(scope, None, send)  # type: ignore[arg-type]
        return sent

    sent = asyncio.run(request("GET", "/sweeps/s-1", auth()))
    assert [m["type"] for m in sent] == ["http.response.start", "http.response.body"]
    assert sent[0]["status"] == 200 and sent[1]["body"] == b'{"id": "s-1"}'
    assert dict(sent[0]["headers"])[b"content-length"] == b"13"
    assert passed_on == [] and fetched == []  # from the cache

    # a bearer's read of another owner's sweep, or of none: the reader's 404, answered here too
    for headers, path in [(auth(BOB), "/sweeps/s-1"), (auth(), "/sweeps/s-2")]:
        sent = asyncio.run(request("GET", path, headers))
        assert sent[0]["status"] == 404
        assert json.loads(sent[1]["body"])["error"]["code"] == "not_found"
    assert passed_on == [] and fetched == ["s-2"]  # the miss read the store

    # everything else is the route's: other ways to sign, no valid token, ids it refuses, other endpoints
    for method, path, headers in [
        ("GET", "/sweeps/s-1", {}),
        ("GET", "/sweeps/s-1", auth("nope")),
        ("GET", "/sweeps/s-1", {"Authorization": f"Basic {ALICE}"}),
        ("GET", "/sweeps/S-1", auth()),  # the route's 422
        ("GET", "/sweeps/s\x00-1", auth()),
        ("GET", "/sweeps/" + "s" * 81, auth()),
        ("POST", "/sweeps/s-1", auth()),
        ("GET", "/sweeps/s-1/report", auth()),
        ("GET", "/sweeps/s-1/", auth()),
    ]:
        assert asyncio.run(request(method, path, headers)) == []
    assert len(passed_on) == 9 and fetched == ["s-2"]
    # before the lifespan has made the reader, nothing is answered here
    asyncio.run(request("GET", "/sweeps/s-1", auth(), SimpleNamespace(tokens=state.tokens)))
    assert len(passed_on) == 10


def test_concurrent_misses_share_one_store_read() -> None:
    from service.views import ViewCache

    cache = ViewCache(ttl_s=10)
    calls = 0

    async def fetch(sweep_id: str) -> tuple[str, bytes]:
        nonlocal calls
        calls += 1
        await asyncio.sleep(0.05)
        return "alice", b"{}"

    async def many() -> list[Any]:
        return await asyncio.gather(*(cache.load("s-1", fetch) for _ in range(20)))

    views = asyncio.run(many())
    # one read for twenty waiting clients: an expiring entry causes no burst of queries
    assert calls == 1
    assert all(v is not None and v.body == b"{}" for v in views)
    cache.invalidate("s-1")
    assert cache.get("s-1") is None


def test_expired_view_is_served_while_one_renewal_runs() -> None:
    from service.views import ViewCache

    cache = ViewCache(ttl_s=0.01)
    bodies = iter([b"old", b"new"])
    calls = 0

    async def fetch(sweep_id: str) -> tuple[str, bytes]:
        nonlocal calls
        calls += 1
        await asyncio.sleep(0.05)
        return "alice", next(bodies)

    async def scenario() -> tuple[list[bytes], bytes]:
        await cache.load("s-1", fetch)
        await asyncio.sleep(0.02)  # expired now
        during = await asyncio.gather(*(cache.load("s-1", fetch) for _ in range(10)))
        await asyncio.sleep(0.1)  # the renewal lands
        return [v.body for v in during if v], cache._views["s-1"].body

    during, after = asyncio.run(scenario())
    # nobody waited for the store: the expired render answered, one renewal replaced it
    assert during == [b"old"] * 10
    assert after == b"new"
    assert calls == 2


def test_health_is_cached_briefly_then_rechecked(make_settings: Any, launcher: FakeLauncher) -> None:
    with TestClient(create_app(make_settings(health_cache_s=0.3), launcher=launcher)) as client:
        assert client.get("/healthz").status_code == 200
        launcher.healthy = False
        # within health_cache_s the last round answers: probes do not each hit Ray and MLflow
        assert client.get("/healthz").status_code == 200
        # after it, a new round runs and the failure shows
        wait_until(lambda: client.get("/healthz").status_code == 503, 10, interval_s=0.1, what="503")


def test_prometheus_metrics_on_their_own_port_move_with_the_traffic(
    make_settings: Callable[..., Settings], launcher: FakeLauncher
) -> None:
    from svc_helpers import ThreadServer

    port = free_port()
    with (
        ThreadServer(make_settings(metrics_port=port), launcher) as server,
        httpx.Client(base_url=server.url, timeout=30, headers=auth()) as http,
    ):
        sweep_id = http.post("/sweeps", json=tiny_spec()).json()["id"]
        for _ in range(3):
            assert http.get(f"/sweeps/{sweep_id}").status_code == 200
        http.get("/healthz")

        def scrape() -> dict[str, float]:
            text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
            return {
                line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
                for line in text.splitlines()
                if line and not line.startswith("#")
            }

        first = scrape()
        key = 'batchsweep_http_requests_total{method="GET",route="/sweeps/{sweep_id}",status="200"}'
        assert first[key] >= 3  # by route template, HotReads' cached answers included
        assert first['batchsweep_http_requests_total{method="POST",route="/sweeps",status="201"}'] == 1
        assert sum(v for k, v in first.items() if k.startswith('batchsweep_sweeps{owner="alice"')) == 1
        assert first['batchsweep_dependency_up{dependency="store"}'] == 1.0
        assert not any(sweep_id in name for name in first)  # no series per sweep id
        # the latency histogram counts the same requests; its buckets are cumulative, ending at +Inf
        labels = 'method="GET",route="/sweeps/{sweep_id}"'
        hist = "batchsweep_http_request_duration_seconds"
        assert first[f"{hist}_count{{{labels}}}"] == first[key] == first[f'{hist}_bucket{{le="+Inf",{labels}}}']
        assert first[f'{hist}_bucket{{le="0.001",{labels}}}'] <= first[f'{hist}_bucket{{le="10.0",{labels}}}']
        assert 0 < first[f"{hist}_sum{{{labels}}}"] < 10 * first[key]
        http.get(f"/sweeps/{sweep_id}")
        assert scrape()[key] == first[key] + 1
        assert http.get("/metrics").status_code in (401, 404)  # not on the API's port


def test_a_bad_warmup_search_is_refused_by_field_and_value(client: TestClient, launcher: FakeLauncher) -> None:
    bad = tiny_spec(schedule={"warmup_fraction": 0.05, "warmup_search": [0.2, 1.5]})
    body = assert_error(client.post("/sweeps", json=bad, headers=auth()), 422, "invalid_spec")
    problem = body["details"][0]
    assert (problem["field"], problem["value"]) == ("schedule.warmup_search.1", 1.5), body
    assert "warmup_search[1] must be a fraction of the steps in [0, 1)" in problem["message"], body
    assert launcher.started == []
    good = tiny_spec(schedule={"warmup_fraction": 0.05, "warmup_search": [0.2]})
    resp = client.post("/sweeps?dry_run=true", json=good, headers=auth())
    # 2 cells x (2 search + 1 other warm-up + 1 confirmation), + 1 search trial at the reference
    assert resp.status_code == 200 and resp.json()["total_trials"] == 9, resp.text
