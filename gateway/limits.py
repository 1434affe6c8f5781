"""Per-tenant fairness in Redis: request rate, in-flight requests, concurrent jobs, idempotency.

Everything is one atomic Lua call so that several gateway processes share the limits exactly
(no read-then-write race lets a tenant through twice), and the clock is Redis' own ``TIME`` so
gateways with skewed clocks agree. No web framework here: tasks/webhooks.py releases job slots.
"""

from __future__ import annotations

import math
import secrets
import time
import uuid
from dataclasses import dataclass
from typing import cast

import orjson
import redis

from tasks.jobs import FINAL_STATES, JOB_TTL
from tasks.redis_values import as_text

#: How long an in-flight request slot lives if the gateway process dies before releasing it.
INFLIGHT_STALE_MS = 120_000
#: How long a job-admission placeholder lives (covers the submit round trip).
PLACEHOLDER_MS = 60_000
#: Jobs listed per session (the index is trimmed to this).
JOBS_PER_SESSION = 200

# Token bucket. KEYS[1] bucket hash. ARGV: rate (tokens/s), burst. Returns {allowed, wait_ms}.
_BUCKET = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local rate = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local data = redis.call('HMGET', KEYS[1], 'tokens', 'ts')
local tokens = tonumber(data[1])
local ts = tonumber(data[2])
if tokens == nil or ts == nil then tokens = burst; ts = now end
if now > ts then tokens = math.min(burst, tokens + (now - ts) * rate / 1000) end
local allowed = 0
local wait = 0
if tokens >= 1 then
  tokens = tokens - 1
  allowed = 1
else
  wait = math.ceil((1 - tokens) * 1000 / rate)
end
redis.call('HSET', KEYS[1], 'tokens', tostring(tokens), 'ts', tostring(now))
redis.call('PEXPIRE', KEYS[1], math.ceil(burst * 1000 / rate) + 1000)
return {allowed, wait}
"""

# Counting semaphore with stale-slot expiry. KEYS[1] zset. ARGV: token, max, stale_ms.
_ACQUIRE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - tonumber(ARGV[3]))
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[2]) then return 0 end
redis.call('ZADD', KEYS[1], now, ARGV[1])
redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[3]))
return 1
"""

# Job admission. KEYS[1] zset of active job ids (+ "p:" placeholders). ARGV: placeholder, max,
# placeholder ttl ms, JSON list of final states. Drops finished/vanished jobs, then admits.
_ADMIT = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local final = {}
for _, s in ipairs(cjson.decode(ARGV[4])) do final[s] = true end
local members = redis.call('ZRANGE', KEYS[1], 0, -1, 'WITHSCORES')
for i = 1, #members, 2 do
  local id = members[i]
  local score = tonumber(members[i + 1])
  if string.sub(id, 1, 2) == 'p:' then
    if score < now - tonumber(ARGV[3]) then redis.call('ZREM', KEYS[1], id) end
  else
    local st = redis.call('HGET', 'compactd:job:' .. id, 'state')
    if (not st) or final[cjson.decode(st)] then redis.call('ZREM', KEYS[1], id) end
  end
