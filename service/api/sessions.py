"""Browser sessions: sign-in with an API token or a one-time link, a signed cookie, CSRF, sign-out.

    POST /login {token}           the token checked like a bearer token (service.api.auth.TokenTable);
                                  wrong ones rate-limited per client address (SignInLimiter)
    GET /login/once?code=...      a one-time link (minted by POST /login/once with a bearer token)
    -> cookie  batchsweep_session = itsdangerous-signed, timestamped random session id (32 bytes)
               HttpOnly; SameSite=Strict; Path=/; Max-Age=session_ttl_s; Secure when served over https
    POST /logout                  deletes the session's row: the cookie is dead from then on

Sessions live in the service's store (tables `web_sessions`, `sign_in_links`; service/store/database.py), so a
restarted service, or another replica with the same `session_secret`, keeps them. The store holds
only sha256 digests of session ids and link codes: a copy of the database signs nobody in.

A session and a link belong to the owner as configured (SWEEPS_TOKENS): each row holds the mark of the
owner's token when it was made (`token_mark`: an HMAC of the token under the session key, so the store
holds nothing a token can be checked against without the key). Every look-up and every redemption
compares it with the mark of the owner's token now: after the owner was removed or given another token
the cookie or the link is refused (401, or the sign-in page) and its row deleted.

Every cookie-authenticated request that changes state (POST, PUT, PATCH, DELETE) must carry the
session's CSRF token (synchronizer token: random per session, stored with it) in the `X-CSRF-Token`
header or the `csrf_token` form field; service.api.auth checks it. Bearer-token requests need none: a
browser never adds an Authorization header on its own.

All store calls are blocking (the web layer runs them in a worker thread), like service.store.database's.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import math
import os
import secrets
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

from itsdangerous import BadSignature, URLSafeTimedSerializer
from sqlalchemy import delete, select

from service.api.errors import ApiError
from service.api.limits import PRUNE_FLOOR, TokenBucket
from service.settings import Settings
from service.store.database import SignInLinkRow, Store, WebSessionRow, utcnow

log = logging.getLogger(__name__)

COOKIE = "batchsweep_session"
CSRF_HEADER = "X-CSRF-Token"
CSRF_FIELD = "csrf_token"
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
SECRET_FILE = "session_secret"  # in the data dir, when SWEEPS_SESSION_SECRET is not set
_SALT = "batchsweep.session"  # itsdangerous' namespace: a signature made for anything else does not verify


def _digest(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()


def token_mark(key: str, token: str) -> str:
    """The mark of an owner's API token under the session key `key`: HMAC-SHA256, hex (64 characters)."""
    return hmac.new(key.encode(), f"{_SALT}.token\0{token}".encode(), hashlib.sha256).hexdigest()


@dataclass(frozen=True)
class WebSession:
    owner: str
    csrf_token: str
    expires_at: datetime

    def csrf_ok(self, given: str | None) -> bool:
        return given is not None and hmac.compare_digest(self.csrf_token.encode(), given.encode())


@dataclass(frozen=True)
class NewSession:
    cookie: str  # the cookie's value
    session: WebSession


def session_secret(settings: Settings) -> str:
    """SWEEPS_SESSION_SECRET, else the key in <data dir>/session_secret, made once (0600) on first use."""
    if settings.session_secret is not None:
        return settings.session_secret.get_secret_value()
    path: Path = settings.data_dir / SECRET_FILE
    try:
        # O_EXCL: of two processes starting at once, one writes the key and both read it
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        pass
    else:
        with os.fdopen(fd, "w") as out:
            out.write(secrets.token_urlsafe(32))
    for _ in range(50):  # the other process may be between its open and its write
        key = path.read_text().strip()
        if key:
            return key
        time.sleep(0.01)
    raise RuntimeError(f"{path} is empty: delete it and start the service again")


