"""What the service's domain layer (`service.manager`, `service.policy`) refuses, as errors of its own.

They name what went wrong, not an HTTP status: the HTTP layer (`service.api.errors`) answers each kind
with its status and the service's one error shape, and the pages show the same message. `code` is
stable, for machines; `message` is for people; `details` lists field problems
(`{"field", "message", "value"}`).
"""

from __future__ import annotations

from typing import Any

from worker.messages import excerpt


class ServiceError(Exception):
    def __init__(
        self, code: str, message: str, details: list[dict[str, Any]] | None = None, *, retry_after_s: int | None = None
    ) -> None:
        super().__init__(message)
        self.code, self.message = code, message
        self.details = details or []
        self.retry_after_s = retry_after_s  # when asking again may succeed (seconds); None: not by waiting


class Invalid(ServiceError):
    """The request, as it stands, is refused: a spec, a query parameter, a key reused, a cap exceeded."""


class NotFound(ServiceError):
    """No such sweep for this owner (the same whether it does not exist or is another owner's)."""


class Conflict(ServiceError):
    """The sweep is not in a state that allows it (cancel a finished one, the report of a running one)."""


class TooMany(ServiceError):
    """A limit on what one owner may have at once or within a window; `retry_after_s` says when to ask again."""


class Unsupported(ServiceError):
    """A request body of a media type the service does not read."""


def not_found(sweep_id: str, kind: str = "sweep") -> NotFound:
    return NotFound("not_found", f"no {kind} {excerpt(sweep_id)}")


def invalid(message: str, details: list[dict[str, Any]]) -> Invalid:
    return Invalid("invalid_spec", message, details)
