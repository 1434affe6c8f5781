"""End-to-end tests of the distributed runner: real Redis, real worker processes, real HTTP.

Workers are `celery worker --pool threads` subprocesses against a dedicated Redis DB and a temp
object store; the LLM is the scripted HTTP server. The broker visibility timeout is 5 s so a
SIGKILLed worker's unacked tasks are redelivered to the surviving worker within the test.
Skipped when Redis is not reachable on 127.0.0.1:6379.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
import redis

from pipeline.context import build_session_context
from pipeline.transcript import parse_transcript
from storage.objectstore import ObjectStore, open_store
from tests.support.builders import generate_session
from tests.support.llmserver import Behavior, ScriptedLLMServer

REDIS_URL = "redis://127.0.0.1:6379/13"
ROOT = Path(__file__).resolve().parents[1]
PLANTED = "The violet heron sleeps under platform nine at dawn."
MODEL = "dist-model"
WORKER_QUEUES = "compactd.interactive,compactd.background"
PLAN = {"keep_recent_tokens": 2000, "reserve_tokens": 1000, "reserve_floor": 0,
        "context_window": 20000, "target_chunk_tokens": 2000, "max_chunks": 8}


def _redis() -> redis.Redis:
    return redis.Redis.from_url(REDIS_URL)


try:
    _redis().ping()
except redis.RedisError:  # pragma: no cover - environment without Redis
    pytest.skip("Redis is not running on 127.0.0.1:6379", allow_module_level=True)

from storage.sessions import SessionStore  # noqa: E402
from tasks.jobs import FINAL_STATES  # noqa: E402
from tasks.lease import lease_key  # noqa: E402
from tasks.producer import (  # noqa: E402
    cancel_job,
    get_job,
    producer_app,
    submit_compaction,
    wait_job,
)


def transcript_bytes(seed: int, entries: int = 120) -> bytes:
    """A long session whose first user message carries the planted sentence."""
    lines = generate_session(entries, seed=seed, result_chars=1500).splitlines()
    out = []
    planted = False
    for line in lines:
        data = orjson.loads(line)
        msg = data.get("message")
        if not planted and isinstance(msg, dict) and msg.get("role") == "user":
            msg["content"] = f"{msg['content']} {PLANTED}"
            planted = True
        out.append(orjson.dumps(data))
    return b"\n".join(out) + b"\n"


class Cluster:
    """The test Redis DB, a temp store, the LLM server and worker subprocesses."""

    def __init__(self, tmp: Path, llm: ScriptedLLMServer) -> None:
        self.tmp = tmp
        self.llm = llm
        self.store_url = f"file://{tmp / 'store'}"
        (tmp / "store").mkdir()
        self.store: ObjectStore = open_store(self.store_url)
        self.workers: dict[str, subprocess.Popen[bytes]] = {}
        self.env = {
            **os.environ,
            "COMPACTD_REDIS_URL": REDIS_URL,
            "COMPACTD_STORE_URL": self.store_url,
            "COMPACTD_CHAIN": orjson.dumps([{"summarizer": "openai", "base_url": llm.url,
                                             "model": MODEL, "api_key": "k"}]).decode(),
            "COMPACTD_RETRY__ATTEMPTS": "2",
            "COMPACTD_RETRY__MIN_WAIT": "0.05",
            "COMPACTD_RETRY__MAX_WAIT": "0.1",
            "COMPACTD_VISIBILITY_TIMEOUT": "5",
            "PYTHONPATH": str(ROOT),
        }

    def start_worker(self, name: str) -> None:
        log = (self.tmp / f"{name}.log").open("wb")
        proc = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "tasks.app", "worker", "--pool", "threads",
             "-c", "8", "-Q", WORKER_QUEUES, "--without-gossip", "--without-mingle",
             "-n", f"{name}@%h", "--loglevel", "INFO"],
            cwd=ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True)
        self.workers[name] = proc

    def wait_ready(self, timeout: float = 30.0) -> None:
        app = producer_app(REDIS_URL)
        wanted = set(self.workers)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            replies = app.control.ping(timeout=0.5) or []
            seen = {name.split("@")[0] for reply in replies for name in reply}
            if wanted <= seen:
                return
            for name, proc in self.workers.items():
                assert proc.poll() is None, (self.tmp / f"{name}.log").read_text()[-3000:]
        raise AssertionError(f"workers {wanted} did not answer a ping in {timeout} s")

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        proc = self.workers.pop(name)
        if proc.poll() is None:
            os.killpg(proc.pid, sig)
        proc.wait(timeout=20)

    def stop_all(self) -> None:
        for name in list(self.workers):
            proc = self.workers[name]
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for name in list(self.workers):
            proc = self.workers.pop(name)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=5)

    def put_session(self, tenant: str, session: str, data: bytes) -> SessionStore:
        handle = SessionStore(self.store, tenant, session)
        handle.create(data)
        return handle

    def submit(self, tenant: str, session: str, **kw: Any) -> str:
        return submit_compaction(f"store://{tenant}/{session}", plan=PLAN,
                                 redis_url=REDIS_URL, **kw)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    r = _redis()
    r.flushdb()
    with ScriptedLLMServer(latency=0.05) as llm:
        c = Cluster(tmp_path_factory.mktemp("dist"), llm)
        c.start_worker("w1")
        c.start_worker("w2")
        try:
            c.wait_ready()
            yield c
        finally:
            c.stop_all()
    r.flushdb()


@pytest.fixture(autouse=True)
def _llm_defaults(cluster: Cluster) -> Iterator[None]:
    cluster.llm.reset()
    cluster.llm.latency = 0.05
    yield
    cluster.llm.reset()


def assert_compacted_once(cluster: Cluster, key: SessionStore, job: dict[str, Any]) -> None:
    transcript = parse_transcript(key.read_bytes())
    ours = [e for e in transcript.entries if e.type == "compaction"
            and e.data["details"]["compactd"]["compactionId"] == job["jobId"]]
    assert len(ours) == 1, f"expected one compaction entry, got {len(ours)}"
    assert ours[0].id == job["compactionEntryId"]
    assert ours[0].data["details"]["compactd"]["fence"] == job["fence"]
    ctx = build_session_context(transcript.path())
    assert ctx.compaction_id == ours[0].id
    calls = {b["id"] for m in ctx.payloads if m.get("role") == "assistant"
             for b in m.get("content") or [] if isinstance(b, dict) and b.get("type") == "toolCall"}
    for m in ctx.payloads:
        if m.get("role") == "toolResult":
            assert m["toolCallId"] in calls, "toolResult without its call in the model view"


def _append_user(key: SessionStore, text: str) -> str:
    """Append one entry through the session's CAS path, as the owning agent would."""
    entry_id = uuid.uuid4().hex[:8]
    key.append([{"type": "message", "id": entry_id, "timestamp": "2026-03-02T10:00:00.000Z",
                 "message": {"role": "user", "content": text,
                             "timestamp": 1_772_400_000_000}}])
    return entry_id


