"""Pydantic models of the HTTP API, the tenant policy and the gateway's own settings.

The request models are strict (`extra="forbid"`): a typo in a field name must be a 422, not a
silently ignored option that makes a compaction behave differently from what the caller asked.
The response models are permissive (`extra="allow"`) because the job record grows as workers
add fields, and the schema should document the stable core without truncating the rest.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

MiB = 1024 * 1024


class TenantPolicy(BaseModel):
    """Per-tenant knobs. Every field is optional: unset means "use the server default".

    Plan knobs (keepRecentTokens, reserveTokens/triggerRatio, contextWindow) and `summarizer`
    travel with each job. Limits (jobs, in-flight requests, request rate) are enforced by the
    gateway. maxSummaryChars, identifierPolicy, rotate and maxInflightLlmCalls are stored and
    attached to each job (`policy` in the job record) for the workers to honour.
    """

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    keepRecentTokens: int | None = Field(None, ge=0, le=2_000_000)
    reserveTokens: int | None = Field(None, ge=0, le=2_000_000)
    triggerRatio: float | None = Field(
        None, gt=0, lt=1, description="Compact when context > ratio x window (sets the reserve)")
    contextWindow: int | None = Field(None, gt=0, le=10_000_000)
    summarizer: Literal["config", "extractive"] | None = Field(
        None, description="'config': the workers' model chain; 'extractive': no model")
    maxSummaryChars: int | None = Field(None, ge=2000, le=200_000)
    identifierPolicy: Literal["strict", "off"] | None = None
    rotate: bool | None = None
    maxConcurrentJobs: int | None = Field(None, ge=1, le=10_000)
    maxInflightRequests: int | None = Field(None, ge=1, le=10_000)
    maxInflightLlmCalls: int | None = Field(None, ge=1, le=10_000)
    requestsPerSecond: float | None = Field(None, gt=0, le=100_000)
    burst: int | None = Field(None, ge=1, le=100_000)


#: Server defaults for the limits (the plan knobs default to the workers' settings).
DEFAULT_POLICY = TenantPolicy(maxConcurrentJobs=4, maxInflightRequests=32,
                              maxInflightLlmCalls=16, requestsPerSecond=20.0, burst=40,
                              summarizer="config")


class GatewaySettings(BaseSettings):
    """Gateway-only settings (COMPACTD_GATEWAY_*), apart from CompactdSettings on purpose: the
    workers never need them, and the pepper must not end up in a worker's environment dump."""

    model_config = SettingsConfigDict(env_prefix="COMPACTD_GATEWAY_", extra="ignore")

    pepper: SecretStr | None = Field(
        None, description="Server secret mixed into API key hashes; generated into Redis if unset")
    max_transcript_bytes: int = Field(32 * MiB, ge=1024)
    max_entries_bytes: int = Field(4 * MiB, ge=1024)
    max_json_bytes: int = Field(64 * 1024, ge=1024)
    default_policy: TenantPolicy = Field(default_factory=lambda: DEFAULT_POLICY)
    idempotency_ttl_s: int = Field(24 * 3600, ge=60)

    def effective_policy(self, overrides: TenantPolicy) -> TenantPolicy:
        """Server defaults overlaid with the tenant's own settings."""
        base = DEFAULT_POLICY.model_dump(exclude_none=True)
        base.update(self.default_policy.model_dump(exclude_none=True))
        base.update(overrides.model_dump(exclude_none=True))
        return TenantPolicy.model_validate(base)


# --- errors ----------------------------------------------------------------------------------


class ErrorDetail(BaseModel):
    model_config = ConfigDict(extra="allow")

    code: str = Field(description="Machine-readable error code")
    message: str


class ErrorResponse(BaseModel):
    """Every 4xx/5xx body has this shape, so clients parse one thing."""

    error: ErrorDetail


# --- transcripts -----------------------------------------------------------------------------


class TranscriptWritten(BaseModel):
    session: str
    created: bool = Field(description="True when the session was created, False when replaced")
    etag: str
    entries: int
    leafId: str | None


class AppendRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    entries: list[dict[str, Any]] = Field(min_length=1, max_length=10_000)


class AppendResult(BaseModel):
    ids: list[str]
    etag: str


class ContextResponse(BaseModel):
    session: str
    format: Literal["pi", "agent", "openai", "anthropic"]
    compactionId: str | None
    thinkingLevel: str
    model: dict[str, str] | None
    system: str | None = Field(None, description="anthropic only: never set by compactd")
    messages: list[dict[str, Any]]


class Checkpoint(BaseModel):
    model_config = ConfigDict(extra="allow")

    id: str
    createdAt: str
    reason: str
    compactionId: str | None
    leafId: str | None
    bytes: int


class CheckpointList(BaseModel):
    checkpoints: list[Checkpoint]


# --- jobs ------------------------------------------------------------------------------------


class CompactionRequest(BaseModel):
    """POST /v1/sessions/{session}/compactions.

    `trigger`: `manual` always compacts, `threshold` compacts only if the context is above the
    trigger (else the job ends `skipped`), `overflow` always compacts on the interactive queue
    (the agent's user is waiting on a provider overflow).
    """

    model_config = ConfigDict(extra="forbid")

    trigger: Literal["manual", "threshold", "overflow"] = "manual"
    keepRecentTokens: int | None = Field(None, ge=0, le=2_000_000)
    reserveTokens: int | None = Field(None, ge=0, le=2_000_000)
    contextWindow: int | None = Field(None, gt=0, le=10_000_000)
    instructions: str | None = Field(None, max_length=4000,
                                     description="Focus text (treated as data, never obeyed)")
    callbackUrl: str | None = Field(None, max_length=2048,
                                    description="http(s) URL POSTed the job record on job end")

    @field_validator("callbackUrl")
    @classmethod
    def _http_only(cls, value: str | None) -> str | None:
        if value is None:
            return None
        from urllib.parse import urlsplit

        try:
            parts = urlsplit(value)
            parts.port  # noqa: B018  (raises ValueError on a bad port)
        except ValueError as exc:
            raise ValueError(f"callbackUrl is not a valid URL: {exc}") from None
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("callbackUrl must be an absolute http:// or https:// URL")
        if parts.username or parts.password:
            raise ValueError("callbackUrl must not carry credentials")
        if any(ord(ch) < 0x21 or ord(ch) == 0x7F for ch in value):
            raise ValueError("callbackUrl must not contain spaces or control characters")
        return value


class JobProgress(BaseModel):
    chunksDone: int
    chunksTotal: int


class JobRecord(BaseModel):
    """A job record as workers keep it in Redis (only the stable core is listed)."""

    model_config = ConfigDict(extra="allow")

    jobId: str
    state: str
    tenant: str
    session: str
    queue: str | None = None
    createdAt: int
    updatedAt: int | None = None
    progress: JobProgress | None = None
    cancelRequested: bool = False
    error: str | None = None


class JobList(BaseModel):
    jobs: list[JobRecord]


# --- health ----------------------------------------------------------------------------------


class Health(BaseModel):
    status: Literal["ok", "unavailable"]
    checks: dict[str, str] = Field(default_factory=dict)
