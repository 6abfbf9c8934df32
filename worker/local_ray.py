"""A locally started Ray cluster on loopback only, with token auth: set up once at a process's entry (the
command line's callback, the test session, a benchmark), before anything imports ray. Importing a
package of this project changes nothing; this is the one place that writes Ray's own variables.

Ray 2.60 turns 127.0.0.1 into the machine's outward address (`services.get_node_ip_address`) and then
listens on every interface, unless RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 is in the environment when ray is
imported (it is read into `ray._private.ray_constants` then); with it, GCS, raylet, dashboard and workers
listen on 127.0.0.1 only (checked with `ss -ltn`). With RAY_ADDRESS naming a remote cluster (KubeRay),
nothing here changes anything.
"""

from __future__ import annotations

import os
import secrets
import sys
from pathlib import Path

LOOPBACK_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
# Ray Train V2's and Tune's knobs for every process of a cluster started here (a trial's worker group that
# does not come up in 120 s is a lost node, not a slow one; Tune's per-trial logs are only the JSON logger a
# sweep's driver adds: its default CSV logger repeats it and its TensorBoard logger imports torch into the
# driver, ~1.5 s of each sweep's start; the runs are in MLflow)
TRAIN_ENV: dict[str, str] = {
    "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.1",
    "RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S": "120",
    "TUNE_DISABLE_AUTO_CALLBACK_LOGGERS": "1",
}


class RayImportedTooEarly(RuntimeError):
    """ray was imported before `use_local_ray()` set its variables."""


def is_local(address: str | None) -> bool:
    return not address or address.split(":")[0] in ("127.0.0.1", "localhost", "local")


def use_local_ray() -> None:
    """Loopback and token auth for a local cluster (RAY_ADDRESS unset or on this machine); each variable
    only where the environment does not set it already. Also Ray Train's knobs (TRAIN_ENV)."""
    from worker.settings import WorkerSettings

    for key, value in TRAIN_ENV.items():
        os.environ.setdefault(key, value)  # a cluster started by this process inherits them
    if not is_local(WorkerSettings().ray_address):
        return
    if "ray" in sys.modules and os.environ.get("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER") is None:
        raise RayImportedTooEarly(
            "ray was imported before worker.local_ray.use_local_ray(): call it at the process's entry, "
            "first, or a local cluster listens on every interface"
        )
    for key, value in LOOPBACK_ENV.items():
        os.environ.setdefault(key, value)
    if os.environ.setdefault("RAY_AUTH_MODE", "token") == "token":
        ensure_token()


def train_env() -> dict[str, str]:
    """Ray Train's knobs as this process has them (the defaults of TRAIN_ENV unless the environment sets
    them): what a runtime_env hands to every process of a job."""
    return {key: os.environ.get(key, value) for key, value in TRAIN_ENV.items()}


def ensure_token() -> None:
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
