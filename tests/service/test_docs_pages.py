"""The API's docs pages (/docs, /redoc, /docs/oauth2-redirect; service/web/docs.py) go out with the
browser pages' security headers: a Content-Security-Policy of this origin that allows each page's own
inline script by its hash and no framing, nosniff, no-store and the same-origin referrer policy. And
their scripts and styles go out with nosniff. Under that policy they work in Chromium: Swagger UI draws the operations, ReDoc draws them and searches
them (in its blob: worker), the OAuth2 redirect page's script runs."""

from __future__ import annotations

import base64
import hashlib
import re
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient
from harness import chromium
from playwright.sync_api import Browser, Page
from svc_helpers import ThreadServer

from service.web.docs import STATIC_URL
from service.web.pages import PAGE_HEADERS

DOCS_PAGES = ["/docs", "/redoc", "/docs/oauth2-redirect"]


def directives(csp: str) -> dict[str, list[str]]:
    return {name: values for name, *values in (d.split() for d in csp.split(";") if d.strip())}


@pytest.mark.parametrize("path", DOCS_PAGES)
def test_the_docs_pages_send_the_pages_security_headers(client: TestClient, path: str) -> None:
    resp = client.get(path)
    assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/html")
    for name, value in PAGE_HEADERS.items():
        if name != "Content-Security-Policy":
            assert resp.headers[name] == value, name
    assert resp.headers["x-content-type-options"] == "nosniff"
    csp = directives(resp.headers["content-security-policy"])
    assert csp["frame-ancestors"] == ["'none'"]  # no other site frames the docs (clickjacking)
    assert csp["default-src"] == ["'self'"] and csp["object-src"] == ["'none'"] and csp["base-uri"] == ["'none'"]
    assert csp["connect-src"] == ["'self'"] and csp["form-action"] == ["'self'"]
    # scripts: this origin's files and exactly the page's own inline scripts, by hash
    assert csp["script-src"][0] == "'self'"
    inline = re.findall(r"<script\b(?![^>]*\bsrc=)[^>]*>(.*?)</script>", resp.text, re.S)
    hashes = {f"'sha256-{base64.b64encode(hashlib.sha256(js.encode()).digest()).decode()}'" for js in inline}
    assert set(csp["script-src"][1:]) == hashes
    assert len(inline) == (0 if path == "/redoc" else 1)
    assert not {"'unsafe-inline'", "'unsafe-eval'", "*", "data:", "blob:"} & set(csp["script-src"])


@pytest.mark.parametrize("name", ["swagger-ui-bundle.js", "swagger-ui.css", "redoc.standalone.js", "favicon.png"])
def test_the_docs_files_are_never_sniffed_as_another_type(client: TestClient, name: str) -> None:
    resp = client.get(f"{STATIC_URL}/{name}")
    assert resp.status_code == 200
    assert resp.headers.get_list("x-content-type-options") == ["nosniff"]
    # the header is for that prefix only, and the path test is by segment
    assert "x-content-type-options" not in client.get(f"{STATIC_URL}-not/{name}").headers


def test_swagger_ui_sends_the_schemas_url_to_no_validator(client: TestClient) -> None:
    assert '"validatorUrl": null' in client.get("/docs").text


# ---- in Chromium -------------------------------------------------------------------------------------

# ReDoc's footer shows Redocly's logo from their CDN: the policy keeps the page from fetching it (the
# image hides itself when it fails to load)
REDOCLY_LOGO = "https://cdn.redoc.ly/redoc/logo-mini.svg"


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with chromium() as b:
        yield b


def watched(browser: Browser, origin: str) -> tuple[Page, list[str], list[str]]:
    """A new page, the problems it reports (console errors, exceptions, failed requests) and the URLs of
    other origins it asked for."""
    page = browser.new_page()
    problems: list[str] = []
    elsewhere: list[str] = []
    page.on(
        "console",
        lambda m: problems.append(f"console.error: {m.text} ({m.location.get('url')})") if m.type == "error" else None,
    )
    page.on("pageerror", lambda exc: problems.append(f"exception: {exc}"))
    page.on("requestfailed", lambda r: problems.append(f"failed: {r.url}") if r.url.startswith(origin) else None)
    page.on("request", lambda r: None if r.url.startswith((origin, "blob:", "data:")) else elsewhere.append(r.url))
    return page, problems, elsewhere


def test_the_docs_work_under_their_policy_in_chromium(fake_server: ThreadServer, browser: Browser) -> None:
    origin = fake_server.url

    page, problems, elsewhere = watched(browser, origin)
    page.goto(f"{origin}/docs", wait_until="load")
    page.wait_for_selector(".opblock", timeout=60_000)
    assert "/sweeps/{sweep_id}/cancel" in page.locator(".opblock-summary-path").all_inner_texts()
    page.locator(".opblock-summary").first.click()  # an operation opens, with its parameters and responses
    page.wait_for_selector(".opblock-body", timeout=30_000)
    assert problems == [] and elsewhere == [], (problems, elsewhere)
    page.close()

    page, problems, elsewhere = watched(browser, origin)
    page.goto(f"{origin}/redoc", wait_until="load")
    page.wait_for_selector("[data-section-id]", state="attached", timeout=60_000)
    assert "Submit a sweep (JSON or YAML)" in page.inner_text("body")
    page.fill("input[placeholder='Search...']", "cancel")  # ReDoc searches in a worker made from a blob: URL
    page.wait_for_selector("[data-role='search:results'] li", timeout=30_000)
    found = page.locator("[data-role='search:results'] li").all_inner_texts()  # a sweep's cancel and a study's
    assert any("Stop the sweep's Ray work" in r for r in found), found
    # the one thing the policy refused: the logo on Redocly's CDN
    assert elsewhere == [REDOCLY_LOGO], elsewhere
    assert len(problems) == 1 and REDOCLY_LOGO in problems[0] and "Content Security Policy" in problems[0], problems
    page.close()

    # the redirect page's inline script runs (opened by itself, without Swagger UI's window as its opener,
    # it stops where it reads that window's state)
    page, problems, elsewhere = watched(browser, origin)
    page.goto(f"{origin}/docs/oauth2-redirect", wait_until="load")
    page.wait_for_timeout(500)
    problems = [p for p in problems if not p.endswith("/favicon.ico)")]  # the page names no icon; the browser asks
    assert problems == ["exception: Cannot read properties of null (reading 'swaggerUIRedirectOauth2')"], problems
    assert elsewhere == []
    page.close()
