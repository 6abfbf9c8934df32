"""The dashboard page in headless Chromium without Ray: a hand-made sweep (dash_helpers.rich_sweep), served
by a plain HTTP server that records every path the browser asks for.

The page declares its own icon (`<link rel="icon" href="data:,">`), so no browser asks the server for
/favicon.ico: the 404 that request got from a page server made test_dash_browser's error check fail at
random (Chromium logs it only when it arrives before the check).

Playwright drives Debian's Chromium (`/usr/bin/chromium`, which `make test`'s setup installs):
Playwright's own browser download does not work offline, and its Python wheel carries its driver.
"""

from __future__ import annotations

import functools
import socket
import threading
import time
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from dash_helpers import rich_sweep
from playwright.sync_api import Browser, ConsoleMessage, Page, Request, Response

from dashboards import build_figures, render_dashboard


def record_errors(page: Page) -> list[str]:
    """What goes wrong on `page` from now on: JS exceptions, console.error calls (Chromium's own
    error messages too), requests that failed and answers >= 400."""
    errors: list[str] = []

    def on_console(msg: ConsoleMessage) -> None:
        if msg.type == "error":
            errors.append(f"console.error: {msg.text} {msg.location.get('url', '')}")

    def on_failed(req: Request) -> None:
        errors.append(f"request failed: {req.url} ({req.failure})")

    def on_response(resp: Response) -> None:
        if resp.status >= 400:
            errors.append(f"HTTP {resp.status}: {resp.url}")

    page.on("pageerror", lambda exc: errors.append(f"exception: {exc}"))
    page.on("console", on_console)
    page.on("requestfailed", on_failed)
    page.on("response", on_response)
    return errors


class _Recording(SimpleHTTPRequestHandler):
    paths: list[str]

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        self.paths.append(self.path)
        super().do_GET()

    def log_message(self, format: str, *args: object) -> None:
        pass


def serve(directory: Path, paths: list[str]) -> ThreadingHTTPServer:
    handler = type("Handler", (_Recording,), {"paths": paths})
    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(handler, directory=str(directory)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def test_the_page_declares_its_icon() -> None:
    sweep = rich_sweep()
    page = render_dashboard(sweep, build_figures(sweep), png_fallback=False)
    head = page.split("</head>", 1)[0]
    assert '<link rel="icon" href="data:,">' in head


def test_the_browser_asks_the_server_for_the_page_only(browser: Browser, tmp_path: Path) -> None:
    sweep = rich_sweep()
    figs = build_figures(sweep)
    (tmp_path / "index.html").write_text(render_dashboard(sweep, figs), encoding="utf-8")
    paths: list[str] = []
    server = serve(tmp_path, paths)
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    try:
        errors = record_errors(page)
        page.goto(f"http://127.0.0.1:{server.server_port}/index.html", wait_until="load", timeout=60_000)
        page.wait_for_function(f"document.querySelectorAll('.js-plotly-plot').length === {len(figs)}", timeout=60_000)
        # a favicon request follows the load; give it the time it takes when it happens at all
        time.sleep(1.5)
        assert paths == ["/index.html"]
        assert errors == []
    finally:
        page.close()
        server.shutdown()


def test_the_error_record_sees_what_goes_wrong(browser: Browser, tmp_path: Path) -> None:
    # the check above must be able to fail: a page with each kind of fault, and each one reported
    (tmp_path / "index.html").write_text(
        "<!doctype html><html><head><link rel='icon' href='data:,'></head><body>"
        "<img src='/missing.png'><script>console.error('drawn wrong'); undefined_function();</script>"
        "</body></html>",
        encoding="utf-8",
    )
    paths: list[str] = []
    server = serve(tmp_path, paths)
    with socket.socket() as s:  # a port nothing listens on: a fetch there fails
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    page = browser.new_page()
    try:
        errors = record_errors(page)
        page.goto(f"http://127.0.0.1:{server.server_port}/index.html", wait_until="load", timeout=60_000)
        with page.expect_event("requestfailed"):  # returns once Playwright has reported it
            page.evaluate(f"fetch('http://127.0.0.1:{closed}/gone').catch(() => null)")
        text = "\n".join(errors)
        assert "console.error: drawn wrong" in text
        assert "exception:" in text and "undefined_function" in text
        assert f"HTTP 404: http://127.0.0.1:{server.server_port}/missing.png" in text
        assert f"request failed: http://127.0.0.1:{closed}/gone" in text
        assert paths == ["/index.html", "/missing.png"]
    finally:
        page.close()
        server.shutdown()
