"""The /studies routes: a study (sweeps/study.py) priced before it runs, submitted, read and cancelled; the
work is in `service.studies` (a study's scales are sweeps, under /sweeps like any other)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request, Response, status
from fastapi.sse import EventSourceResponse, ServerSentEvent

from service import manager, studies
from service.api.auth import Owner
from service.api.deps import LimitsDep, SettingsDep, StoreDep, StudyId, SupervisorDep
from service.api.events import StudyStreamSlot, study_events
from service.api.routes.sweeps import MAX_OFFSET, Gpu, Mfu, PeakTflops, json_error_responses
from service.api.schemas import error_responses
from service.models import StudyDryRunResult, StudyPage, StudySummary

router = APIRouter(prefix="/studies", tags=["studies"])

# The body is read by hand (JSON or YAML); this documents it for /docs.
STUDY_BODY: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "content": {
            "application/json": {
                "schema": {
                    "type": "object",
                    "description": "a sweep spec without model and token_budget, plus scales and target "
                    "(sweeps/study.py)",
                }
            },
            "application/yaml": {"schema": {"type": "string", "description": "the same study as YAML"}},
        },
    }
}


@router.post(
    "/dry-run",
    response_model=StudyDryRunResult,
    responses=error_responses(401, 413, 415, 422, 429),
    openapi_extra=STUDY_BODY,
    summary="Validate and price a study (JSON or YAML) scale by scale, beside the sweep at its target it replaces",
)
async def dry_run_study(
    request: Request,
    owner: Owner,
    settings: SettingsDep,
    store: StoreDep,
    limits: LimitsDep,
    gpu: Gpu = None,
    mfu: Mfu = None,
    peak_tflops: PeakTflops = None,
) -> StudyDryRunResult:
    pricing = manager.price_config(gpu=gpu, mfu=mfu, peak_tflops=peak_tflops)  # 422 names a bad one
    limits.take_dry_run(owner)  # before the body is read: a refused request costs nothing
    return await manager.dry_run_study(
        await request.body(), request.headers.get("content-type"), settings, pricing,
        owner=owner, work=limits.spec_work, store=store,
    )  # fmt: skip


@router.post(
    "",
    status_code=status.HTTP_201_CREATED,
    response_model=StudySummary,
    responses=error_responses(401, 413, 415, 422, 429),
    openapi_extra=STUDY_BODY,
    summary="Submit a study (JSON or YAML): its scales' sweeps run one at a time, smallest first, then the law",
)
async def submit_study(
    request: Request, response: Response, owner: Owner, settings: SettingsDep, store: StoreDep, limits: LimitsDep
) -> StudySummary:
    limits.take_submit(owner)  # before the body is read: a refused request costs nothing
    row = await studies.submit(
        body=await request.body(), content_type=request.headers.get("content-type"), owner=owner,
        settings=settings, store=store, work=limits.spec_work,
    )  # fmt: skip
    response.headers["Location"] = f"/studies/{row.id}"
    return await studies.get(store, row.id, owner)


@router.get("", response_model=StudyPage, responses=error_responses(401, 422), summary="Your studies, newest first")
async def list_studies(
    owner: Owner,
    store: StoreDep,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
    offset: Annotated[int, Query(ge=0, le=MAX_OFFSET)] = 0,
) -> StudyPage:
    items, total = await studies.list_studies(store, owner, limit, offset)
    return StudyPage(items=items, total=total, limit=limit, offset=offset)


@router.get(
    "/{study_id}",
    response_model=StudySummary,
    responses=error_responses(401, 404, 422),
    summary="The study: each scale's sweep and its status, and once they all succeeded the law",
)
async def get_study(study_id: StudyId, owner: Owner, store: StoreDep) -> StudySummary:
    return await studies.get(store, study_id, owner)


@router.post(
    "/{study_id}/cancel",
    status_code=status.HTTP_202_ACCEPTED,
    response_model=StudySummary,
    responses=error_responses(401, 404, 409, 422),
    summary="Stop the study: its running sweep is cancelled and no other is started",
)
async def cancel_study(study_id: StudyId, owner: Owner, store: StoreDep, supervisor: SupervisorDep) -> StudySummary:
    return await studies.cancel(store, supervisor, study_id, owner)


@router.get(
    "/{study_id}/events",
    response_class=EventSourceResponse,
    responses={200: {"description": "progress events as the study's scales move, then `end`"}}
    | json_error_responses(401, 404, 422, 429),
    summary="Server-sent events of the study: its scales' statuses, then the law (one of the owner's event streams)",
)
async def study_event_stream(
    request: Request, study_id: StudyStreamSlot, settings: SettingsDep, store: StoreDep
) -> AsyncIterator[ServerSentEvent]:
    async for event in study_events(request, store, settings, study_id):
        yield event
