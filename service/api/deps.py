"""Dependencies of the routes, declared by type: `store: StoreDep`, `settings: SettingsDep`, ...

The objects live on `app.state` (made by `create_app` and its lifespan); these only hand them out.
They are `async def` on purpose: FastAPI runs a plain `def` dependency in the thread pool, a thread hop
per dependency per request.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Path, Request

from service.api.health import HealthChecker
from service.api.limits import Limits
from service.cluster.supervisor import Supervisor
from service.settings import Settings
from service.store.database import Store, SweepRow
from service.views import SweepReader


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


# What a sweep id can be: `service.store.database.new_sweep_id` makes `<spec name>-<8 hex>` from a name of
# [a-z0-9-] (sweeps.spec.NAME_PATTERN), stored in a column of this length. Any other path segment is
# refused with 422 (naming the value) by FastAPI before a route or the store sees it, whichever the store:
# PostgreSQL, unlike SQLite, cannot even be asked about a string with a NUL in it.
SWEEP_ID_CHARS = rf"[a-z0-9-]{{1,{SweepRow.__table__.c.id.type.length}}}"
SWEEP_ID_PATTERN = rf"^{SWEEP_ID_CHARS}$"


SettingsDep = Annotated[Settings, Depends(get_settings)]
StoreDep = Annotated[Store, Depends(get_store)]
SupervisorDep = Annotated[Supervisor, Depends(get_supervisor)]
HealthDep = Annotated[HealthChecker, Depends(get_health)]
ReaderDep = Annotated[SweepReader, Depends(get_reader)]
LimitsDep = Annotated[Limits, Depends(get_limits)]
# every route's `{sweep_id}`
SweepId = Annotated[str, Path(pattern=SWEEP_ID_PATTERN, description="the id POST /sweeps answered")]
StudyId = Annotated[str, Path(pattern=SWEEP_ID_PATTERN, description="the id POST /studies answered")]
# an idempotency key (the API's Idempotency-Key header, the submit page's form field): printable ASCII
# only, up to 200 characters; any other is 422 before the store sees it (PostgreSQL cannot store a NUL)
IDEMPOTENCY_KEY_PATTERN = r"^[\x20-\x7e]{0,200}$"
