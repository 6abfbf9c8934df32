"""Bearer tokens -> owner. Tokens come from settings (SWEEPS_TOKENS="alice=token1,bob=token2").

Every endpoint but /healthz depends on `current_owner`; an owner sees only its own sweeps. A request
without an Authorization header may instead carry a browser session's cookie (service/api/sessions.py):
the same owner, the same routes, and for a request that changes state the session's CSRF token too.
"""

from __future__ import annotations

import hmac
import secrets
from typing import Annotated
from urllib.parse import quote, urlsplit

import anyio.to_thread
from fastapi import Depends, Request
from fastapi.security import HTTPBearer

from service.api.errors import ApiError, unauthorized
from service.api.sessions import COOKIE, CSRF_FIELD, CSRF_HEADER, SAFE_METHODS, Sessions, WebSession
from service.settings import Settings

FORM_TYPES = ("application/x-www-form-urlencoded", "multipart/form-data")


class TokenTable:
    """Look-ups that take the same time whichever token matched, or none (no timing oracle)."""

    def __init__(self, settings: Settings) -> None:
        self._pairs = [(token.encode(), owner) for token, owner in settings.owner_of().items()]

    def owner(self, token: str) -> str | None:
        given = token.encode()
        found: str | None = None
        for known, owner in self._pairs:
            if hmac.compare_digest(known, given):
                found = owner
        return found

    def bearer(self, authorization: str | None) -> str | None:
        """The owner of an `Authorization: Bearer <token>` header value; None when absent or unknown."""
        scheme, _, token = (authorization or "").partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            return None
        return self.owner(token)

    def __len__(self) -> int:
        return len(self._pairs)


def generate_token() -> str:
    """A fresh random token for SWEEPS_TOKENS (e.g. `make demo`)."""
    return secrets.token_urlsafe(24)


class BearerOwner(HTTPBearer):
    """The owner of the request's bearer token, else (`sessions`) of its session cookie, else 401 in
    the API's error shape; a browser's page request (GET asking for HTML) is sent to sign in instead.

    One dependency that is also the OpenAPI security scheme: FastAPI resolves each dependency of a
    route on every request, and with a separate `HTTPBearer` sub-dependency (and the state objects as
    three more) a cached `GET /sweeps/{id}` cost ~345 µs in the app, ~280 µs with these two (measured
    in-process). A bearer request never reaches the cookie code.
    """

    def __init__(self, *, sessions: bool = True) -> None:
        # auto_error=False: a missing header becomes our 401 shape, not FastAPI's
        super().__init__(auto_error=False, scheme_name="HTTPBearer", description="SWEEPS_TOKENS: owner=token pairs")
        self.sessions = sessions

    async def __call__(self, request: Request) -> str:  # type: ignore[override]
        table: TokenTable = request.app.state.tokens
        authorization = request.headers.get("authorization")
        owner = table.bearer(authorization)
        if owner is not None:
            return owner
        cookie = request.cookies.get(COOKIE) if self.sessions and authorization is None else None
        if cookie:
            session = await web_session(request, cookie)
            if session is not None:
                if request.method not in SAFE_METHODS:
                    await check_csrf(request, session)
                return session.owner
        if self.sessions and authorization is None and wants_page(request):
            raise sign_in_first(request)
        raise unauthorized()


async def web_session(request: Request, cookie: str) -> WebSession | None:
    """The live session of a cookie value (a store read in a worker thread), None if there is none."""
    sessions: Sessions | None = getattr(request.app.state, "sessions", None)  # None until the lifespan ran
    if sessions is None:
        return None
    session = await anyio.to_thread.run_sync(sessions.lookup, cookie)
    request.state.web_session = session  # the pages read it (their CSRF token) without a second look-up
    return session


async def check_csrf(request: Request, session: WebSession) -> None:
    """403 unless the request carries `session`'s CSRF token: the X-CSRF-Token header, or for a form the
    csrf_token field (the form is parsed here, and Starlette keeps it for the route)."""
    given = request.headers.get(CSRF_HEADER)
    if given is None and request.headers.get("content-type", "").startswith(FORM_TYPES):
        field = (await request.form()).get(CSRF_FIELD)
        given = field if isinstance(field, str) else None
    if not session.csrf_ok(given):
        raise ApiError(
            403,
            "csrf_failed",
            f"this request is signed in by session cookie and changes state, so it needs the session's CSRF "
            f"token in the {CSRF_HEADER} header or the {CSRF_FIELD} form field (the pages send it; bearer-token "
            f"requests need none)",
        )


def wants_page(request: Request) -> bool:
    """A browser navigating: a GET that asks for HTML (fetch, EventSource and API clients do not)."""
    return request.method == "GET" and "text/html" in request.headers.get("accept", "")


def safe_next(path: str | None) -> str:
    """Where to go after signing in: a path on this site only, else /. Refused: anything but a single `/`
    first, a backslash, and any control character or space anywhere: browsers drop tabs and newlines
    from a URL and read a backslash as `/`, so `/%09/host` (a tab) or `/%5Chost` would leave the site."""
    if not path or not path.startswith("/") or path.startswith("//"):
        return "/"
    if any(ord(c) <= 0x20 or c in "\\\x7f" for c in path):
        return "/"
    parts = urlsplit(path)
    if parts.scheme or parts.netloc:
        return "/"
    return path


def sign_in_first(request: Request) -> ApiError:
    """A 303 to the sign-in page that comes back to this page (its body: the error shape, as every error)."""
    here = safe_next(request.url.path + (f"?{request.url.query}" if request.url.query else ""))
    return ApiError(
        303, "sign_in_required", "sign in first: GET /", headers={"Location": f"/?next={quote(here, safe='')}"}
    )


current_owner = BearerOwner()
Owner = Annotated[str, Depends(current_owner)]
# API calls that only a token may make (minting a one-time sign-in link)
bearer_owner = BearerOwner(sessions=False)
BearerOnly = Annotated[str, Depends(bearer_owner)]
