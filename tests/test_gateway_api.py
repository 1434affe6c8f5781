"""The HTTP gateway against a running uvicorn server, real Redis (DB 12) and a real store.

No workers here: these tests cover the API surface (auth, isolation, ids, limits, input
errors, idempotency, ops endpoints). Job execution is in test_gateway_jobs.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import orjson
import pytest

from tests.support.cluster import ROOT, redis_available

if not redis_available():  # pragma: no cover - environment without Redis
    pytest.skip("Redis is not running on 127.0.0.1:6379", allow_module_level=True)

import itertools

from tests.support.builders import generate_session
from tests.support.cluster import (
    GatewayServer,
    flush_once,
    new_tenant,
    redis_client,
    shared_dir,
    tenant_store,
)

UNAUTHORIZED = {"error": {"code": "unauthorized", "message": "missing or invalid API key"}}
SMALL = generate_session(12, seed=1, result_chars=200)


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayServer]:
    shared = shared_dir(tmp_path_factory.getbasetemp())
    flush_once(shared)
    server = GatewayServer(shared).start()
    yield server
    server.stop()


def http(gateway: GatewayServer, key: str | None = None) -> httpx.Client:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.Client(base_url=gateway.url, headers=headers, timeout=30)


def session_id() -> str:
    return f"s-{uuid.uuid4().hex[:8]}"


def upload(c: httpx.Client, session: str, data: bytes = SMALL) -> httpx.Response:
    return c.put(f"/v1/sessions/{session}/transcript", content=data,
                 headers={"Content-Type": "application/x-ndjson"})


# --- authentication ------------------------------------------------------------------------


def test_auth_missing_bad_disabled_key_are_the_same_401(gateway: GatewayServer) -> None:
    creds = new_tenant()
    with http(gateway, creds.api_key) as c:
        assert upload(c, "s1").status_code == 201
    tampered = creds.api_key[:-4] + ("AAAA" if not creds.api_key.endswith("AAAA") else "BBBB")
    unknown_id = "cpd_0123456789abcdef_" + "x" * 43
    bodies = []
    for headers in ({}, {"Authorization": "Bearer nope"}, {"Authorization": f"Bearer {tampered}"},
                    {"X-API-Key": unknown_id}, {"Authorization": f"Basic {creds.api_key}"},
                    {"Authorization": "Bearer " + "k" * 5000}):
        r = httpx.get(f"{gateway.url}/v1/sessions/s1/transcript", headers=headers)
        assert r.status_code == 401, headers
        assert r.headers["www-authenticate"] == "Bearer"
        bodies.append(r.json())
    tenant_store().set_disabled(creds.tenant, True)
    r = httpx.get(f"{gateway.url}/v1/sessions/s1/transcript",
                  headers={"Authorization": f"Bearer {creds.api_key}"})
    assert r.status_code == 401
    bodies.append(r.json())
    assert all(b == UNAUTHORIZED for b in bodies)  # nothing says *why*
    tenant_store().set_disabled(creds.tenant, False)
    r = httpx.get(f"{gateway.url}/v1/sessions/s1/transcript",
                  headers={"X-API-Key": creds.api_key})
    assert r.status_code == 200


def test_rotated_key_replaces_the_old_one_and_only_a_hash_is_stored(
        gateway: GatewayServer) -> None:
    creds = new_tenant()
    rotated = tenant_store().rotate_key(creds.tenant)
    assert rotated.webhook_secret == creds.webhook_secret
    with http(gateway, creds.api_key) as old, http(gateway, rotated.api_key) as new:
        assert old.get("/v1/sessions/x/checkpoints").status_code == 401
        assert new.get("/v1/sessions/x/checkpoints").status_code == 404
    dump = b"".join(v for k in redis_client().keys(b"compactd:*")
                    if redis_client().type(k) == b"hash"
                    for v in redis_client().hgetall(k).values())
    assert rotated.api_key.encode() not in dump
    secret = rotated.api_key.split("_", 2)[2]  # the secret itself may contain "_"
    assert len(secret) >= 32 and secret.encode() not in dump


# --- isolation -----------------------------------------------------------------------------


def test_cross_tenant_isolation_on_every_endpoint(gateway: GatewayServer) -> None:
    a, b = new_tenant(), new_tenant()
    name = "shared-name"
    with http(gateway, a.api_key) as ca, http(gateway, b.api_key) as cb:
        assert upload(ca, name).status_code == 201
        job = ca.post(f"/v1/sessions/{name}/compactions", json={"trigger": "manual"})
        assert job.status_code == 202, job.text
        job_id = job.json()["jobId"]
        a_bytes = ca.get(f"/v1/sessions/{name}/transcript").content
        missing_session = cb.get("/v1/sessions/never-created/transcript").json()
        missing_job = cb.get(f"/v1/jobs/{uuid.uuid4().hex}").json()
        assert missing_session == {"error": {"code": "not_found",
                                             "message": "session not found"}}
        # B sees A's session exactly like a session that does not exist.
        for method, path, kwargs in (
                ("GET", f"/v1/sessions/{name}/transcript", {}),
                ("GET", f"/v1/sessions/{name}/context", {}),
                ("GET", f"/v1/sessions/{name}/checkpoints", {}),
                ("GET", f"/v1/sessions/{name}/jobs", {}),
                ("POST", f"/v1/sessions/{name}/entries",
                 {"json": {"entries": [{"type": "message", "message": {
                     "role": "user", "content": "x", "timestamp": 1}}]}}),
                ("POST", f"/v1/sessions/{name}/compactions", {"json": {}})):
            r = cb.request(method, path, **kwargs)
            assert (r.status_code, r.json()) == (404, missing_session), (method, path)
        # ...and A's job exactly like a job that does not exist (GET and DELETE).
        for method in ("GET", "DELETE"):
            r = cb.request(method, f"/v1/jobs/{job_id}")
            assert (r.status_code, r.json()) == (404, missing_job), method
        assert ca.get(f"/v1/jobs/{job_id}").json()["cancelRequested"] is False
        # B writing "the same" session id creates B's own session; A's is untouched.
        assert upload(cb, name, generate_session(6, seed=9)).status_code == 201
        assert ca.get(f"/v1/sessions/{name}/transcript").content == a_bytes
        assert cb.get(f"/v1/sessions/{name}/transcript").content != a_bytes
        assert cb.get(f"/v1/sessions/{name}/jobs").json() == {"jobs": []}


# --- ids -----------------------------------------------------------------------------------


@pytest.mark.parametrize("raw", ["..", "%2E%2E", "a..b", "a%2Fb", "%2e%2e%2Fx", "a%00b",
                                 "x" * 129, "a%20b", "%C3%A9"])
def test_bad_session_ids_never_touch_storage(gateway: GatewayServer, raw: str) -> None:
    creds = new_tenant()
    store_root = Path(gateway.app.state.services.store._root)  # type: ignore[attr-defined]
    around = sorted(store_root.parent.iterdir())  # nothing may appear beside the store
    with http(gateway, creds.api_key) as c:
        for method, suffix, kwargs in (("PUT", "transcript", {"content": SMALL}),
                                       ("GET", "transcript", {}), ("GET", "context", {}),
                                       ("POST", "entries", {"json": {"entries": [{}]}})):
            url = f"{gateway.url}/v1/sessions/{raw}/{suffix}"
            r = c.request(method, httpx.URL(url), **kwargs)  # raw path, no normalisation
            assert r.status_code in (404, 422), (raw, r.status_code, r.text)
            body = r.json()["error"]
            assert body["code"] in ("invalid_id", "invalid_request", "not_found")
            if r.status_code == 422:
                assert "session" in body["message"]
    assert not (store_root / "tenants" / creds.tenant).exists()
    assert sorted(store_root.parent.iterdir()) == around
    assert sorted(p.name for p in store_root.iterdir()) == ["tenants"]


def test_dot_dot_is_rejected_with_a_clear_message(gateway: GatewayServer) -> None:
    creds = new_tenant()
    with http(gateway, creds.api_key) as c:
        r = c.get(httpx.URL(f"{gateway.url}/v1/sessions/%2E%2E/transcript"))
    assert r.status_code == 422
    assert r.json()["error"]["code"] == "invalid_id"
    assert "'..'" in r.json()["error"]["message"]


# --- input errors and sizes ----------------------------------------------------------------


def test_malformed_jsonl_is_422_naming_the_line(gateway: GatewayServer) -> None:
    creds = new_tenant()
    lines = SMALL.splitlines()
    broken = b"\n".join([*lines[:3], b"{not json", *lines[3:]]) + b"\n"
    with http(gateway, creds.api_key) as c:
        r = upload(c, "bad", broken)
        assert r.status_code == 422
        err = r.json()["error"]
        assert (err["code"], err["line"], err["reason"]) == ("invalid_transcript", 4, "not_json")
        r = upload(c, "bad", b"\xff\xfe\n")
        assert r.status_code == 422 and r.json()["error"]["reason"] == "invalid_utf8"
        assert c.get("/v1/sessions/bad/transcript").status_code == 404  # nothing written


def test_bad_entry_is_422_naming_the_index(gateway: GatewayServer) -> None:
    creds = new_tenant()
    with http(gateway, creds.api_key) as c:
        assert upload(c, "s").status_code == 201
        before = c.get("/v1/sessions/s/transcript").content
        good = {"type": "message", "message": {"role": "user", "content": "ok",
                                               "timestamp": 1}}
        r = c.post("/v1/sessions/s/entries", json={"entries": [good, good, {"no": "type"}]})
        assert r.status_code == 422
        err = r.json()["error"]
        assert (err["code"], err["index"], err["reason"]) == ("invalid_entry", 2, "invalid_entry")
        r = c.post("/v1/sessions/s/entries",
                   json={"entries": [good, {**good, "parentId": "nope"}]})
        assert (r.status_code, r.json()["error"]["index"]) == (422, 1)
        assert c.get("/v1/sessions/s/transcript").content == before  # all or nothing
        assert c.post("/v1/sessions/s/entries", json={"entries": []}).status_code == 422
        assert c.post("/v1/sessions/s/entries", content=b"{").status_code == 422


def test_body_size_limits_are_413(gateway: GatewayServer) -> None:
    creds = new_tenant()
    limits = gateway.app.state.services.gateway
    with http(gateway, creds.api_key) as c:
        big = b"x" * (limits.max_transcript_bytes + 1)
        r = upload(c, "big", big)
        assert r.status_code == 413 and r.json()["error"]["code"] == "payload_too_large"

        def chunks() -> Iterator[bytes]:  # no Content-Length: the stream itself is cut off
            for _ in range(limits.max_transcript_bytes // 65536 + 2):
                yield b"y" * 65536

        r = c.put("/v1/sessions/big/transcript", content=chunks())
        assert r.status_code == 413
        assert upload(c, "big").status_code == 201
        entry = {"type": "message", "message": {"role": "user", "content": "z" * 300_000,
                                                "timestamp": 1}}
        r = c.post("/v1/sessions/big/entries", json={"entries": [entry]})
        assert r.status_code == 413
        r = c.post("/v1/sessions/big/compactions",
                   json={"trigger": "manual", "instructions": "i" * 20_000})
        assert r.status_code == 413
        assert c.get("/v1/sessions/big/transcript").content == SMALL


# --- transcripts ---------------------------------------------------------------------------


def test_upload_replace_append_with_etags(gateway: GatewayServer) -> None:
    creds = new_tenant()
    with http(gateway, creds.api_key) as c:
        created = upload(c, "s")
        assert created.status_code == 201 and created.json()["created"] is True
        r = c.get("/v1/sessions/s/transcript")
        assert r.content == SMALL and r.headers["etag"] == created.headers["etag"]
        assert r.headers["content-type"].startswith("application/x-ndjson")
        etag = r.headers["etag"]
        assert c.get("/v1/sessions/s/transcript",
                     headers={"If-None-Match": etag}).status_code == 304
        entry = {"type": "message", "message": {"role": "user", "content": "next",
                                                "timestamp": 2}}
        appended = c.post("/v1/sessions/s/entries", json={"entries": [entry]},
                          headers={"If-Match": etag})
        assert appended.status_code == 200, appended.text
        new_etag = appended.json()["etag"]
        assert new_etag == c.get("/v1/sessions/s/transcript").headers["etag"] != etag
        stale = c.post("/v1/sessions/s/entries", json={"entries": [entry]},
                       headers={"If-Match": etag})
        assert stale.status_code == 412
        other = generate_session(8, seed=4)
        assert c.put("/v1/sessions/s/transcript", content=other,
                     headers={"If-Match": etag}).status_code == 412
        assert c.put("/v1/sessions/s/transcript", content=other,
                     headers={"If-None-Match": "*"}).status_code == 412
        replaced = c.put("/v1/sessions/s/transcript", content=other,
                         headers={"If-Match": new_etag})
        assert replaced.status_code == 200 and replaced.json()["created"] is False
        assert c.get("/v1/sessions/s/transcript").content == other
        reasons = [cp["reason"] for cp in c.get("/v1/sessions/s/checkpoints").json()[
            "checkpoints"]]
        assert reasons == ["before replace via API"]  # the replaced version is recoverable


def test_context_formats(gateway: GatewayServer) -> None:
    creds = new_tenant()
    with http(gateway, creds.api_key) as c:
        assert upload(c, "s").status_code == 201
        pi = c.get("/v1/sessions/s/context").json()
        assert pi["format"] == "pi" and pi["compactionId"] is None
        assert {m["role"] for m in pi["messages"]} <= {"user", "assistant", "toolResult"}
        oa = c.get("/v1/sessions/s/context", params={"format": "openai"}).json()["messages"]
        assert {m["role"] for m in oa} <= {"user", "assistant", "tool"}
        assert any(m.get("tool_calls") for m in oa)
        an = c.get("/v1/sessions/s/context", params={"format": "anthropic"}).json()["messages"]
        assert all(x["role"] != y["role"] for x, y in itertools.pairwise(an))
        assert c.get("/v1/sessions/s/context", params={"format": "xml"}).status_code == 422


# --- jobs API (no workers needed) ----------------------------------------------------------


def test_idempotency_key(gateway: GatewayServer) -> None:
    creds = new_tenant()
    with http(gateway, creds.api_key) as c:
        assert upload(c, "s").status_code == 201
        body = {"trigger": "manual", "keepRecentTokens": 100}
        first = c.post("/v1/sessions/s/compactions", json=body, headers={"Idempotency-Key": "k1"})
        again = c.post("/v1/sessions/s/compactions", json=body, headers={"Idempotency-Key": "k1"})
        assert first.status_code == again.status_code == 202
        assert first.json()["jobId"] == again.json()["jobId"]
        assert again.headers["idempotent-replayed"] == "true"
        assert first.headers["location"] == f"/v1/jobs/{first.json()['jobId']}"
        r = c.post("/v1/sessions/s/compactions", json={**body, "keepRecentTokens": 5},
                   headers={"Idempotency-Key": "k1"})
        assert r.status_code == 409 and r.json()["error"]["code"] == "idempotency_conflict"
        # A failed submit releases its key: a retry with the same key can succeed later.
        r = c.post("/v1/sessions/nope/compactions", json=body, headers={"Idempotency-Key": "k2"})
        assert r.status_code == 404
        assert upload(c, "nope").status_code == 201
        r = c.post("/v1/sessions/nope/compactions", json=body, headers={"Idempotency-Key": "k2"})
        assert r.status_code == 202


def test_compaction_request_validation(gateway: GatewayServer) -> None:
    creds = new_tenant()
    with http(gateway, creds.api_key) as c:
        assert upload(c, "s").status_code == 201
        for body in ({"trigger": "sometimes"}, {"callbackUrl": "ftp://x/y"},
                     {"callbackUrl": "file:///etc/passwd"}, {"callbackUrl": "http://u:p@h/"},
                     {"keepRecentTokens": -1}, {"unknown": 1}, {"instructions": "x" * 4001}):
            r = c.post("/v1/sessions/s/compactions", json=body)
            assert r.status_code == 422, body
            assert r.json()["error"]["code"] == "invalid_request"


def test_overflow_goes_to_the_interactive_queue(gateway: GatewayServer) -> None:
    creds = new_tenant()
    with http(gateway, creds.api_key) as c:
        assert upload(c, "a").status_code == 201
        assert upload(c, "b").status_code == 201
        over = c.post("/v1/sessions/a/compactions", json={"trigger": "overflow"}).json()
        manual = c.post("/v1/sessions/b/compactions", json={"trigger": "manual"}).json()
    assert over["queue"] == "compactd.interactive"
    assert manual["queue"] == "compactd.background"


def test_concurrent_job_cap_is_429(gateway: GatewayServer) -> None:
    creds = new_tenant({"maxConcurrentJobs": 2})
    with http(gateway, creds.api_key) as c:
        for name in ("a", "b", "c"):
            assert upload(c, name).status_code == 201
        # Jobs stay active: this module runs no workers (in a parallel run another module's
        # worker may finish one, so the cap is checked on the third submit right away).
        from tasks.jobs import JobStore

        ids = [c.post(f"/v1/sessions/{n}/compactions", json={}).json()["jobId"]
               for n in ("a", "b")]
        store = JobStore(redis_client())
        for job_id in ids:  # pin them active, whatever a worker elsewhere does
            redis_client().hset(f"compactd:job:{job_id}", "state", orjson.dumps("summarizing"))
        r = c.post("/v1/sessions/c/compactions", json={})
        assert r.status_code == 429
        assert r.json()["error"]["code"] == "too_many_jobs" and int(r.headers["retry-after"]) > 0
        store.finalize(ids[0], "cancelled")
        assert c.post("/v1/sessions/c/compactions", json={}).status_code == 202


def test_request_rate_limit_is_429_with_retry_after(gateway: GatewayServer) -> None:
    creds = new_tenant({"requestsPerSecond": 0.5, "burst": 3})
    other = new_tenant()
    with http(gateway, creds.api_key) as c, http(gateway, other.api_key) as o:
        codes = [c.get("/v1/sessions/x/checkpoints").status_code for _ in range(4)]
        assert codes == [404, 404, 404, 429]
        r = c.get("/v1/sessions/x/checkpoints")
        assert r.status_code == 429 and r.json()["error"]["code"] == "rate_limited"
        assert 1 <= int(r.headers["retry-after"]) <= 2
        assert o.get("/v1/sessions/x/checkpoints").status_code == 404  # per tenant


def test_inflight_request_cap(gateway: GatewayServer) -> None:
    from gateway.limits import Limits

    creds = new_tenant({"maxInflightRequests": 1})
    slot = Limits(redis_client()).enter(creds.tenant, 1)  # one request "in flight" elsewhere
    assert slot is not None
    with http(gateway, creds.api_key) as c:
        r = c.get("/v1/sessions/x/checkpoints")
        assert r.status_code == 429 and r.json()["error"]["code"] == "too_many_inflight"
        Limits(redis_client()).leave(creds.tenant, slot)
        assert c.get("/v1/sessions/x/checkpoints").status_code == 404


def test_bad_job_ids_are_404(gateway: GatewayServer) -> None:
    creds = new_tenant()
    with http(gateway, creds.api_key) as c:
        for raw in ("..", "%2E%2E", "x" * 64, "ABC", uuid.uuid4().hex):
            r = c.get(httpx.URL(f"{gateway.url}/v1/jobs/{raw}"))
            assert r.status_code in (404, 422), raw
            assert r.json()["error"]["code"] in ("not_found", "invalid_request")


# --- ops -----------------------------------------------------------------------------------


def test_health_ready_metrics(gateway: GatewayServer) -> None:
    assert httpx.get(f"{gateway.url}/healthz").json() == {"status": "ok", "checks": {}}
    ready = httpx.get(f"{gateway.url}/readyz")
    assert ready.status_code == 200 and ready.json()["checks"] == {"redis": "ok", "store": "ok"}
    creds = new_tenant()
    with http(gateway, creds.api_key) as c:
        c.get("/v1/sessions/abc123/checkpoints")
    r = httpx.get(f"{gateway.url}/metrics")
    assert r.headers["content-type"].startswith("text/plain")
    text = r.text
    assert 'route="/v1/sessions/{session}/checkpoints"' in text
    assert "abc123" not in text and creds.tenant not in text


def test_readyz_is_503_when_redis_is_down(tmp_path: Path) -> None:
    import asyncio

    from compactd.settings import CompactdSettings
    from gateway.app import create_app
    from tests.support.cluster import gateway_settings

    app = create_app(CompactdSettings(redis_url="redis://127.0.0.1:1/0",
                                      store_url=f"file://{tmp_path}"), gateway_settings())

    async def run() -> tuple[httpx.Response, httpx.Response]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gw") as client:
            ready = await client.get("/readyz")
            api = await client.get("/v1/sessions/s/transcript",
                                   headers={"X-API-Key": "cpd_0123456789abcdef_" + "k" * 43})
            return ready, api

    ready, api = asyncio.run(run())
    assert ready.status_code == 503 and ready.json()["checks"]["redis"] != "ok"
    assert api.status_code == 503 and api.json()["error"]["code"] == "redis_unavailable"


def test_committed_openapi_matches_the_app() -> None:
    result = subprocess.run([sys.executable, "scripts/export_openapi.py", "--check"], cwd=ROOT,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    schema = json.loads((ROOT / "docs/openapi.json").read_text())
    assert "/v1/sessions/{session}/compactions" in schema["paths"]
