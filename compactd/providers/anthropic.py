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

from compactd.providers.base import HttpSummarizer, token_count
from compactd.providers.http import CallTimeouts, HttpResult
from compactd.providers.retry import RetryPolicy
from pipeline.summarizer import (
    EmptySummaryError,
    OutputBudgetExhaustedError,
    SummaryRequest,
    SummaryUsage,
)

__all__ = ["AnthropicSummarizer", "parse_message"]


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
            input_tokens=token_count(usage_raw.get("input_tokens")),
            output_tokens=token_count(usage_raw.get("output_tokens")),
            cache_read_tokens=token_count(usage_raw.get("cache_read_input_tokens")),
            cache_write_tokens=token_count(usage_raw.get("cache_creation_input_tokens")),
        )

    if not text:
        stop_reason = data.get("stop_reason")
        if stop_reason == "max_tokens":
            raise OutputBudgetExhaustedError(
                f"summary output budget ({max_tokens} tokens) was exhausted without visible text"
            )
        raise EmptySummaryError(f"the model returned no text (stop_reason={stop_reason!r})")
    return text, usage


class AnthropicSummarizer(HttpSummarizer):
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
        super().__init__(base_url, model, api_key, max_output_tokens_cap=max_output_tokens_cap,
                         timeouts=timeouts, retry_policy=retry_policy, name=name,
                         temperature=temperature, extra_headers=extra_headers)
        self.api_version = api_version

    @property
    def url(self) -> str:
        return f"{self.base_url}/messages"

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

    def parse(self, data: dict[str, Any], result: HttpResult, *, max_tokens: int,
              secrets: list[str], prompt: str) -> tuple[str, SummaryUsage]:
        return parse_message(data, max_tokens=max_tokens)
