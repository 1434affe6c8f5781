"""Token estimates and the trigger (spec §2.1, §2.3; TV1, TV2)."""

from __future__ import annotations

from typing import Any

import pytest

from pipeline.prepare import prepare_compaction
from pipeline.settings import PlanSettings
from pipeline.tokens import (
    estimate_context_tokens,
    estimate_tokens,
    message_chars,
    usage_tokens,
    weighted_chars,
)
from pipeline.transcript import parse_transcript
from pipeline.trigger import effective_reserve, should_compact
from tests.support.builders import SessionBuilder


def assistant(
    *blocks: dict[str, Any], usage: dict[str, Any] | None = None, stop: str = "stop"
) -> dict[str, Any]:
    msg: dict[str, Any] = {"role": "assistant", "content": list(blocks), "stopReason": stop}
    if usage is not None:
        msg["usage"] = usage
    return msg


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


# --- TV1 --------------------------------------------------------------------------------------


def test_tv1_should_compact_pi_reserve() -> None:
    assert should_compact(183617, 200000, 16384) is True
    assert should_compact(183616, 200000, 16384) is False  # strict >
    assert should_compact(183617, 200000, 16384, enabled=False) is False
    assert should_compact(10**9, 0, 16384) is False  # OpenClaw: window 0 -> never
    assert should_compact(95000, 100000, 10000) is True
    assert should_compact(89000, 100000, 10000) is False


def test_tv1_with_effective_reserve() -> None:
    # Our default raises pi's 16384 to the 20000 floor on a 200k window: threshold 180000.
    reserve = effective_reserve(16384, 200000)
    assert reserve == 20000
    assert should_compact(180001, 200000, reserve) is True
    assert should_compact(180000, 200000, reserve) is False
    assert should_compact(183616, 200000, reserve) is True  # would not trigger at 16384


def _usage_session(total: int) -> list[Any]:
    b = SessionBuilder()
    b.user("hi")
    b.assistant("done", usage=total)
    return parse_transcript(b.to_bytes()).path()


@pytest.mark.parametrize(
    ("tokens", "floor", "expected"),
    [
        (183617, 0, True),
        (183616, 0, False),  # pi: reserve 16384, floor disabled
        (180001, 20000, True),
        (180000, 20000, False),  # ours: floor 20000
    ],
)
def test_prepare_uses_effective_reserve(tokens: int, floor: int, expected: bool) -> None:
    settings = PlanSettings(
        reserve_tokens=16384, reserve_floor=floor, context_window=200000, keep_recent_tokens=1
    )
    prep = prepare_compaction(_usage_session(tokens), settings)
    assert prep is not None
    assert prep.tokens_before == tokens
    assert prep.reserve_tokens == (16384 if floor == 0 else 20000)
    assert prep.should_compact is expected


# --- effective reserve ------------------------------------------------------------------------


def test_effective_reserve_examples() -> None:
    assert effective_reserve(2048, 16384) == 8384  # floor capped to leave 8000 for the prompt
    assert effective_reserve(16384, 200000) == 20000
    assert effective_reserve(16384, 200000, floor=0) == 16384  # floor 0 disables it
    assert effective_reserve(30000, 200000) == 30000  # above the floor: unchanged
    assert effective_reserve(1000, 10000) == 5000  # min prompt = floor(10000 * 0.5)
    assert effective_reserve(2048, 0) == 2048


# --- TV2 --------------------------------------------------------------------------------------


def test_tv2_pi_column() -> None:
    assert estimate_tokens(user("hello world")) == 3
    call = {"type": "toolCall", "id": "c1", "name": "read", "arguments": {"path": "a.txt"}}
    assert message_chars(assistant(call)) == 4 + 16
    assert estimate_tokens(assistant(call)) == 5
    image_result = {
        "role": "toolResult",
        "toolCallId": "c1",
        "content": [{"type": "image", "data": "AAAA", "mimeType": "image/png"}],
    }
    assert estimate_tokens(image_result) == 1200


