"""Engine settings: the knobs of planning and summarizing, with pi/OpenClaw defaults."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class PlanSettings(BaseModel):
    """How much to keep, when to trigger, and how to cut the summarized part into chunks."""

    model_config = ConfigDict(frozen=True)

    keep_recent_tokens: int = Field(20000, ge=0, description="Recent tokens kept verbatim")
    reserve_tokens: int = Field(16384, ge=0, description="Tokens reserved for summary + reply")
    reserve_floor: int = Field(20000, ge=0, description="Reserve floor (0 disables), capped "
                               "to leave a prompt budget on small windows")
    context_window: int = Field(200000, gt=0, description="The agent model's context window")
    target_chunk_tokens: int = Field(12000, gt=0, description="Preferred chunk size for fan-out")
    max_chunks: int = Field(16, ge=1, description="Upper bound on parallel chunks per job")


class SummarySettings(BaseModel):
    """What the summary must contain and how hard the audit pushes back."""

    model_config = ConfigDict(frozen=True)

    identifier_policy: Literal["strict", "off", "custom"] = Field(
        "strict", description="strict: keep every opaque identifier verbatim (audited)")
    identifier_instructions: str | None = Field(None, description="Operator text for `custom`")
    audit_retries: int = Field(1, ge=0, le=3, description="Retries with audit feedback")
    max_summary_chars: int = Field(16000, ge=2000, description="Cap of the committed summary")
    instructions: str | None = Field(None, description="Focus text, treated as untrusted data")
