"""End to end in headless Chromium (Debian's `chromium`, driven by Playwright): the dashboard page of
the real tiny sweep, and the MLflow UI's pages of its experiment and summary run.
Screenshots go to the test's tmp_path, and a copy of each to /tmp/dashboards-shots/."""

from __future__ import annotations

import functools
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser, ConsoleMessage, Page, Response

from dashboards import build_figures, load_sweep, publish, render_dashboard
from sweeps.analysis import describe_bracket
from sweeps.report import describe_noise

pytestmark = pytest.mark.ray

SHOTS = Path("/tmp/dashboards-shots")
BIN = Path(sys.executable).parent
# URLs a self-contained page may load: itself, and what it makes in memory
LOCAL = ("http://127.0.0.1", "data:", "blob:", "about:")


def new_page(browser: Browser, height: int = 1000) -> tuple[Page, list[str], list[str]]:
    """A page, and two lists it fills from now on: every URL it requests, and what goes wrong (JS
    exceptions, console.error calls, Chromium's own error messages, failed requests, answers >= 400)."""
    page = browser.new_page(viewport={"width": 1400, "height": height})
    urls: list[str] = []
    errors: list[str] = []

    def on_console(msg: ConsoleMessage) -> None:
        if msg.type == "error":
            errors.append(f"console.error: {msg.text} {msg.location.get('url', '')}")

    def on_response(resp: Response) -> None:
        if resp.status >= 400:
            errors.append(f"HTTP {resp.status}: {resp.url}")

    page.on("request", lambda req: urls.append(req.url))
    page.on("pageerror", lambda exc: errors.append(f"exception: {exc}"))
    page.on("console", on_console)
    page.on("requestfailed", lambda req: errors.append(f"request failed: {req.url} ({req.failure})"))
    page.on("response", on_response)
    return page, urls, errors


def wait_for(page: Page, expression: str, timeout: float) -> Any:
    """Poll a JS expression until it is truthy; returns its value."""
    return page.wait_for_function(expression, timeout=timeout * 1000, polling=250).json_value()


def goto(page: Page, url: str, timeout: float = 60.0) -> None:
    page.goto(url, wait_until="load", timeout=timeout * 1000)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _keep(shot: Path) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    shutil.copy(shot, SHOTS / shot.name)


