"""Building the model fallback chain from settings (extractive is always the implicit last)."""

from __future__ import annotations

from compactd.providers import AnthropicSummarizer, CallTimeouts, OpenAISummarizer, RetryPolicy
from compactd.settings import CompactdSettings, ModelConfig
from pipeline.summarizer import Summarizer


def build_summarizer(config: ModelConfig, settings: CompactdSettings) -> Summarizer:
    key = config.api_key or settings.llm_api_key
    timeouts = CallTimeouts(connect=settings.timeouts.connect, read=settings.timeouts.read,
                            total=settings.timeouts.total)
    retry = RetryPolicy(attempts=settings.retry.attempts, min_wait=settings.retry.min_wait,
                        max_wait=settings.retry.max_wait, jitter=settings.retry.jitter)
    cls = OpenAISummarizer if config.summarizer == "openai" else AnthropicSummarizer
    return cls(config.base_url, config.model, key.get_secret_value() if key else None,
               max_output_tokens_cap=config.max_output_tokens, timeouts=timeouts,
               retry_policy=retry)


def build_chain(settings: CompactdSettings) -> list[Summarizer]:
    return [build_summarizer(config, settings) for config in settings.chain]
