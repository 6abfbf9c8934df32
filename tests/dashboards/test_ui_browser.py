"""A person in a browser, end to end: headless Chromium (Debian's, driven by Playwright; see
conftest.py) against `sweeps serve` as the README runs it (its own local Ray head, SQLite stores) and
an MLflow UI on the same store, as `make demo` runs them.

Sign in (a wrong token first), submit a tiny sweep from the submit page (a bad spec first: its error
shows next to its line), watch the list update while it runs, see a sweep submitted elsewhere appear,
cancel that second sweep from its page, watch the first one's page turn into its dashboard (plotly.js
from the service, once), follow the MLflow link to the sweep's runs, sign out. No console errors,
failed requests or answers >= 400 on the service's pages; screenshots of every step are kept in
$SWEEPS_TEST_ARTIFACTS (default: the test's tmp_path), whose path the test prints.

Slow (about 3 minutes on the 2-core machine): run it under the heavy-work lock.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import httpx
import pytest
import yaml
from harness import ServiceProcess, tiny_spec
from playwright.sync_api import Browser, BrowserContext, ConsoleMessage, Page, Response, expect

from service.api.sessions import COOKIE
from service.cluster.processes import free_port
from service.cluster.ray_head import LocalRayHead
from service.web.pages import PLOTLYJS_URL
from sweeps.layout import KIND_TAG, KIND_TRAINING

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.timeout(900)]

BIN = Path(sys.executable).parent
TOKEN = "alice-browser-token-0123456789"
BOB_TOKEN = "bob-browser-token-0123456789"
# what the service must not inherit from the test's environment: it runs on its embedded defaults
EMBEDDED = ("RAY_ADDRESS", "MLFLOW_TRACKING_URI", "SWEEPS_OPTUNA_STORAGE", "SWEEPS_DATABASE_URL", "RAY_AUTH_TOKEN")


def close_reloading(page: Page) -> None:
    """Close a page of the service that reloads itself (the list when a sweep ends or appears, a dashboard
    when its sweep ends). A close that races such a reload's commit is acknowledged by Chromium and then
    dropped, and `page.close()`, which waits for the page to be gone, waits forever (upstream:
    microsoft/playwright issues 42366 and 42068; it hung this test for 15 minutes in a clean-clone run).
    With run_before_unload=True Playwright sends the close without that wait (the service's pages have no
    beforeunload handler); closing the context at the end ends the page for good."""
    page.close(run_before_unload=True)


def tiny(name: str, **overrides: Any) -> dict[str, Any]:
    """gpt2-nano, 2 batch sizes, 1 search trial (2 at the reference, the smaller) and 1 confirmation run
    each: 5 trials of 8192 tokens."""
    small = {"token_budget": 8192, "eval_every_tokens": 2048, "eval_tokens": 4096}
    return tiny_spec(name, **(small | {"lr": {"min": 1e-3, "max": 1e-2, "trials_per_batch_size": 1}} | overrides))


@dataclass
class Stack:
    url: str
    mlflow_url: str
    data_dir: Path
    service: ServiceProcess


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, token_cache: Path) -> Iterator[Stack]:
    root = tmp_path_factory.mktemp("ui")
    data_dir = root / "data"
    mlflow_port = free_port()
    mlflow_url = f"http://127.0.0.1:{mlflow_port}"
    port = free_port()
    env = {
        "SWEEPS_DATA_DIR": str(data_dir),
        "SWEEPS_TOKENS": f"alice={TOKEN},bob={BOB_TOKEN}",
        "SWEEPS_POLL_INTERVAL_S": "0.5",
        "MLFLOW_UI_URL": mlflow_url,
        "BATCHSWEEP_CACHE": str(token_cache),
    }
    command = [str(BIN / "sweeps"), "serve", "--host", "127.0.0.1", "--port", str(port)]
    svc = ServiceProcess(env=env, log_path=root / "api.log", port=port, command=command, unset=EMBEDDED)
    mlflow = None
    try:
        svc.start(timeout_s=180)  # its lifespan made the MLflow store: the UI below only reads it
        with (root / "mlflow.log").open("wb") as out:
            mlflow = subprocess.Popen(
                [str(BIN / "mlflow"), "server", "--backend-store-uri", f"sqlite:///{data_dir / 'mlflow.db'}",
                 "--host", "127.0.0.1", "--port", str(mlflow_port), "--workers", "1"],
                cwd=root, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
        yield Stack(svc.url, mlflow_url, data_dir, svc)
    finally:
        svc.stop()
        LocalRayHead(data_dir).stop()  # the head `sweeps serve` started, by its pid
        if mlflow is not None:
            os.killpg(mlflow.pid, signal.SIGTERM)  # the server and its worker: the group we started
            try:
                mlflow.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(mlflow.pid, signal.SIGKILL)
                mlflow.wait(timeout=30)


@dataclass
class Watch:
    """What goes wrong on the pages of one origin: JS exceptions, console errors, failed requests and
    answers >= 400 (a request the page dropped itself, as a reload does its event streams, is not
    wrong), and every URL they load."""

    origin: str
    errors: list[str] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)

    def expected(self, status: int, url: str) -> None:
        """Forget the one answer `status` from `url` so far (and the console line Chromium logs for it)."""
        ours = (f"HTTP {status}: {url}", f"status of {status} (")
        left = [e for e in self.errors if not (url in e and any(o in e for o in ours))]
        assert len(self.errors) - len(left) == 2, self.errors  # the answer and its console line
        self.errors = left

    def attach(self, page: Page) -> Page:
        def on_console(msg: ConsoleMessage) -> None:
            if msg.type == "error" and msg.location.get("url", "").startswith(self.origin):
                self.errors.append(f"console.error: {msg.text} {msg.location}")

        def on_response(resp: Response) -> None:
            if resp.url.startswith(self.origin) and resp.status >= 400:
                self.errors.append(f"HTTP {resp.status}: {resp.url}")

        def on_failed(req: Any) -> None:
            # ERR_ABORTED: the browser itself dropped it (the page went on: an event stream, a poll)
            if req.url.startswith(self.origin) and req.failure != "net::ERR_ABORTED":
                self.errors.append(f"request failed: {req.url} ({req.failure})")

        page.on("request", lambda req: self.requests.append(req.url))
        page.on("pageerror", lambda exc: self.errors.append(f"exception on {page.url}: {exc}"))
        page.on("console", on_console)
        page.on("requestfailed", on_failed)
        page.on("response", on_response)
        return page


def wait_js(page: Page, expression: str, timeout_s: float) -> Any:
    # as a function: Playwright calls it through the DevTools protocol; an expression it would eval()
    # in the page, which the service's Content-Security-Policy forbids
    return page.wait_for_function(f"() => ({expression})", timeout=timeout_s * 1000, polling=250).json_value()


class Shots:
    def __init__(self, folder: Path) -> None:
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        print(f"\nscreenshots of the browser test: {folder}")

    def __call__(self, page: Page, name: str) -> None:
        # a record for people, not a check: a full page's capture waits on the renderer, which the suite's
        # other half (Ray, a second browser) can hold past Playwright's default 30 s on two cores
        page.screenshot(path=str(self.folder / f"{name}.png"), full_page=True, timeout=120_000)


@pytest.fixture
def shots(tmp_path: Path) -> Shots:
    return Shots(Path(os.environ.get("SWEEPS_TEST_ARTIFACTS") or tmp_path) / "ui-browser")


def status_of(stack: Stack, sweep_id: str) -> dict[str, Any]:
    resp = httpx.get(f"{stack.url}/sweeps/{sweep_id}", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30)
    resp.raise_for_status()
    return resp.json()  # type: ignore[no-any-return]


def test_a_person_in_a_browser(stack: Stack, browser: Browser, shots: Shots) -> None:
    started = time.monotonic()
    watch = Watch(stack.url)
    context: BrowserContext = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = watch.attach(context.new_page())
    try:
        _run(stack, context, page, watch, shots)
    except Exception:
        shots(page, "failure")
        print(stack.service.tail())
        raise
    finally:
        context.close()
        print(f"browser test took {time.monotonic() - started:.0f} s")
    assert watch.errors == []


def _run(stack: Stack, context: BrowserContext, page: Page, watch: Watch, shots: Shots) -> None:
    # ---- sign in: a wrong token is refused with a message, the right one lands on the (empty) list
    page.goto(f"{stack.url}/", wait_until="load")
    assert page.locator("#sign-in").is_visible()
    shots(page, "01-sign-in")
    page.fill("#token", "not-the-token")
    page.click("#sign-in button[type=submit]")
    page.wait_for_selector("#message")
    assert "not valid" in page.inner_text("#message")
    watch.expected(401, f"{stack.url}/login")  # this step's point, not an error of the page
    page.fill("#token", TOKEN)
    page.click("#sign-in button[type=submit]")
    page.wait_for_selector("#empty")
    assert page.inner_text("#owner") == "alice"
    cookie = next(c for c in context.cookies() if c["name"] == COOKIE)
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict"

    # ---- the submit page: a bad spec shows its error next to its line, a good one is checked, then runs
    page.click("text=New sweep")
    page.wait_for_selector("#spec")
    page.fill("#spec", yaml.safe_dump(tiny("ui-first", lr={"min": -1.0, "max": 1e-2, "trials_per_batch_size": 1})))
    page.click("#check")
    page.wait_for_selector("#listing .bad-line")
    bad_line = page.inner_text("#listing .bad-line")
    assert "min: -1.0" in bad_line and "lr.min" in bad_line and "greater than 0" in bad_line
    shots(page, "02-submit-error-next-to-its-line")
    watch.expected(422, f"{stack.url}/submit")
    page.fill("#spec", yaml.safe_dump(tiny("ui-first")))
    page.click("#check")
    page.wait_for_selector("#message")
    assert "Valid: 2 cells, 5 trials" in page.inner_text("#message")  # + the reference's one more search
    page.click("#submit")
    page.wait_for_url(re.compile(r".*/sweeps/ui-first-[0-9a-f]{8}/dashboard$"))
    first = page.url.rsplit("/", 2)[1]
    assert page.locator("#cancel").is_visible()  # its live page; it stays open in this tab
    page.evaluate("window.__sameDocument = true")

    # ---- the list, in a second tab, follows it live (no reload: a marker in the page survives), per cell
    tab = watch.attach(context.new_page())
    tab.goto(f"{stack.url}/", wait_until="load")
    tab.evaluate("window.__sameDocument = true")
    row = f'[data-sweep="{first}"]'
    tab.wait_for_selector(f'{row} [data-cell="adamw/bs4"]')
    wait_js(
        tab,
        f"""window.__sameDocument === true &&
            document.querySelector('{row} [data-status-text]').textContent === 'running' &&
            /^[1-9]\\d*\\/5 trials$/.test(document.querySelector('{row} [data-trials]').textContent)""",
        timeout_s=300,
    )
    shots(tab, "03-list-live")

    # ---- a sweep submitted elsewhere (the API) shows up by itself; cancel it from its page
    longer = tiny(
        "ui-second", token_budget=32768, eval_every_tokens=4096,  # 8 evaluations a trial, not 16
        lr={"min": 1e-3, "max": 1e-2, "trials_per_batch_size": 4},
        resources={"max_concurrent_trials": 1}, pruning={"enabled": False},
    )  # fmt: skip
    resp = httpx.post(f"{stack.url}/sweeps", json=longer, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30)
    assert resp.status_code == 201, resp.text
    second = resp.json()["id"]
    tab.wait_for_selector(f'[data-sweep="{second}"]', timeout=30_000)
    tab.click(f'[data-sweep="{second}"] a[data-link="dashboard"]')
    tab.wait_for_url(f"**/sweeps/{second}/dashboard")
    tab.wait_for_selector("#cancel")
    deadline = time.monotonic() + 120
    while status_of(stack, second)["status"] != "running":
        assert time.monotonic() < deadline, status_of(stack, second)
        time.sleep(0.5)
    # its curves grow while it runs: redrawn from the event stream, without a reload of the page
    tab.evaluate("window.__sameDocument = true")
    holder = "document.querySelector('[data-curves]').dataset"
    wait_js(tab, f"Number({holder}.points || 0) > 0", timeout_s=240)
    first_points = int(tab.evaluate(f"{holder}.points"))
    wait_js(tab, f"Number({holder}.points) > {first_points} && Number({holder}.updates) >= 2", timeout_s=240)
    assert tab.evaluate("window.__sameDocument") is True
    assert tab.locator("#live-curves .js-plotly-plot").count() == 1
    shots(tab, "03b-live-curves")
    # and MLflow is linked while it runs: the experiment exists before the first trial
    tab.reload(wait_until="load")
    experiment_id = status_of(stack, second)["experiment_id"]
    assert experiment_id and f"/#/experiments/{experiment_id}" in (tab.get_attribute("#mlflow-link", "href") or "")
    tab.click("#cancel")
    wait_js(tab, "document.getElementById('cancel-note').textContent.includes('cancel requested')", 30)
    shots(tab, "04-cancel-requested")
    # the page follows it to the end: cancelled, nothing left to cancel
    wait_js(
        tab,
        "document.querySelector('[data-status-text]')?.textContent === 'cancelled' && !document.getElementById('cancel')",
        timeout_s=240,
    )
    assert status_of(stack, second)["status"] == "cancelled"
    shots(tab, "05-cancelled")
    close_reloading(tab)  # it reloads itself now that the sweep ended

    # ---- the first one's page turned into its dashboard when it finished: the figures, plotly.js once
    wait_js(page, "document.querySelectorAll('.js-plotly-plot').length >= 6", timeout_s=420)
    assert page.evaluate("window.__sameDocument") is None  # it loaded again by itself
    assert status_of(stack, first)["status"] == "succeeded"
    assert "largest degradation-free batch size" in page.inner_text("#answer").lower()
    assert page.inner_text(".svc-bar [data-status-text]") == "succeeded"
    plotly_loads = [u for u in watch.requests if "plotly" in u and u.endswith(".js")]
    assert plotly_loads and set(plotly_loads) == {f"{stack.url}{PLOTLYJS_URL}"}, plotly_loads
    assert all(u.startswith((stack.url, "data:", "blob:", "about:")) for u in watch.requests), (
        "the service's pages load nothing from elsewhere"
    )
    shots(page, "06-dashboard")

    # ---- back on the list: the answer, and the MLflow link opens the sweep's runs
    page.goto(f"{stack.url}/", wait_until="load")
    answer = page.inner_text(f'[data-sweep="{first}"] .answer')
    assert re.search(
        r"adamw: vs itself: (fine up to|degraded from|undecided).*\(estimate (B = \d+|none)(; [\d or]+, within noise)?\)",
        answer,
    ), answer
    with context.expect_page() as opened:
        page.click(f'[data-sweep="{first}"] a[data-link="mlflow"]')
    mlflow = opened.value
    # a page opened by a click has no body until its document parses (CI's predicate once read a null body)
    mlflow.wait_for_load_state("load")
    assert "workflowType=machine_learning" in mlflow.url
    experiment_id = status_of(stack, first)["experiment_id"]
    assert f"/#/experiments/{experiment_id}/runs" in mlflow.url
    wait_js(
        mlflow,
        "document.body?.innerText.includes('adamw bs=4') && document.body?.innerText.includes('adamw bs=8')",
        180,
    )
    expanded = mlflow.evaluate(
        "(() => { const b = [...document.querySelectorAll('button[data-component-id*=\"runnamecellrenderer\"]')];"
        " b.forEach(x => x.click()); return b.length; })()"
    )
    assert expanded == 2, "one expander per cell run (1 optimizer x 2 batch sizes), trials nested under them"
    wait_js(mlflow, "document.body?.innerText.includes('adamw bs=4 lr=')", 60)
    text = mlflow.evaluate("document.body.innerText")
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{stack.data_dir / 'mlflow.db'}")
    assert client.get_experiment(experiment_id).tags[KIND_TAG] == KIND_TRAINING  # not a GenAI experiment
    runs = client.search_runs([experiment_id], max_results=100)
    missing = [r.info.run_name for r in runs if r.info.run_name not in text]
    assert not missing, f"runs of the sweep not shown in the MLflow UI: {missing}"
    shots(mlflow, "07-mlflow-runs")
    # val loss against tokens with no configuration: every cell run carries its confirmation run's
    # curve (step = tokens), so MLflow's chart view of the experiment draws it
    cells = [r for r in runs if r.data.tags.get("batchsweep.role") == "cell"]
    assert len(cells) == 2
    for cell in cells:
        curve = client.get_metric_history(cell.info.run_id, "val_loss")
        assert len(curve) >= 2 and [m.step for m in curve] == sorted(m.step for m in curve)
    charts = context.new_page()  # the experiment's Chart view, as its toggle opens it
    charts.goto(
        mlflow.url.replace("workflowType=machine_learning", "workflowType=machine_learning&compareRunsMode=CHART")
    )
    # its charts render as they scroll into view (one section per metric prefix; val_loss is in the
    # last, "Model metrics"): scroll every scrolled pane down while waiting
    scroll_down = (
        "document.querySelectorAll('*').forEach(e => { if (e.scrollHeight > e.clientHeight + 50) "
        "e.scrollTop = e.scrollHeight; })"
    )
    wait_js(charts, f"({scroll_down}, document.body?.innerText.includes('adamw bs=4 (val_loss)'))", 120)
    assert "adamw bs=8 (val_loss)" in charts.evaluate("document.body.innerText")
    shots(charts, "07b-mlflow-charts")
    charts.close()
    mlflow.close()

    # ---- the API docs `make demo` links to: Swagger UI draws the operations from this origin alone
    docs = Watch(stack.url)
    docs_page = docs.attach(context.new_page())
    docs_page.goto(f"{stack.url}/docs", wait_until="load")
    docs_page.wait_for_selector(".opblock", timeout=60_000)
    paths = docs_page.locator(".opblock-summary-path").all_inner_texts()
    assert "/sweeps" in paths and "/sweeps/{sweep_id}/report" in paths, paths
    assert all(u.startswith((stack.url, "data:", "blob:", "about:")) for u in docs.requests), docs.requests
    assert docs.errors == []
    shots(docs_page, "07c-api-docs")
    docs_page.close()

    # ---- sign out: back to the form, and the old cookie is dead on the server too
    page.click("#sign-out")
    page.wait_for_selector("#sign-in")
    assert COOKIE not in {c["name"] for c in context.cookies()}
    dead = httpx.get(f"{stack.url}/sweeps", cookies={COOKIE: cookie["value"]}, timeout=30)
    assert dead.status_code == 401
    shots(page, "08-signed-out")


def test_a_search_of_the_batch_axis_in_the_browser(stack: Stack, browser: Browser, shots: Shots) -> None:
    """A `{min, max}` spec through `sweeps serve` on embedded defaults ends with a bracket; its tested
    sizes and the decision at each step show on the dashboard and the list, and MLflow tags each cell."""
    spec = tiny("ui-search", batch_sizes={"min": 4, "max": 16, "resolution": 2.0}, seeds=2)
    resp = httpx.post(f"{stack.url}/sweeps", json=spec, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30)
    assert resp.status_code == 201, resp.text
    sweep_id = resp.json()["id"]
    deadline = time.monotonic() + 600
    while (s := status_of(stack, sweep_id))["status"] not in ("succeeded", "failed", "cancelled"):
        assert time.monotonic() < deadline, s
        time.sleep(1)
    assert s["status"] == "succeeded", f"{s}\n{stack.service.tail()}"
    report = httpx.get(
        f"{stack.url}/sweeps/{sweep_id}/report", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30
    ).json()
    assert report["batch_search"]["lattice"] == [4, 8, 16]
    adamw = report["optimizers"]["adamw"]
    steps = adamw["search_steps"]
    assert steps[0]["batch_size"] == 4 and steps[0]["chosen"] == "reference"
    assert [c["batch_size"] for c in adamw["cells"]] == sorted(st["batch_size"] for st in steps)
    assert set(adamw["bracket"]["baseline"]) == {"largest_fine", "smallest_degraded", "contradictions", "lr_checked"}
    assert adamw["bracket"]["baseline"]["largest_fine"] in (4, 8, 16)  # the reference is fine against itself

    watch = Watch(stack.url)
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = watch.attach(context.new_page())
    try:
        page.goto(f"{stack.url}/", wait_until="load")
        page.fill("#token", TOKEN)
        page.click("#sign-in button[type=submit]")
        page.wait_for_selector(f'[data-sweep="{sweep_id}"] .answer')
        listed = page.inner_text(f'[data-sweep="{sweep_id}"] .search-steps')
        assert listed == "tested in order: " + " → ".join(f"{st['batch_size']} ({st['chosen']})" for st in steps)
        page.goto(f"{stack.url}/sweeps/{sweep_id}/dashboard", wait_until="load")
        page.wait_for_selector("#batch-search table.search-steps")
        rows = page.locator('#batch-search table[data-optimizer="adamw"] tbody tr').all()
        assert len(rows) == len(steps)
        for row, st in zip(rows, steps, strict=True):
            cells = row.locator("td").all_inner_texts()
            assert cells[0] == str(st["order"]) and cells[1] == f"B = {st['batch_size']}"
            assert cells[2].startswith(st["chosen"]) and cells[3] == st["why"]
        # the bracket after the last step is the report's
        lo, hi = adamw["bracket"]["baseline"]["largest_fine"], adamw["bracket"]["baseline"]["smallest_degraded"]
        assert (
            rows[-1].locator("td").all_inner_texts()[5]
            == f"[{lo if lo is not None else '-'}, {hi if hi is not None else '-'})"
        )
        shots(page, "09-batch-search-dashboard")
    finally:
        context.close()
    assert watch.errors == []

    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{stack.data_dir / 'mlflow.db'}")
    cells = client.search_runs([s["experiment_id"]], "tags.`batchsweep.role` = 'cell'", max_results=100)
    chosen = {int(r.data.tags["batchsweep.batch_size"]): r.data.tags["batchsweep.chosen"] for r in cells}
    assert chosen == {st["batch_size"]: st["chosen"] for st in steps}
    assert all(r.data.tags["batchsweep.chosen_why"] for r in cells)
    trials = client.search_runs([s["experiment_id"]], "tags.`batchsweep.role` = 'confirm'", max_results=100)
    assert trials and all(
        t.data.tags["batchsweep.chosen"] == chosen[int(t.data.tags["batchsweep.batch_size"])] for t in trials
    )


def test_a_link_of_another_account_switches_nobody_until_confirmed_and_sign_out_ends_streams(
    stack: Stack, browser: Browser, shots: Shots
) -> None:
    """Signed in as alice, the browser opens a one-time link made for bob (as a page of another site
    could make it do): nobody is switched until the person presses the button; a `next` to another host
    is dropped; and signing out ends the event streams that session had open."""
    bob = {"Authorization": f"Bearer {BOB_TOKEN}"}
    link = httpx.post(f"{stack.url}/login/once", headers=bob, timeout=30)
    assert link.status_code == 201, link.text
    url = link.json()["url"]
    watch = Watch(stack.url)
    context = browser.new_context()
    page = watch.attach(context.new_page())
    try:
        page.goto(f"{stack.url}/", wait_until="load")
        page.fill("#token", TOKEN)
        page.click("#sign-in button[type=submit]")
        page.wait_for_selector("#owner")
        assert page.inner_text("#owner") == "alice"
        # the link, with a `next` to another host: the page warns, and signs nobody in by itself
        other = watch.attach(context.new_page())
        other.goto(url + "&next=//evil.example/steal", wait_until="load")
        assert "signed in as alice" in other.inner_text("#switch")
        assert other.input_value("#confirm-sign-in input[name=next]") == "/"
        page.reload(wait_until="load")
        assert page.inner_text("#owner") == "alice"  # opening the link changed nothing
        shots(other, "10-link-of-another-account")
        with other.expect_navigation():
            other.click("#confirm-sign-in button[type=submit]")
        assert urlparse(other.url).netloc == urlparse(stack.url).netloc  # not sent to the other host
        # sent to "/" (the link's safe `next`); no goto of our own: the list reloads itself when a sweep of
        # bob's ends or a new one shows up, and such a reload would cut a navigation of the test's short
        other.wait_for_url(f"{stack.url}/", wait_until="load")
        expect(other.locator("#owner")).to_have_text("bob")  # the person pressed the button: now bob
        close_reloading(other)

        # bob's running sweep, followed by an event stream of this (cookie) session; then sign out
        resp = httpx.post(
            f"{stack.url}/sweeps",
            json=tiny("ui-stream", token_budget=65536, eval_every_tokens=8192,
                      lr={"min": 1e-3, "max": 1e-2, "trials_per_batch_size": 4},
                      resources={"max_concurrent_trials": 1}, pruning={"enabled": False}),
            headers=bob, timeout=30,
        )  # fmt: skip
        assert resp.status_code == 201, resp.text
        sweep_id = resp.json()["id"]
        # the stream in a tab of its own (on a page that runs nothing else: /healthz's JSON), as signing
        # out (a form) navigates the tab it is pressed in
        streaming = watch.attach(context.new_page())
        # a JSON page declares no icon: Chromium asks for /favicon.ico, which the service has not
        streaming.route("**/favicon.ico", lambda route: route.fulfill(status=204))
        streaming.goto(f"{stack.url}/healthz", wait_until="load")
        streaming.evaluate(
            f"""() => {{ window.__es = new EventSource('/sweeps/{sweep_id}/events');
                window.__events = 0; window.__es.addEventListener('progress', () => window.__events++); }}"""
        )
        wait_js(streaming, "window.__events > 0 && window.__es.readyState === 1", 60)
        # the list open in another tab too: it polls for new sweeps every 5 s
        listing = watch.attach(context.new_page())
        listing.goto(f"{stack.url}/", wait_until="load")
        listing.evaluate("window.__sameDocument = true")
        page.goto(f"{stack.url}/", wait_until="load")
        page.click("#sign-out")
        page.wait_for_selector("#sign-in")
        # the stream ends within a second or two of the sign-out, and reconnecting is refused (401): closed
        wait_js(streaming, "window.__es.readyState === 2", 30)
        # the other list's next poll is refused, once, and that tab shows the sign-in form by itself; the
        # tab that signed out stopped its own poll first, so it met no 401 (what is left is checked below)
        wait_js(listing, "window.__sameDocument === undefined && document.getElementById('sign-in') !== null", 30)
        watch.expected(401, f"{stack.url}/sweeps?limit=1")
        # the event streams of both tabs (the list follows bob's running sweep too) ended the same way
        stream = [e for e in watch.errors if f"/sweeps/{sweep_id}/events" in e or "EventSource" in e]
        assert any(e.startswith("HTTP 401") for e in stream), watch.errors  # this step's point, not an error
        watch.errors = [e for e in watch.errors if e not in stream]
        httpx.post(f"{stack.url}/sweeps/{sweep_id}/cancel", headers=bob, timeout=30)
    finally:
        context.close()
    assert watch.errors == []
