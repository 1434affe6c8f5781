"""Compaction jobs: submit (idempotent, admission-controlled), inspect, list, cancel.

A job is visible only to the tenant whose session it compacts; any other job id — unknown,
expired, another tenant's, or a CLI job on a file target — gets the very same 404 body, so job
ids cannot be probed across tenants.
"""

from __future__ import annotations

import hashlib
import logging
import re
import time
from typing import Annotated, Any

import orjson
from fastapi import APIRouter, Depends, Header, Path, Response

from compactd.logs import log_context
from compactd.metrics import JOBS_SUBMITTED
from gateway.auth import (
    ApiError,
    Services,
    Session,
    Tenant,
    TenantContext,
    checked_id,
    not_found,
    services,
)
from gateway.models import CompactionRequest, ErrorResponse, JobList, JobRecord
from tasks import webhooks
from tasks.app import BACKGROUND_QUEUE, INTERACTIVE_QUEUE
from tasks.jobs import CircuitOpen, JobStore
from tasks.producer import cancel_job, get_job, submit_compaction

log = logging.getLogger("compactd.gateway")
router = APIRouter(tags=["jobs"])
Svc = Annotated[Services, Depends(services)]

IDEMPOTENCY_KEY = re.compile(r"[\x21-\x7e]{1,255}")
ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"model": ErrorResponse, "description": "Missing or invalid API key"},
    404: {"model": ErrorResponse, "description": "No such session/job (or not this tenant's)"},
    422: {"model": ErrorResponse, "description": "Invalid id or input"},
    429: {"model": ErrorResponse, "description": "Rate or concurrency limit (see Retry-After)"},
}


def visible_job(svc: Services, ctx: TenantContext, job_id: str) -> dict[str, Any]:
    """The job record if it belongs to the caller's tenant, else the uniform 404."""
    if not re.fullmatch(r"[0-9a-f]{32}", job_id):
        raise not_found("job")
    record = get_job(job_id, redis_url=svc.settings.redis_url)
    if (record is None or record.get("tenant") != ctx.tenant
            or not str(record.get("target", "")).startswith("store://")):
        raise not_found("job")
    return record


def _plan(ref_policy: Any, body: CompactionRequest) -> dict[str, int]:
    """Plan overrides: tenant policy first, then the request (which wins)."""
    plan: dict[str, int] = {}
    window = body.contextWindow or ref_policy.contextWindow
    if ref_policy.keepRecentTokens is not None:
        plan["keep_recent_tokens"] = ref_policy.keepRecentTokens
    if ref_policy.reserveTokens is not None:
        plan["reserve_tokens"] = ref_policy.reserveTokens
    elif ref_policy.triggerRatio is not None and window:
        plan["reserve_tokens"] = round(window * (1 - ref_policy.triggerRatio))
    if window:
        plan["context_window"] = window
    if body.keepRecentTokens is not None:
        plan["keep_recent_tokens"] = body.keepRecentTokens
    if body.reserveTokens is not None:
        plan["reserve_tokens"] = body.reserveTokens
    return plan


@router.post(
    "/v1/sessions/{session}/compactions", status_code=202, response_model=JobRecord,
    summary="Submit a compaction job",
    responses={409: {"model": ErrorResponse, "description": "Idempotency-Key reused with a "
                     "different body"}, **ERRORS},
)
def submit(
    body: CompactionRequest, response: Response, ref: Session, svc: Svc,
    idempotency_key: Annotated[str | None, Header(max_length=255)] = None,
) -> dict[str, Any]:
    """Queue a compaction of the session; 202 with the job record. An active job for the same
    session is joined (its record is returned). `Idempotency-Key`: the same key with the same
    body returns the same job; with a different body, 409."""
    t, s = ref.tenant, ref.session
    fingerprint = ""
    if idempotency_key is not None:
        if not IDEMPOTENCY_KEY.fullmatch(idempotency_key):
            raise ApiError(422, "invalid_idempotency_key",
                           "Idempotency-Key must be 1-255 printable ASCII characters")
        canonical = orjson.dumps({"session": s, **body.model_dump()},
                                 option=orjson.OPT_SORT_KEYS)
        fingerprint = hashlib.sha256(canonical).hexdigest()
        ttl = svc.gateway.idempotency_ttl_s
        deadline = time.monotonic() + 5.0
        while True:
            outcome, existing = svc.limits.idempotency_claim(t, idempotency_key, fingerprint, ttl)
            if outcome == "replay" and existing is not None:
                response.headers["Idempotent-Replayed"] = "true"
                response.headers["Location"] = f"/v1/jobs/{existing}"
                record = get_job(existing, redis_url=svc.settings.redis_url)
                if record is None:
                    raise ApiError(409, "idempotency_expired", "the job of this "
                                   "Idempotency-Key has expired; use a new key")
                return record
            if outcome == "conflict":
                raise ApiError(409, "idempotency_conflict", "Idempotency-Key was already used "
                               "with a different request body")
            if outcome == "new":
                break
            if time.monotonic() > deadline:
                raise ApiError(409, "idempotency_in_progress", "a request with this "
                               "Idempotency-Key is still being processed",
                               headers={"Retry-After": "1"})
            time.sleep(0.05)
    stored = False
    try:
        job_id = _submit(svc, ref, body)
        if idempotency_key is not None:
            svc.limits.idempotency_store(t, idempotency_key, fingerprint, job_id,
                                         svc.gateway.idempotency_ttl_s)
            stored = True
    finally:
        if idempotency_key is not None and not stored:
            svc.limits.idempotency_release(t, idempotency_key)
    record = get_job(job_id, redis_url=svc.settings.redis_url)
    assert record is not None
    response.headers["Location"] = f"/v1/jobs/{job_id}"
    return record


