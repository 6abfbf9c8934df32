"""The GPU-hours caps (issue 46, "Cost"): a cap per sweep and a cap per owner over a window, both priced by
the dry run's own `sweeps.cost.price` (its upper bound, at its default pricing). Over the cap per sweep a
submit is a 422, over the cap per owner a 429 with Retry-After; both name the price and the cap, and
store and start nothing. In-process app, drivers faked (no Ray)."""

from __future__ import annotations

import html
import re
import threading
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
import yaml
from fastapi.testclient import TestClient
from harness import tiny_spec
from svc_helpers import BOB, FakeLauncher, auth, wait_until

from service.settings import SettingsError, load_settings
from service.store import database
from service.store.database import Store, SweepRow, utcnow
from sweeps.cost import price
from sweeps.spec import SweepSpec

WEEK_S = 7 * 86400.0


def spec_price(spec: dict[str, Any]) -> float:
    """What the dry run says the spec costs at most, on its default pricing (an H100 at MFU 0.4)."""
    return price(SweepSpec.model_validate(spec)).gpu_hours.max


TINY = spec_price(tiny_spec())


def error(resp: Any, status: int, code: str) -> dict[str, Any]:
    assert resp.status_code == status, resp.text
    body = resp.json()["error"]
    assert body["code"] == code, body
    return body  # type: ignore[no-any-return]


def hours_in(message: str, before: str) -> float:
    """The number of GPU-hours `message` gives right after `before`."""
    match = re.search(re.escape(before) + r" ([0-9.,e+-]+) GPU-hours", message)
    assert match, (before, message)
    return float(match.group(1).replace(",", ""))


def total(client: TestClient, token: str | None = None) -> int:
    return client.get("/sweeps", headers=auth(token) if token else auth()).json()["total"]  # type: ignore[no-any-return]


def test_a_sweep_over_the_cap_per_sweep_is_refused_with_its_price_and_the_cap(
    app_client: Callable[..., TestClient], launcher: FakeLauncher
) -> None:
    cap = TINY / 2
    client = app_client(max_gpu_hours_per_sweep=cap)
    err = error(client.post("/sweeps", json=tiny_spec(), headers=auth()), 422, "gpu_hours_per_sweep")
    message = err["message"]
    assert hours_in(message, "priced at") == pytest.approx(TINY, rel=1e-3)
    assert hours_in(message, "the cap per sweep is") == pytest.approx(cap, rel=1e-3)
    assert "SWEEPS_MAX_GPU_HOURS_PER_SWEEP" in message and "H100" in message
    # nothing recorded, nothing started
    assert total(client) == 0 and launcher.started == []
    # a smaller spec (half the tokens per trial) passes the same cap
    small = tiny_spec(token_budget=2500)
    assert spec_price(small) < cap
    resp = client.post("/sweeps", json=small, headers=auth())
    assert resp.status_code == 201, resp.text


def test_the_dry_run_says_whether_a_spec_passes_the_caps(app_client: Callable[..., TestClient]) -> None:
    client = app_client(max_gpu_hours_per_sweep=TINY / 2, max_gpu_hours_per_owner=TINY * 10)
    # priced for the caps on their own pricing, whatever the dry run asks (a huge peak prices it at nothing)
    resp = client.post("/sweeps", params={"dry_run": "true", "peak_tflops": 100_000}, json=tiny_spec(), headers=auth())
    assert resp.status_code == 200, resp.text
    caps = resp.json()["caps"]
    assert caps["gpu_hours"] == pytest.approx(TINY) and resp.json()["cost"]["gpu_hours"]["max"] < TINY / 50
    assert caps["passes"] is False and caps["max_gpu_hours_per_sweep"] == TINY / 2
    assert len(caps["problems"]) == 1 and "SWEEPS_MAX_GPU_HOURS_PER_SWEEP" in caps["problems"][0]
    assert caps["window_s"] == WEEK_S
    resp = client.post("/sweeps?dry_run=true", json=tiny_spec(token_budget=2500), headers=auth())
    assert resp.json()["caps"]["passes"] is True and resp.json()["caps"]["problems"] == []
    assert total(client) == 0


