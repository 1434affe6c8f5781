"""Operational endpoints: liveness, readiness and Prometheus metrics (no authentication:
they reveal no tenant data, and orchestrators and scrapers cannot hold tenant keys)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Response
from fastapi.responses import JSONResponse

from compactd import metrics
from gateway.auth import Services, services
from gateway.models import Health

router = APIRouter(tags=["ops"])


@router.get("/healthz", response_model=Health, summary="The process is up")
def healthz() -> Health:
    return Health(status="ok")


@router.get("/readyz", response_model=Health, summary="Redis and the object store answer",
            responses={503: {"model": Health}})
def readyz(svc: Annotated[Services, Depends(services)]) -> JSONResponse:
    checks: dict[str, str] = {}
    try:
        svc.redis.ping()
        checks["redis"] = "ok"
    except Exception as exc:  # any failure means "not ready", whatever its type
        checks["redis"] = type(exc).__name__
    try:
        svc.store.head("compactd-readyz-probe")
        checks["store"] = "ok"
    except Exception as exc:
        checks["store"] = type(exc).__name__
    ok = all(v == "ok" for v in checks.values())
    body = Health(status="ok" if ok else "unavailable", checks=checks)
    return JSONResponse(body.model_dump(), status_code=200 if ok else 503)


@router.get("/metrics", summary="Prometheus metrics", response_class=Response,
            responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}}}})
def get_metrics() -> Response:
    return Response(metrics.render(), media_type=metrics.CONTENT_TYPE)
