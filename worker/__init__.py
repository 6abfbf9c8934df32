"""One GPT-2 training run (model, data, optimizers, loop) and its launch on Ray.

Importing the package pins a *local* Ray cluster to loopback before anything imports ray: Ray
otherwise rewrites 127.0.0.1 to the machine's outward address and binds all interfaces (RECON.md).
Set RAY_ADDRESS to a non-loopback cluster (KubeRay) and nothing here changes.
"""

from __future__ import annotations

import os

_address = os.environ.get("RAY_ADDRESS", "")
if not _address or _address.split(":")[0] in ("127.0.0.1", "localhost"):
    # read by ray at import time: node IP = 127.0.0.1, listeners on loopback only
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    # token auth on, the token in ~/.ray/auth_token (created by the first local cluster)
    os.environ.setdefault("RAY_AUTH_MODE", "token")
