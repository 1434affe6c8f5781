"""Job records, cancellation flags and the per-session circuit breaker, all in Redis.

A job record is a Redis hash `compactd:job:{id}` whose field values are JSON. A hash (rather
than one JSON string) lets concurrent tasks update different fields without a read-modify-write
race, and lets the final transition be one atomic Lua check ("only if not already final"),
which is what makes a redelivered callback a no-op. Progress is a set of finished chunk indexes
(`compactd:job:{id}:done`), so a redelivered chunk is not counted twice.

Records hold ids, counters, timings and error strings — never transcript text (instructions
given by the submitter are stored because the worker needs them; they are not task args).
"""

from __future__ import annotations

import os
import time
from typing import Any

import orjson
import redis

from tasks.redis_values import as_text

FINAL_STATES = frozenset({"succeeded", "failed", "skipped", "cancelled", "superseded"})
STATES = ("queued", "planning", "summarizing", "merging", "auditing", "committing",
          *sorted(FINAL_STATES))
JOB_TTL = 7 * 24 * 3600
STAGING_TTL = 6 * 3600
CANCEL_TTL = 24 * 3600


class CircuitOpen(Exception):
    """Too many consecutive failed/ineffective compactions for this session: cooling down."""

    def __init__(self, tenant: str, session: str, retry_after: float) -> None:
        super().__init__(f"circuit breaker open for session {tenant}/{session}: the last "
                         f"compactions failed or were ineffective; retry in {retry_after:.0f} s")
        self.retry_after = retry_after


def job_key(job_id: str) -> str:
    return f"compactd:job:{job_id}"


def cancel_key(job_id: str) -> str:
    return f"compactd:job:{job_id}:cancel"


def done_key(job_id: str) -> str:
    return f"compactd:job:{job_id}:done"


def input_key(job_id: str, index: int) -> str:
    return f"compactd:job:{job_id}:input:{index}"


def output_key(job_id: str, index: int) -> str:
    return f"compactd:job:{job_id}:out:{index}"


def snapshot_key(job_id: str) -> str:
    return f"compactd:job:{job_id}:snapshot"


def launched_key(job_id: str) -> str:
    return f"compactd:job:{job_id}:launched"


def session_job_key(tenant: str, session: str) -> str:
    return f"compactd:session:{tenant}:{session}:job"


def breaker_key(tenant: str, session: str) -> str:
    return f"compactd:breaker:{tenant}:{session}"


def now_ms() -> int:
    return int(time.time() * 1000)


def _enc(value: Any) -> bytes:
    return orjson.dumps(value)


# Final transition: only if the record exists and is not already final. Returns 1 if applied.
_FINALIZE = """
local cur = redis.call('HGET', KEYS[1], 'state')
if not cur then return -1 end
local state = cjson.decode(cur)
for _, s in ipairs(cjson.decode(ARGV[1])) do
  if s == state then return 0 end
end
for i = 2, #ARGV, 2 do redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1]) end
return 1
"""

# Move a queued job straight to a final state (cancel before any worker picked it up).
_IF_STATE = """
local cur = redis.call('HGET', KEYS[1], 'state')
if not cur then return -1 end
if cjson.decode(cur) ~= ARGV[1] then return 0 end
for i = 2, #ARGV, 2 do redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1]) end
return 1
"""

# Join-or-claim the session slot. KEYS: session pointer. ARGV: new job id, pointer ttl (ms),
# JSON list of final states. Returns the job id that owns the session now.
_JOIN = """
local cur = redis.call('GET', KEYS[1])
if cur then
  local st = redis.call('HGET', 'compactd:job:' .. cur, 'state')
  if st then
    local state = cjson.decode(st)
    local final = false
    for _, s in ipairs(cjson.decode(ARGV[3])) do
      if s == state then final = true end
    end
    if not final then return cur end
  end
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return ARGV[1]
"""

_DEL_IF = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


