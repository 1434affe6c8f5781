"""Token estimates, as pi computes them, with OpenClaw's CJK weighting.

pi divides characters by four (rounding up) and counts characters the way JavaScript does, in
UTF-16 code units; we do the same so our cut points match pi's on the same transcript. CJK text
is denser than that (about one token per character), so like OpenClaw we weight each CJK
character as four. Images in tool results and custom messages cost 4800 characters (1200 tokens),
as in pi; user images cost nothing, as in pi.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

CHARS_PER_TOKEN = 4
IMAGE_CHARS = 4800

# CJK ideographs, kana, hangul, CJK punctuation and fullwidth forms (OpenClaw's ranges, ours).
_CJK = re.compile(
    "[\u1100-\u11ff\u2e80-\u2fdf\u2ff0-\u303f\u3040-\u30ff\u3100-\u31ff\u3200-\u4dbf"
    "\u4e00-\u9fff\ua960-\ua97f\uac00-\ud7ff\uf900-\ufaff\ufe30-\ufe4f\uff00-\uffef"
    "\U00020000-\U0003134f]"
)


def weighted_chars(text: str) -> int:
    """UTF-16 length with each CJK code point counted as four characters."""
    if text.isascii():
        return len(text)
    units = len(text.encode("utf-16-le")) // 2
    extra = 0
    for match in _CJK.finditer(text):
        extra += 2 if ord(match.group()) > 0xFFFF else 3
    return units + extra


def _blocks(content: Any) -> Sequence[Mapping[str, Any]]:
    if isinstance(content, list):
        return [b for b in content if isinstance(b, Mapping)]
    return ()


def _text_chars(content: Any, *, image_chars: int) -> int:
    if isinstance(content, str):
        return weighted_chars(content)
    total = 0
    for block in _blocks(content):
        kind = block.get("type")
        if kind == "text":
            total += weighted_chars(str(block.get("text", "")))
        elif kind == "image":
            total += image_chars
    return total


def _json_chars(value: Any) -> int:
    try:
        return weighted_chars(orjson.dumps(value).decode())
    except TypeError:
        return len("[unserializable]")


def message_chars(message: Mapping[str, Any]) -> int:
    """Characters pi charges for one message (before dividing by four)."""
    role = message.get("role")
    if role == "user":
        return _text_chars(message.get("content"), image_chars=0)
    if role == "assistant":
        total = 0
        for block in _blocks(message.get("content")):
            kind = block.get("type")
            if kind == "text":
                total += weighted_chars(str(block.get("text", "")))
            elif kind == "thinking":
                total += weighted_chars(str(block.get("thinking", "")))
            elif kind == "toolCall":
                total += weighted_chars(str(block.get("name", "")))
                total += _json_chars(block.get("arguments", {}))
        return total
    if role in ("toolResult", "custom"):
        return _text_chars(message.get("content"), image_chars=IMAGE_CHARS)
    if role == "bashExecution":
        return weighted_chars(str(message.get("command", ""))) + weighted_chars(
            str(message.get("output", ""))
        )
    if role in ("branchSummary", "compactionSummary"):
        return weighted_chars(str(message.get("summary", "")))
    return 0


def estimate_tokens(message: Mapping[str, Any]) -> int:
    """pi's `estimateTokens`: ceil(chars / 4)."""
    return math.ceil(message_chars(message) / CHARS_PER_TOKEN)


def usage_tokens(usage: Mapping[str, Any]) -> int:
    """pi's `calculateContextTokens`: totalTokens when set, else the sum of the parts."""
    total = usage.get("totalTokens") or 0
    if total:
        return int(total)
    return int(
        (usage.get("input") or 0)
        + (usage.get("output") or 0)
        + (usage.get("cacheRead") or 0)
        + (usage.get("cacheWrite") or 0)
    )


def usable_usage(message: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The usage of an assistant message that counts (not aborted, not an error)."""
    if message.get("role") != "assistant":
        return None
    if message.get("stopReason") in ("aborted", "error"):
        return None
    usage = message.get("usage")
    return usage if isinstance(usage, Mapping) else None


@dataclass(frozen=True, slots=True)
class ContextEstimate:
    """pi's `estimateContextTokens` result."""

    tokens: int
    usage_tokens: int
    trailing_tokens: int
    last_usage_index: int | None


def estimate_context_tokens(messages: Sequence[Mapping[str, Any]]) -> ContextEstimate:
    """Last usable assistant usage plus estimates for the messages after it."""
    for index in range(len(messages) - 1, -1, -1):
        usage = usable_usage(messages[index])
        if usage is not None:
            base = usage_tokens(usage)
            trailing = sum(estimate_tokens(m) for m in messages[index + 1 :])
            return ContextEstimate(base + trailing, base, trailing, index)
    total = sum(estimate_tokens(m) for m in messages)
    return ContextEstimate(total, 0, total, None)
