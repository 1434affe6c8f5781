"""Service settings: environment (COMPACTD_*), an optional TOML file, and defaults.

One model for the whole service so the CLI, the workers and the gateway agree. Secrets (API
keys) come from here only and are `SecretStr`, so they never show in a repr, a log line or a
job record.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

from pipeline.settings import PlanSettings, SummarySettings


class ModelConfig(BaseModel):
    """One level of the model fallback chain."""

    summarizer: Literal["openai", "anthropic"]
    base_url: str
    model: str
    api_key: SecretStr | None = None
    max_output_tokens: int | None = Field(None, gt=0, description="The model's own output cap")


class TimeoutConfig(BaseModel):
    connect: float = Field(5.0, gt=0, description="Seconds to connect to a model server")
    read: float = Field(120.0, gt=0, description="Seconds between bytes of a response")
    total: float = Field(180.0, gt=0, description="Hard deadline of one LLM call")


class RetryConfig(BaseModel):
    attempts: int = Field(3, ge=1, le=10, description="Attempts per LLM call")
    min_wait: float = Field(0.5, ge=0, description="First backoff (s), doubling")
    max_wait: float = Field(5.0, ge=0, description="Longest backoff (s)")
    jitter: float = Field(0.2, ge=0, le=1, description="± share of random jitter")


class CompactdSettings(BaseSettings):
    """Everything configurable.

    Environment: COMPACTD_<FIELD>, nested with `__` (COMPACTD_PLAN__KEEP_RECENT_TOKENS=30000).
    """

    model_config = SettingsConfigDict(env_prefix="COMPACTD_", env_nested_delimiter="__",
                                      extra="forbid")

    redis_url: str = Field("redis://127.0.0.1:6379/0",
                           description="Broker, results, leases, job records")
    store_url: str = Field("file://./.data/store", description="file:///dir or "
                           "s3://bucket[/prefix]?endpoint_url=…&region=… (credentials from the "
                           "AWS environment)")
    llm_api_key: SecretStr | None = Field(None, description="Default key for every model")
    chain: list[ModelConfig] = Field(default_factory=list,
                                     description="Model fallback chain; empty = extractive")
    plan: PlanSettings = Field(default_factory=PlanSettings)
    summary: SummarySettings = Field(default_factory=SummarySettings)
    timeouts: TimeoutConfig = Field(default_factory=TimeoutConfig)
    retry: RetryConfig = Field(default_factory=RetryConfig)
    llm_concurrency: int = Field(64, ge=1, description="Pooled HTTP connections per process")
    rotate: bool = Field(False, description="Start a successor segment after each commit")
    log_format: Literal["json", "text"] = Field("json", description="Log line format")
    log_level: str = Field("INFO", description="Root log level")
    checkpoints_max: int = Field(25, ge=1, description="Checkpoints kept per session")
    checkpoints_max_bytes: int = Field(128 * 1024 * 1024, ge=1,
                                       description="Checkpoint bytes kept per session")


def load_settings(config: Path | None = None, **overrides: Any) -> CompactdSettings:
    """Defaults < TOML file < environment < explicit overrides (CLI flags)."""
    data: dict[str, Any] = {}
    if config is not None:
        with config.open("rb") as handle:
            data = tomllib.load(handle)
    env = CompactdSettings()
    merged = {**data, **env.model_dump(exclude_unset=True), **overrides}
    return CompactdSettings.model_validate(merged)
