"""Bearer tokens -> owner. Tokens come from settings (SWEEPS_TOKENS="alice=token1,bob=token2").

Every endpoint but /healthz depends on `current_owner`; an owner sees only its own sweeps.
"""

from __future__ import annotations

import hmac
import secrets
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from service.errors import unauthorized
from service.settings import Settings

# auto_error=False: a missing header becomes our 401 shape, not FastAPI's 403
_bearer = HTTPBearer(auto_error=False, description="SWEEPS_TOKENS: owner=token pairs")


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

    def __len__(self) -> int:
        return len(self._pairs)


def generate_token() -> str:
    """A fresh random token for SWEEPS_TOKENS (e.g. `make demo`)."""
    return secrets.token_urlsafe(24)


async def current_owner(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> str:
    if credentials is None or credentials.scheme.lower() != "bearer":
        raise unauthorized()
    table: TokenTable = request.app.state.tokens
    owner = table.owner(credentials.credentials)
    if owner is None:
        raise unauthorized()
    return owner


Owner = Annotated[str, Depends(current_owner)]
