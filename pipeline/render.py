"""How a slice of conversation is shown to a summarizer (spec §4.1, OpenClaw's variant).

Thinking is not rendered (it is the model's scratch space, often huge, and OpenClaw drops it),
tool results are cut to 2000 characters but keep the diagnostic tail where the error usually
is, non-text blocks become short markers, and `toolResult.details` and runtime-context messages
never reach a model.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

import orjson

from pipeline.context import convert_to_llm

TOOL_RESULT_MAX_CHARS = 2000
DIAGNOSTIC_TAIL_CHARS = 600
MAX_OMISSION_MESSAGES = 8
RUNTIME_CONTEXT_TYPE = "openclaw.runtime-context"
IMAGE_MARKER = "[image data omitted from summary input]"
NON_TEXT_MARKER = "[non-text data omitted from summary input]"
MORE_OMITTED_MARKER = "[More image/non-text data omitted from summary input]"

_DIAGNOSTIC = re.compile(
    r"error|exception|failed|fatal|traceback|panic|stack trace|errno|exit code", re.IGNORECASE
)
_STRONG_DIAGNOSTICS = frozenset({"error", "exception", "fatal", "panic", "errno"})


def is_runtime_context(message: Mapping[str, Any]) -> bool:
    return message.get("role") == "custom" and message.get("customType") == RUNTIME_CONTEXT_TYPE


def sanitize(messages: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """Drop what must never reach a summarizer: runtime-context carriers, excluded messages."""
    return [
        m for m in messages
        if not is_runtime_context(m) and not m.get("excludeFromContext")
    ]


def truncate_tool_result(text: str, limit: int = TOOL_RESULT_MAX_CHARS) -> str:
    """Head of the output, or head + diagnostic tail when an error sits near the end.

    OpenClaw's `truncateForSummary`: the failure a command reports usually comes last, so when
    the last `limit` characters name one (preferring the last error/exception/fatal/panic/errno
    over weaker words), keep a shorter head and up to 600 characters from that word, moved back
    so the tail is full when the word is close to the end. The plain head is kept instead when
    the diagnostic is already inside it, or when shortening it would drop a diagnostic it shows.
    """
    if len(text) <= limit:
        return text
    tail_chars = min(limit * 3 // 10, DIAGNOSTIC_TAIL_CHARS)
    matches = list(_DIAGNOSTIC.finditer(text, len(text) - limit))
    if matches:
        strong = [m for m in matches if m.group().lower() in _STRONG_DIAGNOSTICS]
        match = (strong or matches)[-1]
        head = text[: limit - tail_chars]
        displaced = text[max(0, len(head) - 32) : limit]
        tail_start = min(match.start(), len(text) - tail_chars)
        if not _DIAGNOSTIC.search(displaced) and tail_start >= len(head):
            tail = text[tail_start : tail_start + tail_chars]
            omitted = len(text) - len(head) - len(tail)
            where = "middle/trailing" if tail_start + len(tail) < len(text) else "more"
            return f"{head}\n\n[... {omitted} {where} characters truncated]\n\n{tail}"
    return f"{text[:limit]}\n\n[... {len(text) - limit} more characters truncated]"


class _Omissions:
    """OpenClaw's bounded omission markers: at most 8 messages get them, then one line."""

    def __init__(self) -> None:
        self.messages = 0
        self.announced = False

    def markers(self, content: Any) -> list[str]:
        if not isinstance(content, list):
            return []
        kinds: list[str] = []
        for block in content:
            if not isinstance(block, Mapping) or block.get("type") == "text":
                continue
            marker = IMAGE_MARKER if block.get("type") == "image" else NON_TEXT_MARKER
            if marker not in kinds:
                kinds.append(marker)
        if not kinds:
            return []
        self.messages += 1
        if self.messages <= MAX_OMISSION_MESSAGES:
            return kinds
        if not self.announced:
            self.announced = True
            return [MORE_OMITTED_MARKER]
        return []


def _texts(content: Any) -> list[str]:
    if isinstance(content, str):
        return [content]
    out: list[str] = []
    for block in content or []:
        if isinstance(block, Mapping) and block.get("type") in ("text", "toolResult",
                                                                "tool_result"):
            text = block.get("text")
            if isinstance(text, str):
                out.append(text)
    return out


def _call(block: Mapping[str, Any]) -> str:
    arguments = block.get("arguments")
    if isinstance(arguments, Mapping):
        args = ", ".join(
            f"{key}={orjson.dumps(value).decode()}" for key, value in arguments.items()
        )
    else:
        args = ""
    return f"{block.get('name', '')}({args})"


def render_messages(messages: Iterable[Mapping[str, Any]]) -> str:
    """Serialize messages as `[User]: …`, `[Assistant]: …`, `[Tool result]: …` blocks."""
    parts: list[str] = []
    omissions = _Omissions()
    for message in convert_to_llm(sanitize(messages)):
        role = message.get("role")
        content = message.get("content")
        if role == "user":
            pieces = _texts(content) + omissions.markers(content)
            text = "\n".join(p for p in pieces if p)
            if text:
                parts.append(f"[User]: {text}")
        elif role == "assistant":
            blocks = [b for b in content or [] if isinstance(b, Mapping)]
            texts = [str(b.get("text", "")) for b in blocks if b.get("type") == "text"]
            calls = [_call(b) for b in blocks if b.get("type") == "toolCall"]
            if any(texts):
                parts.append("[Assistant]: " + "\n".join(t for t in texts if t))
            if calls:
                parts.append("[Assistant tool calls]: " + "; ".join(calls))
        elif role == "toolResult":
            body = truncate_tool_result("\n".join(_texts(content)))
            pieces = [body] if body else []
            pieces += omissions.markers(content)
            if pieces:
                parts.append("[Tool result]: " + "\n".join(pieces))
    return "\n\n".join(parts)
