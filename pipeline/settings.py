"""Engine settings: the knobs of planning and summarizing, with pi/OpenClaw defaults."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class PlanSettings(BaseModel):
    """How much to keep, when to trigger, and how to cut the summarized part into chunks."""

    model_config = ConfigDict(frozen=True)

    keep_recent_tokens: int = Field(20000, ge=0)
    reserve_tokens: int = Field(16384, ge=0)
    reserve_floor: int = Field(20000, ge=0)
    context_window: int = Field(200000, gt=0)
    target_chunk_tokens: int = Field(12000, gt=0, description="Preferred chunk size for fan-out")
    max_chunks: int = Field(16, ge=1, description="Upper bound on parallel chunks per job")


class SummarySettings(BaseModel):
    """What the summary must contain and how hard the audit pushes back."""

    model_config = ConfigDict(frozen=True)

    identifier_policy: Literal["strict", "off", "custom"] = "strict"
    identifier_instructions: str | None = None
    audit_retries: int = Field(1, ge=0, le=3)
    max_summary_chars: int = Field(16000, ge=2000)
    instructions: str | None = Field(None, description="Focus text, treated as untrusted data")
