"""Jobs through the gateway with real worker subprocesses: the full upload -> compact ->
context flow, signed webhooks with retries, cancellation and the CLI over HTTP."""

from __future__ import annotations

import hashlib
import hmac
import threading
import time
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import orjson
import pytest

from tests.support.cluster import redis_available

if not redis_available():  # pragma: no cover - environment without Redis
    pytest.skip("Redis is not running on 127.0.0.1:6379", allow_module_level=True)

from compactd.client import CompactdAPIError
from pipeline.context import COMPACTION_PREFIX
from tests.support.builders import generate_session
from tests.support.cluster import (
    PEPPER,
    REDIS_URL,
    GatewayServer,
    Workers,
    flush_once,
    new_tenant,
    shared_dir,
)

PLANTED = "The violet heron sleeps under platform nine at dawn."
PLAN = {"keep_recent_tokens": 2000, "context_window": 20000}


def transcript(seed: int, entries: int = 120) -> bytes:
    """A long session whose first user message carries a planted sentence."""
    out = []
    planted = False
    for line in generate_session(entries, seed=seed, result_chars=1500).splitlines():
        data = orjson.loads(line)
        msg = data.get("message")
        if not planted and isinstance(msg, dict) and msg.get("role") == "user":
            msg["content"] = f"{msg['content']} {PLANTED}"
            planted = True
        out.append(orjson.dumps(data))
    return b"\n".join(out) + b"\n"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory
            ) -> Iterator[tuple[GatewayServer, Workers]]:
    shared = shared_dir(tmp_path_factory.getbasetemp())
    flush_once(shared)
    gateway = GatewayServer(shared).start()
    workers = Workers(shared, tmp_path_factory.mktemp("worker-logs")).start(1)
    yield gateway, workers
    workers.stop()
    gateway.stop()


