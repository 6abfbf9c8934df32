"""The browser pages in-process (TestClient, drivers faked): sign-in, the list, a sweep's live page,
the submit page with its dry run, the static files. Security: test_pages_security.py. In a real
browser against a real service: tests/dashboards/test_ui_browser.py."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
import yaml
from fastapi.testclient import TestClient
from harness import real_report, tiny_spec
from svc_helpers import ALICE, FakeLauncher, auth, wait_until

from dashboards.page import PLOTLYJS_TAG, plotlyjs_from
from service.api.sessions import COOKIE
from service.app import create_app
from service.web.pages import PLOTLYJS_URL, answer_of, static_url, with_service_bar

HTML = {"Accept": "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"}  # what Chromium sends


def csrf_of(html: str) -> str:
    match = re.search(r'<meta name="csrf-token" content="([^"]+)">', html)
    assert match, html[:2000]
    return match.group(1)


def sign_in(client: TestClient, token: str = ALICE) -> str:
    """Sign `client` in through the form; returns the session's CSRF token (from the page it lands on)."""
    resp = client.post("/login", data={"token": token}, follow_redirects=False)
    assert resp.status_code == 303, resp.text
    assert COOKIE in resp.cookies
    page = client.get("/", headers=HTML)
    assert page.status_code == 200
    return csrf_of(page.text)


def embedded(html: str) -> list[dict[str, Any]]:
    """The sweeps a page hands to app.js (the JSON of GET /sweeps/{id})."""
    match = re.search(r'<script type="application/json" id="sweeps-data">(.*?)</script>', html, re.S)
    assert match, html[:2000]
    return json.loads(match.group(1))  # type: ignore[no-any-return]


def submit(client: TestClient, csrf: str, spec: dict[str, Any] | None = None) -> str:
    resp = client.post("/sweeps", json=spec or tiny_spec(), headers={"X-CSRF-Token": csrf})
    assert resp.status_code == 201, resp.text
    return str(resp.json()["id"])


# ---- sign-in -------------------------------------------------------------------------------------


def test_signed_out_home_is_the_sign_in_form(client: TestClient) -> None:
    resp = client.get("/?next=/submit", headers=HTML)
    assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/html")
    assert 'action="/login"' in resp.text and 'name="token"' in resp.text and 'type="password"' in resp.text
    assert 'name="next" value="/submit"' in resp.text  # where it goes after signing in
    assert "Your sweeps" not in resp.text


def test_sign_in_with_the_api_token_then_the_list(client: TestClient) -> None:
    resp = client.post("/login", data={"token": ALICE, "next": "/submit"}, follow_redirects=False)
    assert resp.status_code == 303 and resp.headers["location"] == "/submit"
    page = client.get("/", headers=HTML)
    assert "Your sweeps" in page.text and 'signed in as <b id="owner">alice</b>' in page.text
    assert "No sweeps yet" in page.text


def test_wrong_token_shows_the_form_again_with_a_message(client: TestClient) -> None:
    resp = client.post("/login", data={"token": "not-a-token"})
    assert resp.status_code == 401
    assert "That token is not valid." in resp.text and 'action="/login"' in resp.text
    assert COOKIE not in resp.cookies


def test_one_time_link_signs_in_and_lands_on_the_list(client: TestClient) -> None:
    made = client.post("/login/once", headers=auth())
    assert made.status_code == 201, made.text
    url = made.json()["url"]
    assert re.fullmatch(r"http://testserver/login/once\?code=[\w-]{40,}", url), url
    shown = client.get(url.removeprefix("http://testserver"))
    # opening the link signs nobody in: its page holds a button that does
    assert shown.status_code == 200 and COOKIE not in shown.cookies and 'id="confirm-sign-in"' in shown.text
    code = re.search(r'name="code" value="([^"]+)"', shown.text).group(1)  # type: ignore[union-attr]
    resp = client.post("/login/once/confirm", data={"code": code, "next": "/"})
    assert resp.status_code == 200 and COOKIE in resp.cookies
    # a page of this site moves on to the list (see signed_in.html: why not a redirect)
    assert '<meta http-equiv="refresh" content="0; url=/">' in resp.text
    assert "Your sweeps" in client.get("/", headers=HTML).text