end
local active = redis.call('ZCARD', KEYS[1])
if active >= tonumber(ARGV[2]) then return 0 end
redis.call('ZADD', KEYS[1], now, ARGV[1])
redis.call('PEXPIRE', KEYS[1], 7 * 24 * 3600 * 1000)
return 1
"""


def active_jobs_key(tenant: str) -> str:
    return f"compactd:gw:active:{tenant}"


def session_jobs_key(tenant: str, session: str) -> str:
    return f"compactd:gw:jobs:{tenant}:{session}"


def idempotency_key(tenant: str, key: str) -> str:
    return f"compactd:gw:idem:{tenant}:{key}"


@dataclass(frozen=True, slots=True)
class RateDecision:
    allowed: bool
    retry_after_s: int


class Limits:
    """The Redis-side limiters of one gateway process."""

    def __init__(self, client: redis.Redis) -> None:
        self.r = client
        self._bucket = client.register_script(_BUCKET)
        self._acquire = client.register_script(_ACQUIRE)
        self._admit = client.register_script(_ADMIT)

    # -- request rate ------------------------------------------------------------------------
    def take_token(self, tenant: str, rate: float, burst: int) -> RateDecision:
        allowed, wait_ms = self._bucket(keys=[f"compactd:gw:rate:{tenant}"],
                                        args=[repr(float(rate)), int(burst)])
        return RateDecision(bool(allowed), max(1, math.ceil(int(wait_ms) / 1000)))

    # -- in-flight requests ------------------------------------------------------------------
    def enter(self, tenant: str, limit: int) -> str | None:
        """Take an in-flight slot; the token to give back to `leave`, or None when full."""
        token = secrets.token_hex(8)
        ok = self._acquire(keys=[f"compactd:gw:inflight:{tenant}"],
                           args=[token, int(limit), INFLIGHT_STALE_MS])
        return token if ok else None

    def leave(self, tenant: str, token: str) -> None:
        self.r.zrem(f"compactd:gw:inflight:{tenant}", token)

    # -- concurrent jobs ---------------------------------------------------------------------
    def admit_job(self, tenant: str, limit: int) -> str | None:
        """Reserve a job slot; the placeholder to `confirm_job`/`drop_placeholder`, or None."""
        placeholder = f"p:{uuid.uuid4().hex}"
        ok = self._admit(keys=[active_jobs_key(tenant)],
                         args=[placeholder, int(limit), PLACEHOLDER_MS,
                               orjson.dumps(sorted(FINAL_STATES))])
        return placeholder if ok else None

    def confirm_job(self, tenant: str, session: str, placeholder: str, job_id: str) -> None:
        """Swap the placeholder for the real job id and index the job under its session."""
        now = time.time()
        pipe = self.r.pipeline()
        pipe.zrem(active_jobs_key(tenant), placeholder)
        pipe.zadd(active_jobs_key(tenant), {job_id: now * 1000})
        pipe.zadd(session_jobs_key(tenant, session), {job_id: now})
        pipe.zremrangebyrank(session_jobs_key(tenant, session), 0, -JOBS_PER_SESSION - 1)
        pipe.expire(session_jobs_key(tenant, session), JOB_TTL)
        pipe.execute()

    def drop_placeholder(self, tenant: str, placeholder: str) -> None:
        self.r.zrem(active_jobs_key(tenant), placeholder)

    def session_jobs(self, tenant: str, session: str) -> list[str]:
        # Without withscores the reply is members only.
        members = cast(list[bytes | str],
                       self.r.zrevrange(session_jobs_key(tenant, session), 0, -1))
        return [as_text(m) for m in members]

    # -- idempotency -------------------------------------------------------------------------
    def idempotency_claim(self, tenant: str, key: str, fingerprint: str, ttl_s: int
                          ) -> tuple[str, str | None]:
        """("new", None) when this request owns the key now; ("replay", job_id) for the same
        body; ("conflict", None) for a different body; ("pending", None) while the first
        request with this key is still submitting."""
        rk = idempotency_key(tenant, key)
        if self.r.set(rk, orjson.dumps({"fp": fingerprint, "job": None}), nx=True, ex=ttl_s):
            return "new", None
        raw = self.r.get(rk)
        if raw is None:
            return self.idempotency_claim(tenant, key, fingerprint, ttl_s)
        data = orjson.loads(raw)
        if data.get("fp") != fingerprint:
            return "conflict", None
        if data.get("job") is None:
            return "pending", None
        return "replay", str(data["job"])

    def idempotency_store(self, tenant: str, key: str, fingerprint: str, job_id: str,
                          ttl_s: int) -> None:
        self.r.set(idempotency_key(tenant, key),
                   orjson.dumps({"fp": fingerprint, "job": job_id}), ex=ttl_s)

    def idempotency_release(self, tenant: str, key: str) -> None:
        """Forget a claim whose submit failed, so a retry with the same key can succeed."""
        self.r.delete(idempotency_key(tenant, key))
