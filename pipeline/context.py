"""The model view of a session: pi's `buildSessionContext` and `convertToLlm`.

This is what the agent sends to its LLM after a compaction, so it is the contract every test
checks against: the summary first, then the kept tail from `firstKeptEntryId`, then everything
after the compaction entry.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pipeline.transcript import Entry

COMPACTION_PREFIX = (
    "The conversation history before this point was compacted into the following summary:"
)
BRANCH_PREFIX = "The following is a summary of a branch that this conversation came back from:"


@dataclass(frozen=True, slots=True)
class ContextMessage:
    """A message in the model view and the entry it came from."""

    entry_id: str
    message: dict[str, Any]


@dataclass(slots=True)
class SessionContext:
    messages: list[ContextMessage] = field(default_factory=list)
    thinking_level: str = "off"
    model: dict[str, str] | None = None
    compaction_id: str | None = None

    @property
    def payloads(self) -> list[dict[str, Any]]:
        return [m.message for m in self.messages]


def entry_message(entry: Entry) -> dict[str, Any] | None:
    """pi's entry -> message mapping for the model view (compactions are handled apart)."""
    kind = entry.type
    data = entry.data
    if kind == "message":
        return entry.message
    if kind == "custom_message":
        return {
            "role": "custom",
            "customType": data.get("customType"),
            "content": data.get("content"),
            "display": data.get("display", True),
            "details": data.get("details"),
            "timestamp": data.get("timestamp"),
        }
    if kind == "branch_summary" and data.get("summary"):
        return {
            "role": "branchSummary",
            "summary": data.get("summary"),
            "fromId": data.get("fromId"),
            "timestamp": data.get("timestamp"),
        }
    return None


def compaction_message(entry: Entry) -> dict[str, Any]:
    return {
        "role": "compactionSummary",
        "summary": entry.data.get("summary", ""),
        "tokensBefore": entry.data.get("tokensBefore", 0),
        "timestamp": entry.data.get("timestamp"),
    }


def build_session_context(path: Sequence[Entry]) -> SessionContext:
    """pi's `buildSessionContext` over a root-to-leaf path."""
    ctx = SessionContext()
    compaction_index: int | None = None
    for index, entry in enumerate(path):
        kind = entry.type
        if kind == "thinking_level_change":
            ctx.thinking_level = str(entry.data.get("thinkingLevel", "off"))
        elif kind == "model_change":
            ctx.model = {
                "provider": str(entry.data.get("provider", "")),
                "modelId": str(entry.data.get("modelId", "")),
            }
        elif kind == "compaction":
            compaction_index = index
        elif entry.role == "assistant":
            msg = entry.message or {}
            ctx.model = {"provider": str(msg.get("provider", "")), "modelId": str(
                msg.get("model", ""))}

    def emit(entry: Entry) -> None:
        message = entry_message(entry)
        if message is not None:
            ctx.messages.append(ContextMessage(entry.id, message))

    if compaction_index is None:
        for entry in path:
            emit(entry)
        return ctx

    compaction = path[compaction_index]
    ctx.compaction_id = compaction.id
    ctx.messages.append(ContextMessage(compaction.id, compaction_message(compaction)))
    first_kept = compaction.data.get("firstKeptEntryId")
    keeping = False
    for entry in path[:compaction_index]:
        if entry.id == first_kept:
            keeping = True
        if keeping:
            emit(entry)
    for entry in path[compaction_index + 1 :]:
        emit(entry)
    return ctx


def _text_of(content: Any) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return list(content) if isinstance(content, list) else []


def bash_to_text(message: Mapping[str, Any]) -> str:
    """pi's rendering of a user-typed `!cmd` for the model."""
    text = f"Ran `{message.get('command', '')}`\n"
    output = message.get("output") or ""
    text += f"```\n{output}\n```" if output else "(no output)"
    if message.get("cancelled"):
        text += "\n\n(command cancelled)"
    elif message.get("exitCode") not in (None, 0):
        text += f"\n\nCommand exited with code {message.get('exitCode')}"
    if message.get("truncated") and message.get("fullOutputPath"):
        text += f"\n\n[Output truncated. Full output: {message.get('fullOutputPath')}]"
    return text


def convert_to_llm(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """pi's `convertToLlm`: every role becomes user, assistant or toolResult."""
    out: list[dict[str, Any]] = []
    for message in messages:
        role = message.get("role")
        ts = message.get("timestamp")
        if role == "bashExecution":
            if message.get("excludeFromContext"):
                continue
            out.append({"role": "user", "content": [{"type": "text",
                                                      "text": bash_to_text(message)}],
                        "timestamp": ts})
        elif role == "custom":
            out.append({"role": "user", "content": _text_of(message.get("content")),
                        "timestamp": ts})
        elif role == "branchSummary":
            text = f"{BRANCH_PREFIX}\n\n<summary>\n{message.get('summary', '')}</summary>"
            out.append({"role": "user", "content": [{"type": "text", "text": text}],
                        "timestamp": ts})
        elif role == "compactionSummary":
            text = f"{COMPACTION_PREFIX}\n\n<summary>\n{message.get('summary', '')}\n</summary>"
            out.append({"role": "user", "content": [{"type": "text", "text": text}],
                        "timestamp": ts})
        elif role in ("user", "assistant", "toolResult"):
            out.append(dict(message))
    return out
