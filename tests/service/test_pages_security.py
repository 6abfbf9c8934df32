"""Security of the browser sign-in (service/api/sessions.py, service/api/auth.py, service/web/pages.py),
in-process: nothing works across owners by cookie either; a cookie's state change without the
session's CSRF token is refused; the cookie's flags; sign-out ends the session for good; wrong tokens
are rate-limited per client address; one-time links are one-time; the bearer API is as it was."""

from __future__ import annotations

import re
import time
from http.cookies import SimpleCookie
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from harness import tiny_spec
from itsdangerous import URLSafeTimedSerializer
from svc_helpers import ALICE, BOB, FakeLauncher, auth, wait_until
from test_pages import HTML, sign_in, submit

from service.api.sessions import COOKIE
from service.app import create_app


def cookie_attrs(resp: httpx.Response) -> dict[str, Any]:
    header = next(v for k, v in resp.headers.multi_items() if k == "set-cookie" and v.startswith(COOKIE + "="))
    morsel = SimpleCookie(header)[COOKIE]
    flags = {k.lower() for k in re.findall(r";\s*(\w+)(?=;|$)", header)}
    return {"value": morsel.value, "samesite": morsel["samesite"], "path": morsel["path"],
            "max-age": morsel["max-age"], "httponly": "httponly" in flags, "secure": "secure" in flags}  # fmt: skip


def as_cookie(value: str) -> dict[str, str]:
    return {"Cookie": f"{COOKIE}={value}"}


def error_code(resp: httpx.Response) -> str:
    return str(resp.json()["error"]["code"])


# ---- the cookie ----------------------------------------------------------------------------------


def test_cookie_is_httponly_strict_signed_and_expiring(client: TestClient) -> None:
    resp = client.post("/login", data={"token": ALICE}, follow_redirects=False)
    c = cookie_attrs(resp)
    assert c["httponly"] and c["samesite"].lower() == "strict" and c["path"] == "/"
    assert int(c["max-age"]) == 12 * 3600  # session_ttl_s
    assert not c["secure"]  # served over plain http here
    # signed: the value is itsdangerous' payload.timestamp.signature, not the session id in the store
    assert c["value"].count(".") == 2


def test_cookie_is_secure_over_https(make_settings: Any, launcher: FakeLauncher) -> None:
    with TestClient(create_app(make_settings(), launcher=launcher), base_url="https://testserver") as client:
        resp = client.post("/login", data={"token": ALICE}, follow_redirects=False)
        assert cookie_attrs(resp)["secure"]


def test_forwarded_proto_counts_only_from_a_trusted_proxy(make_settings: Any, launcher: FakeLauncher) -> None:
    https = {"X-Forwarded-Proto": "https"}
    with TestClient(create_app(make_settings(), launcher=launcher)) as client:
        assert not cookie_attrs(client.post("/login", data={"token": ALICE}, headers=https, follow_redirects=False))[
            "secure"
        ]
    with TestClient(create_app(make_settings(trusted_proxies="*"), launcher=launcher)) as client:
        assert cookie_attrs(client.post("/login", data={"token": ALICE}, headers=https, follow_redirects=False))[
            "secure"
        ]


def test_trusted_proxies_must_be_addresses(make_settings: Any) -> None:
    with pytest.raises(
        ValueError, match=r"SWEEPS_TRUSTED_PROXIES takes IP addresses or networks \(or \*\), got 'nope'"
    ):
        make_settings(trusted_proxies="10.0.0.0/8,nope")
    assert make_settings(trusted_proxies="10.0.0.0/8, 127.0.0.1").trusted_proxies == ["10.0.0.0/8", "127.0.0.1"]


def test_a_short_session_secret_is_refused(make_settings: Any) -> None:
    with pytest.raises(ValueError, match="SWEEPS_SESSION_SECRET must be at least 32 characters") as info:
        make_settings(session_secret="short-key")
    assert "short-key" not in str(info.value)


def test_forged_tampered_and_expired_cookies_are_refused(make_settings: Any, launcher: FakeLauncher) -> None:
    with TestClient(create_app(make_settings(session_ttl_s=1), launcher=launcher)) as client:
        value = cookie_attrs(client.post("/login", data={"token": ALICE}, follow_redirects=False))["value"]
        client.cookies.clear()
        assert client.get("/sweeps", headers=as_cookie(value)).status_code == 200
        payload, stamp, sig = value.split(".")
        for bad in (f"{payload}.{stamp}.{sig[:-2]}xx", "garbage", URLSafeTimedSerializer("other key").dumps("x")):
            assert error_code(client.get("/sweeps", headers=as_cookie(bad))) == "unauthorized"
        time.sleep(2.1)  # past session_ttl_s (the signature's age and the store's expiry both say so)
        assert client.get("/sweeps", headers=as_cookie(value)).status_code == 401