def test_end_to_end_many_sessions_two_workers(cluster: Cluster) -> None:
    keys = {f"s{i}": cluster.put_session("acme", f"s{i}", transcript_bytes(i)) for i in range(4)}
    started = time.monotonic()
    job_ids = {s: cluster.submit("acme", s, queue="compactd.interactive" if i % 2 else
                                 "compactd.background") for i, s in enumerate(keys)}
    records = {s: wait_job(j, timeout=60, redis_url=REDIS_URL) for s, j in job_ids.items()}
    elapsed = time.monotonic() - started
    for s, job in records.items():
        assert job["state"] == "succeeded", (job.get("error"), job.get("reason"), job)
        assert job["fallbackLevel"] == "full" and job["effective"] is True
        assert job["tokensAfter"] < job["tokensBefore"]
        assert job["progress"]["chunksDone"] == job["progress"]["chunksTotal"] >= 8
        assert {"planMs", "summarizeMs", "mergeMs", "commitMs", "totalMs"} <= set(job["timings"])
        assert_compacted_once(cluster, keys[s], job)
        assert not _redis().exists(lease_key("acme", s))
    assert cluster.llm.max_in_flight > 1, "chunks did not run in parallel"
    assert elapsed < 45


def test_duplicate_submit_joins(cluster: Cluster) -> None:
    key = cluster.put_session("acme", "dup", transcript_bytes(11))
    cluster.llm.latency = 0.3
    first = cluster.submit("acme", "dup")
    second = cluster.submit("acme", "dup")
    assert first == second
    job = wait_job(first, timeout=60, redis_url=REDIS_URL)
    assert job["state"] == "succeeded", (job.get("error"), job.get("reason"), job)
    assert_compacted_once(cluster, key, job)
    compactions = [e for e in parse_transcript(key.read_bytes()).entries
                   if e.type == "compaction"]
    assert len(compactions) == 1


def test_provider_outage_falls_back_or_fails_cleanly(cluster: Cluster) -> None:
    data = transcript_bytes(21)
    key = cluster.put_session("acme", "outage", data)
    cluster.llm.always(MODEL, Behavior.server_error(500))
    job = wait_job(cluster.submit("acme", "outage"), timeout=60, redis_url=REDIS_URL)
    if job["state"] == "succeeded":
        assert job["fallbackLevel"] == "extractive"
        assert_compacted_once(cluster, key, job)
    else:
        assert job["state"] == "failed" and job["error"]
        assert key.read_bytes() == data
    assert not _redis().exists(lease_key("acme", "outage"))


