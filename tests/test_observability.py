"""What operators see: worker /metrics after a job, and JSON logs without conversation text.

One real worker started through the `compactd worker` CLI (as compose.yaml starts it) with a
metrics port, on its own Redis DB, an extractive-only chain and an LLM API key set, so the
test can prove the key never reaches a log line either.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import orjson
import pytest
import redis

from storage.objectstore import open_store
from storage.sessions import SessionStore
from tasks.producer import producer_app, submit_compaction, wait_job
from tests.support.builders import SessionBuilder

ROOT = Path(__file__).resolve().parents[1]
REDIS_URL = "redis://127.0.0.1:6379/11"
SECRET_KEY = "sk-test-NEVER-LOG-THIS-9f8e7d"
PLANTED = "the launch codes are hidden under the blue teapot"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="module")
def worker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, int, str]]:
    tmp = tmp_path_factory.mktemp("obs")
    store_url = f"file://{tmp / 'store'}"
    port = _free_port()
    r = redis.Redis.from_url(REDIS_URL)
    r.flushdb()
    log_path = tmp / "worker.log"
    env = {**os.environ, "COMPACTD_REDIS_URL": REDIS_URL, "COMPACTD_STORE_URL": store_url,
           "COMPACTD_LLM_API_KEY": SECRET_KEY, "COMPACTD_LOG_FORMAT": "json",
           "PYTHONPATH": str(ROOT)}
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "compactd", "worker", "--concurrency", "4", "--name",
             "obs@%h", "--metrics-port", str(port)],
            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        app = producer_app(REDIS_URL)
        deadline = time.monotonic() + 30
        while not (app.control.ping(timeout=0.5) or []):
            assert proc.poll() is None, log_path.read_text()[-3000:]
            assert time.monotonic() < deadline, "worker did not start"
        yield log_path, port, store_url
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
        r.flushdb()


def _session() -> bytes:
    b = SessionBuilder()
    b.user(f"Never deploy on Fridays. Remember: {PLANTED}.")
    for i in range(40):
        b.user(f"step {i}: update module {i} " + "words " * 60)
        b.assistant(f"updated module {i} " + "detail " * 200, usage=5000 + i * 4000)
    return b.to_bytes()


@pytest.fixture(scope="module")
def finished_job(worker: tuple[Path, int, str]) -> dict[str, object]:
    _, _, store_url = worker
    SessionStore(open_store(store_url), "obs", "s1").create(_session())
    job_id = submit_compaction("store://obs/s1", redis_url=REDIS_URL,
                               plan={"keep_recent_tokens": 4000, "context_window": 128000})
    job = wait_job(job_id, timeout=60, redis_url=REDIS_URL)
    assert job["state"] == "succeeded", (job.get("error"), job.get("reason"), job)
    return job


def test_worker_metrics_after_a_job(worker: tuple[Path, int, str],
                                    finished_job: dict[str, object]) -> None:
    _, port, _ = worker
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    assert 'compactd_jobs_total{state="succeeded",tenant="obs"} 1.0' in text
    assert 'compactd_fallback_level_total{level="full"} 1.0' in text
    assert "compactd_tokens_before_count 1.0" in text
    assert "compactd_compaction_ratio_count 1.0" in text
    assert 'compactd_stage_seconds_count{stage="plan"}' in text
    assert 'compactd_llm_calls_total{model="extractive",outcome="ok"}' in text


def test_logs_are_json_with_ids_and_no_text_or_keys(worker: tuple[Path, int, str],
                                                    finished_job: dict[str, object]) -> None:
    log_path, _, _ = worker
    time.sleep(0.5)
    raw = log_path.read_text()
    assert PLANTED not in raw and "blue teapot" not in raw
    assert SECRET_KEY not in raw
    records = [orjson.loads(line) for line in raw.splitlines() if line.startswith("{")]
    ours = [r for r in records if r.get("job_id") == finished_job["jobId"]]
    assert ours, "no log line carries the job id"
    assert all(r["tenant"] == "obs" and r["session"] == "s1" for r in ours)
    assert {r["stage"] for r in ours} >= {"merge_and_audit"}
    assert any(r["msg"] == "job ended" and r.get("state") == "succeeded" for r in ours)
