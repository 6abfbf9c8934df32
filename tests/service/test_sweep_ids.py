"""A path segment that no sweep id can be (a NUL, capitals, spaces, non-ASCII, too long) is refused by
every route that takes a sweep id with one 422 that names the value, the same on SQLite and PostgreSQL,
and never reaches the store (PostgreSQL cannot even be asked about a string with a NUL in it)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from harness import PostgresServer, tiny_spec
from sqlalchemy import event
from svc_helpers import FakeLauncher, auth, wait_until
from test_pages import sign_in

from service.app import create_app
from service.settings import Settings
from service.store.database import Store

# (in the URL, as the route receives it)
BAD_IDS = [
    ("abc%00", "abc\x00"),
    ("%00", "\x00"),
    ("Abc-1", "Abc-1"),
    ("a%20b", "a b"),
    ("caf%C3%A9", "café"),
    ("a" * 81, "a" * 81),
]
ROUTES = [
    ("GET", "/sweeps/{}"),
    ("GET", "/sweeps/{}/curves"),
    ("GET", "/sweeps/{}/events"),
    ("GET", "/sweeps/{}/report"),
    ("GET", "/sweeps/{}/dashboard"),
    ("POST", "/sweeps/{}/cancel"),
]


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request: pytest.FixtureRequest, make_settings: Callable[..., Settings]) -> Iterator[str | None]:
    if request.param == "sqlite":
        yield None  # the data dir's own
        return
    pg: PostgresServer = request.getfixturevalue("postgres")
    yield pg.url
    Store(pg.url).delete_all()  # the PostgreSQL database is shared by the session


@pytest.fixture
def served(
    store_url: str | None, make_settings: Callable[..., Settings], launcher: FakeLauncher
) -> Iterator[tuple[TestClient, list[Any]]]:
    """The app on the store, and the parameters of every statement it sends the store from now on."""
    # raise_server_exceptions=False: a 500 is an answer to assert on, not an exception in the test
    with TestClient(
        create_app(make_settings(database_url=store_url), launcher=launcher), raise_server_exceptions=False
    ) as client:
        sent: list[Any] = []
        store: Store = client.app.state.store  # type: ignore[attr-defined]
        event.listen(store.engine, "before_cursor_execute", lambda *a: sent.append(a[3]))
        yield client, sent


def test_an_id_no_sweep_can_have_is_422_on_every_route_before_the_store(
    served: tuple[TestClient, list[Any]], launcher: FakeLauncher, caplog: pytest.LogCaptureFixture
) -> None:
    client, sent = served
    resp = client.post("/sweeps", json=tiny_spec(), headers=auth())
    assert resp.status_code == 201, resp.text
    sweep_id = resp.json()["id"]
    wait_until(lambda: sweep_id in launcher.drivers, 10)
    assert client.get(f"/sweeps/{sweep_id}", headers=auth()).status_code == 200
    sent.clear()
    caplog.set_level(logging.ERROR)
    for method, route in ROUTES:
        for in_url, value in BAD_IDS:
            resp = client.request(method, route.format(in_url), headers=auth())
            assert resp.status_code == 422, f"{method} {route.format(in_url)}: {resp.status_code} {resp.text[:300]}"
            error = resp.json()["error"]
            assert error["code"] == "invalid_request" and "sweep_id" in error["message"]
            assert [d["field"] for d in error["details"]] == ["path.sweep_id"]
            assert error["details"][0]["value"] == value  # named: the value as the route received it
    # none of them reached the store (its poller's statements name no bad id), and nothing was logged as
    # an error (a traceback is how a 500 showed up)
    assert not [p for p in sent if any(v in str(p) for _, v in BAD_IDS)], sent
    assert [r for r in caplog.records if r.levelno >= logging.ERROR] == []
    # a real id, and one that is merely unknown, answer as before
    assert client.get(f"/sweeps/{sweep_id}/curves", headers=auth()).status_code == 200
    for method, route in ROUTES:
        assert client.request(method, route.format("no-such-sweep-00000000"), headers=auth()).status_code == 404


def test_unsigned_requests_are_401_before_the_id_is_judged(served: tuple[TestClient, list[Any]]) -> None:
    client, _ = served
    for method, route in ROUTES:
        assert client.request(method, route.format("abc%00")).status_code == 401


def test_a_browser_session_gets_the_same_422(served: tuple[TestClient, list[Any]]) -> None:
    client, _ = served
    csrf = sign_in(client)
    assert client.get("/sweeps/abc%00/dashboard").status_code == 422
    resp = client.post("/sweeps/abc%00/cancel", headers={"X-CSRF-Token": csrf})
    assert resp.status_code == 422 and resp.json()["error"]["details"][0]["value"] == "abc\x00"
    # the CSRF check comes first: a cookie's cancel without the token is refused whatever the id
    assert client.post("/sweeps/abc%00/cancel").status_code == 403


def test_the_openapi_documents_the_ids_form(served: tuple[TestClient, list[Any]]) -> None:
    client, _ = served
    paths = client.get("/openapi.json").json()["paths"]
    for method, route in ROUTES:
        operation = paths[route.format("{sweep_id}")][method.lower()]
        (param,) = [p for p in operation["parameters"] if p["name"] == "sweep_id"]
        assert param["in"] == "path" and param["schema"]["pattern"] == "^[a-z0-9-]{1,80}$"
        assert "422" in operation["responses"]


@pytest.mark.parametrize("key", ["k\x00ey", "k\x1bey", "ключ", "k" * 201])
def test_an_idempotency_key_of_other_than_printable_ascii_is_422_on_both_submit_routes(
    served: tuple[TestClient, list[Any]], launcher: FakeLauncher, key: str
) -> None:
    client, sent = served
    csrf = sign_in(client)
    form = {"spec": "name: x\n", "action": "submit", "csrf_token": csrf, "idempotency_key": key}
    resp = client.post("/submit", data=form)
    assert resp.status_code == 422, resp.text[:300]
    assert resp.json()["error"]["details"][0]["field"] == "body.idempotency_key"
    if "\x00" not in key and key.isascii():  # a header cannot carry a NUL or non-ASCII over HTTP at all
        resp = client.post("/sweeps", json=tiny_spec(), headers=auth() | {"Idempotency-Key": key})
        assert resp.status_code == 422 and resp.json()["error"]["details"][0]["field"] == "header.idempotency-key"
    assert launcher.drivers == {} and not [p for p in sent if any(key in str(v) for v in (p or ()))]
