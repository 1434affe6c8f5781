"""The FastAPI app factory: routes, one error shape, request metrics/logs and body caps.

`create_app()` connects to nothing: Redis and the store are opened lazily by their clients, so
the app can be built for the OpenAPI export or tests without services running.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import redis
from fastapi import FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from compactd.logs import log_context, safe_error
from compactd.metrics import HTTP_REQUESTS
from compactd.settings import CompactdSettings, load_settings
from gateway import routes_jobs, routes_ops, routes_sessions
from gateway.auth import ApiError, Services
from gateway.models import GatewaySettings
from pipeline.errors import TranscriptError
from storage.errors import InvalidId, StoreError
from storage.objectstore import ObjectStore, open_store
from storage.sessions import StoreBusy

log = logging.getLogger("compactd.gateway")
VERSION = "1.0.0"
#: Metric label values for the method: anything else is "OTHER" (clients choose the method
#: string, and an unbounded label would let them blow up the metrics' cardinality).
METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})


def open_configured_store(store_url: str) -> ObjectStore:
    """Like the workers: a relative `file://./dir` URL is relative to the working directory."""
    from storage.localfs import LocalFileStore

    parts = urlsplit(store_url)
    if parts.scheme == "file" and parts.netloc not in ("", "localhost"):
        return LocalFileStore(Path(parts.netloc + parts.path).resolve())
    return open_store(store_url)


class BodyLimitAndMetrics:
    """Pure ASGI middleware (it must see the matched route after the app ran, and must be able
    to stop a body stream): caps request bodies per route family (413), counts requests by
    route *template* and logs one line per request with the tenant and session ids."""

    def __init__(self, app: ASGIApp, gateway: GatewaySettings) -> None:
        self.app = app
        self.gateway = gateway

    def limit_for(self, method: str, path: str) -> int:
        if method == "PUT" and path.endswith("/transcript"):
            return self.gateway.max_transcript_bytes
        if path.endswith("/entries"):
            return self.gateway.max_entries_bytes
        return self.gateway.max_json_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        method = scope["method"]
        limit = self.limit_for(method, scope["path"])
        status = {"code": 500}

        async def send_wrapper(message: Message) -> None:
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
            await send(message)

        declared = dict(scope.get("headers") or []).get(b"content-length")
        try:
            if declared is not None and declared.isdigit() and int(declared) > limit:
                error = ApiError(413, "payload_too_large", f"body exceeds {limit} bytes",
                                 limit=limit)
                await JSONResponse(error.body(), status_code=413)(scope, receive, send_wrapper)
                return
            seen = {"bytes": 0}

            async def receive_wrapper() -> Message:
                message = await receive()
                if message["type"] == "http.request":
                    seen["bytes"] += len(message.get("body", b""))
                    if seen["bytes"] > limit:
                        raise HTTPException(413, f"body exceeds {limit} bytes")
                return message

            await self.app(scope, receive_wrapper, send_wrapper)
        finally:
            route = scope.get("route")
            template = getattr(route, "path", None) or "unmatched"
            label = method if method in METHODS else "OTHER"
            HTTP_REQUESTS.labels(label, template, str(status["code"])).inc()
            info = scope.get("compactd") or {}
            with log_context(tenant=info.get("tenant"), session=info.get("session")):
                log.info("request", extra={
                    "ctx_method": label, "ctx_route": template, "ctx_status": status["code"],
                    "ctx_ms": round((time.perf_counter() - started) * 1000, 1)})


def _error(status: int, code: str, message: str, headers: dict[str, str] | None = None,
           **extra: Any) -> JSONResponse:
    return JSONResponse({"error": {"code": code, "message": message, **extra}},
                        status_code=status, headers=headers)


_HTTP_CODES = {400: "bad_request", 401: "unauthorized", 403: "forbidden", 404: "not_found",
               405: "method_not_allowed", 406: "not_acceptable", 409: "conflict",
               413: "payload_too_large", 415: "unsupported_media_type", 422: "invalid_request",
               429: "rate_limited"}


def _install_handlers(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def api_error(_: Request, exc: ApiError) -> JSONResponse:
        return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = _HTTP_CODES.get(exc.status_code, "error")
        message = str(exc.detail) if exc.status_code != 404 else "no such route"
        return _error(exc.status_code, code, message, headers=dict(exc.headers or {}))

    @app.exception_handler(RequestValidationError)
    async def validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
        errors = [{"loc": [str(p) for p in e.get("loc", ())], "msg": str(e.get("msg", "")),
                   "type": str(e.get("type", ""))} for e in exc.errors()][:20]
        first = errors[0] if errors else {"loc": [], "msg": "invalid request"}
        where = ".".join(first["loc"])
        return _error(422, "invalid_request", f"{where}: {first['msg']}", errors=errors)

    @app.exception_handler(TranscriptError)
    async def stored_transcript_error(_: Request, exc: TranscriptError) -> JSONResponse:
        # Only stored transcripts get here (uploads are checked in the route): server data.
        return _error(500, "corrupt_transcript", "the stored transcript cannot be read",
                      line=exc.line, reason=exc.code)

    @app.exception_handler(InvalidId)
    async def invalid_id(_: Request, exc: InvalidId) -> JSONResponse:
        return _error(422, "invalid_id", str(exc), kind=exc.kind)

    @app.exception_handler(StoreBusy)
    async def busy(_: Request, exc: StoreBusy) -> JSONResponse:
        return _error(503, "busy", "the session is under heavy write contention; retry",
                      headers={"Retry-After": "1"})

    @app.exception_handler(StoreError)
    async def store_error(_: Request, exc: StoreError) -> JSONResponse:
        log.error("store error: %s", safe_error(exc))
        return _error(503, "store_unavailable", "the object store failed; retry later",
                      headers={"Retry-After": "5"})

    @app.exception_handler(redis.RedisError)
    async def redis_error(_: Request, exc: redis.RedisError) -> JSONResponse:
        log.error("redis error: %s", safe_error(exc))
        return _error(503, "redis_unavailable", "the job database is unavailable; retry later",
                      headers={"Retry-After": "5"})


def create_app(settings: CompactdSettings | None = None,
               gateway: GatewaySettings | None = None) -> FastAPI:
    """Build the gateway. Settings default to the environment (COMPACTD_*,
    COMPACTD_GATEWAY_*)."""
    settings = settings or load_settings()
    gateway = gateway or GatewaySettings()
    app = FastAPI(
        title="compactd",
        version=VERSION,
        description="LLM context compaction for agent platforms: upload pi session "
                    "transcripts, submit compaction jobs, read the compacted model view.",
    )
    client = redis.Redis.from_url(settings.redis_url, max_connections=128,
                                  health_check_interval=25)
    app.state.services = Services(settings, gateway, client,
                                  open_configured_store(settings.store_url))
    app.include_router(routes_ops.router)
    app.include_router(routes_sessions.router)
    app.include_router(routes_jobs.router)
    _install_handlers(app)
    app.add_middleware(BodyLimitAndMetrics, gateway=gateway)
    return app
