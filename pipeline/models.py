"""Pydantic models of the pi session format (v3), one per entry type and message role.

They validate what enters the system (parsed lines, appended entries, API bodies) and document
the contract. They are permissive on purpose: `extra="allow"` keeps fields we do not know, and
only the fields pi itself relies on are required, because real transcripts carry provider- and
extension-specific additions that must survive a rewrite untouched.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow", populate_by_name=True)


# --- content blocks ---------------------------------------------------------------------------


class TextBlock(_Open):
    type: Literal["text"]
    text: str


class ImageBlock(_Open):
    type: Literal["image"]
    data: str = ""
    mimeType: str | None = None


class ThinkingBlock(_Open):
    type: Literal["thinking"]
    thinking: str = ""


class ToolCallBlock(_Open):
    type: Literal["toolCall"]
    id: str
    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)


Content = str | list[dict[str, Any]]


# --- message roles ----------------------------------------------------------------------------


class Usage(_Open):
    input: int = 0
    output: int = 0
    cacheRead: int = 0
    cacheWrite: int = 0
    totalTokens: int = 0


class UserMessage(_Open):
    role: Literal["user"]
    content: Content
    timestamp: int | float | None = None


class AssistantMessage(_Open):
    role: Literal["assistant"]
    content: list[dict[str, Any]]
    api: str | None = None
    provider: str | None = None
    model: str | None = None
    usage: Usage | None = None
    stopReason: str | None = None
    errorMessage: str | None = None
    timestamp: int | float | None = None


class ToolResultMessage(_Open):
    role: Literal["toolResult"]
    toolCallId: str
    toolName: str | None = None
    content: Content = Field(default_factory=list)
    details: Any = None
    isError: bool = False
    timestamp: int | float | None = None


class BashExecutionMessage(_Open):
    role: Literal["bashExecution"]
    command: str
    output: str = ""
    exitCode: int | None = None
    cancelled: bool = False
    truncated: bool = False
    fullOutputPath: str | None = None
    excludeFromContext: bool = False
    timestamp: int | float | None = None


class CustomMessage(_Open):
    role: Literal["custom"]
    customType: str
    content: Content
    display: bool = True
    details: Any = None
    timestamp: int | float | None = None


class BranchSummaryMessage(_Open):
    role: Literal["branchSummary"]
    summary: str
    fromId: str | None = None
    timestamp: int | float | None = None


class CompactionSummaryMessage(_Open):
    role: Literal["compactionSummary"]
    summary: str
    tokensBefore: int | float = 0
    timestamp: int | float | None = None


KNOWN_ROLES = frozenset(
    {"user", "assistant", "toolResult", "bashExecution", "custom", "branchSummary",
     "compactionSummary"}
)

AgentMessage = Annotated[
    UserMessage
    | AssistantMessage
    | ToolResultMessage
    | BashExecutionMessage
    | CustomMessage
    | BranchSummaryMessage
    | CompactionSummaryMessage,
    Field(discriminator="role"),
]

# --- header and entries -----------------------------------------------------------------------


class SessionHeader(_Open):
    type: Literal["session"]
    id: str
    version: int = 1
    timestamp: str | None = None
    cwd: str | None = None
    parentSession: str | None = None


class _EntryBase(_Open):
    id: str = Field(min_length=1)
    parentId: str | None
    timestamp: str | int | float | None = None


class MessageEntry(_EntryBase):
    type: Literal["message"]
    message: AgentMessage


class CompactionEntry(_EntryBase):
    type: Literal["compaction"]
    summary: str
    firstKeptEntryId: str
    tokensBefore: int | float
    details: dict[str, Any] | None = None
    fromHook: bool | None = None


class BranchSummaryEntry(_EntryBase):
    type: Literal["branch_summary"]
    fromId: str | None = None
    summary: str
    details: Any = None
    fromHook: bool | None = None


class CustomEntry(_EntryBase):
    type: Literal["custom"]
    customType: str
    data: Any = None


class CustomMessageEntry(_EntryBase):
    type: Literal["custom_message"]
    customType: str
    content: Content
    display: bool = True
    details: Any = None


class LabelEntry(_EntryBase):
    type: Literal["label"]
    targetId: str
    label: str | None = None


class ModelChangeEntry(_EntryBase):
    type: Literal["model_change"]
    provider: str | None = None
    modelId: str | None = None


class ThinkingLevelChangeEntry(_EntryBase):
    type: Literal["thinking_level_change"]
    thinkingLevel: str


class SessionInfoEntry(_EntryBase):
    type: Literal["session_info"]
    name: str | None = None


class GenericEntry(_EntryBase):
    """Any entry type we do not know (e.g. OpenClaw `reset`, future pi types): kept verbatim."""

    type: str


KNOWN_ENTRY_MODELS: dict[str, type[_EntryBase]] = {
    "message": MessageEntry,
    "compaction": CompactionEntry,
    "branch_summary": BranchSummaryEntry,
    "custom": CustomEntry,
    "custom_message": CustomMessageEntry,
    "label": LabelEntry,
    "model_change": ModelChangeEntry,
    "thinking_level_change": ThinkingLevelChangeEntry,
    "session_info": SessionInfoEntry,
}

_header_adapter = TypeAdapter(SessionHeader)


def validate_header(data: dict[str, Any]) -> SessionHeader:
    return _header_adapter.validate_python(data)


def validate_entry(data: dict[str, Any]) -> _EntryBase:
    """Validate one entry dict against its type's model (unknown types: base fields only).

    Messages with a role we do not know are accepted with the base checks only, so extension
    roles pass through; known roles are checked strictly.
    """
    model = KNOWN_ENTRY_MODELS.get(data.get("type", ""), GenericEntry)
    if model is MessageEntry:
        message = data.get("message")
        if isinstance(message, dict) and message.get("role") not in KNOWN_ROLES:
            if not isinstance(message.get("role"), str):
                raise ValueError("message.role must be a string")
            return GenericEntry.model_validate(data)
    return model.model_validate(data)
