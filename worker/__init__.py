"""One GPT-2 training run (model, data, optimizers, loop) and its launch on Ray.

Importing the package pins a *local* Ray cluster to loopback before anything imports ray: Ray
otherwise rewrites 127.0.0.1 to the machine's outward address and binds all interfaces (Ray 2.60,
`services.resolve_ip_for_localhost`; checked with `ss -ltn`).
Set RAY_ADDRESS to a non-loopback cluster (KubeRay) and nothing here changes.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path


def _ensure_local_ray_token() -> None:
    """Token auth needs a token before `ray start`: create ~/.ray/auth_token as a local `ray.init()`
    would (256 random bits), once, unless one is given through the environment."""
    if os.environ.get("RAY_AUTH_TOKEN") or os.environ.get("RAY_AUTH_TOKEN_PATH"):
        return
    path = Path.home() / ".ray" / "auth_token"
    if path.exists():
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)  # a concurrent creator wins
    except FileExistsError:
        return
    except OSError:  # read-only home: Ray reports the missing token itself
        return
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_hex(32))


_address = os.environ.get("RAY_ADDRESS", "")
if not _address or _address.split(":")[0] in ("127.0.0.1", "localhost"):
    # read by ray at import time: node IP = 127.0.0.1, listeners on loopback only
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    # token auth on, the token in ~/.ray/auth_token
    if os.environ.setdefault("RAY_AUTH_MODE", "token") == "token":
        _ensure_local_ray_token()