# ---- the list ------------------------------------------------------------------------------------


def test_list_shows_the_owners_sweeps_newest_first_with_progress_and_links(
    make_settings: Any, launcher: FakeLauncher
) -> None:
    settings = make_settings(mlflow_ui_url="http://127.0.0.1:5000")
    with TestClient(create_app(settings, launcher=launcher)) as client:
        csrf = sign_in(client)
        first, second = submit(client, csrf, tiny_spec("first")), submit(client, csrf, tiny_spec("second"))
        wait_until(lambda: {first, second} <= set(launcher.drivers), 10)
        progress = {
            "cells_done": 1, "cells_total": 2, "trials_done": 3, "trials_total": 6,
            "cells": [{"cell": "adamw/4", "optimizer": "adamw", "batch_size": 4, "search_done": 2, "search_total": 2,
                       "seeds_done": 1, "seeds_total": 1, "finished": True}],
        }  # fmt: skip
        launcher.set(first, progress=progress, experiment_id="5")
        launcher.finish(second, report=real_report())
        wait_until(lambda: client.get(f"/sweeps/{second}", headers=auth()).json()["status"] == "succeeded", 10)
        wait_until(lambda: client.get(f"/sweeps/{first}", headers=auth()).json()["progress"]["trials_done"] == 3, 10)

        page = client.get("/", headers=HTML)
        assert page.status_code == 200
        ids = re.findall(r'<tr data-sweep="([^"]+)"', page.text)
        assert ids == [second, first]  # newest first
        live = {s["id"]: s for s in embedded(page.text)}
        assert live[first]["status"] == "running" and live[first]["progress"]["trials_done"] == 3
        assert "3/6 trials" in page.text  # without JavaScript too
        assert f'href="/sweeps/{first}/dashboard"' in page.text
        assert 'href="http://127.0.0.1:5000/#/experiments/5/runs?workflowType=machine_learning"' in page.text
        # the finished one shows the report's answer: adamw at batch 8 is within 5% of batch 4
        row = page.text.split(f'<tr data-sweep="{second}"')[1].split("</tr>")[0]
        assert "<b>adamw</b>: vs itself: <b>" in row and "(estimate B = 8)" in row and "succeeded" in row
        # the one rendering of the answer: the dashboard's, escaped there
        assert '<ul class="answer-list"><li><b>adamw</b>' in row
        # app.js keeps the list live; nothing comes from another origin
        assert f'<script src="{static_url("app.js")}" defer></script>' in page.text
        assert not re.search(r'(src|href)="(https?:)?//(?!127\.0\.0\.1:5000/)', page.text)
        assert "script-src 'self';" in page.headers["content-security-policy"]
        assert page.headers["cache-control"] == "no-store"


def test_list_pages_by_twenty(make_settings: Any, launcher: FakeLauncher) -> None:
    with TestClient(create_app(make_settings(max_concurrent_per_owner=100), launcher=launcher)) as client:
        csrf = sign_in(client)
        ids = [submit(client, csrf, tiny_spec(f"s{i}")) for i in range(21)]
        first = client.get("/", headers=HTML).text
        assert len(re.findall(r"<tr data-sweep=", first)) == 20 and "1–20 of 21" in first
        assert 'href="/?offset=20"' in first
        older = client.get("/?offset=20", headers=HTML).text
        assert re.findall(r'<tr data-sweep="([^"]+)"', older) == [ids[0]]


# ---- one sweep -----------------------------------------------------------------------------------


