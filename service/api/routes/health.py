"""GET /healthz: no auth, 200 when the store, Ray and MLflow all answer, else 503."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from service.api.deps import HealthDep
from service.api.schemas import Health

router = APIRouter(tags=["health"])


@router.get("/healthz", response_model=Health, responses={503: {"model": Health}})
async def healthz(checker: HealthDep) -> JSONResponse:
    health = await checker.health()
    return JSONResponse(health.model_dump(mode="json"), status_code=200 if health.status == "ok" else 503)