# ---- sign-out ------------------------------------------------------------------------------------


def test_sign_out_ends_the_session_for_good(client: TestClient) -> None:
    csrf = sign_in(client)
    value = client.cookies[COOKIE]
    resp = client.post("/logout", data={"csrf_token": csrf}, follow_redirects=False)
    assert resp.status_code == 303 and cookie_attrs(resp)["value"] == ""  # dropped in this browser ...
    client.cookies.clear()
    # ... and dead anywhere else it was copied to: the session is gone from the store
    assert client.get("/sweeps", headers=as_cookie(value)).status_code == 401
    assert (
        client.post("/sweeps", json=tiny_spec(), headers=as_cookie(value) | {"X-CSRF-Token": csrf}).status_code == 401
    )
    assert 'action="/login"' in client.get("/", headers=HTML | as_cookie(value)).text


def test_sign_out_needs_the_csrf_token(client: TestClient) -> None:
    sign_in(client)
    resp = client.post("/logout", data={"csrf_token": "wrong"}, follow_redirects=False)
    assert resp.status_code == 403 and error_code(resp) == "csrf_failed"
    assert client.get("/sweeps").status_code == 200  # still signed in


def test_sessions_outlive_a_restart_of_the_service(make_settings: Any, launcher: FakeLauncher) -> None:
    settings = make_settings()
    with TestClient(create_app(settings, launcher=launcher)) as client:
        value = cookie_attrs(client.post("/login", data={"token": ALICE}, follow_redirects=False))["value"]
    with TestClient(create_app(settings, launcher=launcher)) as client:  # a new process on the same store and key
        assert client.get("/sweeps", headers=as_cookie(value)).status_code == 200


# ---- CSRF ----------------------------------------------------------------------------------------


def test_state_changes_by_cookie_need_the_sessions_csrf_token(client: TestClient, launcher: FakeLauncher) -> None:
    csrf = sign_in(client)
    sweep_id = submit(client, csrf)
    wait_until(lambda: sweep_id in launcher.drivers, 10)
    other = sign_in(TestClient(client.app))  # another session's token (same owner) is not this one's
    for headers in ({}, {"X-CSRF-Token": ""}, {"X-CSRF-Token": "x" * 43}, {"X-CSRF-Token": other}):
        for method, path, kwargs in (
            ("POST", "/sweeps", {"json": tiny_spec()}),
            ("POST", f"/sweeps/{sweep_id}/cancel", {}),
            ("POST", "/sweeps?dry_run=true", {"json": tiny_spec()}),
        ):
            resp = client.request(method, path, headers=headers, **kwargs)
            assert resp.status_code == 403, (path, headers, resp.text)
            err = resp.json()["error"]
            assert err["code"] == "csrf_failed" and "X-CSRF-Token" in err["message"]
    # forms: the submit page's form without its field stores nothing
    resp = client.post("/submit", data={"spec": "name: x", "action": "submit"})
    assert resp.status_code == 403 and error_code(resp) == "csrf_failed"
    assert launcher.cancelled == [] and client.get("/sweeps").json()["total"] == 1
    # reads need none; with the token, the change goes through
    assert client.get(f"/sweeps/{sweep_id}").status_code == 200
    assert client.post(f"/sweeps/{sweep_id}/cancel", headers={"X-CSRF-Token": csrf}).status_code == 202


def test_bearer_requests_need_no_csrf_token_and_keep_their_401s(client: TestClient) -> None:
    assert client.post("/sweeps", json=tiny_spec(), headers=auth()).status_code == 201
    resp = client.get("/sweeps")
    assert resp.status_code == 401 and resp.headers["www-authenticate"] == "Bearer"
    # a wrong bearer header is wrong, whatever cookie comes with it
    sign_in(client)
    resp = client.get("/sweeps", headers={"Authorization": "Bearer nope"})
    assert resp.status_code == 401 and error_code(resp) == "unauthorized"