def test_live_page_of_a_running_sweep_for_the_browser_409_for_the_api(
    client: TestClient, launcher: FakeLauncher
) -> None:
    csrf = sign_in(client)
    sweep_id = submit(client, csrf)
    wait_until(lambda: sweep_id in launcher.drivers, 10)
    page = client.get(f"/sweeps/{sweep_id}/dashboard", headers=HTML)
    assert page.status_code == 200 and "data-reload-on-end" in page.text
    assert f'data-cancel="{sweep_id}"' in page.text and "Cancel sweep" in page.text
    assert embedded(page.text)[0]["id"] == sweep_id
    # an API client (no text/html in Accept) keeps the API's answer
    api = client.get(f"/sweeps/{sweep_id}/dashboard", headers=auth())
    assert api.status_code == 409 and api.json()["error"]["code"] == "not_finished"

    # finished, but no figures recorded (the fake driver records nothing): the page says so, no 5xx
    launcher.finish(sweep_id)
    wait_until(lambda: client.get(f"/sweeps/{sweep_id}", headers=auth()).json()["status"] == "succeeded", 10)
    page = client.get(f"/sweeps/{sweep_id}/dashboard", headers=HTML)
    assert page.status_code == 200 and "has no recorded figures yet" in page.text
    assert "Cancel sweep" not in page.text
    assert client.get(f"/sweeps/{sweep_id}/dashboard", headers=auth()).status_code == 409


def test_cancel_from_the_page_with_its_csrf_token(client: TestClient, launcher: FakeLauncher) -> None:
    csrf = sign_in(client)
    sweep_id = submit(client, csrf)
    wait_until(lambda: client.get(f"/sweeps/{sweep_id}", headers=auth()).json()["status"] == "running", 10)
    csrf_on_page = csrf_of(client.get(f"/sweeps/{sweep_id}/dashboard", headers=HTML).text)
    assert csrf_on_page == csrf  # one token per session, on every page
    resp = client.post(f"/sweeps/{sweep_id}/cancel", headers={"X-CSRF-Token": csrf_on_page})  # what app.js sends
    assert resp.status_code == 202 and resp.json()["cancel_requested"] is True
    assert sweep_id in launcher.cancelled


def test_finished_dashboard_loads_plotly_from_static_with_the_service_bar() -> None:
    # the published page of dashboards/ (plotlyjs="relative") as the service turns it
    published = f"<!DOCTYPE html><html><head>{PLOTLYJS_TAG}</head><body><h1>x</h1></body></html>"
    served = with_service_bar(plotlyjs_from(published, PLOTLYJS_URL), '<header id="bar"></header>')
    assert f'<script charset="utf-8" src="{PLOTLYJS_URL}"></script>' in served and PLOTLYJS_TAG not in served
    assert '<body><header id="bar"></header><h1>x</h1>' in served
    assert f'<link rel="stylesheet" href="{static_url("app.css")}"></head>' in served
    assert plotlyjs_from("<html>inline already</html>", PLOTLYJS_URL) == "<html>inline already</html>"


# ---- submit --------------------------------------------------------------------------------------


def test_submit_page_starts_with_the_example(client: TestClient) -> None:
    sign_in(client)
    page = client.get("/submit", headers=HTML)
    assert page.status_code == 200 and 'enctype="multipart/form-data"' in page.text
    assert "name: demo" in page.text and 'name="csrf_token"' in page.text and 'name="idempotency_key"' in page.text


def test_check_shows_each_error_next_to_its_line(client: TestClient) -> None:
    csrf = sign_in(client)
    text = yaml.safe_dump(tiny_spec(lr={"min": -1.0, "max": 1e-2, "trials_per_batch_size": 2}), sort_keys=False)
    resp = client.post("/submit", data={"spec": text, "action": "check", "csrf_token": csrf})
    assert resp.status_code == 422
    rows = re.findall(r"<tr><td>(\d*)</td><td><code>([^<]*)</code></td><td>([^<]*)</td>", resp.text)
    assert rows, resp.text[:3000]
    line, field, message = rows[0]
    assert field == "lr.min" and "greater than 0" in message
    assert text.splitlines()[int(line) - 1].strip().startswith("min:")  # the line that says min: -1.0
    # and in the listing, under that line
    listing = resp.text.split('id="listing"')[1]
    assert re.search(
        r'<li class="bad-line"><code>\s*min: -1\.0</code>\s*<div class="inline-problem"><code>lr\.min</code>', listing
    )
    assert client.get("/sweeps", headers=auth()).json()["total"] == 0  # a check stores nothing


def test_a_parse_error_names_its_line_in_the_message(client: TestClient) -> None:
    csrf = sign_in(client)
    resp = client.post("/submit", data={"spec": "name: x\nlr: [1, 2\n", "action": "check", "csrf_token": csrf})
    assert resp.status_code == 422 and "line" in resp.text and "<code>body</code>" in resp.text