def _submit(svc: Services, ref: Any, body: CompactionRequest) -> str:
    t, s, policy = ref.tenant, ref.session, ref.policy
    if not ref.store.exists():
        raise not_found("session")
    placeholder = svc.limits.admit_job(t, policy.maxConcurrentJobs or 1)
    if placeholder is None:
        raise ApiError(429, "too_many_jobs", f"the tenant already has "
                       f"{policy.maxConcurrentJobs} active jobs", headers={"Retry-After": "5"},
                       retryAfter=5)
    confirmed = False
    try:
        queue = INTERACTIVE_QUEUE if body.trigger == "overflow" else BACKGROUND_QUEUE
        try:
            job_id = submit_compaction(
                ref.target, tenant=t, session=s, summarizer=policy.summarizer or "config",
                plan=_plan(policy, body), instructions=body.instructions,
                if_needed=body.trigger == "threshold", queue=queue,
                redis_url=svc.settings.redis_url, policy=policy.model_dump(
                    include={"maxSummaryChars", "identifierPolicy", "rotate",
                             "maxInflightLlmCalls"}, exclude_none=True))
        except CircuitOpen as exc:
            wait = max(1, int(exc.retry_after + 0.999))
            raise ApiError(429, "circuit_open", "recent compactions of this session failed or "
                           "were ineffective; cooling down", headers={"Retry-After": str(wait)},
                           retryAfter=wait) from None
        except ValueError as exc:
            raise ApiError(422, "invalid_request", str(exc)) from None
        svc.limits.confirm_job(t, s, placeholder, job_id)
        confirmed = True
    finally:
        if not confirmed:
            svc.limits.drop_placeholder(t, placeholder)
    with log_context(tenant=t, session=s, job_id=job_id):
        jobs = JobStore(svc.redis)
        jobs.update(job_id, trigger=body.trigger)
        if body.callbackUrl is not None:
            webhooks.register_callback(job_id, body.callbackUrl, redis_url=svc.settings.redis_url)
            webhooks.dispatch(job_id, redis_url=svc.settings.redis_url)  # already ended?
        JOBS_SUBMITTED.labels(t, body.trigger).inc()
        log.info("job submitted", extra={"ctx_trigger": body.trigger, "ctx_queue": queue})
    return job_id


JobId = Annotated[str, Path(description="Job id (32 hex characters)", max_length=64)]


@router.get("/v1/jobs/{job_id}", response_model=JobRecord, responses=ERRORS,
            summary="A job record")
def read_job(job_id: JobId, ctx: Tenant, svc: Svc) -> dict[str, Any]:
    return visible_job(svc, ctx, job_id)


@router.delete("/v1/jobs/{job_id}", response_model=JobRecord, responses=ERRORS,
               summary="Cancel a job (a finished job is returned unchanged)")
def delete_job(job_id: JobId, ctx: Tenant, svc: Svc) -> dict[str, Any]:
    visible_job(svc, ctx, job_id)
    with log_context(tenant=ctx.tenant, job_id=job_id):
        log.info("job cancel requested")
        return cancel_job(job_id, redis_url=svc.settings.redis_url)


@router.get("/v1/sessions/{session}/jobs", response_model=JobList, responses=ERRORS,
            summary="Jobs submitted for the session through the API, newest first")
def list_jobs(ref: Session, svc: Svc) -> dict[str, Any]:
    checked_id("session", ref.session)
    records = []
    for job_id in svc.limits.session_jobs(ref.tenant, ref.session):
        record = get_job(job_id, redis_url=svc.settings.redis_url)
        if record is not None and record.get("tenant") == ref.tenant:
            records.append(record)
    if not records and not ref.store.exists():
        raise not_found("session")
    return {"jobs": records}
