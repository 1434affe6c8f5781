"""Overflow detection: provider error texts (spec §2.2) and usage-based cases, incl. TV17."""

from __future__ import annotations

from typing import Any

import pytest

from pipeline.overflow import (
    is_context_overflow,
    is_overflow_error_text,
    prompt_tokens_from_usage,
)


def error_message(text: str) -> dict[str, Any]:
    return {
        "role": "assistant",
        "stopReason": "error",
        "errorMessage": text,
        "usage": {"input": 0, "output": 0, "cacheRead": 0},
    }


def usage_message(stop: str, **usage: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"input": 0, "output": 0, "cacheRead": 0}
    base.update(usage)
    return {"role": "assistant", "stopReason": stop, "usage": base}


# --- TV17 -------------------------------------------------------------------------------------


def test_tv17_anthropic_prompt_too_long() -> None:
    msg = error_message("prompt is too long: 213462 tokens > 200000 maximum")
    assert is_context_overflow(msg) is True


def test_tv17_throttling_error_prefix_is_excluded() -> None:
    # pi alone would say True ("too many tokens"); OpenClaw's exclusion list says False.
    text = "Throttling error: Too many tokens, please wait before trying again."
    assert is_overflow_error_text(text) is False
    assert is_context_overflow(error_message(text)) is False


def test_tv17_raw_throttling_exception_is_not_excluded() -> None:
    # Without the formatter's "Throttling error:" prefix the exclusion does not apply.
    text = "ThrottlingException: Too many tokens, please wait before trying again."
    assert is_overflow_error_text(text) is True


def test_tv17_cerebras_413_no_body() -> None:
    assert is_context_overflow(error_message("413 status code (no body)")) is True


def test_tv17_silent_overflow() -> None:
    msg = usage_message("stop", input=150000, cacheRead=60000, output=10)
    assert is_context_overflow(msg, 200000) is True


# --- one positive per pattern family ----------------------------------------------------------

FAMILIES = {
    "anthropic": "prompt is too long: 210000 tokens > 200000 maximum",
    "anthropic_request_too_large": '{"type":"error","error":{"type":"request_too_large"}}',
    "bedrock": "ValidationException: Input is too long for requested model.",
    "openai": "Your input exceeds the context window of this model.",
    "gemini": "The input token count (1200000) exceeds the maximum number of tokens allowed "
    "(1048576).",
    "xai": "This model's maximum prompt length is 131072 but the request contains 140000 tokens.",
    "groq": "Please reduce the length of the messages or completion.",
    "openrouter": "This endpoint's maximum context length is 128000 tokens. However, you "
    "requested about 130000 tokens.",
    "copilot": "prompt token count of 130000 exceeds the limit of 128000",
    "llamacpp": "the request exceeds the available context size, try increasing it",
    "lmstudio": "Trying to keep the first 9000 tokens when context the overflows. However, the "
    "model is loaded with context length of only 8192 tokens, which is not enough. Try to "
    "load the model with a larger context length, or provide a shorter input: 9000 is "
    "greater than the context length",
    "minimax": "invalid params, context window exceeds limit (2013)",
    "kimi": "Your request exceeded model token limit: 262144",
    "mistral": "Prompt contains 140000 tokens, too large for model with 131072 maximum context "
    "length",
    "zai": "model_context_window_exceeded",
    "litellm_of": "litellm.ContextWindowExceededError: This model's input exceeds the model's "
    "maximum context length of 8,192 tokens",
    "litellm_paren": "Request exceeds maximum context length (32768)",
    "poolside": "Input exceeds maximum allowed input length of 100,000 tokens",
    "together": "Input (140000 tokens) is longer than the model's context length (131072 tokens).",
    "zhipu": "tokens in request more than max tokens allowed",
    "ds4": "prompt has 9000 tokens, but the configured context size is 8192 tokens",
    "ollama": "prompt too long; exceeded max context length by 512 tokens",
    "ollama_short": "Prompt too long; exceeded context length",
    "generic_underscore": "Error code: 400 - {'error': {'code': 'context_length_exceeded'}}",
    "generic_space": "Context length exceeded for this request",
    "generic_too_many_tokens": "Too many tokens in request",
    "generic_token_limit": "Token limit exceeded",
    "cerebras_400": "400 (no body)",
    "cerebras_413_status": "413 status code (no body)",
}


