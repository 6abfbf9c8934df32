"""Run the service with uvicorn: `python -m service [--host H] [--port P]` or `sweeps serve`."""

from __future__ import annotations

import uvicorn

from service.api.app import create_app
from service.settings import Settings
from sweeps.logs import configure as configure_logs


def serve(settings: Settings | None = None, *, log_level: str = "info") -> None:
    settings = settings or Settings()
    configure_logs(settings.log_format, log_level)  # text or JSON lines (SWEEPS_LOG_FORMAT)
    uvicorn.run(
        create_app(settings),
        host=settings.host,
        port=settings.port,
        log_level=log_level,
        # event streams stay open; without a bound a restart would wait for every watcher to leave
        timeout_graceful_shutdown=3,
        access_log=False,  # one line per request costs more than the request under load
        log_config=None,  # uvicorn's loggers propagate to the root's handlers, formatted as configured
        # nothing here reads the client's address; behind a proxy, its X-Forwarded-* would only cost time
        proxy_headers=False,
    )
