"""The /sweeps routes: HTTP in and out; the work is in `service.manager`."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import APIRouter, Header, Query, Request, Response, status
from fastapi.responses import JSONResponse
from fastapi.sse import EventSourceResponse, ServerSentEvent

from service import manager
from service.api.auth import Owner
from service.api.deps import (
    IDEMPOTENCY_KEY_PATTERN,
    LimitsDep,
    ReaderDep,
    SettingsDep,
    StoreDep,
    SupervisorDep,
    SweepId,
)
from service.api.events import StreamSlot, sweep_events
from service.api.schemas import ErrorResponse, SweepCreated, error_responses
from service.models import DryRunResult, Status, SweepCurves, SweepDetail, SweepPage, SweepSummary

router = APIRouter(prefix="/sweeps", tags=["sweeps"])

MAX_OFFSET = 1_000_000  # GET /sweeps?offset=

# The body is read by hand (JSON or YAML); this documents it for /docs.
SPEC_BODY: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "content": {
            "application/json": {"schema": {"$ref": "#/components/schemas/SweepSpec"}},
            "application/yaml": {"schema": {"type": "string", "description": "the same spec as YAML"}},
        },
    }
}


# The dry run's pricing (sweeps/cost.py), on POST /sweeps/dry-run and POST /sweeps?dry_run=true
Gpu = Annotated[
    str | None, Query(description="dry run: the GPU to price on (default H100; worker/hardware.py's table)")
]
Mfu = Annotated[float | None, Query(description="dry run: the model FLOPs utilisation to assume, (0, 1]")]
PeakTflops = Annotated[
    float | None, Query(description="dry run: the GPU's dense bf16 peak in TFLOP/s (overrides the table)")
]


@router.post(
    "",
    status_code=status.HTTP_201_CREATED,
    response_model=SweepCreated | DryRunResult,
    responses={200: {"model": DryRunResult, "description": "dry run: the spec is valid"}}
    | error_responses(401, 413, 415, 422, 429),
    openapi_extra=SPEC_BODY,
    summary="Submit a sweep (JSON or YAML); answers at once with its id",
)
async def submit_sweep(
    request: Request,
    response: Response,
    owner: Owner,
    settings: SettingsDep,
    store: StoreDep,
    supervisor: SupervisorDep,
    limits: LimitsDep,
    dry_run: Annotated[
        bool,
        Query(
            description="validate only: store and start nothing (rate-limited per owner); the same as "
            "POST /sweeps/dry-run"
        ),
    ] = False,
    gpu: Gpu = None,
    mfu: Mfu = None,
    peak_tflops: PeakTflops = None,
    idempotency_key: Annotated[
        str | None,
        Header(
            pattern=IDEMPOTENCY_KEY_PATTERN, description="a retried submit with the same key returns the same sweep"
        ),
    ] = None,
) -> SweepCreated | DryRunResult:
    if dry_run:
        response.status_code = status.HTTP_200_OK
        return await dry_run_sweep(request, owner, settings, store, supervisor, limits, gpu, mfu, peak_tflops)
    manager.unpriced_submit(gpu=gpu, mfu=mfu, peak_tflops=peak_tflops)  # 422 naming any
    limits.take_submit(owner)  # before the body is read: a refused request costs nothing
    created = await manager.submit(
        body=await request.body(),
        content_type=request.headers.get("content-type"),
        owner=owner,
        idempotency_key=idempotency_key,
        settings=settings,
        store=store,
        supervisor=supervisor,
        work=limits.spec_work,
    )
    response.headers["Location"] = f"/sweeps/{created.row.id}"
    if created.replayed:
        response.headers["Idempotent-Replayed"] = "true"
    return SweepCreated(id=created.row.id, status=created.row.status, replayed=created.replayed)  # type: ignore[arg-type]


@router.post(
    "/dry-run",
    response_model=DryRunResult,
    responses=error_responses(401, 413, 415, 422, 429),
    openapi_extra=SPEC_BODY,
    summary="Validate and price a spec (JSON or YAML): store and start nothing (rate-limited per owner)",
)
async def dry_run_sweep(
    request: Request,
    owner: Owner,
    settings: SettingsDep,
    store: StoreDep,
    supervisor: SupervisorDep,
    limits: LimitsDep,
    gpu: Gpu = None,
    mfu: Mfu = None,
    peak_tflops: PeakTflops = None,
) -> DryRunResult:
    pricing = manager.price_config(gpu=gpu, mfu=mfu, peak_tflops=peak_tflops)  # 422 names a bad one
    limits.take_dry_run(owner)  # before the body is read: a refused request costs nothing
    return await manager.dry_run(
        await request.body(), request.headers.get("content-type"), settings, pricing,
        owner=owner, work=limits.spec_work, store=store, launcher=supervisor.launcher,
    )  # fmt: skip


@router.get("", response_model=SweepPage, responses=error_responses(401, 422), summary="Your sweeps, newest first")
async def list_sweeps(
    owner: Owner,
    settings: SettingsDep,
    store: StoreDep,
    status_filter: Annotated[list[Status] | None, Query(alias="status", description="repeat to allow several")] = None,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
    # bounded: the store's integers are 64-bit, and no owner has a million sweeps to page through
    offset: Annotated[int, Query(ge=0, le=MAX_OFFSET)] = 0,
) -> SweepPage:
    return await manager.list_sweeps(
        store, settings, owner, list(status_filter) if status_filter else None, limit, offset
    )


@router.get("/{sweep_id}", response_model=SweepDetail, responses=error_responses(401, 404, 422))
async def get_sweep(sweep_id: SweepId, owner: Owner, reader: ReaderDep) -> Response:
    # already-rendered JSON (service/views.py); response_model documents its shape. A bearer request for a
    # well-formed id is answered before routing, by the same read (service.api.middleware.HotReads)
    return Response(await reader.detail_json(sweep_id, owner), media_type="application/json")


@router.get(
    "/{sweep_id}/curves",
    response_model=SweepCurves,
    responses=error_responses(401, 404, 422),
    summary="Val loss against tokens of every trial so far (the live page draws them while the sweep runs)",
)
async def get_curves(sweep_id: SweepId, owner: Owner, store: StoreDep) -> SweepCurves:
    return await manager.curves(store, sweep_id, owner)


@router.get(
    "/{sweep_id}/report",
    responses={200: {"description": "the analysis JSON (see sweeps/analysis.py)"}}
    | error_responses(401, 404, 409, 422),
    summary="The sweep's analysis; 409 until it has finished",
)
async def get_report(sweep_id: SweepId, owner: Owner, store: StoreDep) -> JSONResponse:
    return JSONResponse(await manager.report(store, sweep_id, owner))


@router.post(
    "/{sweep_id}/cancel",
    status_code=status.HTTP_202_ACCEPTED,
    response_model=SweepSummary,
    responses=error_responses(401, 404, 409, 422),
    summary="Stop the sweep's Ray work; finished trials are kept",
)
async def cancel_sweep(
    sweep_id: SweepId, owner: Owner, settings: SettingsDep, store: StoreDep, supervisor: SupervisorDep
) -> SweepSummary:
    return await manager.cancel(store, settings, supervisor, sweep_id, owner)


def json_error_responses(*codes: int) -> dict[int | str, dict[str, Any]]:
    """`error_responses` for a route whose own media type is not JSON: a `model` would be documented
    under the route's text/event-stream, but the errors are JSON."""
    schema = {"$ref": f"#/components/schemas/{ErrorResponse.__name__}"}
    return {code: {"content": {"application/json": {"schema": schema}}} for code in codes}


@router.get(
    "/{sweep_id}/events",
    # FastAPI's own SSE (fastapi.sse): it encodes the yielded events and sets the streaming headers
    response_class=EventSourceResponse,
    responses={200: {"description": "progress events, then `end`"}} | json_error_responses(401, 404, 422, 429),
    summary="Server-sent events of the sweep's progress (at most max_event_streams_per_owner open at once)",
)
async def sweep_event_stream(
    request: Request, sweep_id: StreamSlot, settings: SettingsDep, store: StoreDep
) -> AsyncIterator[ServerSentEvent]:
    # StreamSlot: the path's id, after the 404 check, with the owner's stream slot held until the response has ended
    async for event in sweep_events(request, store, settings, sweep_id):
        yield event
