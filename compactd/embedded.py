"""The embedded runner: one process, chunks summarized in a thread pool, same engine steps.

`compact_transcript` plans, summarizes (in parallel), merges, audits and builds the entry;
the caller decides where the result goes (a new file, or the same object by CAS).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from pipeline.commit import SnapshotFacts, snapshot_facts
from pipeline.engine import (
    CompactionFailed,
    CompactionJob,
    FinalSummary,
    UnitOutcome,
    compaction_entry,
    elapsed_ms,
    is_effective,
    prepare_job,
    run_job,
    tokens_after,
)
from pipeline.plan import plan_transcript
from pipeline.settings import PlanSettings, SummarySettings
from pipeline.summarizer import CancelToken, Summarizer, SummaryRequest
from pipeline.transcript import Entry, Transcript


@dataclass(slots=True)
class CompactResult:
    """What `compactd compact --json` prints."""

    status: str
    reason: str = ""
    compaction_entry_id: str | None = None
    first_kept_entry_id: str | None = None
    tokens_before: int = 0
    tokens_after: int = 0
    chunks: int = 0
    audit_passed: bool = False
    audit_failures: list[str] = field(default_factory=list)
    fallback_level: str | None = None
    summarizer: str | None = None
    model: str | None = None
    elapsed_ms: float = 0.0
    compaction_id: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "status": self.status, "reason": self.reason,
            "compactionId": self.compaction_id,
            "compactionEntryId": self.compaction_entry_id,
            "firstKeptEntryId": self.first_kept_entry_id,
            "tokensBefore": self.tokens_before, "tokensAfter": self.tokens_after,
            "chunks": self.chunks, "auditPassed": self.audit_passed,
            "auditFailures": self.audit_failures, "fallbackLevel": self.fallback_level,
            "summarizer": self.summarizer, "model": self.model, "elapsedMs": self.elapsed_ms,
        }


@dataclass(slots=True)
class Compaction:
    """A finished compaction ready to commit."""

    result: CompactResult
    entry: dict[str, Any] | None = None
    facts: SnapshotFacts | None = None
    job: CompactionJob | None = None
    final: FinalSummary | None = None
    outcomes: list[UnitOutcome] = field(default_factory=list)


Progress = Callable[[str, int, int], None]


def _thread_map(workers: int, progress: Progress | None) -> Any:
    def map_fn(fn: Callable[[SummaryRequest], UnitOutcome],
               items: Sequence[SummaryRequest]) -> list[UnitOutcome]:
        if not items:
            return []
        done = 0
        results: list[UnitOutcome | None] = [None] * len(items)
        with ThreadPoolExecutor(max_workers=max(1, min(workers, len(items)))) as pool:
            futures = {pool.submit(fn, item): index for index, item in enumerate(items)}
            for future in futures:
                results[futures[future]] = future.result()
                done += 1
                if progress:
                    progress("summarizing", done, len(items))
        return [r for r in results if r is not None]
    return map_fn


def compact_transcript(transcript: Transcript, chain: Sequence[Summarizer], *,
                       plan_settings: PlanSettings, summary_settings: SummarySettings,
                       leaf_id: str | None = None, if_needed: bool = False,
                       compaction_id: str | None = None, cancel: CancelToken | None = None,
                       workers: int = 16, progress: Progress | None = None,
                       model_max_output: int | None = None) -> Compaction:
    started = time.perf_counter()
    plan = plan_transcript(transcript, plan_settings, leaf_id)
    prep = plan.preparation
    if prep is None or plan.chunks is None:
        return Compaction(CompactResult("skipped", "nothing to compact (empty branch or the "
                                        "leaf is already a compaction)",
                                        elapsed_ms=elapsed_ms(started)))
    base = CompactResult("skipped", first_kept_entry_id=prep.first_kept_entry_id,
                         tokens_before=prep.tokens_before, chunks=len(plan.chunks.chunks))
    if prep.nothing_to_summarize:
        base.reason = "nothing to summarize: everything fits in the kept recent history"
        base.elapsed_ms = elapsed_ms(started)
        return Compaction(base)
    if if_needed and not prep.should_compact:
        base.reason = (f"below the trigger: {prep.tokens_before} tokens <= window "
                       f"{plan_settings.context_window} - reserve {prep.reserve_tokens}")
        base.elapsed_ms = elapsed_ms(started)
        return Compaction(base)

    job = prepare_job(plan, plan_settings, summary_settings, compaction_id=compaction_id,
                      model_max_output=model_max_output)
    if progress:
        progress("summarizing", 0, len(job.chunk_messages) + (1 if job.prefix_request else 0))
    try:
        final, outcomes = run_job(job, chain, cancel, _thread_map(workers, progress))
    except CompactionFailed as exc:
        base.status = "failed"
        base.reason = str(exc)
        base.audit_failures = list(exc.audit.failures) if exc.audit else []
        base.compaction_id = job.compaction_id
        base.elapsed_ms = elapsed_ms(started)
        return Compaction(base, job=job)

    entry_id = transcript.new_id(seed=job.compaction_id)
    entry = compaction_entry(job, final, entry_id=entry_id, parent_id=prep.leaf_id,
                             chunk_count=len(plan.chunks.chunks))
    after = tokens_after([*prep.path, Entry(data=entry)])
    entry["details"]["compactd"]["tokensAfter"] = after
    effective = is_effective(after, plan_settings, prep.reserve_tokens)
    facts = snapshot_facts(transcript, job.compaction_id, prep.first_kept_entry_id,
                           prep.summarized_entry_ids(),
                           prep.previous_compaction.id if prep.previous_compaction else None)
    result = CompactResult(
        "compacted" if effective else "ineffective",
        "" if effective else "the compacted context is still above the trigger",
        entry_id, prep.first_kept_entry_id, prep.tokens_before, after,
        len(plan.chunks.chunks), final.audit.passed, list(final.audit.failures),
        final.fallback_level, final.summarizer, final.model, elapsed_ms(started),
        job.compaction_id,
    )
    return Compaction(result, entry, facts, job, final, outcomes)