class Receiver:
    """A webhook receiver on 127.0.0.1 that fails the first `fail_first` deliveries."""

    def __init__(self, fail_first: int = 1) -> None:
        self.calls: list[tuple[int, dict[str, str], bytes]] = []
        self.fail_first = fail_first
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                status = 500 if len(receiver.calls) < receiver.fail_first else 200
                receiver.calls.append((status, dict(self.headers.items()), body))
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *_: Any) -> None:
                return

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def wait(self, count: int, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while len(self.calls) < count:
            assert time.monotonic() < deadline, f"only {len(self.calls)} webhook calls"
            time.sleep(0.05)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_upload_compact_context_flow(cluster: tuple[GatewayServer, Workers]) -> None:
    gateway, _ = cluster
    creds = new_tenant({"summarizer": "extractive", "keepRecentTokens": 2000,
                        "contextWindow": 20000})
    with gateway.client(creds.api_key) as c:
        written = c.put_transcript("flow", transcript(seed=5))
        assert written["created"] is True and written["entries"] == 120
        job = c.submit_compaction("flow", trigger="manual", instructions="Keep the heron.")
        assert job["state"] in ("queued", "planning", "summarizing", "merging", "auditing",
                                "committing", "succeeded")
        done = c.wait_job(job["jobId"], timeout=60, poll=0.1)
        assert done["state"] == "succeeded", done
        assert done["tokensAfter"] < done["tokensBefore"]
        ctx = c.get_context("flow")
        assert ctx["compactionId"] is not None
        first = ctx["messages"][0]
        assert first["role"] == "user"
        assert first["content"][0]["text"].startswith(COMPACTION_PREFIX)
        agent = c.get_context("flow", "agent")["messages"]
        assert agent[0]["role"] == "compactionSummary"
        assert "## Decisions" in agent[0]["summary"]
        assert c.get_context("flow", "openai")["messages"][0]["role"] == "user"
        assert [cp["compactionId"] for cp in c.list_checkpoints("flow")] == [job["jobId"]]
        assert [j["jobId"] for j in c.list_jobs("flow")] == [job["jobId"]]
        raw, etag = c.get_transcript("flow")
        assert b'"type":"compaction"' in raw and etag
        # The agent keeps appending after the compaction: the model view follows.
        c.append_entries("flow", [{"type": "message", "message": {
            "role": "user", "content": "and now?", "timestamp": 9}}], if_match=etag)
        assert c.get_context("flow")["messages"][-1]["content"] == "and now?"


def test_threshold_trigger_skips_small_sessions(cluster: tuple[GatewayServer, Workers]) -> None:
    gateway, _ = cluster
    creds = new_tenant({"summarizer": "extractive"})
    with gateway.client(creds.api_key) as c:
        c.put_transcript("small", generate_session(10, seed=2, result_chars=100))
        job = c.submit_compaction("small", trigger="threshold")
        done = c.wait_job(job["jobId"], timeout=60, poll=0.1)
        assert done["state"] == "skipped"
        assert c.get_context("small")["compactionId"] is None


def test_signed_webhook_is_retried_until_delivered(cluster: tuple[GatewayServer, Workers]
                                                   ) -> None:
    gateway, _ = cluster
    creds = new_tenant({"summarizer": "extractive", **{
        "keepRecentTokens": PLAN["keep_recent_tokens"],
        "contextWindow": PLAN["context_window"]}})
    receiver = Receiver(fail_first=1)
    try:
        with gateway.client(creds.api_key) as c:
            c.put_transcript("hook", transcript(seed=6))
            job = c.submit_compaction("hook", callback_url=receiver.url)
            final = c.wait_job(job["jobId"], timeout=60, poll=0.1)
            receiver.wait(2)
            assert [status for status, _, _ in receiver.calls[:2]] == [500, 200]
            _, headers, body = receiver.calls[1]
            header = headers["X-Compactd-Signature"]
            fields = dict(part.split("=", 1) for part in header.split(","))
            assert abs(int(fields["t"]) - time.time()) < 60
            expected = hmac.new(creds.webhook_secret.encode(),
                                f"{fields['t']}.".encode() + body, hashlib.sha256).hexdigest()
            assert hmac.compare_digest(fields["v1"], expected)
            wrong = hmac.new(b"another-secret", f"{fields['t']}.".encode() + body,
                             hashlib.sha256).hexdigest()
            assert fields["v1"] != wrong
            sent = orjson.loads(body)
            assert (sent["jobId"], sent["state"]) == (job["jobId"], final["state"])
            assert "leaseToken" not in sent and "webhooks" not in sent
            assert headers["X-Compactd-Attempt"] == "2"
            deadline = time.monotonic() + 10
            while True:
                record = c.get_job(job["jobId"])
                status = next(iter((record.get("webhooks") or {"-": {}}).values()))
                if status.get("state") == "delivered" or time.monotonic() > deadline:
                    break
                time.sleep(0.05)
            assert status["state"] == "delivered" and status["attempts"] == 2
            assert status["url"] == receiver.url and status["lastStatus"] == 200
    finally:
        receiver.close()


def test_webhook_registered_after_the_job_ended_is_still_sent(
        cluster: tuple[GatewayServer, Workers]) -> None:
    """The gateway registers callbacks after submit returns; a job that ended first must
    still get exactly one delivery (the gateway dispatches it)."""
    from tasks import webhooks
    from tasks.jobs import JobStore
    from tests.support.cluster import redis_client

    creds = new_tenant()
    job_id = uuid.uuid4().hex
    store = JobStore(redis_client())
    store.create(job_id, {"tenant": creds.tenant, "session": "s",
                          "target": f"store://{creds.tenant}/s"})
    store.finalize(job_id, "succeeded")
    webhooks.job_ended(job_id)  # nothing registered yet: nothing sent
    receiver = Receiver(fail_first=0)
    try:
        webhooks.register_callback(job_id, receiver.url, redis_url=REDIS_URL)
        assert webhooks.dispatch(job_id, redis_url=REDIS_URL) == 1
        assert webhooks.dispatch(job_id, redis_url=REDIS_URL) == 0  # claimed once
        receiver.wait(1)
        time.sleep(0.5)
        assert len(receiver.calls) == 1
        _, headers, body = receiver.calls[0]
        assert webhooks.verify(creds.webhook_secret, headers["X-Compactd-Signature"], body)
    finally:
        receiver.close()


def test_cancel_and_cross_tenant_job_access(cluster: tuple[GatewayServer, Workers]) -> None:
    gateway, _ = cluster
    a, b = new_tenant({"summarizer": "extractive"}), new_tenant()
    with gateway.client(a.api_key) as ca, gateway.client(b.api_key) as cb:
        ca.put_transcript("c", transcript(seed=7))
        job = ca.submit_compaction("c", keep_recent_tokens=2000, context_window=20000)
        with pytest.raises(CompactdAPIError) as denied:
            cb.cancel_job(job["jobId"])
        assert denied.value.status == 404 and denied.value.code == "not_found"
        cancelled = ca.cancel_job(job["jobId"])
        assert cancelled["cancelRequested"] or cancelled["state"] in ("succeeded",
                                                                      "cancelled")
        final = ca.wait_job(job["jobId"], timeout=60, poll=0.1)
        assert final["state"] in ("cancelled", "succeeded")


def test_cli_tenants_and_remote(cluster: tuple[GatewayServer, Workers],
                                monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    import compactd.cli_gateway  # noqa: F401  (registers the commands)
    from compactd.cli import app

    gateway, _ = cluster
    monkeypatch.setenv("COMPACTD_REDIS_URL", REDIS_URL)
    monkeypatch.setenv("COMPACTD_GATEWAY_PEPPER", PEPPER)
    runner = CliRunner()
    tenant = f"cli-{uuid.uuid4().hex[:8]}"
    created = runner.invoke(app, ["tenants", "create", tenant, "--policy",
                                  '{"summarizer": "extractive"}'])
    assert created.exit_code == 0, created.output
    key = orjson.loads(created.stdout)["apiKey"]
    listed = runner.invoke(app, ["tenants", "list"])
    entry = next(t for t in orjson.loads(listed.stdout) if t["id"] == tenant)
    assert entry["policy"] == {"summarizer": "extractive"} and key not in listed.stdout
    common = ["--server", gateway.url, "--api-key", key]
    with gateway.client(key) as c:
        c.put_transcript("r", transcript(seed=8))
    sub = runner.invoke(app, ["remote", "submit", "r", *common, "--keep-recent", "2000",
                              "--window", "20000", "--wait"])
    assert sub.exit_code == 0, sub.output
    job = orjson.loads(sub.stdout)
    assert job["state"] == "succeeded"
    status = runner.invoke(app, ["remote", "status", job["jobId"], *common])
    assert orjson.loads(status.stdout)["jobId"] == job["jobId"]
    ctx = runner.invoke(app, ["remote", "context", "r", *common])
    assert orjson.loads(ctx.stdout)["compactionId"] is not None
    missing = runner.invoke(app, ["remote", "status", uuid.uuid4().hex, *common])
    assert missing.exit_code == 1 and "not_found" in missing.output
    assert runner.invoke(app, ["tenants", "disable", tenant]).exit_code == 0
    denied = runner.invoke(app, ["remote", "status", job["jobId"], *common])
    assert denied.exit_code == 1 and "401" in denied.output
