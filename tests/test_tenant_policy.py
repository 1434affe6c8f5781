"""Tenant policy reaches the workers: summary cap, identifier policy, rotation, LLM slots."""

from __future__ import annotations

import threading
import time

import pytest
import redis

from pipeline.summarizer import CancelToken, SummarizerCancelledError
from tasks.admission import llm_slot, slots_key
from tasks.compaction import job_settings

REDIS_URL = "redis://127.0.0.1:6379/10"


@pytest.fixture()
def r() -> redis.Redis:
    client = redis.Redis.from_url(REDIS_URL)
    try:
        client.ping()
    except redis.RedisError:
        pytest.skip("Redis is not running on 127.0.0.1:6379")
    client.delete(slots_key("t1"))
    return client


def test_job_settings_apply_the_tenant_policy() -> None:
    record = {"options": {"plan": {"keep_recent_tokens": 3000}, "instructions": "focus"},
              "policy": {"maxSummaryChars": 6000, "identifierPolicy": "off", "rotate": True}}
    settings = job_settings(record)
    assert settings.plan.keep_recent_tokens == 3000
    assert settings.summary.max_summary_chars == 6000
    assert settings.summary.identifier_policy == "off"
    assert settings.summary.instructions == "focus"
    assert settings.rotate is True
    plain = job_settings({"options": {}})
    assert plain.summary.max_summary_chars == 16000 and plain.rotate is False


def test_llm_slots_cap_a_tenant(r: redis.Redis) -> None:
    inside = 0
    peak = 0
    lock = threading.Lock()

    def unit() -> None:
        nonlocal inside, peak
        with llm_slot(r, "t1", 2):
            with lock:
                inside += 1
                peak = max(peak, inside)
            time.sleep(0.15)
            with lock:
                inside -= 1

    threads = [threading.Thread(target=unit) for _ in range(6)]
    started = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert peak == 2
    assert time.monotonic() - started >= 0.4  # 6 units, 2 at a time, 0.15 s each
    assert r.zcard(slots_key("t1")) == 0


def test_waiting_for_a_slot_stops_on_cancel(r: redis.Redis) -> None:
    cancel = CancelToken()
    with llm_slot(r, "t1", 1):
        threading.Timer(0.2, cancel.cancel).start()
        with pytest.raises(SummarizerCancelledError), llm_slot(r, "t1", 1, cancel):
            pass


def test_expired_slots_are_reclaimed(r: redis.Redis) -> None:
    r.zadd(slots_key("t1"), {"dead-worker": time.time() - 1})
    with llm_slot(r, "t1", 1):
        assert r.zcard(slots_key("t1")) == 1
