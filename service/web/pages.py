"""The service in a browser: sign-in, the list of one's sweeps, a sweep's live page and dashboard, the submit page.

    GET  /                    signed out: the sign-in form; signed in: your sweeps, newest first, live
    POST /login               form {token, next}: a session cookie (service/api/sessions.py), then `next`
    POST /login/once          (API, bearer token only) a one-time sign-in link for the token's owner
    GET  /login/once?code=    the link: a page whose button signs in, then / (what `make demo` prints)
    POST /logout              form {csrf_token}: the session ends in the store, the cookie is dropped
    GET  /submit              paste or upload a spec; POST /submit checks it (the API's dry run) or submits it
    GET  /static/...          the pages' script and styles, and plotly.js for the dashboards, once
    GET  /sweeps/{id}/dashboard  (API too) finished: the figures page of dashboards/, plotly.js from
                              /static/; while the sweep runs: a browser gets its live progress and a
                              cancel button, an API client the 409 of the API

Pages are rendered by Jinja2 (service/web/templates/, autoescaped) and load nothing from another origin:
their Content-Security-Policy allows this origin only, so a page that tried would fail in the browser.
The live parts are service/web/static/app.js, which follows GET /sweeps/{id}/events.

The sweeps themselves go through the same code as the API (service.manager): the same validation,
the same limits, the same owner checks (the API's `Owner`, which takes the session cookie too); these
routes only turn forms into calls and errors into pages.
"""

from __future__ import annotations

import base64
import hashlib
import logging
import re
import secrets
from datetime import datetime
from functools import cache
from importlib import metadata, resources
from pathlib import Path
from typing import Annotated, Any, Literal

import anyio.to_thread
import yaml
from fastapi import APIRouter, Depends, File, Form, Query, Request, UploadFile, status
from fastapi.responses import FileResponse, HTMLResponse, RedirectResponse, Response
from fastapi.templating import Jinja2Templates
from markupsafe import Markup
from pydantic import BaseModel, Field, ValidationError

from service import manager, studies
from service.api.auth import BearerOnly, Owner, check_csrf, safe_next, wants_page, web_session
from service.api.deps import (
    IDEMPOTENCY_KEY_PATTERN,
    LimitsDep,
    SettingsDep,
    StoreDep,
    StudyId,
    SupervisorDep,
    SweepId,
)
from service.api.errors import ApiError, as_api_error
from service.api.schemas import error_responses
from service.api.sessions import COOKIE, Sessions, SignInLimiter, WebSession, client_address
from service.errors import ServiceError
from service.models import SweepSummary
from service.settings import Settings
from service.store.database import SweepRow
from sweeps.documents import compose_yaml
from worker.messages import excerpt

log = logging.getLogger(__name__)


HERE = Path(__file__).resolve().parent


TEMPLATES = Jinja2Templates(directory=HERE / "templates")


STATIC_DIR = HERE / "static"


STATIC_TYPES = {"app.js": "text/javascript", "app.css": "text/css"}


PAGE_SIZE = 20
HOME_STUDIES = 5  # studies the home page lists, newest first; GET /studies has them all


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


# the API's docs (service/web/docs.py): Swagger UI and ReDoc from this origin (fastapi-offline's
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


def summary_of(row: SweepRow, settings: Settings) -> SweepSummary:
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


# the pages, out of the OpenAPI; `api_router`: the one page that is an API route too (documented there)
router = APIRouter(include_in_schema=False)
api_router = APIRouter(tags=["sweeps"])


@router.get(PLOTLYJS_URL)
async def plotly_js() -> FileResponse:
    # the package's own file (what plotly.offline.get_plotlyjs() reads), ~4.8 MB, sent once per browser
    path = resources.files("plotly") / "package_data" / "plotly.min.js"
    return FileResponse(str(path), media_type="text/javascript", headers=IMMUTABLE)