def test_the_cap_per_owner_counts_their_sweeps_within_the_window(
    app_client: Callable[..., TestClient], launcher: FakeLauncher
) -> None:
    cap = TINY * 2.5
    client = app_client(max_gpu_hours_per_owner=cap)
    store: Store = client.app.state.store  # type: ignore[attr-defined]
    first, second = (client.post("/sweeps", json=tiny_spec(f"t{i}"), headers=auth()) for i in range(2))
    assert first.status_code == second.status_code == 201, (first.text, second.text)
    # the first finishes, the second is cancelled: both still count, at the price they were submitted at
    wait_until(lambda: len(launcher.started) == 2, 10)
    launcher.finish(first.json()["id"])
    assert client.post(f"/sweeps/{second.json()['id']}/cancel", headers=auth()).status_code == 202
    launcher.finish(second.json()["id"], status="cancelled")
    wait_until(lambda: client.get("/sweeps?status=queued&status=running", headers=auth()).json()["total"] == 0, 10)

    resp = client.post("/sweeps", json=tiny_spec("t2"), headers=auth())
    err = error(resp, 429, "gpu_hours_per_owner")
    message = err["message"]
    assert hours_in(message, "are priced at") == pytest.approx(2 * TINY, rel=1e-3)
    assert hours_in(message, "this one, priced at") == pytest.approx(TINY, rel=1e-3)
    assert hours_in(message, "the cap per owner is") == pytest.approx(cap, rel=1e-3)
    assert "SWEEPS_MAX_GPU_HOURS_PER_OWNER" in message and "7 days" in message
    # room again when the first leaves the window, a week after it was submitted
    assert WEEK_S - 120 < int(resp.headers["Retry-After"]) <= WEEK_S
    assert total(client) == 2 and len(launcher.started) == 2

    # another owner is unaffected
    assert client.post("/sweeps", json=tiny_spec("b0"), headers=auth(BOB)).status_code == 201
    # the dry run says the same, for each owner
    caps = client.post("/sweeps?dry_run=true", json=tiny_spec("t2"), headers=auth()).json()["caps"]
    assert caps["passes"] is False and caps["owner_gpu_hours"] == pytest.approx(2 * TINY)
    assert len(caps["problems"]) == 1 and "SWEEPS_MAX_GPU_HOURS_PER_OWNER" in caps["problems"][0]
    caps = client.post("/sweeps?dry_run=true", json=tiny_spec("b1"), headers=auth(BOB)).json()["caps"]
    assert caps["passes"] is True and caps["owner_gpu_hours"] == pytest.approx(TINY)

    # the first sweep leaves the window: the third fits
    with store.transaction() as s:
        s.get(SweepRow, first.json()["id"]).created_at = utcnow() - timedelta(days=7, seconds=1)  # type: ignore[union-attr]
    resp = client.post("/sweeps", json=tiny_spec("t2"), headers=auth())
    assert resp.status_code == 201, resp.text
    assert total(client) == 3


def test_a_cap_per_owner_below_one_sweeps_price_is_a_422(app_client: Callable[..., TestClient]) -> None:
    client = app_client(max_gpu_hours_per_owner=TINY / 3)
    err = error(client.post("/sweeps", json=tiny_spec(), headers=auth()), 422, "gpu_hours_per_sweep")
    assert "SWEEPS_MAX_GPU_HOURS_PER_OWNER" in err["message"]
    assert hours_in(err["message"], "priced at") == pytest.approx(TINY, rel=1e-3)
    assert total(client) == 0