def test_check_then_submit_then_the_sweeps_page(client: TestClient, launcher: FakeLauncher) -> None:
    csrf = sign_in(client)
    text = yaml.safe_dump(tiny_spec("from-page"))
    ok = client.post("/submit", data={"spec": text, "action": "check", "csrf_token": csrf})
    assert ok.status_code == 200 and "Valid: 2 cells, 7 trials" in ok.text
    key = re.search(r'name="idempotency_key" value="([^"]+)"', ok.text).group(1)  # type: ignore[union-attr]
    form = {"spec": text, "action": "submit", "csrf_token": csrf, "idempotency_key": key}
    resp = client.post("/submit", data=form, follow_redirects=False)
    assert resp.status_code == 303
    sweep_id = resp.headers["location"].removeprefix("/sweeps/").removesuffix("/dashboard")
    assert sweep_id.startswith("from-page-")
    wait_until(lambda: sweep_id in launcher.started, 10)
    # the same form sent again (a double click, a reload) is the same sweep
    again = client.post("/submit", data=form, follow_redirects=False)
    assert again.headers["location"] == resp.headers["location"]
    assert client.get("/sweeps", headers=auth()).json()["total"] == 1


def test_upload_a_file(client: TestClient) -> None:
    csrf = sign_in(client)
    files = {"file": ("spec.yaml", yaml.safe_dump(tiny_spec("uploaded")).encode(), "application/yaml")}
    resp = client.post(
        "/submit", data={"spec": "", "action": "submit", "csrf_token": csrf}, files=files, follow_redirects=False
    )
    assert resp.status_code == 303 and "/sweeps/uploaded-" in resp.headers["location"]
    bad = client.post(
        "/submit", data={"action": "check", "csrf_token": csrf}, files={"file": ("x.yaml", b"\xff\xfe", "text/plain")}
    )
    assert bad.status_code == 422 and "x.yaml" in bad.text and "is not UTF-8 text" in bad.text


def test_checks_count_as_dry_runs(make_settings: Any, launcher: FakeLauncher) -> None:
    with TestClient(create_app(make_settings(dry_run_burst=1, dry_run_refill_s=60), launcher=launcher)) as client:
        csrf = sign_in(client)
        form = {"spec": yaml.safe_dump(tiny_spec()), "action": "check", "csrf_token": csrf}
        assert client.post("/submit", data=form).status_code == 200
        resp = client.post("/submit", data=form)
        assert resp.status_code == 429 and int(resp.headers["retry-after"]) > 0 and "dry runs" in resp.text


# ---- static files --------------------------------------------------------------------------------


def test_plotly_is_served_once_with_long_caching(client: TestClient) -> None:
    from plotly.offline import get_plotlyjs

    resp = client.get(PLOTLYJS_URL)
    assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/javascript")
    assert resp.text == get_plotlyjs()  # the installed package's file, as dashboards/ would inline it
    assert resp.headers["cache-control"] == "public, max-age=31536000, immutable"
    assert client.get("/static/plotly-0.0.1.min.js").status_code == 404


@pytest.mark.parametrize("name", ["app.js", "app.css"])
def test_static_files_are_named_by_their_content(client: TestClient, name: str) -> None:
    url = static_url(name)
    assert re.fullmatch(rf"/static/{re.escape(name)}\?v=[0-9a-f]{{12}}", url)
    resp = client.get(url)
    assert resp.status_code == 200 and "immutable" in resp.headers["cache-control"]
    assert client.get("/static/../settings.py").status_code == 404
    assert client.get("/static/nothing.js").status_code == 404


def test_the_list_s_answer_reads_reports_as_every_reader_does() -> None:
    report = real_report()
    shown = answer_of(report)
    assert shown is not None and "adamw" in shown and "vs itself" in shown
    # a newer writer's added top-level field is left out (sweeps.analysis.read_report), as the CLI and
    # the dashboards do; a report of another shape shows no answer rather than a wrong one
    assert answer_of({**report, "added_later": 1}) == shown
    broken = json.loads(json.dumps(report))
    broken["optimizers"]["adamw"].pop("cells")
    assert answer_of(broken) is None
