"""Decide whether a failed or truncated model turn means "the context no longer fits".

Compaction has two triggers: the proactive token threshold and the reactive one handled here.
When a provider rejects a prompt for being too long, or accepts it but silently drops part of
it, the agent has to compact and retry instead of surfacing a generic error. Providers report
this in dozens of ways, so detection is a list of case-insensitive pattern families (pi's list
plus the ones OpenClaw added), guarded by OpenClaw's exclusion list: throttling and overload
errors often mention "tokens" too, and compacting a session because of a rate limit would
destroy history for nothing.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

# Messages that look like overflow but are not. Checked before any overflow pattern, so a
# throttling message that happens to say "too many tokens" is never treated as overflow.
_EXCLUDED = re.compile(
    r"^\s*(?:throttling error|service unavailable):|rate limit|too many requests",
    re.IGNORECASE,
)

# One entry per provider family of spec §2.2; the comment names who sends it.
_OVERFLOW_PATTERNS: tuple[re.Pattern[str], ...] = tuple(
    re.compile(source, re.IGNORECASE)
    for source in (
        r"prompt is too long",  # Anthropic
        r"request_too_large",  # Anthropic, request body too large (OpenClaw)
        r"input is too long for requested model",  # Amazon Bedrock
        r"exceeds the context window",  # OpenAI
        r"input token count.*exceeds the maximum",  # Google Gemini
        r"maximum prompt length is \d+",  # xAI
        r"reduce the length of the messages",  # Groq
        r"maximum context length is \d+ tokens",  # OpenRouter
        r"exceeds the limit of \d+",  # GitHub Copilot
        r"exceeds the available context size",  # llama.cpp server
        r"greater than the context length",  # LM Studio
        r"context window exceeds limit",  # MiniMax
        r"exceeded model token limit",  # Kimi
        r"too large for model with \d+ maximum context length",  # Mistral
        r"model_context_window_exceeded",  # z.ai
        # LiteLLM and other OpenAI-compatible proxies (OpenClaw).
        r"exceeds (?:the )?(?:model'?s )?maximum context length"
        r"(?: of [\d,]+ tokens?|\s*\([\d,]+\))",
        r"maximum allowed input length",  # OpenRouter / Poolside (OpenClaw)
        r"input \([\d,]+ tokens\) is longer than the model'?s context length",  # Together
        r"tokens in request more than max tokens allowed",  # Zhipu (OpenClaw)
        # DS4-style servers (OpenClaw).
        r"prompt has [\d,]+ tokens?, but the configured context size is [\d,]+ tokens?",
        r"prompt too long; exceeded (?:max )?context length",  # Ollama (OpenClaw)
        # Generic fallbacks used by many OpenAI-compatible servers.
        r"context[_ ]length[_ ]exceeded",
        r"too many tokens",
        r"token limit exceeded",
        # Cerebras answers a too-long prompt with a bare status line and no body.
        r"^4(?:00|13)\s*(?:status code)?\s*\(no body\)",
    )
)

# Case 3 (Xiaomi MiMo): a turn that stops for "length" having produced nothing, with the
# prompt already filling at least this share of the window, ran out of room for any output.
LENGTH_OVERFLOW_RATIO = 0.99


def is_overflow_error_text(text: str) -> bool:
    """True when a provider error message says the prompt does not fit the context window.

    The exclusion list wins over every pattern: rate-limit and service-unavailable errors are
    transient and must be retried, not answered by compacting the session.
    """
    if not text or _EXCLUDED.search(text):
        return False
    return any(pattern.search(text) for pattern in _OVERFLOW_PATTERNS)


def _as_int(value: Any) -> int | None:
    """Read a token count leniently: transcripts are user data and may hold junk."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and math.isfinite(value):
        return int(value)
    return None


def prompt_tokens_from_usage(usage: Mapping[str, Any] | None) -> int | None:
    """How many tokens the provider says the prompt used, or None when that is unknown.

    OpenClaw's `contextUsage` is authoritative when present: `available` gives the exact prompt
    size, `unavailable` means the provider could not say (so no silent-overflow verdict can be
    drawn). Without it, pi's rule applies: fresh input plus cache reads.
    """
    if not isinstance(usage, Mapping):
        return None
    context_usage = usage.get("contextUsage")
    if isinstance(context_usage, Mapping):
        state = context_usage.get("state")
        if state == "available":
            return _as_int(context_usage.get("promptTokens"))
        if state == "unavailable":
            return None
    fresh = _as_int(usage.get("input"))
    cached = _as_int(usage.get("cacheRead"))
    if fresh is None and cached is None:
        return None
    return (fresh or 0) + (cached or 0)


def is_context_overflow(message: Mapping[str, Any], context_window: int | None = None) -> bool:
    """True when a pi assistant message shows that the context overflowed.

    Three cases (spec §2.2): an error whose text matches an overflow pattern; a "stop" whose
    reported prompt is larger than the window (the provider truncated silently); a "length"
    stop with zero output whose prompt already filled ≥99% of the window. The usage-based
    cases need the window; without it only the error text can decide. For case 3 we measure
    the prompt the same way as case 2 (input + cacheRead, or `contextUsage.promptTokens`),
    because cached prompt tokens occupy the window just as fresh ones do.
    """
    stop_reason = message.get("stopReason")
    if stop_reason == "error":
        error_text = message.get("errorMessage")
        return isinstance(error_text, str) and is_overflow_error_text(error_text)

    if context_window is None or context_window <= 0:
        return False
    usage = message.get("usage")
    prompt_tokens = prompt_tokens_from_usage(usage if isinstance(usage, Mapping) else None)
    if prompt_tokens is None:
        return False

    if stop_reason == "stop":
        return prompt_tokens > context_window
    if stop_reason == "length" and isinstance(usage, Mapping):
        output = _as_int(usage.get("output"))
        return output == 0 and prompt_tokens >= LENGTH_OVERFLOW_RATIO * context_window
    return False