@router.get("/static/{name}")
async def static_file(name: str) -> FileResponse:
    if name not in STATIC_TYPES:
        raise ApiError(404, "not_found", f"no static file {excerpt(name)}")
    return FileResponse(STATIC_DIR / name, media_type=STATIC_TYPES[name], headers=IMMUTABLE)


@router.post("/login", dependencies=[Depends(require_same_origin)])
async def login(
    request: Request,
    settings: SettingsDep,
    limits: LimitsDep,
    token: Annotated[str, Form(max_length=1000)] = "",
    next_path: Annotated[str, Form(alias="next", max_length=2000)] = "/",
) -> Response:
    next_path = safe_next(next_path)
    limiter: SignInLimiter = request.app.state.sign_in_limiter
    address = client_address(request.client)
    try:
        limiter.check(address)  # refused addresses' tokens are not even checked
        owner = request.app.state.tokens.owner(token) if token else None
        if owner is None:
            limiter.wrong(address)
            return sign_in_page(request, next_path, "That token is not valid.", 401)
    except ApiError as exc:  # 429
        return sign_in_page(request, next_path, exc.message, exc.status_code, **(exc.headers or {}))
    try:
        limits.take_sign_in(owner)  # each sign-in stores a session row
    except ApiError as exc:
        return sign_in_page(request, next_path, exc.message, exc.status_code, **(exc.headers or {}))
    sessions: Sessions = request.app.state.sessions
    new = await anyio.to_thread.run_sync(sessions.sign_in, owner)
    log.info("%s signed in from %s", owner, address)
    response = RedirectResponse(next_path, status.HTTP_303_SEE_OTHER, headers={"Cache-Control": "no-store"})
    set_session_cookie(response, request, new.cookie, settings)
    return response


@router.post("/logout")
async def logout(request: Request) -> Response:
    cookie = request.cookies.get(COOKIE)
    if cookie:
        session = await web_session(request, cookie)
        if session is not None:
            await check_csrf(request, session)  # 403: a page of another site cannot sign you out
            sessions: Sessions = request.app.state.sessions
            await anyio.to_thread.run_sync(sessions.sign_out, cookie)
            log.info("%s signed out", session.owner)
    response = RedirectResponse("/", status.HTTP_303_SEE_OTHER, headers={"Cache-Control": "no-store"})
    response.delete_cookie(COOKIE, path="/", secure=request.url.scheme == "https", httponly=True, samesite="strict")
    return response


class SignInLink(BaseModel):
    url: str = Field(description="open it in a browser: it signs the token's owner in, once")
    expires_at: datetime


@router.post(
    "/login/once",
    include_in_schema=True,
    tags=["browser"],
    status_code=status.HTTP_201_CREATED,
    response_model=SignInLink,
    responses=error_responses(401, 429),
    summary="A one-time sign-in link for the browser pages (bearer token only; expires after sign_in_link_ttl_s)",
)
async def new_sign_in_link(request: Request, owner: BearerOnly, settings: SettingsDep, limits: LimitsDep) -> SignInLink:
    limits.take_sign_in(owner)  # each link is a stored row
    sessions: Sessions = request.app.state.sessions
    code, expires = await anyio.to_thread.run_sync(sessions.new_link, owner)
    base = str(settings.public_url or request.base_url).rstrip("/")
    return SignInLink(url=f"{base}/login/once?code={code}", expires_at=expires)


@router.get("/login/once")
async def sign_in_link_page(
    request: Request,
    code: Annotated[str, Query(max_length=200)] = "",
    next_path: Annotated[str, Query(alias="next", max_length=2000)] = "/",
) -> HTMLResponse:
    """The page of a one-time link: a button that signs in. Opening the link changes nothing, so a page of
    another site that loads it cannot switch a person into the attacker's account (login CSRF), and a mail
    or chat scanner that fetches it does not use it up."""
    session = await current_session(request)
    context = {"code": code, "next": safe_next(next_path), "current": session.owner if session else None}
    # Referrer-Policy stays same-origin (PAGE_HEADERS): the code in this URL goes to no other site, and
    # the button's POST carries its Origin (under no-referrer Chromium sends `Origin: null`, which the
    # cross-site check refuses: the browser test found it)
    return page(request, "confirm_sign_in.html", context, headers={"Cache-Control": "no-store"})