def test_tv2_cjk_is_weighted() -> None:
    assert weighted_chars("你好世界") == 16
    assert estimate_tokens(user("你好世界")) == 4
    # Kana, hangul and fullwidth forms are weighted too; an Extension-B character counts once.
    assert weighted_chars("カナ") == 8 and weighted_chars("한") == 4 and weighted_chars("Ａ") == 4
    assert weighted_chars("\U00020000") == 4


def test_emoji_counts_as_two_utf16_units() -> None:
    assert weighted_chars("😀") == 2
    assert weighted_chars("a😀b") == 4
    # Python's len() would say 3 characters -> 1 token; JavaScript says 6 units -> 2 tokens.
    assert estimate_tokens(user("😀😀😀")) == 2
    assert weighted_chars("é") == 1


def test_estimate_per_role() -> None:
    thinking = {"type": "thinking", "thinking": "t" * 8}
    text = {"type": "text", "text": "x" * 4}
    assert estimate_tokens(assistant(thinking, text)) == 3
    user_blocks = {
        "role": "user",
        "content": [{"type": "text", "text": "abcd"}, {"type": "image", "data": "Z" * 9000}],
    }
    assert estimate_tokens(user_blocks) == 1  # pi: user images cost nothing
    custom = {
        "role": "custom",
        "customType": "x",
        "content": [{"type": "text", "text": "abcd"}, {"type": "image", "data": ""}],
    }
    assert estimate_tokens(custom) == 1 + 1200
    bash = {"role": "bashExecution", "command": "ls", "output": "a.txt\n"}
    assert estimate_tokens(bash) == 2
    assert estimate_tokens({"role": "compactionSummary", "summary": "s" * 9}) == 3
    assert estimate_tokens({"role": "branchSummary", "summary": "s" * 4}) == 1
    assert estimate_tokens({"role": "futureRole", "content": "x" * 100}) == 0
    assert estimate_tokens(user("")) == 0


# --- estimate_context_tokens --------------------------------------------------------------------


def test_context_tokens_usage_base_plus_trailing() -> None:
    messages = [
        user("x" * 400),
        assistant({"type": "text", "text": "y" * 40}, usage={"totalTokens": 5000}),
        user("z" * 40),
        {"role": "toolResult", "toolCallId": "c", "content": [{"type": "text", "text": "w" * 8}]},
    ]
    est = estimate_context_tokens(messages)
    assert (est.tokens, est.usage_tokens, est.trailing_tokens, est.last_usage_index) == (
        5012,
        5000,
        12,
        1,
    )


def test_usage_without_total_sums_parts() -> None:
    usage = {"input": 100, "output": 20, "cacheRead": 3000, "cacheWrite": 4, "totalTokens": 0}
    assert usage_tokens(usage) == 3124
    est = estimate_context_tokens([assistant(usage=usage)])
    assert est.tokens == 3124


@pytest.mark.parametrize("stop", ["aborted", "error"])
def test_aborted_and_error_usage_ignored(stop: str) -> None:
    messages = [
        user("x" * 400),
        assistant({"type": "text", "text": "a"}, usage={"totalTokens": 700}),
        user("y" * 40),
        assistant({"type": "text", "text": "b" * 4}, usage={"totalTokens": 99999}, stop=stop),
    ]
    est = estimate_context_tokens(messages)
    assert est.usage_tokens == 700 and est.last_usage_index == 1
    assert est.tokens == 700 + 10 + 1


def test_no_usage_sums_estimates() -> None:
    messages = [user("x" * 400), assistant({"type": "text", "text": "y" * 800})]
    est = estimate_context_tokens(messages)
    assert (est.tokens, est.usage_tokens, est.last_usage_index) == (300, 0, None)
    assert estimate_context_tokens([]).tokens == 0
