"""Retry policy for one summarizer call (spec §5: attempts 3, 500 ms → 5000 ms, jitter 0.2).

What is retried, and why:

* ``TransientSummarizerError`` (429, 5xx, 529, refused or reset connections): the same request
  may well succeed in a moment. When the server sent Retry-After we wait
  ``max(backoff, retry_after)``, the server's value capped at ``max_retry_after`` so that one
  provider cannot park a worker thread for minutes (past the cap we still try once more; if
  it is still throttled the fallback chain one level up hands over to the next model).
* ``EmptySummaryError``: counts as a failure of the model and is retried at most
  ``empty_retries`` times (default 1). An empty answer is sometimes a provider hiccup (a
  filtered or thinking-only turn); a second empty answer at temperature 0 means this model will
  not do it, and burning the third attempt would only delay the next model in the chain.

Never retried (the outcome cannot change, or the caller asked us to stop):
``SummarizerCancelledError``, ``OutputBudgetExhaustedError``, ``ContextOverflowError`` (re-plan
smaller instead), ``SummarizerTimeoutError`` (OpenClaw does not retry transport timeouts: the
call already used its whole deadline, and the threads pool relies on that deadline being the
bound), plain ``SummarizerError`` (4xx: auth, bad request, unknown model) and any other
exception (a bug).

Cancellation is checked before every attempt and while waiting: the wait polls the
``CancelToken`` every ``CANCEL_POLL_SECONDS`` via tenacity's ``sleep`` hook, so a cancelled
job stops within ~50 ms instead of sleeping out a long Retry-After.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from tenacity import RetryCallState, Retrying

from pipeline.summarizer import (
    CancelToken,
    EmptySummaryError,
    SummarizerCancelledError,
    TransientSummarizerError,
)

__all__ = ["CANCEL_POLL_SECONDS", "RetryPolicy", "call_with_retry"]

logger = logging.getLogger("compactd.providers")

T = TypeVar("T")

CANCEL_POLL_SECONDS = 0.05


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how patiently one summarizer call is retried.

    ``attempts`` counts the first call. Waits grow ``min_wait × 2^(n-1)`` up to ``max_wait``,
    scaled by ``1 ± U(0, jitter)`` and clamped to ``[min_wait, max_wait]`` (OpenClaw's
    ``computeBackoff``). ``budget``, when set, bounds the whole call: attempts get at most the
    remaining budget as their deadline and no wait starts that would end past it.
    """

    attempts: int = 3
    min_wait: float = 0.5
    max_wait: float = 5.0
    jitter: float = 0.2
    max_retry_after: float = 30.0
    empty_retries: int = 1
    budget: float | None = None

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError("RetryPolicy.attempts must be >= 1")
        if self.min_wait < 0 or self.max_wait < self.min_wait:
            raise ValueError("RetryPolicy needs 0 <= min_wait <= max_wait")
        if not 0 <= self.jitter < 1:
            raise ValueError("RetryPolicy.jitter must be in [0, 1)")
        if self.max_retry_after < 0 or self.empty_retries < 0:
            raise ValueError("RetryPolicy.max_retry_after and empty_retries must be >= 0")
        if self.budget is not None and self.budget <= 0:
            raise ValueError("RetryPolicy.budget must be > 0")

    def backoff(self, retry_number: int, rng: random.Random | None = None) -> float:
        """Jittered exponential wait before retry ``retry_number`` (1 = the first retry)."""
        base = min(self.min_wait * 2.0 ** max(0, retry_number - 1), self.max_wait)
        factor = 1.0 + (rng or random).uniform(-self.jitter, self.jitter)
        return min(max(base * factor, self.min_wait), self.max_wait)

    def wait_before(
        self, retry_number: int, retry_after: float | None, rng: random.Random | None = None
    ) -> float:
        """Backoff, raised to the server's Retry-After (capped at ``max_retry_after``)."""
        wait = self.backoff(retry_number, rng)
        if retry_after is not None and retry_after > 0:
            wait = max(wait, min(retry_after, self.max_retry_after))
        return wait


def _interruptible_sleep(cancel: CancelToken | None) -> Callable[[float], None]:
    def sleep(seconds: float) -> None:
        end = time.monotonic() + seconds
        while True:
            if cancel is not None and cancel.cancelled:
                raise SummarizerCancelledError("cancelled while waiting to retry")
            remaining = end - time.monotonic()
            if remaining <= 0:
                return
            time.sleep(min(remaining, CANCEL_POLL_SECONDS) if cancel is not None else remaining)

    return sleep


def call_with_retry(
    attempt: Callable[[float | None], T],
    *,
    policy: RetryPolicy,
    cancel: CancelToken | None = None,
    label: str = "summarizer call",
) -> tuple[T, int]:
    """Run ``attempt`` under ``policy``; return its value and the number of attempts made.

    ``attempt`` receives the absolute ``time.monotonic()`` deadline imposed by
    ``policy.budget`` (``None`` without a budget); it should raise the ``pipeline.summarizer``
    errors. The last error is re-raised unchanged when retries run out.
    """
    started = time.monotonic()
    budget_end = None if policy.budget is None else started + policy.budget
    attempts = 0
    empties = 0

    def one() -> T:
        nonlocal attempts
        if cancel is not None and cancel.cancelled:
            raise SummarizerCancelledError("cancelled before the call")
        attempts += 1
        return attempt(budget_end)

    def should_retry(state: RetryCallState) -> bool:
        nonlocal empties
        outcome = state.outcome
        if outcome is None or not outcome.failed:
            return False
        exc = outcome.exception()
        if isinstance(exc, EmptySummaryError):
            empties += 1
            return empties <= policy.empty_retries
        return isinstance(exc, TransientSummarizerError)

    def wait(state: RetryCallState) -> float:
        exc = state.outcome.exception() if state.outcome is not None else None
        retry_after = exc.retry_after if isinstance(exc, TransientSummarizerError) else None
        return policy.wait_before(state.attempt_number, retry_after)

    def stop(state: RetryCallState) -> bool:
        if state.attempt_number >= policy.attempts:
            return True
        return budget_end is not None and time.monotonic() + state.upcoming_sleep >= budget_end

    def log_retry(state: RetryCallState) -> None:
        exc = state.outcome.exception() if state.outcome is not None else None
        # Our error texts are already scrubbed (no keys, no prompt text).
        logger.warning(
            "%s failed (attempt %d/%d): %s: %s; retrying in %.2fs",
            label,
            state.attempt_number,
            policy.attempts,
            type(exc).__name__,
            exc,
            state.upcoming_sleep,
        )

    retrying = Retrying(
        stop=stop,
        wait=wait,
        retry=should_retry,
        sleep=_interruptible_sleep(cancel),
        before_sleep=log_retry,
        reraise=True,
    )
    value = retrying(one)
    return value, attempts
