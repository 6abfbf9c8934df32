"""The HTTP API's own models: what only an HTTP answer has (the created sweep, health, the error shape).

What the service tells about sweeps (`SweepSummary`, `SweepDetail`, `DryRunResult`, ...) is the domain
layer's, in `service.models`; the routes answer those as they are.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from service.models import Status


class _Out(BaseModel):
    model_config = ConfigDict(extra="ignore")


class SweepCreated(_Out):
    id: str
    status: Status
    replayed: bool = Field(description="true when an earlier submit with the same Idempotency-Key made this sweep")


class CheckResult(_Out):
    ok: bool
    error: str | None = None
    latency_ms: float


class Health(_Out):
    status: Literal["ok", "unavailable"]
    checks: dict[str, CheckResult]


class ErrorDetail(_Out):
    field: str
    message: str
    value: Any = None


class ErrorInfo(_Out):
    code: str
    message: str
    details: list[ErrorDetail] = Field(default_factory=list)


class ErrorResponse(_Out):
    error: ErrorInfo


def error_responses(*codes: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI `responses=` entries documenting the error shape."""
    return {code: {"model": ErrorResponse} for code in codes}