class _Quiet(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


def test_dashboard_page_renders_without_errors(tiny_sweep, browser: Browser, tmp_path: Path) -> None:
    outcome, _ = tiny_sweep
    sweep = load_sweep(outcome.tracking_uri, outcome.sweep_id)
    figs = build_figures(sweep)
    site = tmp_path / "site"
    site.mkdir()
    (site / "index.html").write_text(render_dashboard(sweep, figs), encoding="utf-8")
    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Quiet, directory=str(site)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    page, urls, errors = new_page(browser)
    try:
        goto(page, f"http://127.0.0.1:{server.server_port}/index.html")
        # every figure became a plotly plot, and each drew its traces
        wait_for(page, f"document.querySelectorAll('.js-plotly-plot').length === {len(figs)}", timeout=60)
        traces = page.evaluate(
            "[...document.querySelectorAll('.js-plotly-plot')]"
            ".map(d => d.querySelectorAll('.scatterlayer .trace').length)"
        )
        assert len(traces) == len(figs) and all(n > 0 for n in traces), traces
        # the page is readable without JavaScript errors (and without failed loads)
        assert errors == []
        # self-contained: nothing was fetched from anywhere but the page's own server
        assert urls and all(u.startswith(LOCAL) for u in urls), urls
        # the answer at the top, and the star drawn at the report's batch size
        answer = page.evaluate("document.getElementById('answer').innerText")
        for opt, o in outcome.report.optimizers.items():
            bs = o.largest_degradation_free_batch_size.self
            decided = describe_bracket(o.bracket.self)
            noise = describe_noise(o, "self")
            estimate = f"{'none' if bs is None else f'B = {bs}'}{f'; {noise}' if noise else ''}"
            assert f"{opt}: vs itself: {decided} (estimate {estimate})" in answer
            stars = page.evaluate(
                f"document.getElementById('fig-scaling').data.filter(t => t.name.startsWith('{opt}: largest "
                "degradation-free B = ') && t.name.includes('itself')).map(t => t.x[0])"
            )
            assert stars == ([bs] if bs is not None else [])
        top = page.evaluate("document.getElementById('answer').getBoundingClientRect().top")
        first_fig = page.evaluate("document.querySelector('.js-plotly-plot').getBoundingClientRect().top")
        assert top < first_fig  # the answer is above the figures
        _keep(screenshot(page, tmp_path / "dashboard.png"))
    finally:
        page.close()
        server.shutdown()


def screenshot(page: Page, path: Path, *, full_page: bool = True) -> Path:
    page.screenshot(path=path, full_page=full_page, timeout=60_000)
    return path


def _wait_healthy(url: str, proc: subprocess.Popen, log: Path, timeout: float = 180.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"mlflow server exited ({proc.returncode}):\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(url, timeout=5) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(1)
    raise AssertionError(f"mlflow server not healthy after {timeout} s:\n{log.read_text()[-3000:]}")


CLICK_TEXT = """(() => {
  const els = [...document.querySelectorAll('body *')].filter(e => e.textContent.trim() === %r);
  if (!els.length) return false;
  els[els.length - 1].click();
  return true;
})()"""


def test_mlflow_ui_shows_nested_runs_and_figures(tiny_sweep, browser: Browser, tmp_path: Path) -> None:
    outcome, _ = tiny_sweep
    publish(outcome.tracking_uri, outcome.sweep_id, tmp_path / "published")
    port = free_port()
    log = tmp_path / "mlflow-server.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [
                str(BIN / "mlflow"),
                "server",
                "--backend-store-uri",
                outcome.tracking_uri,
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--workers",
                "1",
            ],
            cwd=tmp_path,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    base = f"http://127.0.0.1:{port}"
    page, _, _ = new_page(browser, height=1300)
    try:
        _wait_healthy(f"{base}/health", proc, log)
        # MLflow 3's UI opens an experiment on its GenAI overview; the runs table is /runs
        goto(page, f"{base}/#/experiments/{outcome.experiment_id}/runs")
        wait_for(page, "document.body?.innerText.includes('adamw bs=4')", timeout=120)
        # the cell runs are parents: expand them and their trials appear, named by optimizer, batch, lr, seed
        expanded = page.evaluate(
            "(() => { const b = [...document.querySelectorAll("
            "'button[data-component-id*=\"runnamecellrenderer\"]')]; b.forEach(x => x.click());"
            " return b.length; })()"
        )
        assert expanded == 4, "expected one expander per cell run (2 optimizers x 2 batch sizes)"
        wait_for(page, "document.body?.innerText.includes('adamw bs=4 lr=')", timeout=60)
        text = page.evaluate("document.body.innerText")
        client_names = [r.info.run_name for r in _runs(outcome)]
        missing = [n for n in client_names if n not in text]
        assert not missing, f"run names not shown in the MLflow UI: {missing}"
        _keep(screenshot(page, tmp_path / "mlflow-experiment.png", full_page=False))

        # the figures are artifacts of the summary run; the PNG previews in the artifact browser
        goto(page, f"{base}/#/experiments/{outcome.experiment_id}/runs/{outcome.summary_run_id}/artifacts")
        wait_for(page, "document.body?.innerText.includes('report.json')", timeout=60)
        assert page.evaluate(CLICK_TEXT % "figures")
        wait_for(page, "document.body?.innerText.includes('scaling.png')", timeout=30)
        assert page.evaluate(CLICK_TEXT % "scaling.png")
        # the preview is a blob image of the PNG's real size
        width = wait_for(
            page,
            "[...document.images].filter(i => i.src.startsWith('blob:') && i.complete).map(i => i.naturalWidth)[0]",
            timeout=30,
        )
        assert width > 500
        _keep(screenshot(page, tmp_path / "mlflow-artifacts.png", full_page=False))
    finally:
        page.close()
        os.killpg(proc.pid, signal.SIGTERM)  # the server and its uvicorn worker: the group we started
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)


def _runs(outcome) -> list:
    from mlflow.tracking import MlflowClient

    return MlflowClient(outcome.tracking_uri).search_runs([outcome.experiment_id], max_results=1000)
