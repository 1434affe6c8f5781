"""Per-tenant admission of LLM calls: at most N summarize units of one tenant in flight.

Celery's rate_limit is per worker and per task type, so one tenant with a huge backlog could
take every thread of every worker. Each unit holds a slot in a Redis sorted set (member = a
random token, score = expiry) while it calls the model; expired slots (a worker that died)
are reclaimed on the next acquire, so a crash cannot leak capacity for longer than the TTL.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Iterator

import redis

from pipeline.summarizer import CancelToken, SummarizerCancelledError

SLOT_TTL_S = 600
POLL_S = 0.1

_ACQUIRE = """
local now = tonumber(ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if redis.call('ZCARD', KEYS[1]) < tonumber(ARGV[2]) then
  redis.call('ZADD', KEYS[1], now + tonumber(ARGV[3]), ARGV[4])
  redis.call('EXPIRE', KEYS[1], tonumber(ARGV[3]))
  return 1
end
return 0
"""


def slots_key(tenant: str) -> str:
    return f"compactd:tenant:{tenant}:llm-slots"


@contextlib.contextmanager
def llm_slot(r: redis.Redis, tenant: str, limit: int | None,
             cancel: CancelToken | None = None) -> Iterator[None]:
    """Hold one of the tenant's `limit` slots for the duration of the block (no limit: no-op).

    Waits (polling) for a free slot; a cancelled job stops waiting.
    """
    if not limit:
        yield
        return
    token = uuid.uuid4().hex
    script = r.register_script(_ACQUIRE)
    while not script(keys=[slots_key(tenant)], args=[time.time(), limit, SLOT_TTL_S, token]):
        if cancel is not None and cancel.cancelled:
            raise SummarizerCancelledError("compaction cancelled while waiting for a slot")
        time.sleep(POLL_S)
    try:
        yield
    finally:
        r.zrem(slots_key(tenant), token)
