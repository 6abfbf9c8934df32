"""The published figures/ folder opened in headless Chromium without Ray and without a server: each
HTML figure and the page, opened from a download of the summary run's artifacts (file:// URLs), find
plotly.js by relative path and draw; a figure copied away from plotly.min.js says what it misses.

Playwright drives Debian's Chromium (`/usr/bin/chromium`, which `make test`'s setup installs), as in
test_dash_page_browser: Playwright's own browser download does not work offline.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from dash_helpers import record_sweep, rich_sweep
from mlflow.tracking import MlflowClient
from playwright.sync_api import Browser, ConsoleMessage, Page

from dashboards import publish

NAMES = ["scaling", "lr_sensitivity", "best_lr", "loss_curves", "attention_logits", "steps_to_target"]


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """figures/ of a published sweep, downloaded from MLflow (what a reader of the artifacts gets)."""
    root = tmp_path_factory.mktemp("mlflow-store")
    uri = f"sqlite:///{root / 'mlflow.db'}"
    _, summary_id, _ = record_sweep(uri, rich_sweep("opened"), root / "artifacts")
    publish(uri, "opened", root / "out")
    return Path(MlflowClient(uri).download_artifacts(summary_id, "figures", str(root / "download")))


def open_page(browser: Browser, path: Path) -> tuple[Page, list[str], list[str]]:
    """`path` opened as a file:// URL, with every URL it requested and what went wrong (JS exceptions,
    console.error calls, failed loads)."""
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    urls: list[str] = []
    errors: list[str] = []

    def on_console(msg: ConsoleMessage) -> None:
        if msg.type == "error":
            errors.append(f"console.error: {msg.text}")

    page.on("request", lambda req: urls.append(req.url))
    page.on("pageerror", lambda exc: errors.append(f"exception: {exc}"))
    page.on("console", on_console)
    page.on("requestfailed", lambda req: errors.append(f"request failed: {req.url} ({req.failure})"))
    page.goto(path.as_uri(), wait_until="load", timeout=60_000)
    return page, urls, errors


@pytest.mark.parametrize("name", NAMES)
def test_a_figure_opened_from_the_artifact_folder_draws(browser: Browser, folder: Path, name: str) -> None:
    page, urls, errors = open_page(browser, folder / f"{name}.html")
    try:
        page.wait_for_function("document.querySelectorAll('.js-plotly-plot').length === 1", timeout=60_000)
        assert page.evaluate("document.querySelectorAll('.js-plotly-plot .scatterlayer .trace').length") > 0
        assert page.evaluate("document.getElementById('no-plotly') === null")
        assert errors == []
        # the only things loaded: the figure and plotly.min.js beside it, no network
        assert sorted(urls) == sorted([(folder / f"{name}.html").as_uri(), (folder / "plotly.min.js").as_uri()])
    finally:
        page.close()


def test_the_published_page_opened_from_the_artifact_folder_draws_every_figure(browser: Browser, folder: Path) -> None:
    page, urls, errors = open_page(browser, folder / "dashboard.html")
    try:
        page.wait_for_function(f"document.querySelectorAll('.js-plotly-plot').length === {len(NAMES)}", timeout=60_000)
        assert errors == []
        assert urls and all(u.startswith(("file://", "data:")) for u in urls), urls
        assert [u for u in urls if u.endswith("/plotly.min.js")] == [(folder / "plotly.min.js").as_uri()]
    finally:
        page.close()


def test_a_figure_without_plotlyjs_beside_it_says_so(browser: Browser, folder: Path, tmp_path: Path) -> None:
    alone = tmp_path / "scaling.html"
    shutil.copy(folder / "scaling.html", alone)
    page, _, errors = open_page(browser, alone)
    try:
        text = page.wait_for_selector("#no-plotly", timeout=30_000).inner_text()  # type: ignore[union-attr]
        assert "plotly.min.js" in text and "scaling.png" in text
        assert page.evaluate("document.querySelectorAll('.js-plotly-plot').length") == 0
        # and the record above sees what went wrong, so its empty lists mean something
        assert any("plotly.min.js" in e for e in errors), errors
    finally:
        page.close()