class Sessions:
    """Sign-in, look-up and sign-out of browser sessions, in `store`."""

    def __init__(self, store: Store, settings: Settings) -> None:
        self.store = store
        self.ttl_s, self.link_ttl_s = settings.session_ttl_s, settings.sign_in_link_ttl_s
        key = session_secret(settings)
        self._signer = URLSafeTimedSerializer(key, salt=_SALT)
        # owner -> the mark of their token as configured now; an owner not configured has none
        self._marks = {owner: token_mark(key, token.get_secret_value()) for owner, token in settings.tokens.items()}

    def _current(self, owner: str, mark: str) -> bool:
        """Whether a row made with `mark` still belongs to `owner`: configured, with the same token."""
        now = self._marks.get(owner)
        return now is not None and hmac.compare_digest(now, mark)

    # ---- sessions ---------------------------------------------------------------------------------

    def sign_in(self, owner: str) -> NewSession:
        session_id = secrets.token_urlsafe(32)
        now = utcnow()
        session = WebSession(owner, secrets.token_urlsafe(32), now + timedelta(seconds=self.ttl_s))
        with self.store.transaction() as s:
            s.execute(delete(WebSessionRow).where(WebSessionRow.expires_at <= now))  # the dead ones, on the way
            s.add(
                WebSessionRow(
                    id_hash=_digest(session_id),
                    owner=owner,
                    token_mark=self._marks[owner],
                    csrf_token=session.csrf_token,
                    created_at=now,
                    expires_at=session.expires_at,
                )
            )
        return NewSession(self._signer.dumps(session_id), session)

    def _session_id(self, cookie: str) -> str | None:
        try:
            # max_age: the signature's own timestamp bounds the cookie too, whatever the store says
            value = self._signer.loads(cookie, max_age=math.ceil(self.ttl_s))
        except BadSignature:  # includes SignatureExpired
            return None
        return value if isinstance(value, str) else None

    def lookup(self, cookie: str) -> WebSession | None:
        """The live session of a cookie value; None when unsigned, expired, signed out, or no longer its
        owner's (removed, or another token: then its row is deleted)."""
        session_id = self._session_id(cookie)
        if session_id is None:
            return None
        with self.store.transaction() as s:
            row = s.get(WebSessionRow, _digest(session_id))
            if row is None or row.expires_at <= utcnow():
                return None
            if not self._current(row.owner, row.token_mark):
                s.delete(row)
                log.info(
                    "a session of %s ended: the owner is no longer configured with the token it was made under",
                    row.owner,
                )
                return None
            return WebSession(row.owner, row.csrf_token, row.expires_at)

    def sign_out(self, cookie: str) -> bool:
        """Ends the cookie's session; False when there was none."""
        session_id = self._session_id(cookie)
        if session_id is None:
            return False
        with self.store.transaction() as s:
            return s.execute(delete(WebSessionRow).where(WebSessionRow.id_hash == _digest(session_id))).rowcount > 0  # type: ignore[attr-defined,no-any-return]

    # ---- one-time links ---------------------------------------------------------------------------

    def new_link(self, owner: str) -> tuple[str, datetime]:
        """A fresh one-time sign-in code of `owner` and when it expires."""
        code = secrets.token_urlsafe(32)
        now = utcnow()
        expires = now + timedelta(seconds=self.link_ttl_s)
        with self.store.transaction() as s:
            s.execute(delete(SignInLinkRow).where(SignInLinkRow.expires_at <= now))
            s.add(
                SignInLinkRow(
                    code_hash=_digest(code),
                    owner=owner,
                    token_mark=self._marks[owner],
                    created_at=now,
                    expires_at=expires,
                )
            )
        return code, expires

    def redeem_link(self, code: str) -> str | None:
        """The owner of a live code, which is used up by this call; None when unknown, used, expired, or
        no longer its owner's (removed, or another token)."""
        digest = _digest(code)
        with self.store.transaction() as s:
            found = s.execute(
                select(SignInLinkRow.owner, SignInLinkRow.token_mark).where(
                    SignInLinkRow.code_hash == digest, SignInLinkRow.expires_at > utcnow()
                )
            ).one_or_none()
            # the delete decides: of two requests with one code, only one deletes the row
            used = s.execute(delete(SignInLinkRow).where(SignInLinkRow.code_hash == digest)).rowcount  # type: ignore[attr-defined]
        if found is None or used != 1 or not self._current(found.owner, found.token_mark):
            return None
        return found.owner  # type: ignore[no-any-return]


class SignInLimiter:
    """Wrong tokens per client address: a `TokenBucket` (service/api/limits.py) of `sign_in_burst`, refilled
    one every `sign_in_refill_s`. A wrong token takes one; when there was none left the address is
    refused until the bucket holds one again, and while refused its tokens are not checked at all (so a
    guess cannot tell right from wrong by the answer). A right token takes nothing.

    In this process's memory: with several replicas each counts its own share (like service/api/limits.py)."""

    def __init__(self, settings: Settings) -> None:
        self.bucket = TokenBucket(settings.sign_in_burst, settings.sign_in_refill_s)
        self._refused_until: dict[str, float] = {}  # address -> time.monotonic() it may try again
        self._lock = threading.Lock()

    def check(self, address: str) -> None:
        """Raise 429 while `address` is refused."""
        with self._lock:
            until = self._refused_until.get(address)
            wait = (until - time.monotonic()) if until is not None else 0.0
            if until is not None and wait <= 0:
                del self._refused_until[address]
        if wait > 0:
            raise self._too_many(wait)

    def wrong(self, address: str) -> None:
        """Count a wrong token of `address`; raise 429 when that was one too many."""
        wait = self.bucket.take(address)
        if wait > 0:
            with self._lock:
                now = time.monotonic()
                if len(self._refused_until) >= PRUNE_FLOOR:  # forget the refusals that have run out
                    self._refused_until = {a: t for a, t in self._refused_until.items() if t > now}
                self._refused_until[address] = now + wait
            raise self._too_many(wait)

    def _too_many(self, wait: float) -> ApiError:
        seconds = max(1, math.ceil(wait))
        return ApiError(
            429,
            "too_many_sign_ins",
            f"too many wrong tokens from this address; {self.bucket.burst} are allowed, then one every "
            f"{self.bucket.refill_s:g} s: try again in {seconds} s",
            headers={"Retry-After": str(seconds)},
        )


def client_address(scope_client: tuple[str, int] | None) -> str:
    """The request's client address (the proxy's, unless SWEEPS_TRUSTED_PROXIES names it)."""
    return scope_client[0] if scope_client else "unknown"


__all__ = [
    "COOKIE",
    "CSRF_FIELD",
    "CSRF_HEADER",
    "SAFE_METHODS",
    "NewSession",
    "Sessions",
    "SignInLimiter",
    "WebSession",
    "client_address",
    "session_secret",
    "token_mark",
]
