"""Webhook delivery on job end: signed POSTs of the job record, retried with backoff.

Why a Celery task on its own queue (`compactd.webhooks`) rather than a call inside the
compaction worker: a slow or dead receiver must never hold a compaction thread, and retries
must survive a worker restart (the retry is a broker message with a countdown, not a sleeping
thread). `job_ended` itself only does a few Redis calls and one broker publish, and swallows
every error — a webhook problem can never fail or re-run a compaction.

Exactly one delivery chain per (job, callback URL), whichever side notices the end first:
callbacks are registered by the gateway *after* `submit_compaction` returns, so a fast job may
end before its callback exists. Both `job_ended` (worker) and the gateway (after registering)
call `dispatch`, which claims each callback with SET NX before sending the task.

Signature: ``X-Compactd-Signature: t=<unix>,v1=<hex HMAC-SHA256(secret, "<t>.<body>")>`` with
the tenant's webhook secret; receivers should reject old timestamps (replay) and compare in
constant time. Each attempt's outcome is written into the job record (`webhooks` field).
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import random
import threading
import time
from typing import Any

import httpx
import orjson
import redis
from celery import Task

from compactd.logs import log_context, safe_error
from tasks.app import app
from tasks.jobs import FINAL_STATES, JOB_TTL, JobStore, job_key
from tasks.redis_values import as_text

log = logging.getLogger("compactd.webhooks")

WEBHOOK_QUEUE = "compactd.webhooks"
SIGNATURE_HEADER = "X-Compactd-Signature"
TASK_NAME = "tasks.webhooks.deliver"

# Merge one callback's status into the record's `webhooks` JSON field atomically (several
# callbacks of one job may be delivered concurrently). No-op once the record has expired.
_SET_STATUS = """
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
local raw = redis.call('HGET', KEYS[1], 'webhooks')
local all = {}
if raw then all = cjson.decode(raw) end
all[ARGV[1]] = cjson.decode(ARGV[2])
redis.call('HSET', KEYS[1], 'webhooks', cjson.encode(all))
return 1
"""


def max_attempts() -> int:
    return int(os.environ.get("COMPACTD_WEBHOOK_MAX_ATTEMPTS", "8"))


def backoff_base() -> float:
    """First retry delay in seconds (doubles per attempt, capped at 10 min, 20% jitter)."""
    return float(os.environ.get("COMPACTD_WEBHOOK_BACKOFF", "2"))


def callbacks_key(job_id: str) -> str:
    return f"compactd:job:{job_id}:callbacks"


def claim_key(job_id: str, cb_id: str) -> str:
    return f"compactd:job:{job_id}:callback:{cb_id}:claimed"


def callback_id(url: str) -> str:
    return hashlib.sha256(url.encode()).hexdigest()[:16]


def sign(secret: str, timestamp: int, body: bytes) -> str:
    """The signature header value for `body` sent at `timestamp`."""
    mac = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256)
    return f"t={timestamp},v1={mac.hexdigest()}"


def verify(secret: str, header: str, body: bytes, *, tolerance_s: float = 300.0,
           now: float | None = None) -> bool:
    """Receiver-side check (used by tests and `compactd.client`): signature and freshness."""
    try:
        fields = dict(part.split("=", 1) for part in header.split(","))
        timestamp = int(fields["t"])
        given = fields["v1"]
    except (KeyError, ValueError):
        return False
    if abs((now if now is not None else time.time()) - timestamp) > tolerance_s:
        return False
    expected = sign(secret, timestamp, body).split("v1=", 1)[1]
    return hmac.compare_digest(expected, given)


_clients: dict[str, redis.Redis] = {}
_lock = threading.Lock()


def _redis(redis_url: str | None) -> redis.Redis:
    from compactd.settings import load_settings

    url = redis_url or load_settings().redis_url
    with _lock:
        if url not in _clients:
            _clients[url] = redis.Redis.from_url(url)
        return _clients[url]


def _set_status(r: redis.Redis, job_id: str, cb_id: str, status: dict[str, Any]) -> None:
    r.eval(_SET_STATUS, 1, job_key(job_id), cb_id, orjson.dumps(status))


def register_callback(job_id: str, url: str, *, redis_url: str | None = None) -> str:
    """Remember `url` as a callback of the job (gateway side); returns the callback id."""
    r = _redis(redis_url)
    cb_id = callback_id(url)
    pipe = r.pipeline()
    pipe.hset(callbacks_key(job_id), cb_id, url)
    pipe.expire(callbacks_key(job_id), JOB_TTL)
    pipe.execute()
    return cb_id


def dispatch(job_id: str, *, redis_url: str | None = None) -> int:
    """Queue one delivery per registered, not yet claimed callback of a *final* job.

    Returns how many deliveries were queued. Safe to call any number of times from anywhere.
    """
    from tasks.producer import producer_app

    r = _redis(redis_url)
    state = r.hget(job_key(job_id), "state")
    if state is None or orjson.loads(state) not in FINAL_STATES:
        return 0
    queued = 0
    for raw_id, raw_url in r.hgetall(callbacks_key(job_id)).items():
        cb_id, url = as_text(raw_id), as_text(raw_url)
        if not r.set(claim_key(job_id, cb_id), b"1", nx=True, ex=JOB_TTL):
            continue
        _set_status(r, job_id, cb_id, {"url": url, "state": "pending", "attempts": 0})
        producer_app(redis_url).send_task(TASK_NAME, args=[job_id, cb_id], queue=WEBHOOK_QUEUE,
                                          argsrepr=repr((job_id, cb_id)), kwargsrepr="{}")
        queued += 1
    return queued


def _release_job_slot(r: redis.Redis, job_id: str) -> None:
    """Free the tenant's concurrent-job slot at once (the gateway also prunes lazily)."""
    raw = r.hget(job_key(job_id), "tenant")
    if raw is not None:
        r.zrem(f"compactd:gw:active:{orjson.loads(raw)}", job_id)