def test_cancel_leaves_transcript_unchanged(cluster: Cluster) -> None:
    data = transcript_bytes(31)
    key = cluster.put_session("acme", "cancel", data)
    cluster.llm.latency = 3.0
    job_id = cluster.submit("acme", "cancel")
    deadline = time.monotonic() + 20
    while (get_job(job_id, redis_url=REDIS_URL) or {})["state"] != "summarizing":
        assert time.monotonic() < deadline
        time.sleep(0.05)
    cancel_job(job_id, redis_url=REDIS_URL)
    job = wait_job(job_id, timeout=30, redis_url=REDIS_URL)
    assert job["state"] == "cancelled", job
    assert key.read_bytes() == data
    assert not _redis().exists(lease_key("acme", "cancel"))
    # The session is free again: a new job runs (fast server) and commits.
    cluster.llm.latency = 0.05
    again = wait_job(cluster.submit("acme", "cancel"), timeout=60, redis_url=REDIS_URL)
    assert again["state"] == "succeeded", again


def test_circuit_breaker_opens_after_repeated_failures(cluster: Cluster) -> None:
    from tasks.jobs import CircuitOpen, JobStore

    store = JobStore(_redis())
    for _ in range(store.breaker_threshold):
        store.record_outcome("acme", "flaky", bad=True)
    with pytest.raises(CircuitOpen, match="circuit breaker open"):
        cluster.submit("acme", "flaky")
    store.record_outcome("acme", "flaky", bad=False)


def test_worker_killed_mid_chord_redelivers_without_lost_appends(cluster: Cluster) -> None:
    key = cluster.put_session("acme", "crash", transcript_bytes(41))
    cluster.llm.latency = 1.5
    job_id = cluster.submit("acme", "crash")
    # Wait until chunk calls are in flight on both workers, then SIGKILL w1.
    deadline = time.monotonic() + 20
    while cluster.llm.in_flight < 4:
        assert time.monotonic() < deadline, "chord never got going"
        time.sleep(0.02)
    appended: list[str] = []
    stop = threading.Event()

    def agent() -> None:
        n = 0
        while not stop.is_set():
            n += 1
            appended.append(_append_user(key, f"agent keeps working {n}"))
            time.sleep(0.2)

    writer = threading.Thread(target=agent, daemon=True)
    writer.start()
    cluster.kill("w1")
    try:
        job = wait_job(job_id, timeout=60, redis_url=REDIS_URL)
    finally:
        stop.set()
        writer.join(timeout=5)
    assert job["state"] == "succeeded", (job.get("error"), job.get("reason"), job)
    print("crash job record:", {k: job.get(k) for k in ("redeliveries", "retries", "timings",
                                                         "progress", "commitStatus",
                                                         "commitAttempts", "fence")})
    assert job.get("redeliveries", 0) >= 1, "no task was redelivered: the kill missed the chord"
    assert_compacted_once(cluster, key, job)
    final = parse_transcript(key.read_bytes())
    assert appended and all(e in final for e in appended), "an agent append was lost"
    on_path = {e.id for e in final.path()}
    assert set(appended) <= on_path
    assert not _redis().exists(lease_key("acme", "crash"))
    cluster.start_worker("w3")
    cluster.wait_ready()


def test_redis_holds_no_transcript_text(cluster: Cluster) -> None:
    """Runs last: scan every key of the test DB (queues, unacked, results, chord state, job
    records) for the planted sentence. Only the content cache may hold summary text."""
    r = _redis()
    for _ in range(100):  # let the last events/acks settle
        if all(get_job(k.decode().split(":")[2], redis_url=REDIS_URL)["state"] in FINAL_STATES
               for k in r.scan_iter(match="compactd:job:*") if k.count(b":") == 2):
            break
        time.sleep(0.1)
    needle = PLANTED.encode()
    hits = []
    staged = []
    for key in r.scan_iter(count=500):
        name = key.decode()
        if (":input:" in name or ":out:" in name or name.endswith(":snapshot")) \
                and name.startswith("compactd:job:"):
            staged.append(name)
        kind = r.type(key).decode()
        if kind == "string":
            values = [r.get(key) or b""]
        elif kind == "list":
            values = r.lrange(key, 0, -1)
        elif kind == "hash":
            values = [k + b"=" + v for k, v in r.hgetall(key).items()]
        elif kind == "set":
            values = list(r.smembers(key))
        elif kind == "zset":
            values = [m for m, _ in r.zrange(key, 0, -1, withscores=True)]
        else:
            values = []
        if any(needle in v for v in values) and not name.startswith("compactd:cache:"):
            hits.append(name)
    assert not staged, f"staged job text left in Redis: {staged[:5]}"
    assert not hits, f"transcript text found in Redis keys: {hits[:5]}"
    # Task messages in worker logs carry ids only, too.
    for log in cluster.tmp.glob("w*.log"):
        assert PLANTED not in log.read_text(errors="replace"), log.name