def test_under_the_caps_a_sweep_is_accepted_and_stored_with_its_price(
    app_client: Callable[..., TestClient], launcher: FakeLauncher
) -> None:
    client = app_client(max_gpu_hours_per_sweep=TINY * 1.01, max_gpu_hours_per_owner=TINY * 3.01)
    key = {"Idempotency-Key": "k0"}
    ids = []
    for i in range(3):
        resp = client.post("/sweeps", json=tiny_spec(f"u{i}"), headers=auth() | (key if i == 0 else {}))
        assert resp.status_code == 201, resp.text
        ids.append(resp.json()["id"])
    # the owner is at the cap now: a retry of the first submit is that sweep again, never refused
    replay = client.post("/sweeps", json=tiny_spec("u0"), headers=auth() | key)
    assert replay.status_code == 201 and replay.json()["id"] == ids[0] and replay.json()["replayed"] is True
    error(client.post("/sweeps", json=tiny_spec("u3"), headers=auth()), 429, "gpu_hours_per_owner")
    store: Store = client.app.state.store  # type: ignore[attr-defined]
    assert [store.get(i).gpu_hours for i in ids] == [pytest.approx(TINY)] * 3  # type: ignore[union-attr]
    wait_until(lambda: sorted(launcher.started) == sorted(ids), 10)


def test_the_submit_pages_check_says_whether_a_submit_would_pass_the_caps(
    app_client: Callable[..., TestClient],
) -> None:
    client = app_client(max_gpu_hours_per_sweep=TINY * 2, max_gpu_hours_per_owner=TINY * 1.5)

    def check(name: str) -> str:
        resp = client.post("/submit", data={"spec": yaml.safe_dump(tiny_spec(name)), "action": "check"}, headers=auth())
        assert resp.status_code == 200, resp.text
        return html.unescape(resp.text)

    fits = check("c0")
    assert "within the caps" in fits and "per sweep" in fits and "0 used" in fits and "Submit it to start" in fits
    assert client.post("/sweeps", json=tiny_spec("c0"), headers=auth()).status_code == 201
    over = check("c1")
    assert "A submit now would be refused" in over and "SWEEPS_MAX_GPU_HOURS_PER_OWNER" in over
    assert "Submit it to start" not in over


def test_no_caps_by_default(client: TestClient) -> None:
    resp = client.post("/sweeps?dry_run=true", json=tiny_spec(), headers=auth())
    caps = resp.json()["caps"]
    assert (
        caps["passes"] is True and caps["max_gpu_hours_per_sweep"] is None and caps["max_gpu_hours_per_owner"] is None
    )
    assert client.post("/sweeps", json=tiny_spec(), headers=auth()).status_code == 201


def test_concurrent_submits_of_one_owner_never_pass_the_cap_together(store_path: str) -> None:
    store = Store(store_path)
    store.migrate()
    budget = database.Budget(2.5, timedelta(days=7))
    outcomes: list[str] = []

    def submit(i: int) -> None:
        try:
            store.create(sweep_id=f"s{i}", owner="alice", spec=tiny_spec(f"s{i}"), gpu_hours=1.0, budget=budget)
            outcomes.append("created")
        except database.OverBudget as exc:
            assert exc.spent == 2.0 and exc.price == 1.0
            outcomes.append("refused")

    threads = [threading.Thread(target=submit, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(outcomes) == ["created"] * 2 + ["refused"] * 6
    store.create(sweep_id="b", owner="bob", spec=tiny_spec("b"), gpu_hours=2.5, budget=budget)  # per owner
    store.dispose()


@pytest.fixture
def store_path(tmp_path: Any) -> str:
    return f"sqlite:///{tmp_path / 'service.db'}"


@pytest.mark.parametrize("value", ["-1", "0", "nan", "inf"])
def test_a_cap_that_is_not_a_positive_number_is_refused_at_start(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("SWEEPS_MAX_GPU_HOURS_PER_SWEEP", value)
    with pytest.raises(SettingsError) as info:
        load_settings()
    assert info.value.problems == [
        f"SWEEPS_MAX_GPU_HOURS_PER_SWEEP: must be a positive number of GPU-hours (unset: no cap), got {float(value):g}"
    ]
    monkeypatch.delenv("SWEEPS_MAX_GPU_HOURS_PER_SWEEP")
    monkeypatch.setenv("SWEEPS_GPU_HOURS_WINDOW_S", "0")
    with pytest.raises(SettingsError, match="SWEEPS_GPU_HOURS_WINDOW_S"):
        load_settings()
