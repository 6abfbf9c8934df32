"""Bearer tokens -> owner. Tokens come from settings (SWEEPS_TOKENS="alice=token1,bob=token2").

Every endpoint but /healthz depends on `current_owner`; an owner sees only its own sweeps.
"""

from __future__ import annotations

import hmac
import secrets
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPBearer

from service.errors import unauthorized
from service.settings import Settings


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
    """The owner of the request's bearer token, else 401 in the API's error shape.

    One dependency that is also the OpenAPI security scheme: FastAPI resolves each dependency of a
    route on every request, and with a separate `HTTPBearer` sub-dependency (and the state objects as
    three more) a cached `GET /sweeps/{id}` cost ~345 µs in the app, ~280 µs with these two (measured
    in-process).
    """

    def __init__(self) -> None:
        # auto_error=False: a missing header becomes our 401 shape, not FastAPI's
        super().__init__(auto_error=False, scheme_name="HTTPBearer", description="SWEEPS_TOKENS: owner=token pairs")

    async def __call__(self, request: Request) -> str:  # type: ignore[override]
        table: TokenTable = request.app.state.tokens
        owner = table.bearer(request.headers.get("authorization"))
        if owner is None:
            raise unauthorized()
        return owner


current_owner = BearerOwner()
Owner = Annotated[str, Depends(current_owner)]
