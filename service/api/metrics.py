"""Prometheus metrics of the service (prometheus-client, served on a port of their own).

    batchsweep_http_requests_total{method, route, status}      requests answered, by route template
    batchsweep_http_request_duration_seconds{method, route}    their latency (histogram)
    batchsweep_sweeps{status, owner}                           sweeps in the store (read at scrape time)
    batchsweep_driver_starts{status}                           driver starts summed over those sweeps
    batchsweep_dependency_up{dependency}                       1 when /healthz's last check of the store,
                                                               Ray and MLflow passed, else 0

The port (SWEEPS_METRICS_PORT, off when unset) is separate from the API's so that the Ingress never
exposes it: on Kubernetes only the monitoring namespace reaches it (deploy/kubernetes/networkpolicy.yaml,
servicemonitor.yaml). Each app has a registry of its own (tests run several apps in one process).
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.api.health import HealthChecker
from service.api.middleware import HOT_ROUTE, SWEEP_PATH
from service.store.database import Store

BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class Metrics:
    """The registry, and the request counts and latencies kept as plain numbers: the middleware runs on the
    event loop's one thread, so a dict lookup and two additions record a request (~1 us), and the
    collector turns them into Prometheus families when scraped. prometheus-client's own Counter and
    Histogram take a lock and a `labels()` lookup per request: with them metrics cost 25 % of the hot
    read's throughput (benchmarks/api_load.py --compare-metrics)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.counts: dict[tuple[str, str, str], int] = {}  # (method, route, status) -> requests
        # (method, route) -> [count per bucket of BUCKETS and one past the last, sum of seconds]
        self.latencies: dict[tuple[str, str], list[float]] = {}
        self.registry.register(_RequestCollector(self))

    def record(self, method: str, route: str, status: int, seconds: float) -> None:
        key = (method, route, str(status))
        self.counts[key] = self.counts.get(key, 0) + 1
        row = self.latencies.get(key[:2])
        if row is None:
            row = self.latencies[key[:2]] = [0.0] * (len(BUCKETS) + 2)
        row[bisect.bisect_left(BUCKETS, seconds)] += 1
        row[-1] += seconds

    def watch(self, store: Store, health: HealthChecker) -> Collector:
        """Gauges read from the store and the health checker at scrape time (unregister it at the end)."""
        collector = _StoreCollector(store, health)
        self.registry.register(collector)
        return collector


class _RequestCollector(Collector):
    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics

    def collect(self) -> Iterator[CounterMetricFamily | HistogramMetricFamily]:
        requests = CounterMetricFamily(
            "batchsweep_http_requests", "HTTP requests answered", labels=["method", "route", "status"]
        )
        for key, n in sorted(dict(self.metrics.counts).items()):
            requests.add_metric(list(key), n)
        yield requests
        latency = HistogramMetricFamily(
            "batchsweep_http_request_duration_seconds",
            "Time to answer an HTTP request (to the end of the response)",
            labels=["method", "route"],
        )
        for key, row in sorted(dict(self.metrics.latencies).items()):
            cumulative, buckets = 0.0, []
            for bound, n in zip([*map(str, BUCKETS), "+Inf"], row[:-1], strict=True):
                cumulative += n
                buckets.append((bound, cumulative))
            latency.add_metric(list(key), buckets, sum_value=row[-1])
        yield latency


class _StoreCollector(Collector):
    def __init__(self, store: Store, health: HealthChecker) -> None:
        self.store, self.health = store, health

    def collect(self) -> Iterator[GaugeMetricFamily]:
        sweeps = GaugeMetricFamily("batchsweep_sweeps", "Sweeps in the store", labels=["status", "owner"])
        starts = GaugeMetricFamily("batchsweep_driver_starts", "Driver starts of the sweeps", labels=["status"])
        per_status: dict[str, int] = {}
        for status, owner, count, driver_starts in self.store.tallies():
            sweeps.add_metric([status, owner], count)
            per_status[status] = per_status.get(status, 0) + driver_starts
        for status, total in sorted(per_status.items()):
            starts.add_metric([status], total)
        yield sweeps
        yield starts
        up = GaugeMetricFamily("batchsweep_dependency_up", "Last health check passed", labels=["dependency"])
        last = self.health.last()
        if last is not None:
            for name, check in last.checks.items():
                up.add_metric([name], 1.0 if check.ok else 0.0)
        yield up


class RequestMetrics:
    """Plain ASGI middleware, just inside HotReads (which counts its own answers): counts and times every
    other HTTP request, labelled by route template (never by raw path: sweep ids would explode the
    series)."""

    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app, self.metrics = app, metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = [500]

        async def sent(message: Message) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, sent)
        finally:
            self.metrics.record(scope.get("method", ""), route_label(scope), status[0], time.perf_counter() - started)


def route_label(scope: Scope) -> str:
    route = scope.get("route")
    if route is not None and getattr(route, "path", None):
        return str(route.path)
    if SWEEP_PATH.fullmatch(scope.get("path", "")):
        return HOT_ROUTE  # no route in the scope: answered before routing
    return "unmatched"


__all__ = ["Metrics", "RequestMetrics", "route_label"]
