"""Summarizer for the Anthropic Messages API (and compatible gateways).

One non-streaming ``POST {base_url}/messages`` per attempt: the system prompt in ``system``,
one user message with ``SummaryRequest.user_prompt()`` (spec §4.2), temperature 0. The text
blocks of the answer are joined with ``\\n`` as pi does. Anthropic reports a too-long prompt as
400 "prompt is too long" (or 413 ``request_too_large``) and overload as 529; the shared status
mapping in ``compactd.providers.http`` handles both.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from compactd.providers.http import (
    CallTimeouts,
    decode_json_object,
    post_json,
    raise_for_provider_status,
)
from compactd.providers.retry import RetryPolicy, call_with_retry
from pipeline.summarizer import (
    CancelToken,
    EmptySummaryError,
    OutputBudgetExhaustedError,
    SummaryRequest,
    SummaryResult,
    SummaryUsage,
)

__all__ = ["AnthropicSummarizer", "parse_message"]


def _int(value: Any) -> int:
    """A token count, leniently: gateways send null, floats or nothing."""
    if isinstance(value, bool):
        return 0
    if isinstance(value, int):
        return max(0, value)
    if isinstance(value, float) and value == value and value >= 0:
        return int(value)
    return 0


def parse_message(data: Mapping[str, Any], *, max_tokens: int) -> tuple[str, SummaryUsage]:
    """Summary text and usage from a Messages API body, or the error that explains why not.

    Only ``text`` blocks count: thinking or tool blocks are not a summary. Anthropic's
    ``input_tokens`` already excludes cache reads and writes, so usage maps one to one.
    """
    content = data.get("content")
    blocks = content if isinstance(content, list) else []
    text = "\n".join(
        block["text"]
        for block in blocks
        if isinstance(block, dict)
        and block.get("type") == "text"
        and isinstance(block.get("text"), str)
    ).strip()

    usage_raw = data.get("usage")
    usage = SummaryUsage()
    if isinstance(usage_raw, dict):
        usage = SummaryUsage(
            input_tokens=_int(usage_raw.get("input_tokens")),
            output_tokens=_int(usage_raw.get("output_tokens")),
            cache_read_tokens=_int(usage_raw.get("cache_read_input_tokens")),
            cache_write_tokens=_int(usage_raw.get("cache_creation_input_tokens")),
        )

    if not text:
        stop_reason = data.get("stop_reason")
        if stop_reason == "max_tokens":
            raise OutputBudgetExhaustedError(
                f"summary output budget ({max_tokens} tokens) was exhausted without visible text"
            )
        raise EmptySummaryError(f"the model returned no text (stop_reason={stop_reason!r})")
    return text, usage


class AnthropicSummarizer:
    """``Summarizer`` over the Anthropic Messages API.

    ``base_url`` includes the version prefix (``https://api.anthropic.com/v1``). The key goes in
    ``x-api-key`` only when set (local gateways often need none) and never appears in ``repr``,
    exceptions or logs.
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key: str | None = None,
        api_version: str = "2023-06-01",
        *,
        max_output_tokens_cap: int | None = None,
        timeouts: CallTimeouts | None = None,
        retry_policy: RetryPolicy | None = None,
        name: str = "anthropic",
        temperature: float | None = 0.0,
        extra_headers: Mapping[str, str] | None = None,
    ) -> None:
        if not base_url:
            raise ValueError("base_url is required")
        if not model:
            raise ValueError("model is required")
        if max_output_tokens_cap is not None and max_output_tokens_cap < 1:
            raise ValueError("max_output_tokens_cap must be >= 1")
        self.name = name
        self.model = model
        self.base_url = base_url.rstrip("/")
        self.api_version = api_version
        self.max_output_tokens_cap = max_output_tokens_cap
        self.timeouts = timeouts or CallTimeouts()
        self.retry_policy = retry_policy or RetryPolicy()
        self.temperature = temperature
        self._api_key = api_key or None
        self._extra_headers = dict(extra_headers or {})

    def __repr__(self) -> str:
        key = "set" if self._api_key else "none"
        return (
            f"AnthropicSummarizer(name={self.name!r}, base_url={self.base_url!r}, "
            f"model={self.model!r}, api_version={self.api_version!r}, api_key={key})"
        )

    @property
    def url(self) -> str:
        return f"{self.base_url}/messages"

    def _max_tokens(self, request: SummaryRequest) -> int:
        budget = request.max_output_tokens
        if self.max_output_tokens_cap is not None:
            budget = min(budget, self.max_output_tokens_cap)
        return max(1, budget)

    def _headers(self) -> dict[str, str]:
        headers = dict(self._extra_headers)
        headers["anthropic-version"] = self.api_version
        headers["content-type"] = "application/json"
        if self._api_key:
            headers["x-api-key"] = self._api_key
        return headers

    def build_payload(self, request: SummaryRequest) -> dict[str, Any]:
        """The request body (public so tests and tools can inspect what would be sent)."""
        payload: dict[str, Any] = {
            "model": self.model,
            "max_tokens": self._max_tokens(request),
            "system": request.system_prompt,
            "messages": [{"role": "user", "content": request.user_prompt()}],
        }
        if self.temperature is not None:
            payload["temperature"] = self.temperature
        return payload

    def summarize(
        self, request: SummaryRequest, *, cancel: CancelToken | None = None
    ) -> SummaryResult:
        """One summary, retried per ``retry_policy``; raises the ``pipeline.summarizer`` errors."""
        payload = self.build_payload(request)
        max_tokens = self._max_tokens(request)
        headers = self._headers()
        secrets = [self._api_key] if self._api_key else []
        prompt = request.user_prompt()
        cancelled = (lambda: cancel.cancelled) if cancel is not None else None

        def attempt(deadline: float | None) -> tuple[str, SummaryUsage]:
            result = post_json(
                self.url,
                payload,
                headers=headers,
                timeouts=self.timeouts,
                provider=self.name,
                deadline=deadline,
                cancelled=cancelled,
            )
            raise_for_provider_status(result, provider=self.name, secrets=secrets, prompt=prompt)
            data = decode_json_object(result, provider=self.name, secrets=secrets, prompt=prompt)
            return parse_message(data, max_tokens=max_tokens)

        (text, usage), attempts = call_with_retry(
            attempt, policy=self.retry_policy, cancel=cancel, label=f"{self.name}:{self.model}"
        )
        return SummaryResult(
            text=text, summarizer=self.name, model=self.model, usage=usage, attempts=attempts
        )
