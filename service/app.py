"""The FastAPI application: `create_app(settings)`.

Lifespan: migrate the store, connect to Ray, create the MLflow store once (before any driver races to),
reconcile the store with the drivers Ray reports, then poll the drivers in the background. Stopping
the service only disconnects it: sweep drivers are detached Ray actors and keep running.

This module and everything it imports must stay free of torch (a test checks).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio.to_thread
from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from fastapi.telemetry import TelemetryConfig
from fastapi_offline import FastAPIOffline
from prometheus_client import start_http_server

from service.api import errors
from service.api.auth import TokenTable
from service.api.health import HealthChecker, mlflow_check
from service.api.metrics import Metrics, RequestMetrics
from service.api.middleware import BodyLimit, HotReads, PrefixHeaders
from service.api.routes import health, studies, sweeps
from service.api.sessions import Sessions, SignInLimiter
from service.cluster.launcher import Launcher, RayLauncher
from service.cluster.supervisor import Supervisor
from service.render import PageCache
from service.settings import Settings, redacted
from service.store.database import Store
from service.views import SweepReader, ViewCache
from service.web import docs, pages
from sweeps.spec import SweepSpec

log = logging.getLogger(__name__)


# FastAPI's native OpenTelemetry, off unless asked for (SWEEPS_OTEL=true): even with no provider
# configured it looks the providers up on every request, ~10 µs, a third of the app's time for a
# cached GET /sweeps/{id} (measured in-process).
TELEMETRY_OFF: TelemetryConfig = {"tracing": False, "metrics": False, "logs": False, "operation_spans": False}


def create_app(settings: Settings | None = None, *, launcher: Launcher | None = None) -> FastAPI:
    """The service; `launcher` replaces the Ray launcher (tests without a cluster)."""
    settings = settings or Settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        settings.data_dir.mkdir(parents=True, exist_ok=True)
        store = Store(settings.database)
        views = ViewCache(settings.read_cache_s)
        store.listeners.append(views.invalidate)
        await anyio.to_thread.run_sync(store.migrate)
        ray_launcher = launcher or RayLauncher(settings)
        # fatal when it fails: a service that cannot reach its cluster can neither run nor watch sweeps
        await anyio.to_thread.run_sync(ray_launcher.connect)
        try:
            await anyio.to_thread.run_sync(mlflow_check, settings.tracking_uri)
        except Exception as exc:
            # not fatal: /healthz reports it, and the drivers retry on their own; the URI may hold a
            # password, and the error's text the URI: neither is logged whole
            log.warning("MLflow store %s is not reachable (%s)", redacted(settings.tracking_uri), type(exc).__name__)
        supervisor = Supervisor(store, ray_launcher, settings)
        app.state.store, app.state.launcher, app.state.supervisor = store, ray_launcher, supervisor
        app.state.reader = SweepReader(store, settings, views)
        app.state.health = HealthChecker(store, ray_launcher, settings)
        app.state.sessions = Sessions(store, settings)  # browser sign-in (service/api/sessions.py)
        app.state.pages = PageCache()  # finished sweeps' dashboards and studies' laws, drawn once
        await supervisor.reconcile()
        supervisor.start()
        url = store.engine.url.render_as_string()  # password hidden
        exporter = None
        if metrics is not None:
            gauges = metrics.watch(store, app.state.health)
            # prometheus-client's own WSGI server, on a daemon thread of its own
            exporter, _ = start_http_server(settings.metrics_port, addr=settings.host, registry=metrics.registry)
            log.info("Prometheus metrics on http://%s:%d/metrics", settings.host, settings.metrics_port)
        log.info("sweep service ready (store %s, %d owners)", url, len(app.state.tokens))
        try:
            yield
        finally:
            if exporter is not None:
                exporter.shutdown()
                exporter.server_close()
                metrics.registry.unregister(gauges)  # type: ignore[union-attr]
            await supervisor.stop()
            await anyio.to_thread.run_sync(ray_launcher.close)
            store.dispose()

    # FastAPIOffline: FastAPI that serves Swagger UI's and ReDoc's files itself (/static-offline-docs/), so the
    # docs work offline and on machines that reach no CDN, as this one; their pages are service/web/docs.py's
    # (with the pages' security headers), not its own
    app = FastAPIOffline(
        docs_url=None,
        redoc_url=None,
        swagger_ui_oauth2_redirect_url=docs.OAUTH2_REDIRECT_URL,
        static_url=docs.STATIC_URL,
        title="batchsweep",
        summary="Batch-size sweeps: how large can the batch get before quality degrades?",
        version="0.1.0",
        lifespan=lifespan,
        telemetry=TELEMETRY_OFF if not settings.otel else None,
    )
    app.state.settings = settings
    app.state.tokens = TokenTable(settings)
    if not len(app.state.tokens):
        log.warning("SWEEPS_TOKENS is empty: every request but /healthz will be refused")
    app.state.sign_in_limiter = SignInLimiter(settings)
    errors.install(app)
    # the offline docs' scripts and styles: never read as another type than they are sent as
    app.add_middleware(PrefixHeaders, prefix=docs.STATIC_URL, headers={"X-Content-Type-Options": "nosniff"})
    app.add_middleware(BodyLimit, max_bytes=settings.max_body_bytes)
    metrics = Metrics() if settings.metrics_port else None
    app.state.metrics = metrics
    if metrics is not None:  # inside HotReads, which counts its own answers (no wrapper on the hot read)
        app.add_middleware(RequestMetrics, metrics=metrics)
    app.add_middleware(HotReads, state=app.state)  # a hit skips the rest
    if settings.trusted_proxies:
        # uvicorn's own: the client address and scheme from X-Forwarded-For/-Proto, only when the TCP
        # peer is one of these (server.py runs uvicorn with proxy_headers=False, so nothing else does)
        from uvicorn.middleware.proxy_headers import ProxyHeadersMiddleware

        app.add_middleware(ProxyHeadersMiddleware, trusted_hosts=settings.trusted_proxies)  # type: ignore[arg-type]
    app.include_router(health.router)
    app.include_router(sweeps.router)
    app.include_router(studies.router)
    # the browser pages, sign-in and /static/ (not in the OpenAPI), and GET /sweeps/{id}/dashboard (in it)
    app.include_router(pages.router)
    app.include_router(pages.api_router)
    app.include_router(docs.router)  # /docs, /docs/oauth2-redirect, /redoc
    app.openapi = lambda: _openapi(app)  # type: ignore[method-assign]
    return app


def _openapi(app: FastAPI) -> dict[str, Any]:
    """FastAPI's schema plus `SweepSpec` (the body is parsed by hand, so FastAPI does not see it)."""
    if app.openapi_schema:
        return app.openapi_schema
    schema = get_openapi(
        title=app.title,
        version=app.version,
        summary=app.summary,
        routes=app.routes,
    )
    spec_schema = SweepSpec.model_json_schema(ref_template="#/components/schemas/{model}")
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    components.update(spec_schema.pop("$defs", {}))
    components["SweepSpec"] = spec_schema
    app.openapi_schema = schema
    return schema