@pytest.mark.parametrize("text", list(FAMILIES.values()), ids=list(FAMILIES))
def test_every_pattern_family_is_detected(text: str) -> None:
    assert is_overflow_error_text(text) is True
    assert is_overflow_error_text(text.upper()) is True  # case-insensitive


# --- exclusion list and negatives -------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        "Throttling error: prompt is too long",
        "throttling error: context length exceeded",
        "Service unavailable: too many tokens in flight, retry later",
        "Service Unavailable: prompt is too long",
        "429 rate limit reached: too many tokens per minute",
        "Rate limit exceeded (token limit exceeded for this minute)",
        "Too many requests: context_length_exceeded",
    ],
)
def test_exclusion_list_wins_over_patterns(text: str) -> None:
    assert is_overflow_error_text(text) is False


@pytest.mark.parametrize(
    "text",
    [
        "",
        "Internal server error",
        "overloaded_error: Overloaded",
        "Invalid API key provided",
        "model not found: gpt-9",
        "Connection reset by peer",
        "500 status code (no body)",  # Cerebras rule is 400/413 only
        "HTTP 413 status code (no body)",  # must start the message
        "Request timed out after 180s",
    ],
)
def test_ordinary_errors_are_not_overflow(text: str) -> None:
    assert is_overflow_error_text(text) is False


def test_error_text_only_counts_for_error_stop_reason() -> None:
    msg = {"stopReason": "stop", "errorMessage": "prompt is too long", "usage": {}}
    assert is_context_overflow(msg) is False
    assert is_context_overflow({"stopReason": "error"}) is False
    assert is_context_overflow({"stopReason": "error", "errorMessage": None}) is False


# --- usage-based cases ------------------------------------------------------------------------


def test_silent_overflow_needs_window_and_strictly_more() -> None:
    msg = usage_message("stop", input=150000, cacheRead=50000)
    assert is_context_overflow(msg, 200000) is False  # equal is not over
    assert is_context_overflow(usage_message("stop", input=200001), 200000) is True
    assert is_context_overflow(usage_message("stop", input=999999)) is False  # no window
    assert is_context_overflow(usage_message("stop", input=999999), 0) is False


def test_silent_overflow_only_for_stop() -> None:
    for stop in ("toolUse", "aborted", "error"):
        assert is_context_overflow(usage_message(stop, input=300000), 200000) is False


def test_context_usage_available_overrides_input() -> None:
    over = usage_message(
        "stop",
        input=10,
        cacheRead=0,
        contextUsage={"state": "available", "promptTokens": 200500, "totalTokens": 200600},
    )
    assert is_context_overflow(over, 200000) is True
    under = usage_message(
        "stop",
        input=250000,
        contextUsage={"state": "available", "promptTokens": 1000, "totalTokens": 1200},
    )
    assert is_context_overflow(under, 200000) is False


def test_context_usage_unavailable_means_unknown() -> None:
    msg = usage_message("stop", input=250000, contextUsage={"state": "unavailable"})
    assert prompt_tokens_from_usage(msg["usage"]) is None
    assert is_context_overflow(msg, 200000) is False


def test_length_with_zero_output_near_full_window() -> None:
    assert is_context_overflow(usage_message("length", input=198000, output=0), 200000) is True
    assert is_context_overflow(usage_message("length", input=197999, output=0), 200000) is False
    # Some output means the model had room; not an overflow.
    assert is_context_overflow(usage_message("length", input=199000, output=5), 200000) is False
    # Cache reads occupy the window too.
    msg = usage_message("length", input=1000, cacheRead=197500, output=0)
    assert is_context_overflow(msg, 200000) is True


def test_junk_usage_never_raises() -> None:
    assert is_context_overflow({"stopReason": "stop", "usage": "junk"}, 1000) is False
    assert is_context_overflow({"stopReason": "stop", "usage": {"input": "x"}}, 1000) is False
    assert is_context_overflow({"stopReason": "stop", "usage": {"input": True}}, 1000) is False
    assert is_context_overflow({"stopReason": "stop"}, 1000) is False
    assert prompt_tokens_from_usage({"input": 2.0, "cacheRead": float("nan")}) == 2
