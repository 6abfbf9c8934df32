"""What the browser pages are made of: templates, their security headers, static files, and the helpers
that turn sweeps, reports and refused specs into what a page shows. The routes are in routes/pages.py."""

from __future__ import annotations

import base64
import hashlib
import logging
import re
import secrets
from functools import cache
from importlib import metadata, resources
from pathlib import Path
from typing import Any

import yaml
from fastapi import Request
from fastapi.responses import HTMLResponse, Response
from fastapi.templating import Jinja2Templates
from markupsafe import Markup
from pydantic import ValidationError

from service import manager
from service.api.auth import wants_page, web_session
from service.api.errors import ApiError, as_api_error
from service.api.sessions import COOKIE, WebSession
from service.errors import ServiceError
from service.models import SweepSummary
from service.settings import Settings
from service.store.database import Store, SweepRow
from sweeps.documents import compose_yaml

log = logging.getLogger(__name__)


HERE = Path(__file__).resolve().parent


TEMPLATES = Jinja2Templates(directory=HERE / "templates")


STATIC_DIR = HERE / "static"


STATIC_TYPES = {"app.js": "text/javascript", "app.css": "text/css"}


PAGE_SIZE = 20


MAX_LISTED_LINES = 1000  # the problems' listing beside the form; a spec has ~50 lines, the body limit allows 100,000s


MAX_OFFSET = 1_000_000


EXAMPLE_SPEC = resources.files("sweeps") / "examples" / "demo.yaml"


# This origin only. The dashboard's figures are plotly divs with inline scripts and styles
# (dashboards/page.py): that page allows exactly its own inline scripts, by their hashes
# (`dashboard_csp`), and inline styles (plotly.js adds <style> elements and style attributes as it draws).
PAGE_CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
    "form-action 'self'; frame-ancestors 'none'; base-uri 'none'; object-src 'none'"
)


# the live page draws its curves with plotly.js (from this origin), which sets inline styles as it draws
LIVE_CSP = PAGE_CSP.replace("style-src 'self'", "style-src 'self' 'unsafe-inline'").replace(
    "img-src 'self' data:", "img-src 'self' data: blob:"
)


DASHBOARD_CSP = (
    "default-src 'self'; script-src 'self'{hashes}; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data: blob:; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'; "
    "object-src 'none'"
)


# the API's docs (service/api/routes/docs.py): Swagger UI and ReDoc from this origin (fastapi-offline's
# copies), each page's inline script allowed by its hash; inline styles (ReDoc's styled-components adds
# <style> elements, and its page has one of its own); ReDoc's search runs in a worker made from a blob: URL
DOCS_CSP = (
    "default-src 'self'; script-src 'self'{hashes}; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
    "connect-src 'self'; worker-src blob:; form-action 'self'; frame-ancestors 'none'; base-uri 'none'; "
    "object-src 'none'"
)


_INLINE_SCRIPT = re.compile(r"<script\b(?![^>]*\bsrc=)[^>]*>(.*?)</script>", re.S | re.I)


def csp_for(policy: str, html: str) -> str:
    """`policy` for one page: its inline scripts allowed by their sha256 (what the browser hashes is the
    text between the tags) in place of `{hashes}`, and no others: no 'unsafe-inline', no 'unsafe-eval'."""
    hashes = sorted(
        {
            f"'sha256-{base64.b64encode(hashlib.sha256(js.encode()).digest()).decode()}'"
            for js in _INLINE_SCRIPT.findall(html)
        }
    )
    return policy.format(hashes="".join(f" {h}" for h in hashes))


def dashboard_csp(html: str) -> str:
    return csp_for(DASHBOARD_CSP, html)


# no-store: a page holds the session's CSRF token and the owner's sweeps; no cache keeps them
PAGE_HEADERS = {
    "Content-Security-Policy": PAGE_CSP,
    "Cache-Control": "no-store",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
}


# a file named by its content (or plotly's version) never changes under its URL
IMMUTABLE = {"Cache-Control": "public, max-age=31536000, immutable", "X-Content-Type-Options": "nosniff"}


