"""What both HTTP summarizers share: settings, output budget, and one retried POST per call.

A provider subclass only says where to post (`url`), with which headers and body, and how to
read the answer (`parse`); transport, deadlines, error mapping and retries are the same for
every provider and live here once.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from compactd.providers.http import (
    CallTimeouts,
    HttpResult,
    decode_json_object,
    post_json,
    raise_for_provider_status,
)
from compactd.providers.retry import RetryPolicy, call_with_retry
from pipeline.summarizer import CancelToken, SummaryRequest, SummaryResult, SummaryUsage


def token_count(value: Any) -> int:
    """A token count, leniently: providers and gateways send null, floats or nothing."""
    if isinstance(value, bool):
        return 0
    if isinstance(value, int):
        return max(0, value)
    if isinstance(value, float) and value == value and value >= 0:
        return int(value)
    return 0


class HttpSummarizer:
    """Base of the provider summarizers. The API key never appears in `repr` or errors."""

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key: str | None,
        *,
        max_output_tokens_cap: int | None,
        timeouts: CallTimeouts | None,
        retry_policy: RetryPolicy | None,
        name: str,
        temperature: float | None,
        extra_headers: Mapping[str, str] | None,
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
        self.max_output_tokens_cap = max_output_tokens_cap
        self.timeouts = timeouts or CallTimeouts()
        self.retry_policy = retry_policy or RetryPolicy()
        self.temperature = temperature
        self._api_key = api_key or None
        self._extra_headers = dict(extra_headers or {})

    def __repr__(self) -> str:
        key = "set" if self._api_key else "none"
        return (
            f"{type(self).__name__}(name={self.name!r}, base_url={self.base_url!r}, "
            f"model={self.model!r}, api_key={key})"
        )

    @property
    def url(self) -> str:
        raise NotImplementedError

    def _headers(self) -> dict[str, str]:
        raise NotImplementedError

    def build_payload(self, request: SummaryRequest) -> dict[str, Any]:
        """The request body (public so tests and tools can inspect what would be sent)."""
        raise NotImplementedError

    def parse(self, data: dict[str, Any], result: HttpResult, *, max_tokens: int,
              secrets: list[str], prompt: str) -> tuple[str, SummaryUsage]:
        """Summary text and usage from a decoded 200 body, or the error explaining why not."""
        raise NotImplementedError

    def _max_tokens(self, request: SummaryRequest) -> int:
        budget = request.max_output_tokens
        if self.max_output_tokens_cap is not None:
            budget = min(budget, self.max_output_tokens_cap)
        return max(1, budget)

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
            return self.parse(data, result, max_tokens=max_tokens, secrets=secrets, prompt=prompt)

        (text, usage), attempts = call_with_retry(
            attempt, policy=self.retry_policy, cancel=cancel, label=f"{self.name}:{self.model}"
        )
        return SummaryResult(
            text=text, summarizer=self.name, model=self.model, usage=usage, attempts=attempts
        )
