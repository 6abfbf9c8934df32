"""One JSON shape for every error the service answers:

    {"error": {"code": "not_found", "message": "no sweep 'x'", "details": [...]}}

`details` lists field problems for 422s (`{"field", "message", "value"}`, as `format_validation_error`
gives them) and is empty otherwise. `code` is stable; `message` is for people. A refused value is
echoed as a short excerpt at most; an unexpected error answers a bare 500 and is logged with its
traceback (never sent: it names the server's files).
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from service.errors import Conflict, Invalid, NotFound, ServiceError, TooMany, Unsupported
from sweeps.spec import json_value

log = logging.getLogger(__name__)


class ApiError(Exception):
    """Raise anywhere below a route to answer with the error shape."""

    def __init__(
        self,
        status_code: int,
        code: str,
        message: str,
        details: list[dict[str, Any]] | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status_code, self.code, self.message = status_code, code, message
        self.details = details or []
        self.headers = headers


def unauthorized(message: str = "missing or invalid bearer token") -> ApiError:
    return ApiError(401, "unauthorized", message, headers={"WWW-Authenticate": "Bearer"})


# The status each kind of the domain layer's refusals answers with (service/errors.py)
STATUS_OF: dict[type[ServiceError], int] = {Invalid: 422, NotFound: 404, Conflict: 409, TooMany: 429, Unsupported: 415}


def as_api_error(exc: ServiceError) -> ApiError:
    """A refusal of the domain layer as the HTTP answer: its kind's status, Retry-After where it has one."""
    status = next(code for kind, code in STATUS_OF.items() if isinstance(exc, kind))
    headers = {"Retry-After": str(exc.retry_after_s)} if exc.retry_after_s is not None else None
    return ApiError(status, exc.code, exc.message, exc.details, headers)


class PayloadTooLarge(ApiError):
    def __init__(self, limit: int) -> None:
        super().__init__(413, "payload_too_large", f"request body exceeds the limit of {limit} bytes")


def error_body(code: str, message: str, details: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {"error": {"code": code, "message": message, "details": details or []}}


def error_response(
    status_code: int,
    code: str,
    message: str,
    details: list[dict[str, Any]] | None = None,
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    return JSONResponse(error_body(code, message, details), status_code=status_code, headers=headers)


_HTTP_CODES = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    409: "conflict",
    413: "payload_too_large",
    415: "unsupported_media_type",
    422: "invalid_request",
    429: "too_many_requests",
    503: "unavailable",
}


async def _api_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ApiError)
    return error_response(exc.status_code, exc.code, exc.message, exc.details, exc.headers)


def service_error_response(exc: ServiceError) -> JSONResponse:
    """A refusal of the domain layer as its answer (the exception handler's, and `HotReads`')."""
    api = as_api_error(exc)
    return error_response(api.status_code, api.code, api.message, api.details, api.headers)


async def _service_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ServiceError)
    return service_error_response(exc)


async def _http_error(_: Request, exc: Exception) -> JSONResponse:
    # Starlette's own 404s (unknown path) and 405s, in our shape
    assert isinstance(exc, StarletteHTTPException)
    code = _HTTP_CODES.get(exc.status_code, "error")
    return error_response(exc.status_code, code, str(exc.detail), headers=exc.headers)


async def _request_validation_error(_: Request, exc: Exception) -> JSONResponse:
    # query parameters, path parameters and headers that FastAPI itself validates
    assert isinstance(exc, RequestValidationError)
    details = [
        {
            "field": ".".join(str(p) for p in err.get("loc", ())),
            "message": err.get("msg", ""),
            "value": _json_safe(err.get("input")),
        }
        for err in exc.errors()
    ]
    fields = ", ".join(d["field"] for d in details)
    return error_response(422, "invalid_request", f"invalid request: {fields}", details)


async def _unhandled(request: Request, exc: Exception) -> JSONResponse:
    log.exception("unhandled error on %s %s", request.method, request.url.path)
    return error_response(500, "internal", "internal server error")


def _json_safe(value: Any) -> Any:
    if isinstance(value, tuple):
        value = list(value)
    return json_value(value)  # JSON and short, else an excerpt


def install(app: FastAPI) -> None:
    app.add_exception_handler(ApiError, _api_error)
    app.add_exception_handler(ServiceError, _service_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(RequestValidationError, _request_validation_error)
    app.add_exception_handler(Exception, _unhandled)
