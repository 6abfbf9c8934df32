"""The dashboard page in headless Chromium without Ray: a hand-made sweep (dash_helpers.rich_sweep), served
by a plain HTTP server that records every path the browser asks for.

The page declares its own icon (`<link rel="icon" href="data:,">`), so no browser asks the server for
/favicon.ico: the 404 that request got from a page server made test_dash_browser's error check fail at
random (Chromium logs it only when it arrives before the check).
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Iterator
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from cdp_browser import Chromium, find_chromium
from dash_helpers import rich_sweep

from dashboards import build_figures, render_dashboard


@pytest.fixture(scope="module")
def browser() -> Iterator[Chromium]:
    if find_chromium() is None:
        pytest.fail("Chromium is missing: these tests need Debian's `chromium` package (apt-get install -y chromium)")
    with Chromium() as b:
        yield b


class _Recording(SimpleHTTPRequestHandler):
    paths: list[str]

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        self.paths.append(self.path)
        super().do_GET()

    def log_message(self, format: str, *args: object) -> None:
        pass


def test_the_page_declares_its_icon() -> None:
    sweep = rich_sweep()
    page = render_dashboard(sweep, build_figures(sweep), png_fallback=False)
    head = page.split("</head>", 1)[0]
    assert '<link rel="icon" href="data:,">' in head


def test_the_browser_asks_the_server_for_the_page_only(browser: Chromium, tmp_path: Path) -> None:
    sweep = rich_sweep()
    figs = build_figures(sweep)
    (tmp_path / "index.html").write_text(render_dashboard(sweep, figs), encoding="utf-8")
    paths: list[str] = []
    handler = type("Handler", (_Recording,), {"paths": paths})
    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(handler, directory=str(tmp_path)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        page = browser.new_page()
        page.goto(f"http://127.0.0.1:{server.server_port}/index.html")
        page.wait_for(f"document.querySelectorAll('.js-plotly-plot').length === {len(figs)}", timeout=60)
        # a favicon request follows the load; give it the time it takes when it happens at all
        time.sleep(1.5)
        assert paths == ["/index.html"]
        assert page.errors() == []
    finally:
        server.shutdown()
