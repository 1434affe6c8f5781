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


def is_runtime_context(message: Mapping[str, Any]) -> bool:
    return message.get("role") == "custom" and message.get("customType") == RUNTIME_CONTEXT_TYPE


def sanitize(messages: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """Drop what must never reach a summarizer: runtime-context carriers, excluded messages."""
    return [
        m for m in messages
        if not is_runtime_context(m) and not m.get("excludeFromContext")
    ]


def truncate_tool_result(text: str, limit: int = TOOL_RESULT_MAX_CHARS) -> str:
    """Head of the output, plus the diagnostic tail when an error sits past the head."""
    if len(text) <= limit:
        return text
    window_start = len(text) - limit
    matches = list(_DIAGNOSTIC.finditer(text, window_start))
    if matches:
        start = matches[-1].start()
        tail = text[start : start + DIAGNOSTIC_TAIL_CHARS]
        head_len = limit - len(tail)
        if start >= head_len:
            head = text[:head_len]
            middle = start - head_len
            out = f"{head}\n\n[... {middle} middle characters truncated]\n\n{tail}"
            rest = len(text) - (start + len(tail))
            if rest > 0:
                out += f"\n\n[... {rest} more characters truncated]"
            return out
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
