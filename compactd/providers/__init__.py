"""LLM providers behind the ``pipeline.summarizer.Summarizer`` protocol.

Provider calls are side effects, so they live here at the edge and not in ``pipeline/``:
OpenAI-compatible chat completions, the Anthropic Messages API, one shared pooled HTTP client
per process with hard per-call deadlines, and the retry policy of spec §5.
"""

from compactd.providers.anthropic import AnthropicSummarizer
from compactd.providers.http import (
    CallTimeouts,
    close_shared_client,
    configure_shared_client,
    shared_client,
)
from compactd.providers.openai import OpenAISummarizer
from compactd.providers.retry import RetryPolicy, call_with_retry

__all__ = [
    "AnthropicSummarizer",
    "CallTimeouts",
    "OpenAISummarizer",
    "RetryPolicy",
    "call_with_retry",
    "close_shared_client",
    "configure_shared_client",
    "shared_client",
]
