"""A browser session and a one-time sign-in link belong to the owner as configured (service/api/sessions.py):
after the service restarts with the owner removed from SWEEPS_TOKENS, or with another token for them,
the session reads, submits and cancels nothing, the link signs nobody in, and both are gone from the
store; the other owners' sessions and links go on. Against uvicorn on a loopback port (drivers faked),
restarted on the same data dir and session key."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

import httpx
import pytest
from harness import tiny_spec
from sqlalchemy import func, select
from svc_helpers import ALICE, BOB, FakeLauncher, ThreadServer, auth, wait_until
from test_pages import HTML, csrf_of

from service.api.sessions import COOKIE
from service.settings import Settings
from service.store.database import SignInLinkRow, Store, WebSessionRow

NEW_ALICE = "alice-new-token-0123456789"


@dataclass
class Browser:
    """A signed-in browser: its cookie, the session's CSRF token, and a one-time link minted beside it."""

    cookie: str
    csrf: str
    link_code: str


def signed_in(url: str, token: str) -> Browser:
    with httpx.Client(base_url=url, timeout=30) as http:
        resp = http.post("/login", data={"token": token}, headers={"Origin": url})
        assert resp.status_code == 303, resp.text
        csrf = csrf_of(http.get("/", headers=HTML).text)
        made = http.post("/login/once", headers=auth(token))
        assert made.status_code == 201, made.text
        code = re.search(r"code=([\w-]+)", made.json()["url"]).group(1)  # type: ignore[union-attr]
        return Browser(http.cookies[COOKIE], csrf, code)


def rows(settings: Settings, owner: str) -> tuple[int, int]:
    """(sessions, links) of `owner` in the store."""
    store = Store(settings.database)
    try:
        with store.transaction() as s:
            sessions = s.execute(select(func.count()).where(WebSessionRow.owner == owner)).scalar_one()
            links = s.execute(select(func.count()).where(SignInLinkRow.owner == owner)).scalar_one()
    finally:
        store.dispose()
    return int(sessions), int(links)


def as_browser(url: str, browser: Browser) -> httpx.Client:
    return httpx.Client(base_url=url, cookies={COOKIE: browser.cookie}, timeout=30)


# each a first request of its own session after the restart (the first refusal deletes the row)
REQUESTS = ["read", "submit", "cancel", "page"]


@pytest.mark.parametrize("change", ["removed", "token changed"])
def test_a_removed_or_retokened_owners_session_and_link_end(
    change: str, make_settings: Callable[..., Settings], launcher: FakeLauncher
) -> None:
    before = make_settings()
    with ThreadServer(before, launcher) as server:
        alice = {what: signed_in(server.url, ALICE) for what in REQUESTS}
        bob = signed_in(server.url, BOB)
        with as_browser(server.url, alice["read"]) as http:
            resp = http.post("/sweeps", json=tiny_spec(), headers={"X-CSRF-Token": alice["read"].csrf})
            assert resp.status_code == 201, resp.text
            sweep_id = resp.json()["id"]
        wait_until(lambda: sweep_id in launcher.drivers, 10)
    assert rows(before, "alice") == (len(REQUESTS), len(REQUESTS))

    tokens = f"bob={BOB}" if change == "removed" else f"alice={NEW_ALICE},bob={BOB}"
    after = make_settings(tokens=tokens)
    with ThreadServer(after, launcher) as server:
        url = server.url
        # reads, submits and cancels: refused as a request with no session at all
        with as_browser(url, alice["read"]) as http:
            assert http.get(f"/sweeps/{sweep_id}").status_code == 401
            assert http.get("/sweeps").status_code == 401
        with as_browser(url, alice["submit"]) as http:
            resp = http.post("/sweeps", json=tiny_spec(), headers={"X-CSRF-Token": alice["submit"].csrf})
            assert resp.status_code == 401, resp.text
        with as_browser(url, alice["cancel"]) as http:
            resp = http.post(f"/sweeps/{sweep_id}/cancel", headers={"X-CSRF-Token": alice["cancel"].csrf})
            assert resp.status_code == 401 and launcher.cancelled == [], resp.text
        # a browser is sent to sign in, and the list page is the sign-in form
        with as_browser(url, alice["page"]) as http:
            page = http.get(f"/sweeps/{sweep_id}/dashboard", headers=HTML, follow_redirects=False)
            assert page.status_code == 303 and page.headers["location"].startswith("/?next="), page.text
            assert 'action="/login"' in http.get("/", headers=HTML).text
        # the links minted before sign nobody in
        with httpx.Client(base_url=url, timeout=30) as http:
            for browser in alice.values():
                resp = http.post("/login/once/confirm", data={"code": browser.link_code}, headers={"Origin": url})
                assert resp.status_code == 401 and COOKIE not in resp.cookies, resp.text
                assert "This sign-in link was used already or has expired." in resp.text
        assert rows(after, "alice") == (0, 0)

        # the other owner's session and link go on
        with as_browser(url, bob) as http:
            assert http.get("/sweeps").status_code == 200
        with httpx.Client(base_url=url, timeout=30) as http:
            resp = http.post("/login/once/confirm", data={"code": bob.link_code}, headers={"Origin": url})
            assert resp.status_code == 200 and COOKIE in resp.cookies
            assert http.get("/sweeps").status_code == 200

        # the token configured now signs in as ever, to the same sweeps
        if change == "token changed":
            fresh = signed_in(url, NEW_ALICE)
            with as_browser(url, fresh) as http:
                assert http.get("/sweeps").json()["total"] == 1
                resp = http.post(f"/sweeps/{sweep_id}/cancel", headers={"X-CSRF-Token": fresh.csrf})
                # this sweep's driver told, and no other's (the supervisor's pass tells it again while it runs)
                assert resp.status_code == 202 and set(launcher.cancelled) == {sweep_id}, launcher.cancelled


def test_sessions_and_links_outlive_a_restart_with_the_same_tokens(
    make_settings: Callable[..., Settings], launcher: FakeLauncher
) -> None:
    """The control: the same requests after a restart that changed no owner all pass."""
    settings = make_settings()
    with ThreadServer(settings, launcher) as server:
        alice = signed_in(server.url, ALICE)
    with ThreadServer(settings, launcher) as server, as_browser(server.url, alice) as http:
        assert http.get("/sweeps").status_code == 200
        resp = http.post("/sweeps", json=tiny_spec(), headers={"X-CSRF-Token": alice.csrf})
        assert resp.status_code == 201, resp.text
        resp = http.post(f"/sweeps/{resp.json()['id']}/cancel", headers={"X-CSRF-Token": alice.csrf})
        assert resp.status_code == 202
        resp = http.post("/login/once/confirm", data={"code": alice.link_code}, headers={"Origin": server.url})
        assert resp.status_code == 200 and COOKIE in resp.cookies
