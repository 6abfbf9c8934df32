"""The service in a browser: sign-in, the list of one's sweeps, a sweep's live page, the submit page.

    GET  /                    signed out: the sign-in form; signed in: your sweeps, newest first, live
    POST /login               form {token, next}: a session cookie (service/api/sessions.py), then `next`
    POST /login/once          (API, bearer token only) a one-time sign-in link for the token's owner
    GET  /login/once?code=    the link: a session cookie, then / (what `make demo` prints)
    POST /logout              form {csrf_token}: the session ends in the store, the cookie is dropped
    GET  /submit              paste or upload a spec; POST /submit checks it (the API's dry run) or submits it
    GET  /static/...          this page's script and styles, and plotly.js for the dashboards, once
    GET  /sweeps/{id}/dashboard  (route in routes/sweeps.py, answered by service/api/pages.py) while the
                              sweep runs: its live progress and a cancel button; when finished: the
                              figures page of dashboards/, plotly.js from /static/

Pages are rendered by Jinja2 (service/api/templates/, autoescaped) and load nothing from another origin:
their Content-Security-Policy allows this origin only, so a page that tried would fail in the browser.
The live parts are service/api/static/app.js, which follows GET /sweeps/{id}/events.

The sweeps themselves go through the same code as the API (service.manager): the same validation,
the same limits, the same owner checks; these routes only turn forms into calls and errors into pages.
"""

from __future__ import annotations

import logging
from datetime import datetime
from importlib import resources
from typing import Annotated, Literal

import anyio.to_thread
from fastapi import APIRouter, Depends, File, Form, Query, Request, UploadFile, status
from fastapi.responses import FileResponse, HTMLResponse, RedirectResponse, Response
from pydantic import BaseModel, Field

from service import manager
from service.api.auth import BearerOnly, Owner, check_csrf, safe_next, web_session
from service.api.deps import IDEMPOTENCY_KEY_PATTERN, LimitsDep, SettingsDep, StoreDep, SupervisorDep
from service.api.errors import ApiError, as_api_error
from service.api.pages import (
    EXAMPLE_SPEC,
    IMMUTABLE,
    MAX_OFFSET,
    PAGE_SIZE,
    PLOTLYJS_URL,
    STATIC_DIR,
    STATIC_TYPES,
    annotate,
    answer_of,
    current_session,
    page,
    require_same_origin,
    set_session_cookie,
    sign_in_page,
    submit_page,
    sweep_json,
)
from service.api.schemas import error_responses
from service.api.sessions import COOKIE, Sessions, SignInLimiter, client_address
from service.errors import ServiceError
from worker.messages import excerpt

log = logging.getLogger(__name__)


router = APIRouter(include_in_schema=False)


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
        lambda: store.page(owner=session.owner, statuses=None, limit=PAGE_SIZE, offset=offset)
    )
    rows = [{"summary": sweep_json(r, settings), "answer": answer_of(r.report)} for r in result.items]
    context = {
        "nav": "sweeps",
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
                owner=owner, work=limits.specs, store=store, launcher=supervisor.launcher,
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
            work=limits.specs,
        )
    except (ApiError, ServiceError) as refusal:
        exc = refusal if isinstance(refusal, ApiError) else as_api_error(refusal)
        problems, lines = await limits.specs.run(owner, annotate, text, exc.details)
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


__all__ = ["router"]
