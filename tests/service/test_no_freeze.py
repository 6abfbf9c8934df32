"""No request can freeze the service: the parsers of untrusted text are linear in their input, and a
request at the body limit is refused in milliseconds while /healthz from another client keeps answering.

The served app runs under uvicorn in a thread of this process (FakeLauncher, no Ray), so a request that
held the GIL or the event loop would stall the /healthz probe measured beside it. One test runs the real
service in its own process instead: one owner sending the costliest specs at their rate limits, measured
from another owner's and the probe's side.
"""

from __future__ import annotations

import os
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from svc_helpers import ALICE, BOB, FakeLauncher, ThreadServer, auth, start_service

from service.settings import Settings
from sweeps.documents import MAX_NODES, SpecLoadError, compose_yaml, parse_json, parse_yaml

# latencies of a server under test: measured alone, never beside another test (make test runs these one at a time)
pytestmark = pytest.mark.serial

# The body that took minutes at the body limit: 33 open brackets, a quote that never closes, then
# escaped quotes (each one a new start for a string pattern that must find its closing quote).
PATHOLOGICAL_JSON = "[" * 33 + '"'


def pathological_json(size: int) -> str:
    return PATHOLOGICAL_JSON + '\\"' * ((size - len(PATHOLOGICAL_JSON)) // 2)


PROBE_ANSWERS = 5  # answers of /healthz under load before a probe's slowest answer means something


@dataclass
class Probe:
    """The /healthz answers measured while the load ran: how many, and the slowest (s)."""

    slowest: float = 0.0
    answers: int = 0


@contextmanager
def healthz_probe(url: str) -> Iterator[Probe]:
    """GET /healthz in a loop from a client of its own, counted from the end of a short warm-up."""
    measured = Probe()
    stop = threading.Event()

    def probe() -> None:
        with httpx.Client(base_url=url, timeout=30) as http:
            while not stop.is_set():
                started = time.perf_counter()
                assert http.get("/healthz").status_code in (200, 503)
                measured.slowest = max(measured.slowest, time.perf_counter() - started)
                measured.answers += 1
                time.sleep(0.01)

    thread = threading.Thread(target=probe, daemon=True)
    thread.start()
    try:
        time.sleep(0.2)  # a few answers before the load: the first request warms the client
        measured.slowest, measured.answers = 0.0, 0
        yield measured
    finally:
        stop.set()
        thread.join(timeout=30)
    assert measured.answers >= PROBE_ANSWERS, f"the probe barely ran: {measured.answers} answers"


def load_until_probed(probe: Probe, load: Callable[[], object], rounds: int = 20) -> None:
    """`load` once, and again while the probe has answered fewer than PROBE_ANSWERS times beside it: a
    load that ends fast on a busy machine still gets measured (CI: 4 answers beside one round, 12-05)."""
    for _ in range(rounds):
        load()
        if probe.answers >= PROBE_ANSWERS:
            return


def test_a_pathological_json_body_at_the_limit_is_refused_fast_and_healthz_keeps_answering(
    make_settings: Callable[..., Settings], launcher: FakeLauncher
) -> None:
    # dry runs enough for every round of the load (the dry-run limit is another test's)
    settings_ = make_settings(dry_run_burst=100)
    body = pathological_json(settings_.max_body_bytes)
    assert settings_.max_body_bytes - 2 <= len(body) <= settings_.max_body_bytes
    with ThreadServer(settings_, launcher) as server, httpx.Client(base_url=server.url, timeout=60) as http:
        http.get("/healthz")

        def load() -> None:
            for path in ("/sweeps", "/sweeps?dry_run=true") * 3:
                started = time.perf_counter()
                resp = http.post(path, content=body, headers=auth() | {"Content-Type": "application/json"})
                elapsed = time.perf_counter() - started
                assert resp.status_code == 422 and "nested deeper than" in resp.text, resp.text[:300]
                # the freeze took minutes; ~10 ms when idle, 0.1 s seen with the suite's other worker busy
                assert elapsed < 0.5, f"{path}: {elapsed:.3f} s"

        with healthz_probe(server.url) as probe:
            load_until_probed(probe, load)
            assert probe.slowest < 0.2, f"/healthz took {probe.slowest:.3f} s"
        assert launcher.started == []


def test_the_submit_pages_check_is_bounded_after_the_dry_run_limit_said_no(
    make_settings: Callable[..., Settings], launcher: FakeLauncher
) -> None:
    settings_ = make_settings(dry_run_burst=1, dry_run_refill_s=600.0)
    limit = settings_.max_body_bytes
    deep = "[" * (limit // 3 - 64)  # form-encoded: 3 bytes a bracket
    wide = "a: [" + "1, " * (limit // 4) + "]"  # long to compose: it took 1.4 s on the event loop
    wide = wide[: len(wide) - max(0, len(urllib.parse.quote_plus(wide)) - limit + 256)]
    with ThreadServer(settings_, launcher) as server, httpx.Client(base_url=server.url, timeout=60) as http:
        first = http.post("/submit", data={"spec": "name: x\n", "action": "check"}, headers=auth())
        assert first.status_code == 422  # the one dry run of the bucket

        def load() -> None:
            for text in (deep, wide, deep, wide):
                started = time.perf_counter()
                resp = http.post("/submit", data={"spec": text, "action": "check"}, headers=auth())
                elapsed = time.perf_counter() - started
                assert resp.status_code == 429 and "dry runs" in resp.text, resp.text[:300]
                assert elapsed < 0.25, f"{elapsed:.3f} s"  # the page echoes the text back: a 256 KiB render

        with healthz_probe(server.url) as probe:
            load_until_probed(probe, load)
            assert probe.slowest < 0.2, f"/healthz took {probe.slowest:.3f} s"


def test_a_deep_document_on_the_submit_page_is_a_4xx_naming_the_depth(
    make_settings: Callable[..., Settings], launcher: FakeLauncher
) -> None:
    with ThreadServer(make_settings(), launcher) as server, httpx.Client(base_url=server.url, timeout=60) as http:
        resp = http.post("/submit", data={"spec": "[" * 20_000, "action": "check"}, headers=auth())
        assert resp.status_code == 422 and "nested deeper than" in resp.text


# ---- one owner at their limits with the costliest specs slows nobody else -----------------------------

LOAD_S = 5.0  # the burst of both buckets and a few refills
LOAD_MAX_S = 30.0  # on a slow machine the load goes on until both bursts were read in full, up to this
POLL_EVERY_S = 0.1
P99_BOUND_S = 0.5  # the bound; the Kubernetes probe gives up at 8 s


def costliest_yaml(max_bytes: int) -> str:
    """A spec the service parses and validates in full before refusing it: every value the node bound
    allows, as long strings filling the body limit."""
    head = "name: load\ntags: ["
    width = max_bytes // MAX_NODES - 4  # '"..."' plus ', '
    text = head + ", ".join('"' + "x" * width + '"' for _ in range(MAX_NODES - 8)) + "]\n"
    assert len(text.encode()) <= max_bytes
    return text


@pytest.mark.ray
@pytest.mark.timeout(240)
def test_one_owner_at_their_limits_with_the_costliest_specs_slows_neither_healthz_nor_another_owner(
    ray_head: Any, tmp_path: Path
) -> None:
    # the real service in its own process (`python -m service` on the session's Ray head, the default rate
    # limits and health cache): the test's own client threads must not share the service's GIL
    defaults = {name: Settings.model_fields[name].default for name in LIMITS}
    svc = start_service(ray_head, tmp_path, "load", **{f"SWEEPS_{k.upper()}": str(v) for k, v in defaults.items()})
    try:
        body = costliest_yaml(Settings.model_fields["max_body_bytes"].default)
        burst = defaults["dry_run_burst"] + defaults["submit_burst"]
        times, refused = load_and_poll(svc.url, body, burst)
    finally:
        svc.stop()
    for what, took in times.items():
        assert len(took) >= 20, f"{what}: {len(took)} answers"
        slowest = sorted(took)[-max(1, len(took) // 100)]  # p99: at most 1 % of the answers above it
        assert slowest < P99_BOUND_S, f"{what}: p99 {slowest:.3f} s, slowest {max(took):.3f} s of {len(took)}"
    # the load happened: both buckets' bursts were read in full and refused
    assert len(refused) >= burst and set(refused) == {422}, (len(refused), set(refused))


LIMITS = ("dry_run_burst", "dry_run_refill_s", "submit_burst", "submit_refill_s", "health_cache_s")


def load_and_poll(url: str, body: str, burst: int) -> tuple[dict[str, list[float]], list[int]]:
    """One owner (alice) sends `body` from 8 clients to dry runs and submits as fast as the rate limits
    allow (on a 429, waiting what Retry-After says) for LOAD_S, and on until `burst` of them were read
    (a machine that reads them slower is loaded longer; LOAD_MAX_S at most), while /healthz and another owner's (bob's)
    `GET /sweeps` are asked every POLL_EVERY_S: the seconds each poll took, and the statuses of the specs
    read in full."""
    stop = threading.Event()
    refused: list[int] = []
    yaml_body = auth(ALICE) | {"Content-Type": "application/yaml"}

    def attack(path: str) -> None:
        with httpx.Client(base_url=url, timeout=120) as http:
            while not stop.is_set():
                resp = http.post(path, content=body, headers=yaml_body)
                if resp.status_code == 429:
                    stop.wait(float(resp.headers["Retry-After"]))
                else:
                    refused.append(resp.status_code)

    def poll(path: str, headers: dict[str, str]) -> list[float]:
        took: list[float] = []
        with httpx.Client(base_url=url, timeout=120) as http:
            http.get(path, headers=headers)  # a first answer: the connection and the service warm
            while not stop.is_set():
                started = time.perf_counter()
                assert http.get(path, headers=headers).status_code == 200
                took.append(time.perf_counter() - started)
                stop.wait(POLL_EVERY_S)
        return took

    with ThreadPoolExecutor(max_workers=10) as pool:
        attackers = [pool.submit(attack, path) for path in ("/sweeps?dry_run=true", "/sweeps") * 4]
        healthz = pool.submit(poll, "/healthz", {})
        other = pool.submit(poll, "/sweeps", auth(BOB))
        started = time.monotonic()
        time.sleep(LOAD_S)
        while len(refused) < burst and time.monotonic() - started < LOAD_MAX_S:
            time.sleep(POLL_EVERY_S)
        stop.set()
        for attacker in attackers:
            attacker.result(timeout=120)
        times = {"/healthz": healthz.result(timeout=120), "another owner's GET /sweeps": other.result(timeout=120)}
    return times, refused


# ---- the parsers are linear: time at 4x the size stays far below 16x (quadratic) ----------------------

# Fragments that parsers of JSON and YAML treat specially: brackets, quotes, escapes, keys, anchors
FRAGMENTS = ["[", "]", "{", "}", '"', '\\"', "\\", "'", ":", ": ", "- ", "#", "\n", " ", "&a ", "*a", ",", "a", "1"]


def best_time(parse: Callable[[str], object], text: str, repeats: int = 3) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        try:
            parse(text)
        except SpecLoadError:
            pass
        times.append(time.perf_counter() - started)
    return min(times)


def scaling(parse: Callable[[str], object], unit: str, small: int) -> tuple[float, float]:
    text = unit * max(1, small // len(unit))
    return best_time(parse, text), best_time(parse, text * 4)


@pytest.mark.parametrize("parse", [parse_json, parse_yaml, compose_yaml], ids=["json", "yaml", "compose"])
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(unit=st.lists(st.sampled_from(FRAGMENTS), min_size=1, max_size=12).map("".join))
def test_parsers_take_time_linear_in_the_input(parse: Callable[[str], object], unit: str) -> None:
    small, large = scaling(parse, unit, 16 * 1024)
    # linear: 4x; quadratic: 16x. 0.01 s of slack absorbs timer noise on tiny absolute times
    assert large < 8 * small + 0.01, f"{unit!r}: {small:.4f} s -> {large:.4f} s at 4x the size"


@pytest.mark.parametrize("parse", [parse_json, parse_yaml], ids=["json", "yaml"])
def test_the_known_pathological_inputs_scale_linearly(parse: Callable[[str], object]) -> None:
    for make in (pathological_json, lambda n: "[" * n, lambda n: '"' + '\\"' * (n // 2), lambda n: "'" * n):
        small, large = best_time(parse, make(32 * 1024)), best_time(parse, make(128 * 1024))
        assert large < 8 * small + 0.01, f"{make(40)!r}...: {small:.4f} s -> {large:.4f} s"


def test_a_finished_sweeps_dashboard_is_drawn_once_in_a_process_of_its_own_however_many_ask(
    make_settings: Callable[..., Settings], launcher: FakeLauncher, monkeypatch: pytest.MonkeyPatch
) -> None:
    """40 concurrent dashboard requests: one drawing, in the render process (not the server's), the same page
    for all, and /healthz answering throughout. A drawing on a thread of the server's process takes the GIL
    from the event loop at every switch interval while it lasts; one per request, 40 times over."""
    from harness import tiny_spec
    from svc_helpers import slow_dashboard_page

    import dashboards

    monkeypatch.setattr(dashboards, "dashboard_page", slow_dashboard_page)
    with ThreadServer(make_settings(), launcher) as server, httpx.Client(base_url=server.url, timeout=60) as http:
        sweep_id = http.post("/sweeps", json=tiny_spec(), headers=auth()).json()["id"]
        deadline = time.monotonic() + 20
        while sweep_id not in launcher.started and time.monotonic() < deadline:
            time.sleep(0.02)
        launcher.finish(sweep_id)
        assert wait_for_final(http, sweep_id)
        answers: list[httpx.Response] = []
        with healthz_probe(server.url) as probe, ThreadPoolExecutor(max_workers=40) as pool:
            # the first round waits on the one drawing; later ones (only if the probe needs more answers) are
            # served from what it cached
            load_until_probed(
                probe,
                lambda: answers.extend(
                    pool.map(lambda _: http.get(f"/sweeps/{sweep_id}/dashboard", headers=auth()), range(40))
                ),
            )
            assert probe.slowest < 1.0, f"/healthz took {probe.slowest:.3f} s"  # 0.10-0.12 s alone here
        assert {r.status_code for r in answers} == {200}
        pages = {r.text.split("dashboard of ")[1].split("</body>")[0] for r in answers}
        assert len(pages) == 1, pages
        drawn_for, _, drawn_by = pages.pop().partition(" drawn by ")
        assert drawn_for == sweep_id and int(drawn_by) != os.getpid()
        assert server.app.state.pages.renders == 1
        assert http.get(f"/sweeps/{sweep_id}/dashboard", headers=auth()).status_code == 200
        assert server.app.state.pages.renders == 1


def wait_for_final(http: httpx.Client, sweep_id: str) -> bool:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if http.get(f"/sweeps/{sweep_id}", headers=auth()).json()["status"] == "succeeded":
            return True
        time.sleep(0.05)
    return False
