"""Run the service with uvicorn: `python -m service [--host H] [--port P]` or `sweeps serve`."""

from __future__ import annotations

import logging

import uvicorn

from service.app import create_app
from service.settings import Settings


def serve(settings: Settings | None = None, *, log_level: str = "info") -> None:
    settings = settings or Settings()
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    uvicorn.run(
        create_app(settings),
        host=settings.host,
        port=settings.port,
        log_level=log_level,
        # event streams stay open; without a bound a restart would wait for every watcher to leave
        timeout_graceful_shutdown=3,
        access_log=False,  # one line per request costs more than the request under load
        # nothing here reads the client's address; behind a proxy, its X-Forwarded-* would only cost time
        proxy_headers=False,
    )