@cache
def _digest(name: str) -> str:
    return hashlib.sha256((STATIC_DIR / name).read_bytes()).hexdigest()[:12]


def static_url(name: str) -> str:
    """/static/<name>?v=<content hash>: a changed file is a new URL, so every URL can be cached for good."""
    return f"/static/{name}?v={_digest(name)}"


PLOTLY_VERSION = metadata.version("plotly")


# what the dashboard pages load (dashboards.dashboard_page(plotlyjs_src=...)) instead of an inline copy
PLOTLYJS_URL = f"/static/plotly-{PLOTLY_VERSION}.min.js"


TEMPLATES.env.globals["static"] = static_url


def page(
    request: Request,
    name: str,
    context: dict[str, Any],
    *,
    status_code: int = 200,
    session: WebSession | None = None,
    headers: dict[str, str] | None = None,
) -> HTMLResponse:
    session = session or getattr(request.state, "web_session", None)
    base = {"owner": session.owner if session else None, "csrf_token": session.csrf_token if session else None}
    return TEMPLATES.TemplateResponse(  # type: ignore[return-value]
        request, name, base | context, status_code=status_code, headers=PAGE_HEADERS | (headers or {})
    )


def error_page(request: Request, exc: ApiError) -> HTMLResponse:
    headers = {k: v for k, v in (exc.headers or {}).items() if k.lower() == "retry-after"}
    return page(
        request,
        "error.html",
        {"status": exc.status_code, "code": exc.code, "message": exc.message},
        status_code=exc.status_code,
        headers=headers,
    )


async def current_session(request: Request) -> WebSession | None:
    cookie = request.cookies.get(COOKIE)
    return await web_session(request, cookie) if cookie else None


def set_session_cookie(response: Response, request: Request, value: str, settings: Settings) -> None:
    # Secure whenever the browser reached us over https (behind a proxy: SWEEPS_TRUSTED_PROXIES says so)
    response.set_cookie(
        COOKIE,
        value,
        max_age=int(settings.session_ttl_s),
        path="/",
        secure=request.url.scheme == "https",
        httponly=True,
        samesite="strict",
    )


def same_origin(request: Request) -> bool:
    """False for a browser's form posted from another site (login CSRF); requests without Origin pass."""
    origin = request.headers.get("origin")
    if origin is None:
        return True
    return origin.split("://", 1)[-1] == request.headers.get("host")


def require_same_origin(request: Request) -> None:
    """The sign-in forms' guard (a route dependency): 403 cross_site for a form posted from another site."""
    if not same_origin(request):
        raise ApiError(403, "cross_site", "sign-in forms are accepted from this site's own pages only")


def sweep_json(row: SweepRow, settings: Settings) -> SweepSummary:
    return SweepSummary.from_row(row, settings.mlflow_link(row.experiment_id))


def answer_of(report: dict[str, Any] | None) -> Markup | None:
    """The report's answer per optimizer as the dashboards render it (`dashboards.page.answer_list`, escaped
    there), with the batch sizes a search tested; None without a report of this service's schema."""
    if not report:
        return None
    from dashboards.page import answer_list  # plotly and scipy: when a finished sweep is shown
    from sweeps.analysis import read_report

    try:
        r = read_report(report)
    except ValidationError:
        log.warning("a report of schema version %r does not match this service's", report.get("schema_version"))
        return None
    return Markup(answer_list(r, steps=True))


def sign_in_page(
    request: Request, next_path: str, message: str | None = None, status_code: int = 200, **headers: str
) -> HTMLResponse:
    context = {"next": next_path, "message": message, "failed": status_code >= 400}
    return page(request, "sign_in.html", context, status_code=status_code, headers=headers)


def with_service_bar(dashboard: str, bar: str) -> str:
    """The dashboard page (dashboards/page.py, a whole document) with this site's styles and bar on top."""
    link = f'<link rel="stylesheet" href="{static_url("app.css")}">'
    dashboard = dashboard.replace("</head>", link + "</head>", 1) if "</head>" in dashboard else link + dashboard
    return dashboard.replace("<body>", "<body>" + bar, 1) if "<body>" in dashboard else bar + dashboard


