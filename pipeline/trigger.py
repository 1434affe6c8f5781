"""When to compact: the threshold rule and the reserve floor.

The trigger is pi's strict `contextTokens > window - reserve`. Like OpenClaw we raise the
reserve to a floor of 20000 tokens, because pi's 16384 leaves too little room for the summary
call on large windows, but never so far that a small window has no room for the prompt.
"""

from __future__ import annotations

import math

DEFAULT_RESERVE_TOKENS = 16384
RESERVE_TOKENS_FLOOR = 20000
MIN_PROMPT_BUDGET_TOKENS = 8000
MIN_PROMPT_BUDGET_RATIO = 0.5


def effective_reserve(reserve_tokens: int, context_window: int,
                      floor: int = RESERVE_TOKENS_FLOOR) -> int:
    """The configured reserve raised to the floor, the floor capped to leave a prompt budget.

    Example (spec §2.3): window 16384, reserve 2048 -> 8384.
    """
    if floor <= 0 or context_window <= 0:
        return reserve_tokens
    min_prompt = min(MIN_PROMPT_BUDGET_TOKENS, math.floor(context_window * MIN_PROMPT_BUDGET_RATIO))
    capped_floor = max(0, min(floor, context_window - min_prompt))
    return max(reserve_tokens, capped_floor)


def should_compact(context_tokens: int, context_window: int, reserve_tokens: int,
                   *, enabled: bool = True) -> bool:
    """pi's `shouldCompact` (strict `>`); false for a missing or non-positive window."""
    if not enabled or not math.isfinite(context_window) or context_window <= 0:
        return False
    return context_tokens > context_window - reserve_tokens
