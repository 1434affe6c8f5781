"""A real compactd deployment for tests: Redis DB 12, a store directory, worker subprocesses
and the HTTP gateway (uvicorn on 127.0.0.1 in a thread of the test process).

Under pytest-xdist several test processes share DB 12, so state is shared on purpose rather
than isolated: one store directory per test run (under the run's common basetemp), DB 12
flushed once per run (first process to get the file lock), every worker consuming the same
queues with the same store — so whichever worker takes a job can run it. Tests isolate
themselves by using fresh tenant ids.
"""

from __future__ import annotations

import fcntl
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import redis
import uvicorn

from compactd.client import CompactdClient
from compactd.settings import CompactdSettings
from gateway.app import create_app
from gateway.models import GatewaySettings, TenantPolicy
from gateway.tenants import Credentials, TenantStore

REDIS_URL = "redis://127.0.0.1:6379/12"
ROOT = Path(__file__).resolve().parents[2]
PEPPER = "test-pepper-not-secret"
WORKER_QUEUES = "compactd.interactive,compactd.background,compactd.webhooks"
RUN_KEY = "compactd:test:run-id"


def redis_client() -> redis.Redis:
    return redis.Redis.from_url(REDIS_URL)


def redis_available() -> bool:
    try:
        return bool(redis_client().ping())
    except redis.RedisError:
        return False


def shared_dir(basetemp: Path) -> Path:
    """A directory common to all xdist processes of this run (their basetemps' parent)."""
    base = basetemp.parent if os.environ.get("PYTEST_XDIST_WORKER") else basetemp
    path = base / "compactd-gateway"
    path.mkdir(parents=True, exist_ok=True)
    return path


def flush_once(shared: Path) -> None:
    """FLUSHDB on DB 12 once per test run, whichever xdist process comes first."""
    run_id = os.environ.get("PYTEST_XDIST_TESTRUNUID") or str(shared)
    with (shared / ".flush.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        r = redis_client()
        if r.get(RUN_KEY) != run_id.encode():
            r.flushdb()
            r.set(RUN_KEY, run_id)


def store_dir(shared: Path) -> Path:
    path = shared / "store"
    path.mkdir(exist_ok=True)
    return path


def settings_for(shared: Path) -> CompactdSettings:
    return CompactdSettings(redis_url=REDIS_URL, store_url=f"file://{store_dir(shared)}")


GATEWAY_LIMITS = {"max_transcript_bytes": 1024 * 1024, "max_entries_bytes": 256 * 1024,
                  "max_json_bytes": 16 * 1024}


def gateway_settings() -> GatewaySettings:
    return GatewaySettings(pepper=PEPPER, **GATEWAY_LIMITS)  # type: ignore[arg-type]


class GatewayServer:
    """uvicorn serving `create_app` on a free 127.0.0.1 port, in a daemon thread."""

    def __init__(self, shared: Path) -> None:
        self.app = create_app(settings_for(shared), gateway_settings())
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(self.app, log_config=None, access_log=False, lifespan="off",
                                timeout_graceful_shutdown=2)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]},
                                       daemon=True)

    def start(self) -> GatewayServer:
        self.thread.start()
        deadline = time.monotonic() + 15
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("gateway did not start")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
        self.sock.close()

    def client(self, api_key: str | None) -> CompactdClient:
        return CompactdClient(self.url, api_key)


class Workers:
    """`celery worker --pool threads` subprocesses on DB 12 and the shared store."""

    def __init__(self, shared: Path, log_dir: Path) -> None:
        self.shared = shared
        self.log_dir = log_dir
        self.procs: list[subprocess.Popen[bytes]] = []
        self.env = {
            **os.environ,
            "COMPACTD_REDIS_URL": REDIS_URL,
            "COMPACTD_STORE_URL": f"file://{store_dir(shared)}",
            "COMPACTD_VISIBILITY_TIMEOUT": "30",
            "COMPACTD_WEBHOOK_BACKOFF": "0.3",
            "COMPACTD_WEBHOOK_MAX_ATTEMPTS": "5",
            "COMPACTD_CHAIN": "[]",
            "PYTHONPATH": str(ROOT),
        }

    def start(self, count: int = 1) -> Workers:
        for _ in range(count):
            name = f"gw-{uuid.uuid4().hex[:8]}"
            log = (self.log_dir / f"{name}.log").open("wb")
            self.procs.append(subprocess.Popen(
                [sys.executable, "-m", "celery", "-A", "tasks.app", "worker", "--pool",
                 "threads", "-c", "8", "-Q", WORKER_QUEUES, "-I", "tasks.webhooks",
                 "--without-gossip", "--without-mingle", "-n", f"{name}@%h",
                 "--loglevel", "INFO"],
                cwd=ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True))
        self.wait_ready()
        return self

    def wait_ready(self, timeout: float = 30.0) -> None:
        from tasks.producer import producer_app

        app = producer_app(REDIS_URL)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if len(app.control.ping(timeout=0.5) or []) >= 1:
                return
            for proc in self.procs:
                assert proc.poll() is None, "worker exited during startup"
        raise AssertionError("no worker answered a ping")

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=5)
        self.procs.clear()


def new_tenant(policy: dict[str, Any] | None = None, prefix: str = "t") -> Credentials:
    """A fresh tenant (unique id) in DB 12 with the test pepper."""
    store = TenantStore(redis_client(), PEPPER.encode())
    return store.create(f"{prefix}-{uuid.uuid4().hex[:10]}",
                        policy=TenantPolicy.model_validate(policy or {}))


def tenant_store() -> TenantStore:
    return TenantStore(redis_client(), PEPPER.encode())
