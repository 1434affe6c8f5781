"""Per-session lease in Redis: one compaction per session at a time, for efficiency.

A job spans several tasks on several workers, so the lease cannot be a `redis.lock.Lock`
living in one process: the holder is the *job*, identified by a random token stored in its
job record. Acquire = `SET NX PX` plus `INCR` of a per-session fence counter (recorded in the
job record and the compaction entry, so an auditor can reject a lower fence); renew and
release are compare-and-set Lua scripts, so a stale holder can never extend or delete someone
else's lease. Correctness does NOT depend on the lease: a holder that outlived its TTL is
stopped by the storage CAS at commit (reference notes §5).
"""

from __future__ import annotations

import contextlib
import logging
import secrets
import threading
from collections.abc import Iterator
from dataclasses import dataclass

import redis

from tasks.redis_values import as_text

log = logging.getLogger(__name__)

LEASE_TTL_MS = 60_000
HEARTBEAT_S = 10.0

# KEYS: lease, fence. ARGV: token, ttl ms.
# Returns the new fence (>0), -1 if already held by this token (renewed), 0 if held by another.
_ACQUIRE = """
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return redis.call('INCR', KEYS[2])
end
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return -1
end
return 0
"""
_RENEW = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 0
"""
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


def lease_key(tenant: str, session: str) -> str:
    return f"compactd:lease:{tenant}:{session}"


def fence_key(tenant: str, session: str) -> str:
    return f"compactd:fence:{tenant}:{session}"


def new_token() -> str:
    return secrets.token_hex(16)


@dataclass(frozen=True, slots=True)
class Acquired:
    """`fence` is the new fence number, or None when the token already held the lease."""

    ok: bool
    fence: int | None
    holder: str | None = None


class SessionLease:
    """The lease of one session, held by whoever knows `token`."""

    def __init__(self, client: redis.Redis, tenant: str, session: str, token: str,
                 ttl_ms: int = LEASE_TTL_MS) -> None:
        self.r = client
        self.key = lease_key(tenant, session)
        self.fence_key = fence_key(tenant, session)
        self.token = token
        self.ttl_ms = ttl_ms
        self._acquire = client.register_script(_ACQUIRE)
        self._renew = client.register_script(_RENEW)
        self._release = client.register_script(_RELEASE)

    def acquire(self) -> Acquired:
        result = int(self._acquire(keys=[self.key, self.fence_key],
                                   args=[self.token, self.ttl_ms]))
        if result > 0:
            return Acquired(True, result)
        if result == -1:
            return Acquired(True, None)
        holder = self.r.get(self.key)
        return Acquired(False, None, as_text(holder) if holder else None)

    def renew(self) -> bool:
        return bool(self._renew(keys=[self.key], args=[self.token, self.ttl_ms]))

    def release(self) -> bool:
        return bool(self._release(keys=[self.key], args=[self.token]))

    def held(self) -> bool:
        value = self.r.get(self.key)
        return value is not None and as_text(value) == self.token

    @contextlib.contextmanager
    def heartbeat(self, interval: float = HEARTBEAT_S) -> Iterator[threading.Event]:
        """Renew from a daemon thread while the block runs. The yielded event is set if the
        lease was lost (expired and taken by someone else); callers may check it before an
        expensive step, but the commit CAS is what actually protects the transcript."""
        stop = threading.Event()
        lost = threading.Event()

        def run() -> None:
            while not stop.wait(interval):
                try:
                    if not self.renew():
                        lost.set()
                except redis.RedisError as exc:  # transient: the next beat retries
                    log.warning("lease renew failed for %s: %s", self.key, exc)

        thread = threading.Thread(target=run, name=f"lease:{self.key}", daemon=True)
        thread.start()
        try:
            yield lost
        finally:
            stop.set()
            thread.join(timeout=1.0)