@router.post("/login/once/confirm", dependencies=[Depends(require_same_origin)])
async def use_sign_in_link(
    request: Request,
    settings: SettingsDep,
    code: Annotated[str, Form(max_length=200)] = "",
    next_path: Annotated[str, Form(alias="next", max_length=2000)] = "/",
) -> Response:
    # no rate limit: a code is 32 random bytes, and a wrong one is answered without touching a session
    next_path = safe_next(next_path)
    sessions: Sessions = request.app.state.sessions
    owner = await anyio.to_thread.run_sync(sessions.redeem_link, code) if code else None
    if owner is None:
        message = "This sign-in link was used already or has expired. Sign in with your token, or ask for a new link."
        return sign_in_page(request, next_path, message, 401)  # its sign-in form posts with its Origin
    new = await anyio.to_thread.run_sync(sessions.sign_in, owner)
    log.info("%s signed in by a one-time link", owner)
    response = page(
        request,
        "signed_in.html",
        {"next": next_path, "owner": owner},
        session=new.session,
        headers={"Referrer-Policy": "no-referrer", "Cache-Control": "no-store"},
    )
    set_session_cookie(response, request, new.cookie, settings)
    return response


@router.get("/")
async def home(
    request: Request,
    settings: SettingsDep,
    store: StoreDep,
    offset: Annotated[int, Query(ge=0, le=MAX_OFFSET)] = 0,
    next_path: Annotated[str, Query(alias="next", max_length=2000)] = "/",
) -> HTMLResponse:
    session = await current_session(request)
    if session is None:
        return sign_in_page(request, safe_next(next_path))
    result = await anyio.to_thread.run_sync(
        lambda: store.list_sweeps(owner=session.owner, statuses=None, limit=PAGE_SIZE, offset=offset)
    )
    rows = [{"summary": summary_of(r, settings), "answer": answer_of(r.report)} for r in result.items]
    # the newest studies above the first page of sweeps (their scales are among the sweeps below)
    owned, studies_total = await studies.list_studies(store, session.owner, HOME_STUDIES, 0) if offset == 0 else ([], 0)
    context = {
        "nav": "sweeps",
        "studies": owned,
        "studies_total": studies_total,
        "rows": rows,
        "total": result.total,
        "offset": offset,
        "limit": PAGE_SIZE,
        "live": [row["summary"].model_dump(mode="json") for row in rows],
    }
    return page(request, "sweeps.html", context)


@router.get("/submit")
async def new_sweep_page(request: Request, owner: Owner) -> HTMLResponse:
    return submit_page(request, EXAMPLE_SPEC.read_text(encoding="utf-8"))