class JobStore:
    """All job bookkeeping for one Redis database."""

    def __init__(self, client: redis.Redis) -> None:
        self.r = client
        self._finalize = client.register_script(_FINALIZE)
        self._if_state = client.register_script(_IF_STATE)
        self._join = client.register_script(_JOIN)
        self._del_if = client.register_script(_DEL_IF)
        self.breaker_threshold = int(os.environ.get("COMPACTD_BREAKER_THRESHOLD", "3"))
        self.breaker_cooldown = float(os.environ.get("COMPACTD_BREAKER_COOLDOWN", "300"))

    @classmethod
    def from_url(cls, url: str) -> JobStore:
        return cls(redis.Redis.from_url(url))

    # -- records -----------------------------------------------------------------------------
    def create(self, job_id: str, fields: dict[str, Any]) -> None:
        now = now_ms()
        record = {"jobId": job_id, "state": "queued", "createdAt": now, "updatedAt": now,
                  "retries": 0, "timings": {}, **fields}
        key = job_key(job_id)
        pipe = self.r.pipeline()
        pipe.hset(key, mapping={k: _enc(v) for k, v in record.items()})
        pipe.expire(key, JOB_TTL)
        pipe.execute()

    def get(self, job_id: str) -> dict[str, Any] | None:
        raw = self.r.hgetall(job_key(job_id))
        if not raw:
            return None
        record = {as_text(k): orjson.loads(v) for k, v in raw.items()}
        total = record.get("chunksTotal") or 0
        if record.get("state") in FINAL_STATES and "chunksDone" in record:
            done = int(record.pop("chunksDone"))  # the staging set is gone by now
        else:
            done = int(self.r.scard(done_key(job_id)))
        record["progress"] = {"chunksDone": min(done, total), "chunksTotal": total}
        record["cancelRequested"] = bool(self.r.exists(cancel_key(job_id)))
        return record

    def update(self, job_id: str, **fields: Any) -> None:
        """Set fields (ignored once the job is final, so a late task cannot rewrite history)."""
        fields["updatedAt"] = now_ms()
        key = job_key(job_id)
        current = self.r.hget(key, "state")
        if current is None or orjson.loads(current) in FINAL_STATES:
            return
        self.r.hset(key, mapping={k: _enc(v) for k, v in fields.items()})

    def set_state(self, job_id: str, state: str, **fields: Any) -> None:
        self.update(job_id, state=state, **fields)

    def add_timing(self, job_id: str, name: str, ms: float) -> None:
        key = job_key(job_id)
        raw = self.r.hget(key, "timings")
        timings = orjson.loads(raw) if raw else {}
        timings[name] = round(ms, 1)
        self.r.hset(key, "timings", _enc(timings))

    def count(self, job_id: str, field: str) -> None:
        """Atomic counter field (JSON ints are plain decimal strings, so HINCRBY applies)."""
        self.r.hincrby(job_key(job_id), field, 1)

    def finalize(self, job_id: str, state: str, **fields: Any) -> bool:
        """Atomically move to a final state; False if already final (redelivery) or missing."""
        assert state in FINAL_STATES
        fields.update(state=state, updatedAt=now_ms(), finishedAt=now_ms())
        args: list[Any] = [_enc(sorted(FINAL_STATES))]
        for k, v in fields.items():
            args += [k, _enc(v)]
        result: int = self._finalize(keys=[job_key(job_id)], args=args)
        applied = result == 1
        if applied:
            self.r.expire(job_key(job_id), JOB_TTL)
        return applied

    def finalize_if_queued(self, job_id: str, state: str, **fields: Any) -> bool:
        fields.update(state=state, updatedAt=now_ms(), finishedAt=now_ms())
        args: list[Any] = ["queued"]
        for k, v in fields.items():
            args += [k, _enc(v)]
        result: int = self._if_state(keys=[job_key(job_id)], args=args)
        return result == 1

    def is_final(self, job_id: str) -> bool:
        raw = self.r.hget(job_key(job_id), "state")
        return raw is None or orjson.loads(raw) in FINAL_STATES

    # -- session slot (join) -----------------------------------------------------------------
    def claim_session(self, tenant: str, session: str, job_id: str, ttl_s: int) -> str:
        """Return the job that owns the session: an active one (join) or `job_id` (claimed)."""
        owner = self._join(keys=[session_job_key(tenant, session)],
                           args=[job_id, int(ttl_s * 1000), _enc(sorted(FINAL_STATES))])
        return owner.decode() if isinstance(owner, bytes) else str(owner)

    def release_session(self, tenant: str, session: str, job_id: str) -> None:
        self._del_if(keys=[session_job_key(tenant, session)], args=[job_id])

    # -- cancellation ------------------------------------------------------------------------
    def request_cancel(self, job_id: str) -> None:
        self.r.set(cancel_key(job_id), b"1", ex=CANCEL_TTL)

    def cancel_requested(self, job_id: str) -> bool:
        return bool(self.r.exists(cancel_key(job_id)))

    # -- staging -----------------------------------------------------------------------------
    def cleanup_staging(self, job_id: str, units: int) -> None:
        """Delete everything transcript-derived the job put in Redis (inputs, outputs,
        snapshot): after the job, Redis holds only ids, counters and timings."""
        keys = [snapshot_key(job_id), launched_key(job_id), done_key(job_id)]
        keys += [input_key(job_id, i) for i in range(units)]
        keys += [output_key(job_id, i) for i in range(units)]
        self.r.delete(*keys)
        # Belt and braces: a redelivered compact_session could have staged under other indexes.
        for key in self.r.scan_iter(match=f"compactd:job:{job_id}:*put:*", count=200):
            self.r.delete(key)

    # -- circuit breaker ---------------------------------------------------------------------
    def breaker_retry_after(self, tenant: str, session: str) -> float:
        raw = self.r.hget(breaker_key(tenant, session), "openUntil")
        if not raw:
            return 0.0
        return max(0.0, float(raw) - time.time())

    def check_breaker(self, tenant: str, session: str) -> None:
        wait = self.breaker_retry_after(tenant, session)
        if wait > 0:
            raise CircuitOpen(tenant, session, wait)

    def record_outcome(self, tenant: str, session: str, *, bad: bool) -> None:
        """Count consecutive failed/ineffective jobs; open the breaker at the threshold."""
        key = breaker_key(tenant, session)
        if not bad:
            self.r.delete(key)
            return
        failures = int(self.r.hincrby(key, "failures", 1))
        if failures >= self.breaker_threshold:
            self.r.hset(key, mapping={"failures": 0,
                                      "openUntil": time.time() + self.breaker_cooldown})
        self.r.expire(key, int(self.breaker_cooldown) + JOB_TTL)
