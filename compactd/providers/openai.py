"""Summarizer for OpenAI-compatible chat completions (OpenAI, vLLM, llama.cpp, Ollama, LiteLLM).

One non-streaming ``POST {base_url}/chat/completions`` per attempt with a system message and
one user message (``SummaryRequest.user_prompt()``, spec §4.2), temperature 0 so a retried or
re-run compaction asks the same question the same way. Transport, deadline and status handling
live in ``compactd.providers.http``; retrying in ``compactd.providers.retry``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from compactd.providers.base import HttpSummarizer, token_count
from compactd.providers.http import CallTimeouts, HttpResult, raise_for_provider_status
from compactd.providers.retry import RetryPolicy
from pipeline.summarizer import (
    EmptySummaryError,
    OutputBudgetExhaustedError,
    SummaryRequest,
    SummaryUsage,
)

__all__ = ["OpenAISummarizer", "parse_chat_completion"]


def _content_text(content: Any) -> str:
    """``message.content`` as text: a string, or the text parts of a list joined by newlines."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [
            part["text"]
            for part in content
            if isinstance(part, dict)
            and part.get("type") in ("text", "output_text")
            and isinstance(part.get("text"), str)
        ]
        return "\n".join(parts)
    return ""


def parse_chat_completion(data: Mapping[str, Any], *, max_tokens: int) -> tuple[str, SummaryUsage]:
    """Summary text and usage from a chat completion body, or the error that explains why not.

    Usage is normalised the way pi does it, so that ``input + cache_read`` is the prompt size
    for every provider: ``input_tokens = prompt_tokens - cached_tokens``.
    """
    choices = data.get("choices")
    choice = choices[0] if isinstance(choices, list) and choices else {}
    if not isinstance(choice, dict):
        choice = {}
    message = choice.get("message")
    text = _content_text(message.get("content") if isinstance(message, dict) else None).strip()

    usage_raw = data.get("usage")
    usage = SummaryUsage()
    if isinstance(usage_raw, dict):
        details = usage_raw.get("prompt_tokens_details")
        cached = token_count(details.get("cached_tokens")) if isinstance(details, dict) else 0
        prompt_tokens = token_count(usage_raw.get("prompt_tokens"))
        usage = SummaryUsage(
            input_tokens=max(0, prompt_tokens - cached),
            output_tokens=token_count(usage_raw.get("completion_tokens")),
            cache_read_tokens=cached,
        )

    if not text:
        if choice.get("finish_reason") == "length":
            raise OutputBudgetExhaustedError(
                f"summary output budget ({max_tokens} tokens) was exhausted without visible text"
            )
        raise EmptySummaryError(
            f"the model returned no text (finish_reason={choice.get('finish_reason')!r})"
        )
    return text, usage


def _raise_for_embedded_error(
    data: Mapping[str, Any], result: HttpResult, provider: str, secrets: list[str], prompt: str
) -> None:
    """Some gateways (OpenRouter, LiteLLM) answer 200 with ``{"error": {...}}`` and no choices.

    Classify it like a status error: its ``code`` when that is an HTTP status, else as a 502.
    """
    error = data.get("error")
    if not error or data.get("choices"):
        return
    code = error.get("code") if isinstance(error, dict) else None
    status = code if isinstance(code, int) and 400 <= code <= 599 else 502
    raise_for_provider_status(
        HttpResult(status=status, headers=result.headers, body=result.body, elapsed=0.0),
        provider=provider,
        secrets=secrets,
        prompt=prompt,
    )


class OpenAISummarizer(HttpSummarizer):
    """``Summarizer`` over an OpenAI-compatible ``/chat/completions`` endpoint.

    ``max_output_tokens_cap`` is the model's own output limit (OpenClaw caps the budget at
    ``model.maxTokens``). ``max_tokens_field`` lets newer OpenAI models receive
    ``max_completion_tokens``; ``temperature=None`` omits the field for models that reject it.
    The API key is sent only as ``Authorization: Bearer`` and never appears in ``repr``,
    exceptions or logs.
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key: str | None = None,
        *,
        max_output_tokens_cap: int | None = None,
        timeouts: CallTimeouts | None = None,
        retry_policy: RetryPolicy | None = None,
        name: str = "openai",
        temperature: float | None = 0.0,
        max_tokens_field: Literal["max_tokens", "max_completion_tokens"] = "max_tokens",
        extra_headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(base_url, model, api_key, max_output_tokens_cap=max_output_tokens_cap,
                         timeouts=timeouts, retry_policy=retry_policy, name=name,
                         temperature=temperature, extra_headers=extra_headers)
        self.max_tokens_field = max_tokens_field

    @property
    def url(self) -> str:
        return f"{self.base_url}/chat/completions"

    def _headers(self) -> dict[str, str]:
        headers = dict(self._extra_headers)
        if self._api_key:
            headers["authorization"] = f"Bearer {self._api_key}"
        return headers

    def build_payload(self, request: SummaryRequest) -> dict[str, Any]:
        """The request body (public so tests and tools can inspect what would be sent)."""
        payload: dict[str, Any] = {
            "model": self.model,
            "messages": [
                {"role": "system", "content": request.system_prompt},
                {"role": "user", "content": request.user_prompt()},
            ],
            self.max_tokens_field: self._max_tokens(request),
            "stream": False,
        }
        if self.temperature is not None:
            payload["temperature"] = self.temperature
        return payload

    def parse(self, data: dict[str, Any], result: HttpResult, *, max_tokens: int,
              secrets: list[str], prompt: str) -> tuple[str, SummaryUsage]:
        _raise_for_embedded_error(data, result, self.name, secrets, prompt)
        return parse_chat_completion(data, max_tokens=max_tokens)