@router.post("/submit")
async def submit_form(
    request: Request,
    owner: Owner,  # a cookie's request passes only with the session's csrf_token field
    settings: SettingsDep,
    store: StoreDep,
    supervisor: SupervisorDep,
    limits: LimitsDep,
    spec: Annotated[str, Form()] = "",
    file: Annotated[UploadFile | None, File()] = None,
    action: Annotated[Literal["check", "submit"], Form()] = "check",
    idempotency_key: Annotated[str, Form(pattern=IDEMPOTENCY_KEY_PATTERN)] = "",
) -> Response:
    text = spec
    if file is not None and file.filename:
        raw = await file.read()  # bounded: the whole request is (service/api/middleware.py::BodyLimit)
        try:
            text = raw.decode("utf-8") if raw else spec
        except UnicodeDecodeError:
            return submit_page(request, spec, message=f"{excerpt(file.filename)} is not UTF-8 text", status_code=422)
    body = text.encode("utf-8")
    try:
        if action == "check":
            limits.take_dry_run(owner)
            result = await manager.dry_run(
                body, "application/yaml", settings,
                owner=owner, work=limits.spec_work, store=store, launcher=supervisor.launcher,
            )  # fmt: skip
            most = "at most " if isinstance(result.spec.get("batch_sizes"), dict) else ""  # a search of the batch axis
            message = (
                f"Valid: {most}{result.cells} cells, {most}{result.total_trials} trials, each training on "
                f"{result.trained_tokens:,} tokens. {result.caps.summary()}"
                + (f" {result.cluster.summary()}" if result.cluster is not None else "")
                + (
                    " Submit it to start."
                    if result.caps.passes and (result.cluster is None or result.cluster.passes)
                    else ""
                )
            )
            return submit_page(request, text, message=message, key=idempotency_key or None)
        limits.take_submit(owner)
        created = await manager.submit(
            body=body,
            content_type="application/yaml",
            owner=owner,
            idempotency_key=idempotency_key or None,
            settings=settings,
            store=store,
            supervisor=supervisor,
            work=limits.spec_work,
        )
    except (ApiError, ServiceError) as refusal:
        exc = refusal if isinstance(refusal, ApiError) else as_api_error(refusal)
        problems, lines = await limits.spec_work.run(owner, annotate, text, exc.details)
        retry = {k: v for k, v in (exc.headers or {}).items() if k.lower() == "retry-after"}
        return submit_page(
            request,
            text,
            message=exc.message,
            problems=problems,
            lines=lines,
            status_code=exc.status_code,
            headers=retry,
            key=idempotency_key or None,
        )
    return RedirectResponse(f"/sweeps/{created.row.id}/dashboard", status.HTTP_303_SEE_OTHER)


@api_router.get(
    "/sweeps/{sweep_id}/dashboard",
    response_class=HTMLResponse,
    responses={200: {"content": {"text/html": {}}, "description": "the answer and the figures"}}
    | error_responses(401, 404, 409, 422),
    summary="One HTML page: the answer at the top, the batch-scaling figures below; 409 until finished "
    "(a browser, asking for text/html, gets the sweep's live page instead)",
)
async def get_dashboard(
    request: Request, sweep_id: SweepId, owner: Owner, settings: SettingsDep, store: StoreDep
) -> Response:
    # finished: the figures page; not yet: for a browser, the sweep's live page (it loads again by itself
    # when the sweep ends), for an API client the 409 of the API (a comment, not a docstring: the summary
    # above is the OpenAPI's)
    browser = wants_page(request)
    try:
        row = await manager.get_row(store, sweep_id, owner)
    except ServiceError as exc:
        if not browser:
            raise
        return error_page(request, as_api_error(exc))
    summary = summary_of(row, settings)
    note = None
    if (row.final and row.report is not None) or not browser:
        try:
            cache = request.app.state.pages
            html = await manager.dashboard(store, settings, cache, sweep_id, owner, plotlyjs_src=PLOTLYJS_URL)
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


@api_router.get(
    "/studies/{study_id}/law",
    response_class=HTMLResponse,
    responses={200: {"content": {"text/html": {}}, "description": "the study's law figure"}}
    | error_responses(401, 404, 409, 422),
    summary="The study's law as a page: each scale's bracket against tokens, the law and its band, the "
    "prediction, the leave-largest-out check and, with confirm: true, the confirmation at the target and each "
    "law's outcome (or that it is pending or not run); 409 until every scale succeeded",
    tags=["studies"],
)
async def get_study_law(request: Request, study_id: StudyId, owner: Owner, store: StoreDep) -> Response:
    html = await studies.law_page(store, request.app.state.pages, study_id, owner, plotlyjs_src=PLOTLYJS_URL)
    return HTMLResponse(html, headers=PAGE_HEADERS | {"Content-Security-Policy": dashboard_csp(html)})


__all__ = ["PLOTLYJS_URL", "api_router", "router", "static_url"]
