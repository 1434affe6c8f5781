"""The one call every summarizer implements, and the errors it may raise.

A summarizer turns a rendered conversation slice (plus an optional previous summary and the
instruction text) into summary text. The HTTP summarizers send `SummaryRequest.user_prompt()`
as one user message under `system_prompt`; the offline extractive summarizer reads the same
fields directly. Keeping the request a plain value object means a Celery task can rebuild it
from stored inputs and a cache can key on it.
"""

from __future__ import annotations

import hashlib
import threading
from dataclasses import dataclass, field
from typing import Literal, Protocol, runtime_checkable

SummaryKind = Literal["history", "turn_prefix", "merge"]


@dataclass(frozen=True)
class SummaryUsage:
    """Token accounting reported by a provider (zeros for the extractive summarizer)."""

    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0

    def __add__(self, other: SummaryUsage) -> SummaryUsage:
        return SummaryUsage(
            self.input_tokens + other.input_tokens,
            self.output_tokens + other.output_tokens,
            self.cache_read_tokens + other.cache_read_tokens,
            self.cache_write_tokens + other.cache_write_tokens,
        )


@dataclass(frozen=True)
class SummaryRequest:
    """Everything a summarizer needs for one call.

    `conversation` is the rendered slice (see `pipeline.render`), `previous_summary` the summary
    being updated (if any), `instructions` the full instruction text (format, identifier policy,
    wrapped focus text, audit feedback). `max_output_tokens` is the output budget.
    """

    kind: SummaryKind
    system_prompt: str
    conversation: str
    instructions: str
    max_output_tokens: int
    previous_summary: str | None = None
    required_identifiers: tuple[str, ...] = ()
    latest_ask: str | None = None
    constraints: tuple[str, ...] = ()

    def user_prompt(self) -> str:
        """The single user message, laid out as pi lays it out (spec §4.2)."""
        parts = [f"<conversation>\n{self.conversation}\n</conversation>\n\n"]
        if self.previous_summary:
            parts.append(f"<previous-summary>\n{self.previous_summary}\n</previous-summary>\n\n")
        parts.append(self.instructions)
        return "".join(parts)

    def cache_key(self, model_id: str) -> str:
        """Content hash of the request and the model: identical inputs never pay twice."""
        h = hashlib.sha256()
        for part in (
            model_id,
            self.kind,
            self.system_prompt,
            self.conversation,
            self.previous_summary or "",
            self.instructions,
            str(self.max_output_tokens),
            "\x1f".join(self.required_identifiers),
            self.latest_ask or "",
            "\x1f".join(self.constraints),
        ):
            h.update(part.encode("utf-8"))
            h.update(b"\x00")
        return h.hexdigest()


@dataclass(frozen=True)
class SummaryResult:
    """Summary text plus who produced it and what it cost."""

    text: str
    summarizer: str
    model: str
    usage: SummaryUsage = field(default_factory=SummaryUsage)
    attempts: int = 1


class CancelToken:
    """Cooperative cancellation, checked between LLM calls and before retries."""

    def __init__(self) -> None:
        self._event = threading.Event()

    def cancel(self) -> None:
        self._event.set()

    @property
    def cancelled(self) -> bool:
        return self._event.is_set()


@runtime_checkable
class Summarizer(Protocol):
    """One call: rendered chunk + previous summary + instructions -> text + usage."""

    name: str
    model: str

    def summarize(
        self, request: SummaryRequest, *, cancel: CancelToken | None = None
    ) -> SummaryResult: ...


class SummarizerError(Exception):
    """Base class: the summarizer could not produce usable text."""


class TransientSummarizerError(SummarizerError):
    """Retryable (429, 5xx, connection reset). `retry_after` is seconds, if the server said."""

    def __init__(self, message: str, *, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class ContextOverflowError(SummarizerError):
    """The provider said the prompt is too large: re-plan smaller, never retry as is."""


class OutputBudgetExhaustedError(SummarizerError):
    """The output budget ran out before any visible text: retrying the same call cannot help."""


class EmptySummaryError(SummarizerError):
    """The provider answered with no text (or non-text only)."""


class SummarizerTimeoutError(SummarizerError):
    """A per-call deadline passed."""


class SummarizerCancelledError(SummarizerError):
    """The caller cancelled; never retried."""
