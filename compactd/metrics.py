"""Prometheus metrics for gateway and workers (one registry per process).

Labels are bounded on purpose: tenant ids (operators choose them), model names, states,
stages, fallback levels and audit reason *codes* (the part before the colon), never ids of
jobs or sessions and never text.
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import CONTENT_TYPE_LATEST as CONTENT_TYPE
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Histogram,
    generate_latest,
    start_http_server,
)

REGISTRY = CollectorRegistry(auto_describe=True)
_TOKENS = (1_000, 5_000, 10_000, 20_000, 50_000, 100_000, 150_000, 200_000, 500_000, 1_000_000)
_SECONDS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)

JOBS = Counter("compactd_jobs_total", "Compaction jobs by final state", ["state", "tenant"],
               registry=REGISTRY)
JOBS_SUBMITTED = Counter("compactd_jobs_submitted_total", "Jobs accepted by the gateway",
                         ["tenant", "trigger"], registry=REGISTRY)
STAGE_SECONDS = Histogram("compactd_stage_seconds", "Time spent per job stage", ["stage"],
                          buckets=_SECONDS, registry=REGISTRY)
LLM_CALLS = Counter("compactd_llm_calls_total", "Summarizer units by model and outcome",
                    ["model", "outcome"], registry=REGISTRY)
LLM_RETRIES = Counter("compactd_llm_retries_total", "Extra attempts (retries) by model",
                      ["model"], registry=REGISTRY)
TOKENS_BEFORE = Histogram("compactd_tokens_before", "Context tokens before compaction",
                          buckets=_TOKENS, registry=REGISTRY)
TOKENS_AFTER = Histogram("compactd_tokens_after", "Context tokens after compaction",
                         buckets=_TOKENS, registry=REGISTRY)
RATIO = Histogram("compactd_compaction_ratio", "tokensAfter / tokensBefore",
                  buckets=(0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0), registry=REGISTRY)
AUDIT_FAILURES = Counter("compactd_audit_failures_total", "Audit failures by reason code",
                         ["reason"], registry=REGISTRY)
FALLBACK = Counter("compactd_fallback_level_total", "Committed summaries by fallback level",
                   ["level"], registry=REGISTRY)
LEASE_CONFLICTS = Counter("compactd_lease_conflicts_total",
                          "Jobs that found the session lease taken", registry=REGISTRY)
CAS_RETRIES = Counter("compactd_cas_retries_total", "Compare-and-swap retries at commit",
                      registry=REGISTRY)
HTTP_REQUESTS = Counter("compactd_http_requests_total", "Gateway requests",
                        ["method", "route", "status"], registry=REGISTRY)


def reason_code(failure: str) -> str:
    """`missing_section:## Decisions` -> `missing_section` (bounded label values)."""
    return failure.split(":", 1)[0]


def record_audit_failures(failures: Iterable[Iterable[str]]) -> None:
    for attempt in failures:
        for failure in attempt:
            AUDIT_FAILURES.labels(reason_code(failure)).inc()


def render() -> bytes:
    return generate_latest(REGISTRY)


def serve(port: int, addr: str = "0.0.0.0") -> None:
    """Expose /metrics on its own port (workers have no HTTP server of their own)."""
    start_http_server(port, addr=addr, registry=REGISTRY)


__all__ = ["CONTENT_TYPE", "REGISTRY", "render", "serve"]
