"""Settings of the sweep service, from the environment (pydantic-settings).

Every setting has an env var; most carry the `SWEEPS_` prefix. Three keep the names their own tools
use, so one environment serves the service, `sweeps run` and the driver alike:

  RAY_ADDRESS            Ray cluster (default: the service's own local head on 127.0.0.1, which outlives
                         the service; `sweeps stop-head` stops it, see service/ray_head.py)
  MLFLOW_TRACKING_URI    MLflow store (default sqlite:///<data dir>/mlflow.db)
  MLFLOW_UI_URL          base URL of an MLflow UI for links (default: no link)

The rest: SWEEPS_DATA_DIR (./.batchsweep), SWEEPS_DATABASE_URL (sqlite:///<data dir>/service.db),
SWEEPS_OPTUNA_STORAGE (sqlite:///<data dir>/optuna.db), SWEEPS_TOKENS ("alice=<token>,bob=<token>", 16+ characters each),
SWEEPS_MAX_TRIALS, SWEEPS_MAX_TOKEN_BUDGET, SWEEPS_MAX_CONCURRENT_PER_OWNER, SWEEPS_DATA_ROOTS
(comma-separated directories), SWEEPS_HF_DATASETS (comma-separated names), SWEEPS_MAX_BODY_BYTES,
SWEEPS_HOST, SWEEPS_PORT, SWEEPS_POLL_INTERVAL_S, SWEEPS_SSE_INTERVAL_S, SWEEPS_SSE_HEARTBEAT_S,
SWEEPS_HEALTH_CACHE_S, SWEEPS_READ_CACHE_S, SWEEPS_DRY_RUN_BURST, SWEEPS_DRY_RUN_REFILL_S,
SWEEPS_SUBMIT_BURST, SWEEPS_SUBMIT_REFILL_S, SWEEPS_DRIVER_UNRESPONSIVE_S, SWEEPS_METRICS_PORT,
SWEEPS_LOG_FORMAT,
SWEEPS_MAX_EVENT_STREAMS_PER_OWNER, and for the browser pages SWEEPS_SESSION_SECRET, SWEEPS_SESSION_TTL_S,
SWEEPS_SIGN_IN_LINK_TTL_S, SWEEPS_SIGN_IN_BURST, SWEEPS_SIGN_IN_REFILL_S, SWEEPS_SIGN_IN_ROWS_BURST,
SWEEPS_SIGN_IN_ROWS_REFILL_S, SWEEPS_TRUSTED_PROXIES.
"""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Annotated, Any

from pydantic import AliasChoices, AnyHttpUrl, Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from sweeps.logs import LogFormat
from sweeps.runtime import SweepRuntime
from sweeps.spec import DEFAULT_MAX_TRIALS


def _split_csv(value: Any) -> Any:
    """ "a, b,,c" -> ["a", "b", "c"]; lists pass through (constructor arguments)."""
    if isinstance(value, str):
        return [part.strip() for part in value.split(",") if part.strip()]
    return value


