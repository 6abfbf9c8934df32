"""The /studies routes: a study (sweeps/study.py) priced before it runs. Running a study over HTTP is not
served yet: `sweeps study` runs one on the command line."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from service import manager
from service.api.auth import Owner
from service.api.deps import LimitsDep, SettingsDep, StoreDep
from service.api.routes.sweeps import Gpu, Mfu, PeakTflops
from service.api.schemas import error_responses
from service.models import StudyDryRunResult

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
