"""Tenants and API keys in Redis.

Keys look like ``cpd_<keyid>_<secret>``. Redis holds ``compactd:apikey:<keyid> -> tenant`` and,
in the tenant hash, only ``HMAC-SHA256(pepper, key)``: a Redis dump does not reveal usable keys,
and the pepper (COMPACTD_GATEWAY_PEPPER, else a random one generated once into Redis) means the
hashes cannot be checked offline without that secret either. Keys have 256 bits of entropy, so
a fast keyed hash is enough (a slow KDF protects low-entropy passwords, which these are not).
Lookup is by the key id and the comparison is ``hmac.compare_digest``, so an attacker learns
nothing from timing about how much of a guessed key was right.

The webhook secret is stored in the clear because the workers need it to sign deliveries.
This module imports no web framework: the webhook task (tasks/webhooks.py) uses it too.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from dataclasses import dataclass
from typing import Any

import orjson
import redis
from redis.typing import EncodableT, FieldT

from gateway.models import TenantPolicy
from storage.keys import validate_id
from tasks.redis_values import as_bytes, as_text

KEY_PREFIX = "cpd"
TENANTS_SET = "compactd:tenants"
PEPPER_KEY = "compactd:gateway:pepper"
#: Compared against when the key id is unknown, so a miss costs the same as a bad secret.
_DUMMY_HASH = "0" * 64


def tenant_key(tenant: str) -> str:
    return f"compactd:tenant:{tenant}"


def apikey_key(key_id: str) -> str:
    return f"compactd:apikey:{key_id}"


class TenantExists(ValueError):
    """`create` of a tenant id that is taken."""


class TenantNotFound(KeyError):
    """No tenant with that id."""


@dataclass(frozen=True, slots=True)
class Tenant:
    """A tenant as the gateway sees it (never the key hash)."""

    id: str
    name: str
    disabled: bool
    created_at: int
    key_id: str
    policy: TenantPolicy

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "name": self.name, "disabled": self.disabled,
                "createdAt": self.created_at, "keyId": self.key_id,
                "policy": self.policy.model_dump(exclude_none=True)}


@dataclass(frozen=True, slots=True)
class Credentials:
    """What `create` and `rotate_key` return: shown once, never stored in the clear (key)."""

    tenant: str
    api_key: str
    webhook_secret: str


def _new_key() -> tuple[str, str]:
    key_id = secrets.token_hex(8)
    return key_id, f"{KEY_PREFIX}_{key_id}_{secrets.token_urlsafe(32)}"


def split_key(api_key: str) -> str | None:
    """The key id of a well-formed key, else None (without looking anything up)."""
    parts = api_key.split("_", 2)
    if len(parts) != 3 or parts[0] != KEY_PREFIX or len(parts[1]) != 16:
        return None
    if any(c not in "0123456789abcdef" for c in parts[1]) or not 20 <= len(parts[2]) <= 100:
        return None
    return parts[1]


class TenantStore:
    """CRUD for tenants plus key verification, on one Redis client."""

    def __init__(self, client: redis.Redis, pepper: bytes | None = None) -> None:
        self.r = client
        self._pepper = pepper

    @property
    def pepper(self) -> bytes:
        """The configured pepper, else one generated once per Redis (SET NX, so every gateway
        and CLI process sharing the Redis agrees on it)."""
        if self._pepper is None:
            self.r.set(PEPPER_KEY, secrets.token_hex(32), nx=True)
            raw = self.r.get(PEPPER_KEY)
            assert raw is not None
            self._pepper = as_bytes(raw)
        return self._pepper

    def hash_key(self, api_key: str) -> str:
        return hmac.new(self.pepper, api_key.encode(), hashlib.sha256).hexdigest()

    # -- lifecycle ---------------------------------------------------------------------------
    def create(self, tenant: str, *, name: str | None = None,
               policy: TenantPolicy | None = None) -> Credentials:
        validate_id("tenant", tenant)
        key_id, api_key = _new_key()
        webhook_secret = "whsec_" + secrets.token_urlsafe(32)
        fields: dict[FieldT, EncodableT] = {
            "name": name or tenant, "disabled": "0", "createdAt": str(int(time.time())),
            "keyId": key_id, "keyHash": self.hash_key(api_key),
            "webhookSecret": webhook_secret,
            "policy": orjson.dumps((policy or TenantPolicy()).model_dump(
                exclude_none=True)).decode()}
        if not self.r.hsetnx(tenant_key(tenant), "keyId", key_id):
            raise TenantExists(f"tenant {tenant!r} already exists")
        pipe = self.r.pipeline()
        pipe.hset(tenant_key(tenant), mapping=fields)
        pipe.set(apikey_key(key_id), tenant)
        pipe.sadd(TENANTS_SET, tenant)
        pipe.execute()
        return Credentials(tenant, api_key, webhook_secret)

    def get(self, tenant: str) -> Tenant:
        raw = self.r.hgetall(tenant_key(tenant))
        if not raw or b"keyHash" not in raw:
            raise TenantNotFound(tenant)
        data = {as_text(k): as_text(v) for k, v in raw.items()}
        return Tenant(tenant, data.get("name", tenant), data.get("disabled") == "1",
                      int(data.get("createdAt", "0")), data.get("keyId", ""),
                      TenantPolicy.model_validate(orjson.loads(data.get("policy") or "{}")))

    def list(self) -> list[Tenant]:
        out = []
        for raw in sorted(self.r.smembers(TENANTS_SET)):
            try:
                out.append(self.get(as_text(raw)))
            except TenantNotFound:
                continue
        return out

    def rotate_key(self, tenant: str, *, webhook_secret: bool = False) -> Credentials:
        """New API key (the old one stops working at once); optionally a new webhook secret."""
        current = self.get(tenant)
        key_id, api_key = _new_key()
        fields: dict[FieldT, EncodableT] = {"keyId": key_id,
                                            "keyHash": self.hash_key(api_key)}
        if webhook_secret:
            fields["webhookSecret"] = "whsec_" + secrets.token_urlsafe(32)
        pipe = self.r.pipeline()
        pipe.hset(tenant_key(tenant), mapping=fields)
        pipe.set(apikey_key(key_id), tenant)
        pipe.delete(apikey_key(current.key_id))
        pipe.execute()
        return Credentials(tenant, api_key, self.webhook_secret(tenant))

    def set_disabled(self, tenant: str, disabled: bool) -> None:
        self.get(tenant)
        self.r.hset(tenant_key(tenant), "disabled", "1" if disabled else "0")

    def set_policy(self, tenant: str, policy: TenantPolicy) -> None:
        self.get(tenant)
        self.r.hset(tenant_key(tenant), "policy",
                    orjson.dumps(policy.model_dump(exclude_none=True)).decode())

    def webhook_secret(self, tenant: str) -> str:
        raw = self.r.hget(tenant_key(tenant), "webhookSecret")
        if raw is None:
            raise TenantNotFound(tenant)
        return as_text(raw)

    # -- authentication ----------------------------------------------------------------------
    def authenticate(self, api_key: str) -> Tenant | None:
        """The enabled tenant owning `api_key`, else None (unknown, wrong or disabled alike)."""
        key_id = split_key(api_key)
        computed = self.hash_key(api_key)
        owner = self.r.get(apikey_key(key_id)) if key_id else None
        stored = _DUMMY_HASH
        tenant: Tenant | None = None
        if owner is not None:
            raw = self.r.hmget(tenant_key(as_text(owner)), ["keyHash", "keyId"])
            if raw[0] is not None and raw[1] is not None and as_text(raw[1]) == key_id:
                stored = as_text(raw[0])
                try:
                    tenant = self.get(as_text(owner))
                except TenantNotFound:
                    tenant = None
        matched = hmac.compare_digest(computed.encode(), stored.encode())
        if not matched or tenant is None or tenant.disabled:
            return None
        return tenant