def job_ended(job_id: str) -> None:
    """Called once per job when it reaches a final state. Must never block or raise."""
    try:
        r = _redis(None)
        _release_job_slot(r, job_id)
        dispatch(job_id)
    except Exception as exc:  # a webhook problem must never fail a compaction
        log.warning("webhook dispatch failed: %s", safe_error(exc))


_http: httpx.Client | None = None


def _client() -> httpx.Client:
    global _http
    with _lock:
        if _http is None:
            _http = httpx.Client(timeout=httpx.Timeout(10.0, connect=5.0),
                                 follow_redirects=False,
                                 headers={"User-Agent": "compactd-webhooks/1"})
        return _http


def _body(record: dict[str, Any]) -> bytes:
    """The job record as delivered: without delivery bookkeeping and capabilities."""
    shown = {k: v for k, v in record.items() if k not in ("webhooks", "leaseToken")}
    return orjson.dumps(shown, option=orjson.OPT_SORT_KEYS)


@app.task(bind=True, name=TASK_NAME, acks_late=True, ignore_result=True, max_retries=None)
def deliver(self: Task, job_id: str, cb_id: str) -> dict[str, Any]:
    """One delivery attempt; schedules the next one (with backoff) on failure."""
    from gateway.tenants import TenantNotFound, TenantStore

    r = _redis(None)
    attempt = int(self.request.retries) + 1
    url_raw = r.hget(callbacks_key(job_id), cb_id)
    record = JobStore(r).get(job_id)
    if url_raw is None or record is None:
        return {"delivered": False, "reason": "job or callback expired"}
    url = as_text(url_raw)
    status: dict[str, Any] = {"url": url, "attempts": attempt, "lastAttemptAt": int(time.time())}
    with log_context(job_id=job_id, tenant=str(record.get("tenant")), stage="webhook"):
        try:
            secret = TenantStore(r).webhook_secret(str(record["tenant"]))
        except TenantNotFound:
            _set_status(r, job_id, cb_id, {**status, "state": "failed",
                                           "lastError": "tenant no longer exists"})
            return {"delivered": False, "reason": "tenant gone"}
        body = _body(record)
        now = int(time.time())
        headers = {"Content-Type": "application/json", SIGNATURE_HEADER: sign(secret, now, body),
                   "X-Compactd-Job": job_id, "X-Compactd-Attempt": str(attempt)}
        error: str | None = None
        code: int | None = None
        try:
            response = _client().post(url, content=body, headers=headers)
            code = response.status_code
            if not 200 <= code < 300:
                error = f"HTTP {code}"
        except httpx.HTTPError as exc:
            error = safe_error(exc)
        if error is None:
            _set_status(r, job_id, cb_id, {**status, "state": "delivered", "lastStatus": code,
                                           "deliveredAt": int(time.time())})
            log.info("webhook delivered", extra={"ctx_attempt": attempt})
            return {"delivered": True, "attempts": attempt}
        final = attempt >= max_attempts()
        _set_status(r, job_id, cb_id, {**status, "state": "failed" if final else "retrying",
                                       "lastStatus": code, "lastError": error})
        log.warning("webhook attempt failed", extra={"ctx_attempt": attempt,
                                                     "ctx_status": code})
        if final:
            return {"delivered": False, "attempts": attempt}
        delay = min(600.0, backoff_base() * 2 ** (attempt - 1))
        raise self.retry(countdown=delay * random.uniform(0.8, 1.2))
