"""The Python producer API: submit, inspect, wait for and cancel compaction jobs.

Used by `compactd submit/status/cancel` and the gateway. Only ids cross the broker:
`compact_session` is sent with the job id as its single argument (argsrepr says so too), and
everything else the worker needs is in the job record.
"""

from __future__ import annotations

import time
import uuid
from functools import lru_cache
from typing import Any

import redis
from celery import Celery

from compactd.settings import load_settings
from tasks.app import BACKGROUND_QUEUE, QUEUES, make_app, visibility_timeout
from tasks.jobs import FINAL_STATES, CircuitOpen, JobStore
from tasks.lease import new_token
from tasks.targets import parse_target

__all__ = ["CircuitOpen", "cancel_job", "get_job", "submit_compaction", "wait_job"]


@lru_cache(maxsize=4)
def _store(url: str) -> JobStore:
    return JobStore(redis.Redis.from_url(url))


def job_store(redis_url: str | None = None) -> JobStore:
    return _store(redis_url or load_settings().redis_url)


@lru_cache(maxsize=4)
def _app(url: str) -> Celery:
    return make_app(url)


def producer_app(redis_url: str | None = None) -> Celery:
    """A Celery app for sending to the broker at `redis_url` (default: settings)."""
    return _app(redis_url or load_settings().redis_url)


def submit_compaction(target: str, *, tenant: str | None = None, session: str | None = None,
                      summarizer: str = "config", plan: dict[str, Any] | None = None,
                      instructions: str | None = None, if_needed: bool = False,
                      queue: str = BACKGROUND_QUEUE, redis_url: str | None = None,
                      policy: dict[str, Any] | None = None) -> str:
    """Create a job and send `compact_session`; return the job id.

    `policy` carries tenant settings the workers apply (maxSummaryChars, identifierPolicy,
    rotate, maxInflightLlmCalls); it is stored in the record before the task is sent.

    If the session already has an active job, return that job's id instead (join): two
    submits for one session cost one compaction. Raises `CircuitOpen` while the session's
    breaker is open, and ValueError for bad targets or options.
    """
    if queue not in QUEUES:
        raise ValueError(f"unknown queue {queue!r}: use one of {', '.join(QUEUES)}")
    if summarizer not in ("config", "extractive"):
        raise ValueError("summarizer must be 'config' (the worker's chain) or 'extractive'")
    if instructions is not None and len(instructions) > 4000:
        raise ValueError("instructions are capped at 4000 characters")
    parsed = parse_target(target, tenant=tenant, session=session)
    store = job_store(redis_url)
    store.check_breaker(parsed.tenant, parsed.session)
    job_id = uuid.uuid4().hex
    store.create(job_id, {
        "tenant": parsed.tenant, "session": parsed.session, "target": parsed.uri,
        "queue": queue, "leaseToken": new_token(),
        "options": {"summarizer": summarizer, "plan": plan or {}, "instructions": instructions,
                    "ifNeeded": if_needed},
        "policy": policy or {},
    })
    owner = store.claim_session(parsed.tenant, parsed.session, job_id,
                                ttl_s=2 * visibility_timeout() + 600)
    if owner != job_id:
        store.r.delete(f"compactd:job:{job_id}")
        return owner
    result = producer_app(redis_url).send_task(
        "tasks.compaction.compact_session", args=[job_id], queue=queue,
        argsrepr=repr((job_id,)), kwargsrepr="{}")
    store.update(job_id, taskId=result.id)
    return job_id


def get_job(job_id: str, *, redis_url: str | None = None) -> dict[str, Any] | None:
    """The job record (state, progress, tokens, timings, error, ...), or None."""
    record = job_store(redis_url).get(job_id)
    if record is not None:
        record.pop("leaseToken", None)  # a capability, not for display
    return record


def wait_job(job_id: str, timeout: float = 600.0, *, poll: float = 0.05,
             redis_url: str | None = None) -> dict[str, Any]:
    """Poll until the job is final; TimeoutError after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        record = get_job(job_id, redis_url=redis_url)
        if record is None:
            raise KeyError(f"no such job {job_id}")
        if record["state"] in FINAL_STATES:
            return record
        if time.monotonic() >= deadline:
            raise TimeoutError(f"job {job_id} still {record['state']} after {timeout:.0f} s")
        time.sleep(poll)


def cancel_job(job_id: str, *, redis_url: str | None = None) -> dict[str, Any]:
    """Request cancellation. A queued job is cancelled at once; a running one stops at its
    next check (before each LLM call, between retries, before commit) and ends 'cancelled'
    with the transcript unchanged. A job that already committed stays 'succeeded'."""
    store = job_store(redis_url)
    record = store.get(job_id)
    if record is None:
        raise KeyError(f"no such job {job_id}")
    if record["state"] in FINAL_STATES:
        return get_job(job_id, redis_url=redis_url) or record
    store.request_cancel(job_id)
    if store.finalize_if_queued(job_id, "cancelled", error="cancelled before start"):
        store.release_session(record["tenant"], record["session"], job_id)
    if record.get("taskId"):
        producer_app(redis_url).control.revoke(record["taskId"])
    return get_job(job_id, redis_url=redis_url) or record
