"""/healthz: the store (SELECT 1), Ray (connected, cluster reachable) and MLflow (one cheap query).

The three checks run concurrently, each in a worker thread under a timeout. One round runs at a time;
its answer is served for `health_cache_s`, and while the next round runs, probes get the previous
answer (if younger than `health_cache_s` + the check timeout) instead of waiting: a burst of probes
costs one round of checks and never queues behind it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

import anyio
import anyio.to_thread

from service.api.schemas import CheckResult, Health
from service.cluster.launcher import Launcher
from service.settings import Settings
from service.store.database import Store

log = logging.getLogger(__name__)

CHECK_TIMEOUT_S = 5.0


def mlflow_check(tracking_uri: str) -> None:
    """One cheap MLflow query; also creates a fresh SQLite store once, before any driver races to."""
    from mlflow.tracking import MlflowClient  # imported here: seconds to import, and only this needs it

    MlflowClient(tracking_uri).search_experiments(max_results=1)


class HealthChecker:
    def __init__(self, store: Store, launcher: Launcher, settings: Settings) -> None:
        self.checks: dict[str, Callable[[], Any]] = {
            "store": store.ping,
            "ray": launcher.check,
            "mlflow": lambda: mlflow_check(settings.tracking_uri),
        }
        self.cache_s = settings.health_cache_s
        self._last: tuple[float, Health] | None = None
        self._refresh: asyncio.Task[Health] | None = None

    async def health(self) -> Health:
        now = time.monotonic()
        last = self._last
        if last is not None and now - last[0] < self.cache_s:
            return last[1]
        if self._refresh is None:  # one round of checks at a time, however many probes arrive
            self._refresh = asyncio.get_running_loop().create_task(self._check_all())
            self._refresh.add_done_callback(self._refreshed)
        if last is not None and self.cache_s > 0 and now - last[0] < self.cache_s + CHECK_TIMEOUT_S:
            # a recent answer while the next round runs: probes under load never queue behind the checks
            return last[1]
        return await asyncio.shield(self._refresh)

    def last(self) -> Health | None:
        """The last round of checks, if any (what the metrics report; no check is run for it)."""
        return self._last[1] if self._last is not None else None

    def _refreshed(self, task: asyncio.Task[Health]) -> None:
        self._refresh = None
        if not task.cancelled() and task.exception() is None:
            self._last = (time.monotonic(), task.result())

    async def _check_all(self) -> Health:
        results: dict[str, CheckResult] = {}
        async with anyio.create_task_group() as tg:
            for name, fn in self.checks.items():
                tg.start_soon(self._run, name, fn, results)
        ok = all(r.ok for r in results.values())
        return Health(status="ok" if ok else "unavailable", checks=dict(sorted(results.items())))

    @staticmethod
    async def _run(name: str, fn: Callable[[], Any], results: dict[str, CheckResult]) -> None:
        started = time.perf_counter()
        error: str | None = None
        try:
            with anyio.fail_after(CHECK_TIMEOUT_S):
                # abandon: a hung client call must not hold the answer; its thread finishes on its own
                await anyio.to_thread.run_sync(fn, abandon_on_cancel=True)
        except TimeoutError:
            error = f"no answer within {CHECK_TIMEOUT_S} s"
        except Exception as exc:
            # /healthz needs no token: the exception's text (paths, addresses, URLs) goes to the log only
            log.warning("health check %s failed: %s: %s", name, type(exc).__name__, exc)
            error = f"{name} check failed ({type(exc).__name__}); see the service log"
        if error:
            log.warning("health check %s failed: %s", name, error)
        results[name] = CheckResult(ok=error is None, error=error, latency_ms=(time.perf_counter() - started) * 1e3)