def test_sign_in_forms_from_another_site_are_refused(client: TestClient) -> None:
    resp = client.post("/login", data={"token": ALICE}, headers={"Origin": "https://evil.example"})
    assert resp.status_code == 403 and error_code(resp) == "cross_site"
    assert COOKIE not in resp.cookies
    ok = client.post("/login", data={"token": ALICE}, headers={"Origin": "http://testserver"}, follow_redirects=False)
    assert ok.status_code == 303
    # the sign-in link's confirmation is a sign-in form too
    resp = client.post("/login/once/confirm", data={"code": "x" * 43}, headers={"Origin": "https://evil.example"})
    assert resp.status_code == 403 and error_code(resp) == "cross_site"


@pytest.mark.parametrize("target", ["//evil.example/x", "https://evil.example", "/\\evil.example", "evil"])
def test_no_redirect_off_the_site_after_sign_in(client: TestClient, target: str) -> None:
    resp = client.post("/login", data={"token": ALICE, "next": target}, follow_redirects=False)
    assert resp.status_code == 303 and resp.headers["location"] == "/"


# ---- owners --------------------------------------------------------------------------------------


def test_nothing_works_across_owners_by_cookie(client: TestClient, launcher: FakeLauncher) -> None:
    alice = TestClient(client.app)
    alice_csrf = sign_in(alice)
    sweep_id = submit(alice, alice_csrf)
    wait_until(lambda: sweep_id in launcher.drivers, 10)
    bob = TestClient(client.app)
    csrf = sign_in(bob, BOB)
    for path in (f"/sweeps/{sweep_id}", f"/sweeps/{sweep_id}/report", f"/sweeps/{sweep_id}/events"):
        assert error_code(bob.get(path)) == "not_found", path
    assert error_code(bob.get(f"/sweeps/{sweep_id}/dashboard")) == "not_found"
    page = bob.get(f"/sweeps/{sweep_id}/dashboard", headers=HTML)  # the browser's page: 404 too
    assert page.status_code == 404 and "Cancel sweep" not in page.text and "sweeps-data" not in page.text
    # the same page as for a sweep that does not exist: nothing tells bob that alice's does
    missing = bob.get("/sweeps/tiny-00000000/dashboard", headers=HTML)
    assert page.text.replace(sweep_id, "tiny-00000000") == missing.text
    resp = bob.post(f"/sweeps/{sweep_id}/cancel", headers={"X-CSRF-Token": csrf})
    assert resp.status_code == 404 and launcher.cancelled == []
    assert bob.get("/sweeps").json()["total"] == 0
    assert sweep_id not in bob.get("/", headers=HTML).text
    # alice's CSRF token does not make bob's cookie hers
    assert bob.post(f"/sweeps/{sweep_id}/cancel", headers={"X-CSRF-Token": alice_csrf}).status_code == 403
    assert sweep_id in alice.get("/", headers=HTML).text


def test_a_browser_without_session_is_sent_to_sign_in(client: TestClient) -> None:
    resp = client.get("/sweeps/some-sweep/dashboard?x=1", headers=HTML, follow_redirects=False)
    assert resp.status_code == 303 and resp.headers["location"] == "/?next=%2Fsweeps%2Fsome-sweep%2Fdashboard%3Fx%3D1"
    assert client.get("/submit", headers=HTML, follow_redirects=False).headers["location"] == "/?next=%2Fsubmit"
    # API clients (no text/html in Accept) keep their 401
    assert client.get("/sweeps/some-sweep/dashboard").status_code == 401


# ---- wrong tokens --------------------------------------------------------------------------------


def test_wrong_tokens_are_rate_limited_per_client_address(make_settings: Any, launcher: FakeLauncher) -> None:
    settings = make_settings(sign_in_burst=2, sign_in_refill_s=60, trusted_proxies="*")
    with TestClient(create_app(settings, launcher=launcher)) as client:
        here = {"X-Forwarded-For": "203.0.113.7"}
        assert client.post("/login", data={"token": ALICE}, headers=here, follow_redirects=False).status_code == 303
        client.cookies.clear()
        for _ in range(2):
            assert client.post("/login", data={"token": "guess"}, headers=here).status_code == 401
        resp = client.post("/login", data={"token": "guess"}, headers=here)
        assert resp.status_code == 429 and 50 <= int(resp.headers["retry-after"]) <= 60
        assert "too many wrong tokens" in resp.text
        # while refused, the token is not even checked: the right one is refused the same way
        right = client.post("/login", data={"token": ALICE}, headers=here, follow_redirects=False)
        assert right.status_code == 429 and COOKIE not in right.cookies
        # another address has its own bucket; the right token never took from it
        there = {"X-Forwarded-For": "198.51.100.9"}
        assert client.post("/login", data={"token": ALICE}, headers=there, follow_redirects=False).status_code == 303