async def dashboard(request: Request, sweep_id: str, owner: str, settings: Settings, store: Store) -> Response:
    """GET /sweeps/{id}/dashboard. Finished: the figures page. Not yet: for a browser, the sweep's live
    page (it loads again by itself when the sweep ends); for an API client the 409 of the API."""
    browser = wants_page(request)
    try:
        row = await manager.get_row(store, sweep_id, owner)
    except ServiceError as exc:
        if not browser:
            raise
        return error_page(request, as_api_error(exc))
    summary = sweep_json(row, settings)
    note = None
    if (row.final and row.report is not None) or not browser:
        try:
            pages = request.app.state.pages
            html = await manager.dashboard(store, settings, pages, sweep_id, owner, plotlyjs_src=PLOTLYJS_URL)
        except ServiceError as exc:
            if not browser:
                raise
            note = exc.message
        else:
            session = getattr(request.state, "web_session", None)
            bar = TEMPLATES.get_template("service_bar.html").render(s=summary, owner=session.owner if session else None)
            full = with_service_bar(html, bar)
            return HTMLResponse(full, headers=PAGE_HEADERS | {"Content-Security-Policy": dashboard_csp(full)})
    context = {"s": summary, "note": note, "live": [summary.model_dump(mode="json")], "plotlyjs": PLOTLYJS_URL}
    return page(request, "live.html", context, headers={"Content-Security-Policy": LIVE_CSP})


def _line_of(root: Any, field: str) -> int | None:
    """The 1-based line of a dotted field path ("optimizers.1.name") in a composed YAML document: the
    deepest part of the path that the document has (a missing key: its mapping's line)."""
    node, line = root, None
    for part in field.split(".") if field else []:
        if isinstance(node, yaml.MappingNode):
            match = next((v for k, v in node.value if isinstance(k, yaml.ScalarNode) and k.value == part), None)
            key = next((k for k, _ in node.value if isinstance(k, yaml.ScalarNode) and k.value == part), None)
            if match is None or key is None:
                break
            node, line = match, key.start_mark.line + 1
        elif isinstance(node, yaml.SequenceNode) and part.isdigit() and int(part) < len(node.value):
            node = node.value[int(part)]
            line = node.start_mark.line + 1
        else:
            break
    if line is None and root is not None:
        line = root.start_mark.line + 1
    return line


def annotate(text: str, details: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Each problem with its line in `text`, and the text's lines with the problems of each."""
    problems = [dict(d) for d in details]
    # only problems with field paths have lines to find (a parse error names its line in its message,
    # a refusal before parsing, such as the rate limit, has none): compose only then, under the
    # parser's own bounds (CPU work: the route calls this in a worker thread)
    root = compose_yaml(text) if any(p.get("field") not in (None, "body") for p in problems) else None
    for p in problems:
        p["line"] = _line_of(root, str(p.get("field") or "")) if root is not None else None
    text_lines = text.splitlines()
    lines = [{"text": t, "problems": []} for t in text_lines] if len(text_lines) <= MAX_LISTED_LINES else []
    for p in problems:
        if p["line"] is not None and 0 < p["line"] <= len(lines):
            lines[p["line"] - 1]["problems"].append(p)
    return problems, lines


def submit_page(
    request: Request,
    text: str,
    *,
    message: str | None = None,
    problems: list[dict[str, Any]] | None = None,
    lines: list[dict[str, Any]] | None = None,
    status_code: int = 200,
    headers: dict[str, str] | None = None,
    key: str | None = None,
) -> HTMLResponse:
    context = {
        "nav": "submit",
        "text": text,
        "message": message,
        "problems": problems,
        "annotated": lines if problems else None,
        "failed": status_code >= 400,
        # one per page shown: a form sent twice (a double click, a reload) makes one sweep
        "idempotency_key": key or secrets.token_urlsafe(16),
    }
    return page(request, "submit.html", context, status_code=status_code, headers=headers)


__all__ = ["PLOTLYJS_URL", "dashboard", "static_url"]