class Settings(BaseSettings):
    # hide_input_in_errors: a refused SWEEPS_TOKENS must not print its tokens
    model_config = SettingsConfigDict(
        env_prefix="SWEEPS_", extra="ignore", populate_by_name=True, hide_input_in_errors=True
    )

    data_dir: Path = Path(".batchsweep")
    database_url: str | None = None  # None: sqlite:///<data dir>/service.db
    optuna_storage: str | None = None  # None: sqlite:///<data dir>/optuna.db
    # Tools' own names first: an MLFLOW_TRACKING_URI in the environment wins over the default.
    ray_address: str | None = Field(default=None, validation_alias=AliasChoices("ray_address", "RAY_ADDRESS"))
    mlflow_tracking_uri: str | None = Field(
        default=None, validation_alias=AliasChoices("mlflow_tracking_uri", "MLFLOW_TRACKING_URI")
    )
    mlflow_ui_url: str | None = Field(default=None, validation_alias=AliasChoices("mlflow_ui_url", "MLFLOW_UI_URL"))
    # where people reach the API (https://sweeps.example.com behind an Ingress): the links it hands out
    # (one-time sign-in links) start with it. None: the address a request came to (fine on a laptop;
    # behind a proxy that address is the proxy's view, and the Host header is the client's to choose)
    public_url: AnyHttpUrl | None = None
    # everything Ray Tune/Train write (trial results, checkpoints): None = <data dir>/ray_results; on a
    # multi-node cluster a URI every node reaches, e.g. s3://bucket/prefix (pyarrow's URIs)
    storage_uri: str | None = None

    # owner -> token; SecretStr keeps tokens out of reprs and logs
    tokens: Annotated[dict[str, SecretStr], NoDecode] = Field(default_factory=dict)

    max_trials: int = Field(default=DEFAULT_MAX_TRIALS, ge=1)
    max_token_budget: int = Field(default=50_000_000, ge=1)
    max_concurrent_per_owner: int = Field(default=2, ge=1)
    data_roots: Annotated[list[Path], NoDecode] = Field(default_factory=list)  # "builtin" is always allowed
    hf_datasets: Annotated[list[str], NoDecode] = Field(default_factory=list)  # "name" or "name:config"
    max_body_bytes: int = Field(default=256 * 1024, ge=1024)

    host: str = "127.0.0.1"  # loopback unless told otherwise
    port: int = Field(default=8000, ge=0, le=65535)
    poll_interval_s: float = Field(default=1.0, gt=0)
    # a sweep whose driver is lost (killed, its node gone, the cluster restarted) is relaunched under the
    # same id and resumes from its recorded trials, at most this many driver starts in all, waiting
    # driver_restart_backoff_s x 2^(starts - 1) (at most 60 s) before each relaunch
    max_driver_starts: int = Field(default=5, ge=1, le=100)
    driver_restart_backoff_s: float = Field(default=2.0, ge=0, le=60)
    # a driver whose state() has not answered for this long is killed and counts as lost (relaunched)
    driver_unresponsive_s: float = Field(default=600.0, gt=0, le=86_400)
    sse_interval_s: float = Field(default=0.5, gt=0)  # how often an event stream re-reads its sweep
    sse_heartbeat_s: float = Field(default=15.0, gt=0)
    # /healthz answers from a cache this young, so probes under load do not hammer Ray and MLflow
    health_cache_s: float = Field(default=2.0, ge=0)
    # GET /sweeps/{id} serves a render this young; this process's own writes drop it at once (0: off)
    read_cache_s: float = Field(default=1.0, ge=0)
    # FastAPI's OpenTelemetry spans, metrics and logs of each request, to the configured OTel providers
    otel: bool = False
    # Prometheus metrics (service/metrics.py) on this port, on the API's host; None: off (and no
    # per-request counting at all)
    metrics_port: int | None = Field(default=None, ge=1, le=65535)
    # log lines as "text" or "json" (one object a line, with the sweep id and trial: sweeps/logs.py), in
    # the service and in every sweep driver it launches
    log_format: LogFormat = "text"

    # ---- per-owner request limits (service/limits.py); beyond them 429 with Retry-After ----------------
    # Dry runs validate a spec and store nothing, so nothing else bounds them: a token bucket per owner
    # holds dry_run_burst dry runs and refills one every dry_run_refill_s seconds (10 per 10 s).
    dry_run_burst: int = Field(default=10, ge=1)
    dry_run_refill_s: float = Field(default=1.0, gt=0)
    # Submits are bounded by max_concurrent_per_owner once stored, but parsing and validating a refused
    # one is work too: a bucket per owner of submit_burst submits, one more every submit_refill_s seconds
    submit_burst: int = Field(default=30, ge=1)
    submit_refill_s: float = Field(default=1.0, gt=0)
    # open GET /sweeps/{id}/events streams per owner (each re-reads the store every sse_interval_s)
    max_event_streams_per_owner: int = Field(default=16, ge=1)

    # ---- the browser pages (service/sessions.py, service/routes/pages.py) ------------------------------
    # the key that signs session cookies; None: a random key kept in <data dir>/session_secret (made on
    # first start, mode 0600), so a restarted service keeps its sessions. Several replicas need one key.
    session_secret: SecretStr | None = None
    # a browser session lasts this long from sign-in (seconds; sign-out ends it at once)
    session_ttl_s: float = Field(default=12 * 3600, gt=0, le=30 * 86400)
    # a one-time sign-in link (POST /login/once, `make demo`) must be used within this many seconds
    sign_in_link_ttl_s: float = Field(default=600, gt=0, le=86400)
    # wrong tokens at POST /login per client address: a bucket of sign_in_burst, one more every
    # sign_in_refill_s seconds; beyond it 429 with Retry-After, and the token is not even checked
    sign_in_burst: int = Field(default=10, ge=1)
    sign_in_refill_s: float = Field(default=30.0, gt=0)
    # sessions (POST /login) and one-time links (POST /login/once) made per owner: each stores a row, so a
    # bucket of sign_in_rows_burst per owner, one more every sign_in_rows_refill_s seconds
    sign_in_rows_burst: int = Field(default=30, ge=1)
    sign_in_rows_refill_s: float = Field(default=10.0, gt=0)
    # proxies (IP addresses or networks, "*" for any) whose X-Forwarded-For/-Proto are believed: the
    # client address of the sign-in limit and https for Secure cookies. Empty: the TCP peer, as it is.
    trusted_proxies: Annotated[list[str], NoDecode] = Field(default_factory=list)

    @field_validator("tokens", mode="before")
    @classmethod
    def _parse_tokens(cls, value: Any) -> Any:
        if not isinstance(value, str):
            return value
        out: dict[str, str] = {}
        for item in _split_csv(value):
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

    @field_validator("data_roots", "hf_datasets", "trusted_proxies", mode="before")
    @classmethod
    def _parse_csv(cls, value: Any) -> Any:
        return _split_csv(value)

    @field_validator("session_secret", mode="after")
    @classmethod
    def _long_enough(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None and (len(value.get_secret_value()) < 32 or _placeholder(value.get_secret_value())):
            # the key is not echoed
            raise ValueError(
                "SWEEPS_SESSION_SECRET must be at least 32 characters and no placeholder (`openssl rand -hex 32`)"
            )
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

    @field_validator("data_dir", mode="after")
    @classmethod
    def _absolute(cls, value: Path) -> Path:
        # the driver runs in Ray workers whose working directory is not ours
        return value.expanduser().resolve()

    @field_validator("data_roots", mode="after")
    @classmethod
    def _absolute_roots(cls, value: list[Path]) -> list[Path]:
        return [p.expanduser().resolve() for p in value]

    # ---- resolved locations -----------------------------------------------------------------------

    @property
    def database(self) -> str:
        return self.database_url or f"sqlite:///{self.data_dir / 'service.db'}"

    def runtime(self) -> SweepRuntime:
        """Where the sweeps of this service keep their state; handed to every sweep driver as it is."""
        return SweepRuntime.at(
            self.data_dir,
            tracking_uri=self.mlflow_tracking_uri,
            optuna_storage=self.optuna_storage,
            storage_uri=self.storage_uri,
            log_format=self.log_format,
        )

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
