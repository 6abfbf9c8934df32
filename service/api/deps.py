"""Dependencies of the routes, declared by type: `store: StoreDep`, `settings: SettingsDep`, ...

The objects live on `app.state` (made by `create_app` and its lifespan); these only hand them out.
They are `async def` on purpose: FastAPI runs a plain `def` dependency in the thread pool, a thread hop
per dependency per request.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from service.api.health import HealthChecker
from service.api.limits import Limits
from service.cluster.supervisor import Supervisor
from service.manager import SweepReader
from service.settings import Settings
from service.store.database import Store


async def get_settings(request: Request) -> Settings:
    return request.app.state.settings  # type: ignore[no-any-return]


async def get_store(request: Request) -> Store:
    return request.app.state.store  # type: ignore[no-any-return]


async def get_supervisor(request: Request) -> Supervisor:
    return request.app.state.supervisor  # type: ignore[no-any-return]


async def get_reader(request: Request) -> SweepReader:
    return request.app.state.reader  # type: ignore[no-any-return]


async def get_health(request: Request) -> HealthChecker:
    return request.app.state.health  # type: ignore[no-any-return]


async def get_limits(request: Request) -> Limits:
    # made on first use, per app; no await between the look-up and the assignment, so one per app
    state = request.app.state
    limits: Limits | None = getattr(state, "limits", None)
    if limits is None:
        limits = state.limits = Limits.from_settings(state.settings)
    return limits


SettingsDep = Annotated[Settings, Depends(get_settings)]
StoreDep = Annotated[Store, Depends(get_store)]
SupervisorDep = Annotated[Supervisor, Depends(get_supervisor)]
HealthDep = Annotated[HealthChecker, Depends(get_health)]
ReaderDep = Annotated[SweepReader, Depends(get_reader)]
LimitsDep = Annotated[Limits, Depends(get_limits)]
