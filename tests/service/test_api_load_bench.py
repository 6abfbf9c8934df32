"""benchmarks/api_load.py drives a server and reports; a short run against the in-process server."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest
from bench_helpers import load_bench
from harness import tiny_spec
from svc_helpers import ALICE, FakeLauncher, ThreadServer

from service.settings import Settings

# a load generator against a server: measured alone, never beside another test (make test runs these one at a time)
pytestmark = pytest.mark.serial


@pytest.mark.parametrize("client_kind", ["raw", "aiohttp", "httpx"])
def test_short_run_counts_requests_and_prints_ratios(
    make_settings: Callable[..., Settings], launcher: FakeLauncher, client_kind: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # the benchmark sends dry runs back to back: above the per-owner rate limit that guards a shared service
    with ThreadServer(make_settings(dry_run_burst=10**6), launcher) as server:
        _short_run(server, client_kind, capsys)


def _short_run(fake_server: ThreadServer, client_kind: str, capsys: pytest.CaptureFixture[str]) -> None:
    bench = load_bench("api_load")
    import httpx

    sweep_id = httpx.post(
        f"{fake_server.url}/sweeps", json=tiny_spec(), headers={"Authorization": f"Bearer {ALICE}"}
    ).json()["id"]
    phases = asyncio.run(bench.benchmark(fake_server.url, ALICE, sweep_id, 4, 0.5, client_kind, 0.0))
    assert [p.name for p in phases] == ["GET /sweeps/{id}", "POST /sweeps?dry_run=true", "GET /healthz"]
    for p in phases:
        # every request answered 200: a wrong path or body would show up as errors here
        assert p.latencies_ms and not p.errors, (p.name, p.errors)
        assert p.quantile(0.5) <= p.quantile(0.99)
    bench.report(phases, 4)
    out = capsys.readouterr().out
    assert "p99 / healthz p99" in out and "GET /sweeps/{id}" in out