# ---- one-time links ------------------------------------------------------------------------------


def test_one_time_links_are_one_time_short_lived_and_minted_by_token_only(
    make_settings: Any, launcher: FakeLauncher
) -> None:
    with TestClient(create_app(make_settings(sign_in_link_ttl_s=1), launcher=launcher)) as client:

        def redeem(url: str) -> Any:
            code = url.split("code=")[1]
            return client.post("/login/once/confirm", data={"code": code, "next": "/"})

        url = client.post("/login/once", headers=auth()).json()["url"]
        for _ in range(3):  # a link scanner fetching it, a preview, the person: nothing used up yet
            assert COOKIE not in client.get(url.removeprefix("http://testserver")).cookies
        first = redeem(url)
        assert first.status_code == 200 and cookie_attrs(first)["httponly"]
        client.cookies.clear()
        again = redeem(url)
        assert again.status_code == 401 and "used already or has expired" in again.text
        assert COOKIE not in again.cookies
        late = client.post("/login/once", headers=auth(BOB)).json()["url"]
        time.sleep(1.2)
        assert redeem(late).status_code == 401
        assert redeem("x?code=made-up").status_code == 401
        # a session cookie cannot mint links (the API token can)
        csrf = sign_in(client)
        resp = client.post("/login/once", headers={"X-CSRF-Token": csrf})
        assert resp.status_code == 401 and error_code(resp) == "unauthorized"


def test_the_store_keeps_digests_not_session_ids_or_codes(client: TestClient) -> None:
    from sqlalchemy import select

    from service.store.database import SignInLinkRow, WebSessionRow

    value = cookie_attrs(client.post("/login", data={"token": ALICE}, follow_redirects=False))["value"]
    code = client.post("/login/once", headers=auth()).json()["url"].split("code=")[1]
    store = client.app.state.store  # type: ignore[attr-defined]
    with store.transaction() as s:
        stored = [
            *s.execute(select(WebSessionRow.id_hash)).scalars(),
            *s.execute(select(SignInLinkRow.code_hash)).scalars(),
        ]
    session_id = client.app.state.sessions._session_id(value)  # type: ignore[attr-defined]
    assert session_id and code and not any(x in (session_id, code) for x in stored)
    assert all(re.fullmatch(r"[0-9a-f]{64}", x) for x in stored)


def test_a_page_of_another_site_cannot_switch_a_person_into_another_account(client: TestClient) -> None:
    """Login CSRF: an attacker mints a link for their own account and gets a victim's browser to load it."""
    csrf = sign_in(client)  # the victim, alice, is signed in
    attacker = client.post("/login/once", headers=auth(BOB)).json()["url"]
    shown = client.get(attacker.removeprefix("http://testserver"), headers=HTML)
    assert shown.status_code == 200 and 'id="switch"' in shown.text and "<b>alice</b>" in shown.text
    assert 'signed in as <b id="owner">alice</b>' in client.get("/", headers=HTML).text  # still alice
    # the attacker's page posting the confirmation itself: refused, the code stays unused
    code = attacker.split("code=")[1]
    forged = client.post(
        "/login/once/confirm", data={"code": code}, headers={"Origin": "https://evil.example"}, follow_redirects=False
    )
    assert forged.status_code == 403 and COOKIE not in forged.cookies
    assert 'signed in as <b id="owner">alice</b>' in client.get("/", headers=HTML).text
    assert csrf


@pytest.mark.parametrize(
    "target",
    ["//evil.example", "/\\evil.example", "/\t/evil.example", "/\n/evil.example", "/ /evil.example", "https://evil.example",
     "/%2F", "javascript:alert(1)", "/\x7f/x"],
)  # fmt: skip
def test_next_accepts_same_origin_paths_only(target: str) -> None:
    from service.api.auth import safe_next

    expected = "/%2F" if target == "/%2F" else "/"  # an encoded slash stays a path on this site
    assert safe_next(target) == expected
    assert safe_next("/sweeps/x-1/dashboard?a=b") == "/sweeps/x-1/dashboard?a=b"


