"""The domain layer's refusals (service/errors.py) name what went wrong; the HTTP layer answers each kind
with one status, its Retry-After where it has one, and the one error shape. No module below the HTTP layer
raises the HTTP layer's own error."""

from __future__ import annotations

import grimp
import pytest
from fastapi.testclient import TestClient
from svc_helpers import auth

from service import errors
from service.api.errors import STATUS_OF, as_api_error

# the HTTP layer and what runs it; every other module of the service is the domain layer
HTTP_LAYER = ("service.api", "service.web", "service.app", "service.server", "service.__main__")


@pytest.mark.parametrize(
    ("kind", "status"),
    [
        (errors.Invalid, 422),
        (errors.NotFound, 404),
        (errors.Conflict, 409),
        (errors.TooMany, 429),
        (errors.Unsupported, 415),
    ],
)
def test_each_kind_has_its_status(kind: type[errors.ServiceError], status: int) -> None:
    api = as_api_error(kind("some_code", "a message", [{"field": "f", "message": "m", "value": 1}]))
    assert (api.status_code, api.code, api.message, api.details) == (
        status,
        "some_code",
        "a message",
        [{"field": "f", "message": "m", "value": 1}],
    )
    assert api.headers is None
    assert set(STATUS_OF) == set(errors.ServiceError.__subclasses__())  # every kind is mapped


def test_a_wait_becomes_retry_after() -> None:
    api = as_api_error(errors.TooMany("too_many_sweeps", "wait", retry_after_s=7))
    assert api.status_code == 429 and api.headers == {"Retry-After": "7"}


def test_the_domain_layer_does_not_import_the_http_layer() -> None:
    # every module of the service outside its HTTP layer, at the top of a file or inside a function (the
    # graph lint-imports checks its contract on): none imports the HTTP layer, directly or through another
    graph = grimp.build_graph("service")
    domain = sorted(m for m in graph.modules if not in_http_layer(m))
    assert {"service.manager", "service.policy", "service.views", "service.models", "service.errors"} <= set(domain)
    for module in domain:
        reached = sorted(m for m in graph.find_upstream_modules(module) if in_http_layer(m))
        assert reached == [], f"{module} imports the HTTP layer"


def in_http_layer(module: str) -> bool:
    return any(module == p or module.startswith(p + ".") for p in HTTP_LAYER)


def test_over_http_a_domain_refusal_is_the_error_shape(client: TestClient) -> None:
    resp = client.get("/sweeps/nope-12345678", headers=auth())
    assert resp.status_code == 404
    assert resp.json() == {"error": {"code": "not_found", "message": "no sweep 'nope-12345678'", "details": []}}
    resp = client.post("/sweeps", content=b"name: x", headers=auth() | {"Content-Type": "text/plain"})
    assert resp.status_code == 415 and resp.json()["error"]["code"] == "unsupported_media_type"
