"""Authentication, per-request tenant scope and the shared service handles.

Every `/v1` route depends on `tenant_scope`: it resolves the API key to a tenant (401 with one
fixed body for missing, malformed, unknown, wrong and disabled keys alike, so the response
never tells a caller which part was wrong), applies the tenant's request rate (token bucket,
429 + Retry-After) and holds an in-flight slot until the response is done. Storage is then
only ever addressed through `session_ref`, which validates the session id *before* any key
is built and binds it to the authenticated tenant's key space — a session id from the path can
never reach another tenant's objects.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Annotated, Any

import redis
from fastapi import Depends, Path, Request
from fastapi.security import APIKeyHeader, HTTPAuthorizationCredentials, HTTPBearer

from compactd.settings import CompactdSettings
from gateway.limits import Limits
from gateway.models import GatewaySettings, TenantPolicy
from gateway.tenants import TenantStore
from storage.checkpoints import CheckpointLimits
from storage.errors import InvalidId
from storage.keys import validate_id
from storage.objectstore import ObjectStore
from storage.sessions import SessionStore


class ApiError(Exception):
    """An error answered as `{"error": {"code", "message", ...extra}}` with `status`."""

    def __init__(self, status: int, code: str, message: str, *,
                 headers: dict[str, str] | None = None, **extra: Any) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.headers = headers or {}
        self.extra = extra

    def body(self) -> dict[str, Any]:
        return {"error": {"code": self.code, "message": self.message, **self.extra}}


UNAUTHORIZED = ("unauthorized", "missing or invalid API key")


def not_found(what: str) -> ApiError:
    """The one 404 for sessions and jobs: the same for "missing" and "another tenant's"."""
    return ApiError(404, "not_found", f"{what} not found")


@dataclass(slots=True)
class Services:
    """Process-wide handles (one Redis pool, one object store) shared by every request."""

    settings: CompactdSettings
    gateway: GatewaySettings
    redis: redis.Redis
    store: ObjectStore
    tenants: TenantStore = field(init=False)
    limits: Limits = field(init=False)

    def __post_init__(self) -> None:
        pepper = self.gateway.pepper.get_secret_value().encode() if self.gateway.pepper else None
        self.tenants = TenantStore(self.redis, pepper)
        self.limits = Limits(self.redis)

    @property
    def checkpoint_limits(self) -> CheckpointLimits:
        return CheckpointLimits(self.settings.checkpoints_max, self.settings.checkpoints_max_bytes)


def services(request: Request) -> Services:
    svc: Services = request.app.state.services
    return svc


@dataclass(frozen=True, slots=True)
class TenantContext:
    """The authenticated caller: tenant id and its effective policy."""

    tenant: str
    policy: TenantPolicy


_bearer = HTTPBearer(auto_error=False, description="Authorization: Bearer <API key>")
_api_key = APIKeyHeader(name="X-API-Key", auto_error=False, description="The tenant's API key")


def tenant_scope(
    request: Request,
    svc: Annotated[Services, Depends(services)],
    bearer: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
    api_key: Annotated[str | None, Depends(_api_key)],
) -> Iterator[TenantContext]:
    """Authenticate, rate-limit and count the request as in flight (until it completes)."""
    key = bearer.credentials if bearer is not None else api_key
    if not key or len(key) > 256:
        raise ApiError(401, *UNAUTHORIZED, headers={"WWW-Authenticate": "Bearer"})
    tenant = svc.tenants.authenticate(key)
    if tenant is None:
        raise ApiError(401, *UNAUTHORIZED, headers={"WWW-Authenticate": "Bearer"})
    request.scope.setdefault("compactd", {})["tenant"] = tenant.id
    policy = svc.gateway.effective_policy(tenant.policy)
    assert policy.requestsPerSecond is not None and policy.burst is not None
    assert policy.maxInflightRequests is not None
    decision = svc.limits.take_token(tenant.id, policy.requestsPerSecond, policy.burst)
    if not decision.allowed:
        raise ApiError(429, "rate_limited", "request rate limit exceeded",
                       headers={"Retry-After": str(decision.retry_after_s)},
                       retryAfter=decision.retry_after_s)
    slot = svc.limits.enter(tenant.id, policy.maxInflightRequests)
    if slot is None:
        raise ApiError(429, "too_many_inflight", "too many concurrent requests for this tenant",
                       headers={"Retry-After": "1"}, retryAfter=1)
    try:
        yield TenantContext(tenant.id, policy)
    finally:
        svc.limits.leave(tenant.id, slot)


Tenant = Annotated[TenantContext, Depends(tenant_scope)]

#: The id rule of storage.keys, repeated in the schema so clients (and schemathesis) see it.
ID_REGEX = r"^[A-Za-z0-9._-]{1,128}$"


def checked_id(kind: str, value: str) -> str:
    """validate_id as an API error (422 naming the rule), never touching storage."""
    try:
        return validate_id(kind, value)
    except InvalidId as exc:
        raise ApiError(422, "invalid_id", str(exc), kind=kind) from None


@dataclass(frozen=True, slots=True)
class SessionRef:
    """A session of the authenticated tenant."""

    tenant: str
    session: str
    policy: TenantPolicy
    store: SessionStore

    @property
    def target(self) -> str:
        return f"store://{self.tenant}/{self.session}"


def session_ref(
    request: Request,
    ctx: Tenant,
    svc: Annotated[Services, Depends(services)],
    session: Annotated[str, Path(description="Session id ([A-Za-z0-9._-], no '..')",
                                 max_length=128)],
) -> SessionRef:
    """Validate the session id (422 before any storage call) and bind it to the tenant."""
    checked_id("session", session)
    request.scope.setdefault("compactd", {})["session"] = session
    return SessionRef(ctx.tenant, session, ctx.policy,
                      SessionStore(svc.store, ctx.tenant, session,
                                   checkpoint_limits=svc.checkpoint_limits))


Session = Annotated[SessionRef, Depends(session_ref)]


def public_etag(segment_key: str, store_etag: str) -> str:
    """The ETag clients see: changes whenever the live segment or its content changes (the
    store's own etag alone could repeat across segments after a rotation or replace)."""
    digest = hashlib.sha256(f"{segment_key}\n{store_etag}".encode()).hexdigest()[:32]
    return f'"{digest}"'


def etag_matches(header: str, etag: str) -> bool:
    """If-Match / If-None-Match comparison (a list, weak prefixes and `*` tolerated)."""
    for candidate in header.split(","):
        value = candidate.strip().removeprefix("W/")
        if value == "*" or value == etag or f'"{value}"' == etag:
            return True
    return False
