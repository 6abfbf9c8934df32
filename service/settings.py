"""Settings of the sweep service, from the environment (pydantic-settings).

`Settings` extends what a sweep needs (`sweeps.settings.SweepSettings`, itself extending the worker's
`worker.settings.WorkerSettings`) with the HTTP service's own. Every setting has an environment variable,
most with the `SWEEPS_` prefix; the reference of them all, `docs/configuration.md`, is generated from
these classes: `python -m service.config_doc > docs/configuration.md` (a test keeps it current).
"""

from __future__ import annotations

import ipaddress
import math
from typing import Annotated, Any

from pydantic import AliasChoices, AnyHttpUrl, Field, SecretStr, field_validator
from pydantic_settings import NoDecode

from sweeps.settings import SweepSettings
from sweeps.spec import DEFAULT_MAX_TRIALS
from worker.settings import env_field, split_csv


class Settings(SweepSettings):
    """The HTTP service's settings: a sweep's (data dir, stores, Ray, data roots) and its own."""

    # model_config is SweepSettings' (SWEEPS_ prefix; hide_input_in_errors: a refused SWEEPS_TOKENS must not
    # print its tokens)

    database_url: str | None = None
    """the service's store of sweeps, owners and sessions, any SQLAlchemy URL; None: sqlite:///<data
    dir>/service.db"""
    mlflow_ui_url: str | None = Field(default=None, validation_alias=AliasChoices("mlflow_ui_url", "MLFLOW_UI_URL"))
    """base URL of an MLflow UI that the pages and reports link to; None: no link"""
    public_url: AnyHttpUrl | None = None
    """where people reach the API (https://sweeps.example.com behind an Ingress): the links it hands out (one-time
    sign-in links) start with it. None: the address a request came to (fine on a laptop; behind a proxy that
    address is the proxy's view, and the Host header is the client's to choose)"""

    tokens: Annotated[dict[str, SecretStr], NoDecode] = Field(default_factory=dict)
    """the owners and their API tokens, "alice=<token>,bob=<token>" (16+ characters each, unique; `openssl rand
    -hex 32` makes one); empty: nobody can sign in. Kept as SecretStr: out of reprs and logs"""

    ray_auth_token: SecretStr | None = env_field(None, "RAY_AUTH_TOKEN")
    """the shared secret of a Ray cluster with token auth (RAY_AUTH_MODE=token), which Ray itself reads; checked
    here so that a placeholder copied from an example is refused at start; None: Ray's own token file"""

    max_trials: int = Field(default=DEFAULT_MAX_TRIALS, ge=1)
    """the most trials one sweep may plan (search, confirmation seeds and adaptive seeds together); a larger spec
    gets 422"""
    max_token_budget: int = Field(default=50_000_000, ge=1)
    """the most tokens one trial may train (the spec's token_budget); a larger spec gets 422"""
    max_concurrent_per_owner: int = Field(default=2, ge=1)
    """sweeps of one owner that may be queued or running at once; one more gets 429 with Retry-After"""
    # ---- what one sweep and one owner may cost (service/policy.py), in GPU-hours as the dry run prices them ----
    max_gpu_hours_per_sweep: float | None = None
    """the most GPU-hours one sweep may cost: the most a dry run says it can cost (cost.gpu_hours.max) at the dry
    run's default pricing, one H100-SXM at MFU 0.4, whatever ?gpu= or ?mfu= a dry run asks; a submit priced above it
    gets 422 naming the price and this cap. None: no cap"""
    max_gpu_hours_per_owner: float | None = None
    """the most GPU-hours of the sweeps one owner submits within gpu_hours_window_s, each counted at the price it was
    submitted at (as max_gpu_hours_per_sweep prices it) whatever became of it: queued, running, finished, failed or
    cancelled; a submit that would take the owner past it gets 429 naming the prices and this cap, with Retry-After
    (when enough of their sweeps have left the window). None: no cap"""
    gpu_hours_window_s: float = Field(default=7 * 86400.0, gt=0, le=366 * 86400.0)
    """the period of max_gpu_hours_per_owner, in seconds: the sweeps an owner submitted this long before a submit
    count (default 7 days)"""
    hf_datasets: Annotated[list[str], NoDecode] = Field(default_factory=list)
    """comma-separated HF dataset names ("name" or "name:config") a spec may train on as hf:<name>; "builtin"
    always may"""
    max_body_bytes: int = Field(default=256 * 1024, ge=1024)
    """the largest request body (bytes); a larger one gets 413 before it is read"""

    host: str = "127.0.0.1"
    """loopback unless told otherwise"""
    port: int = Field(default=8000, ge=0, le=65535)
    """the API's port (0: any free one)"""
    poll_interval_s: float = Field(default=1.0, gt=0)
    """how often the supervisor polls the sweep drivers and queued sweeps (seconds)"""
    max_driver_starts: int = Field(default=5, ge=1, le=100)
    """a sweep whose driver is lost (killed, its node gone, the cluster restarted) is relaunched under the same id
    and resumes from its recorded trials, at most this many driver starts in all, waiting
    driver_restart_backoff_s x 2^(starts - 1) (at most 60 s) before each relaunch"""
    driver_restart_backoff_s: float = Field(default=2.0, ge=0, le=60)
    """the first wait before a lost driver is relaunched (seconds; doubled for each further start)"""
    driver_unresponsive_s: float = Field(default=600.0, gt=0, le=86_400)
    """a driver whose state() has not answered for this long is killed and counts as lost (relaunched)"""
    sse_interval_s: float = Field(default=0.5, gt=0)
    """how often an event stream re-reads its sweep"""
    sse_heartbeat_s: float = Field(default=15.0, gt=0)
    """an event stream sends a comment this often when nothing changed, so proxies keep it open (seconds)"""
    health_cache_s: float = Field(default=2.0, ge=0)
    """/healthz answers from a cache this young, so probes under load do not hammer Ray and MLflow"""
    read_cache_s: float = Field(default=1.0, ge=0)
    """GET /sweeps/{id} serves a render this young; this process's own writes drop it at once (0: off)"""
    otel: bool = False
    """FastAPI's OpenTelemetry spans, metrics and logs of each request, to the configured OTel providers"""
    metrics_port: int | None = Field(default=None, ge=1, le=65535)
    """Prometheus metrics (service/api/metrics.py) on this port, on the API's host; None: off (and no per-request
    counting at all)"""

    # ---- per-owner request limits (service/api/limits.py); beyond them 429 with Retry-After ----------------
    dry_run_burst: int = Field(default=10, ge=1)
    """Dry runs validate a spec and store nothing, so nothing else bounds them: a token bucket per owner holds
    dry_run_burst dry runs and refills one every dry_run_refill_s seconds (10 per 10 s)."""
    dry_run_refill_s: float = Field(default=1.0, gt=0)
    """seconds until the dry-run bucket holds one more"""
    submit_burst: int = Field(default=30, ge=1)
    """Submits are bounded by max_concurrent_per_owner once stored, but parsing and validating a refused one is
    work too: a bucket per owner of submit_burst submits, one more every submit_refill_s seconds"""
    submit_refill_s: float = Field(default=1.0, gt=0)
    """seconds until the submit bucket holds one more"""
    max_event_streams_per_owner: int = Field(default=16, ge=1)
    """open GET /sweeps/{id}/events streams per owner (each re-reads the store every sse_interval_s)"""

    # ---- the browser pages (service/api/sessions.py, service/web/pages.py) ------------------------------
    session_secret: SecretStr | None = None
    """the key that signs session cookies; None: a random key kept in <data dir>/session_secret (made on first
    start, mode 0600), so a restarted service keeps its sessions. Several replicas need one key."""
    session_ttl_s: float = Field(default=12 * 3600, gt=0, le=30 * 86400)
    """a browser session lasts this long from sign-in (seconds; sign-out ends it at once)"""
    sign_in_link_ttl_s: float = Field(default=600, gt=0, le=86400)
    """a one-time sign-in link (POST /login/once, `make demo`) must be used within this many seconds"""
    sign_in_burst: int = Field(default=10, ge=1)
    """wrong tokens at POST /login per client address: a bucket of sign_in_burst, one more every sign_in_refill_s
    seconds; beyond it 429 with Retry-After, and the token is not even checked"""
    sign_in_refill_s: float = Field(default=30.0, gt=0)
    """seconds until a client address may try one more wrong token"""
    sign_in_rows_burst: int = Field(default=30, ge=1)
    """sessions (POST /login) and one-time links (POST /login/once) made per owner: each stores a row, so a bucket
    of sign_in_rows_burst per owner, one more every sign_in_rows_refill_s seconds"""
    sign_in_rows_refill_s: float = Field(default=10.0, gt=0)
    """seconds until an owner may make one more session or sign-in link"""
    trusted_proxies: Annotated[list[str], NoDecode] = Field(default_factory=list)
    """proxies (IP addresses or networks, "*" for any) whose X-Forwarded-For/-Proto are believed: the client
    address of the sign-in limit and https for Secure cookies. Empty: the TCP peer, as it is."""

    # ---- connections (service/server.py): what clients' sockets may hold of a service reachable directly ----
    max_connections: int | None = Field(default=None, ge=1)
    """client connections open at once; one more first closes the connection idle longest (no request in
    progress), or gets 503 and is closed when every one is busy. None: the file-descriptor soft limit (`ulimit
    -n`) less 200 that the service keeps for itself (at least half of it), at most 4096; logged at start"""
    header_timeout_s: float = Field(default=10.0, gt=0, le=600)
    """a request head (request line and headers) must be whole within this many seconds of the connection's
    opening, or of its first byte after the previous response; else 408 and the connection is closed"""
    max_header_bytes: int = Field(default=32 * 1024, ge=1024, le=1024 * 1024)
    """the largest request head (bytes); a larger one gets 431 and the connection is closed"""
    body_timeout_s: float = Field(default=30.0, gt=0, le=3600)
    """a request body must be whole within this many seconds of its head; else 408 and the connection is closed"""
    keep_alive_s: float = Field(default=5.0, gt=0, le=600)
    """a connection idle between requests is closed after this many seconds"""

    @field_validator("tokens", mode="before")
    @classmethod
    def _parse_tokens(cls, value: Any) -> Any:
        if not isinstance(value, str):
            return value
        out: dict[str, str] = {}
        for item in split_csv(value):
            owner, sep, token = item.partition("=")
            owner, token = owner.strip(), token.strip()
            if not sep or not owner or not token:
                # the offending item is not echoed: it may hold a token
                raise ValueError(
                    "SWEEPS_TOKENS must look like 'alice=token1,bob=token2' (owner=token, comma-separated)"
                )
            if owner in out:
                raise ValueError(f"SWEEPS_TOKENS names owner {owner!r} twice")
            out[owner] = token
        if len(set(out.values())) != len(out):
            raise ValueError("SWEEPS_TOKENS gives one token to two owners; tokens must be unique")
        for owner, token in out.items():
            if len(token) < MIN_TOKEN_CHARS or _placeholder(token):
                # the token is not echoed; its owner is
                raise ValueError(
                    f"SWEEPS_TOKENS: the token of {owner!r} is a placeholder or shorter than {MIN_TOKEN_CHARS} "
                    f"characters; make one with `openssl rand -hex 32`"
                )
        return out

    @field_validator("max_gpu_hours_per_sweep", "max_gpu_hours_per_owner", mode="after")
    @classmethod
    def _gpu_hours_cap(cls, value: float | None) -> float | None:
        if value is not None and not (math.isfinite(value) and value > 0):
            raise ValueError(f"must be a positive number of GPU-hours (unset: no cap), got {value:g}")
        return value

    @field_validator("hf_datasets", "trusted_proxies", mode="before")
    @classmethod
    def _parse_csv(cls, value: Any) -> Any:
        return split_csv(value)

    @field_validator("session_secret", mode="after")
    @classmethod
    def _long_enough(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None and (len(value.get_secret_value()) < 32 or _placeholder(value.get_secret_value())):
            # the key is not echoed
            raise ValueError(
                "SWEEPS_SESSION_SECRET must be at least 32 characters and no placeholder (`openssl rand -hex 32`)"
            )
        return value

    @field_validator("ray_auth_token", mode="after")
    @classmethod
    def _ray_token(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None and (len(value.get_secret_value()) < 32 or _placeholder(value.get_secret_value())):
            # the token is not echoed
            raise ValueError("must be at least 32 characters and no placeholder (`openssl rand -hex 32`)")
        return value

    @field_validator("trusted_proxies", mode="after")
    @classmethod
    def _networks(cls, value: list[str]) -> list[str]:
        for item in value:
            if item == "*":
                continue
            try:
                ipaddress.ip_network(item, strict=False)
            except ValueError:
                raise ValueError(
                    f"SWEEPS_TRUSTED_PROXIES takes IP addresses or networks (or *), got {item[:60]!r}"
                ) from None
        return value

    # ---- resolved locations -----------------------------------------------------------------------

    @property
    def database(self) -> str:
        return self.database_url or f"sqlite:///{self.data_dir / 'service.db'}"

    @property
    def tracking_uri(self) -> str:
        return self.runtime().tracking_uri

    @property
    def optuna_url(self) -> str:
        return self.runtime().optuna_storage

    def owner_of(self) -> dict[str, str]:
        """token -> owner."""
        return {secret.get_secret_value(): owner for owner, secret in self.tokens.items()}

    def mlflow_link(self, experiment_id: str | None) -> str | None:
        if not self.mlflow_ui_url or not experiment_id:
            return None
        # the runs table, not the GenAI overview: MLflow 3's UI picks its view from `workflowType` in the
        # URL (else from the browser's last choice, GenAI at first); the experiment's own kind tag
        # (sweeps/layout.py) says the same to versions and pages that read it
        return f"{self.mlflow_ui_url.rstrip('/')}/#/experiments/{experiment_id}/runs?workflowType=machine_learning"


def redacted(uri: str) -> str:
    """`uri` with the password of its user part replaced by `***` (for logs and messages)."""
    from urllib.parse import urlsplit, urlunsplit

    try:
        parts = urlsplit(uri)
    except ValueError:
        return "<an unparsable URI>"
    if parts.password is None:
        return uri
    host = parts.netloc.rsplit("@", 1)[1]
    return urlunsplit(parts._replace(netloc=f"{parts.username}:***@{host}"))


MIN_TOKEN_CHARS = 16  # an API token; the one-time sign-in codes and session ids are 32 random bytes


def _placeholder(secret: str) -> bool:
    """A secret copied from an example (deploy/kubernetes/secret.example.yaml says CHANGE-ME)."""
    return "changeme" in secret.lower().replace("-", "").replace("_", "")


def load_settings(**overrides: Any) -> Settings:
    """`Settings` from the environment and `overrides`; a bad value raises `SettingsError`, whose lines
    name each variable and what is wrong with it (for a one-line refusal, not pydantic's traceback)."""
    from pydantic import ValidationError

    try:
        return Settings(**overrides)
    except ValidationError as exc:
        raise SettingsError([_setting_problem(e) for e in exc.errors()]) from None


class SettingsError(ValueError):
    """Settings the service cannot start with; `problems`: one line per bad variable."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems


def _setting_problem(error: Any) -> str:
    """`SWEEPS_PORT: must be <= 65535` from one pydantic error: the variable's name, then the message."""
    field = str(error["loc"][0]) if error["loc"] else ""
    info = Settings.model_fields.get(field)
    alias = info.validation_alias if info is not None else None
    names = [a for a in alias.choices if isinstance(a, str) and a.isupper()] if isinstance(alias, AliasChoices) else []
    variable = names[0] if names else f"{Settings.model_config.get('env_prefix', '')}{field}".upper()
    message = str(error["msg"]).removeprefix("Value error, ").removeprefix(f"{variable}: ")
    return f"{variable}: {message}"