def test_the_sign_in_link_page_sends_the_browser_nowhere_else(client: TestClient) -> None:
    url = client.post("/login/once", headers=auth()).json()["url"].removeprefix("http://testserver")
    shown = client.get(f"{url}&next=/%09/evil.example", headers=HTML)
    assert 'name="next" value="/"' in shown.text
    code = url.split("code=")[1]
    done = client.post("/login/once/confirm", data={"code": code, "next": "/\t/evil.example"})
    assert done.status_code == 200 and '<meta http-equiv="refresh" content="0; url=/">' in done.text


def test_sign_in_links_start_with_the_configured_public_url_not_the_host_header(
    make_settings: Any, launcher: FakeLauncher
) -> None:
    with TestClient(create_app(make_settings(public_url="https://sweeps.example.com/"), launcher=launcher)) as client:
        made = client.post("/login/once", headers=auth() | {"Host": "evil.example"})
        assert made.json()["url"].startswith("https://sweeps.example.com/login/once?code=")
    with TestClient(create_app(make_settings(), launcher=launcher)) as client:  # none configured: the request's
        assert client.post("/login/once", headers=auth()).json()["url"].startswith("http://testserver/login/once")


def test_signing_out_ends_the_event_streams_that_session_opened(make_settings: Any, launcher: FakeLauncher) -> None:
    from svc_helpers import ThreadServer

    with ThreadServer(make_settings(), launcher) as server, httpx.Client(base_url=server.url, timeout=30) as http:
        sweep_id = http.post("/sweeps", json=tiny_spec(), headers=auth()).json()["id"]
        resp = http.post("/login", data={"token": ALICE}, follow_redirects=False)
        assert resp.status_code == 303 and COOKIE in http.cookies
        csrf = re.search(r'name="csrf-token" content="([^"]+)"', http.get("/", headers=HTML).text).group(1)  # type: ignore[union-attr]
        bearer = httpx.Client(base_url=server.url, timeout=30, headers=auth())  # a token's stream, beside it
        with (
            http.stream("GET", f"/sweeps/{sweep_id}/events") as cookie_stream,
            bearer.stream("GET", f"/sweeps/{sweep_id}/events") as token_stream,
        ):
            lines = cookie_stream.iter_lines()
            assert any(line.startswith("event: progress") for line, _ in zip(lines, range(20)))
            assert http.post("/logout", data={"csrf_token": csrf}, follow_redirects=False).status_code == 303
            started = time.monotonic()
            for _ in lines:  # the server ends the cookie's stream: iteration stops
                assert time.monotonic() - started < 10, "the stream outlived its session"
            assert time.monotonic() - started < 5
            # the bearer token's stream goes on: its heartbeats still come
            token_lines = token_stream.iter_lines()
            assert any(line == ": heartbeat" for line, _ in zip(token_lines, range(200)))
        bearer.close()


def test_sessions_and_links_made_per_owner_are_bounded(make_settings: Any, launcher: FakeLauncher) -> None:
    settings = make_settings(sign_in_rows_burst=3, sign_in_rows_refill_s=600)
    with TestClient(create_app(settings, launcher=launcher)) as client:
        assert client.post("/login/once", headers=auth()).status_code == 201
        assert client.post("/login", data={"token": ALICE}, follow_redirects=False).status_code == 303
        assert client.post("/login/once", headers=auth()).status_code == 201
        refused = client.post("/login/once", headers=auth())
        assert refused.status_code == 429 and error_code(refused) == "too_many_sign_ins"
        page = client.post("/login", data={"token": ALICE}, follow_redirects=False)
        assert page.status_code == 429 and "Retry-After" in page.headers
        assert client.post("/login/once", headers=auth(BOB)).status_code == 201  # per owner


def test_limiter_maps_forget_what_has_refilled() -> None:
    from service.api.limits import PRUNE_FLOOR, TokenBucket

    now = [0.0]
    bucket = TokenBucket(burst=2, refill_s=1.0, clock=lambda: now[0])
    for i in range(PRUNE_FLOOR - 1):  # one try from each of many addresses
        bucket.take(f"10.0.{i // 256}.{i % 256}")
    assert len(bucket) == PRUNE_FLOOR - 1
    now[0] = 5.0  # all refilled
    bucket.take("a")
    bucket.take("a")
    assert len(bucket) == 1  # only the key that is not back to a full bucket stays
    assert bucket.take("a") > 0  # and its count was kept
