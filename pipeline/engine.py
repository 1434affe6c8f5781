"""The compaction steps both runners execute: prepare inputs, summarize units, finish, entry.

`prepare_job` turns a plan into summary requests (one per chunk, plus the turn prefix).
`summarize_unit` runs one request down the model chain (each model retries transient errors
itself; an overflow splits the request in two). `finish` merges, audits with feedback and walks
the fallback levels — full, without oversized messages, partial, extractive — and never returns
a summary that failed the audit. The embedded runner calls these in a thread pool; the Celery
runner calls `summarize_unit` in chord header tasks and `finish` in the chord callback.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

from pipeline.assemble import assemble_summary, tool_failures
from pipeline.audit import AuditContext, AuditResult, audit_summary
from pipeline.constraints import constraints_from_summary, extract_constraints, merge_register
from pipeline.context import ContextMessage, build_session_context
from pipeline.extractive import ExtractiveSummarizer, parse_rendered
from pipeline.identifiers import extract_identifiers
from pipeline.plan import Plan
from pipeline.prepare import latest_user_text
from pipeline.prompts import (
    PromptContext,
    chunk_request,
    history_request,
    merge_request,
    turn_prefix_request,
)
from pipeline.render import render_messages
from pipeline.settings import PlanSettings, SummarySettings
from pipeline.summarizer import (
    CancelToken,
    ContextOverflowError,
    Summarizer,
    SummarizerCancelledError,
    SummarizerError,
    SummaryRequest,
    SummaryUsage,
)
from pipeline.tokens import estimate_tokens
from pipeline.transcript import Entry
from pipeline.trigger import should_compact

FallbackLevel = Literal["full", "without_oversized", "partial", "extractive"]
FALLBACK_LEVELS: tuple[FallbackLevel, ...] = ("full", "without_oversized", "partial",
                                              "extractive")
IDENTIFIER_WINDOW_MESSAGES = 10
MAX_OVERFLOW_SPLITS = 2
EXTRACTIVE = ExtractiveSummarizer()


class CompactionFailed(Exception):
    """No level produced a summary that passed the audit: nothing may be committed."""

    def __init__(self, message: str, audit: AuditResult | None = None) -> None:
        super().__init__(message)
        self.audit = audit


@dataclass(slots=True)
class CompactionJob:
    """Everything deterministic about one compaction, derived from its plan."""

    plan: Plan
    plan_settings: PlanSettings
    settings: SummarySettings
    compaction_id: str
    prompt: PromptContext
    audit: AuditContext
    register: tuple[str, ...]
    chunk_messages: list[list[ContextMessage]]
    prefix_request: SummaryRequest | None

    @property
    def multi_chunk(self) -> bool:
        return len(self.chunk_messages) > 1

    def chunk_requests(self, omit: frozenset[str] = frozenset()) -> list[SummaryRequest]:
        total = len(self.chunk_messages)
        return [
            chunk_request(_render(msgs, omit), index, total, self.prompt)
            for index, msgs in enumerate(self.chunk_messages, start=1)
        ]

    def final_request(self, partials: Sequence[str], feedback: Sequence[str] = (),
                      omit: frozenset[str] = frozenset()) -> SummaryRequest:
        """The merge of partial summaries, or the single history request when not fanned out."""
        ctx = _with_feedback(self.prompt, feedback)
        previous = self.plan.preparation.previous_summary if self.plan.preparation else None
        if self.multi_chunk:
            return merge_request(partials, previous, ctx)
        messages = self.chunk_messages[0] if self.chunk_messages else []
        return history_request(_render(messages, omit) or "(no earlier messages)", previous, ctx)


def _render(messages: Sequence[ContextMessage], omit: frozenset[str] = frozenset()) -> str:
    return render_messages(m.message for m in messages if m.entry_id not in omit)


def _with_feedback(ctx: PromptContext, feedback: Sequence[str]) -> PromptContext:
    return PromptContext(ctx.settings, ctx.reserve_tokens, ctx.model_max_output,
                         ctx.required_identifiers, ctx.latest_ask, ctx.constraints,
                         tuple(feedback))


def _user_texts(entries: Sequence[Entry]) -> list[str]:
    texts: list[str] = []
    for entry in entries:
        message = entry.message
        if message is None or message.get("role") != "user":
            continue
        content = message.get("content")
        if isinstance(content, str):
            texts.append(content)
        else:
            texts.append("\n".join(str(b.get("text", "")) for b in content or []
                                   if isinstance(b, dict) and b.get("type") == "text"))
    return [t for t in texts if t.strip()]


def prepare_job(plan: Plan, plan_settings: PlanSettings, settings: SummarySettings, *,
                compaction_id: str | None = None,
                model_max_output: int | None = None) -> CompactionJob:
    """Derive requests, audit expectations and the constraint register from a plan."""
    prep = plan.preparation
    if prep is None or plan.chunks is None:
        raise ValueError("nothing to compact: the plan has no preparation")
    summarized = prep.history + prep.turn_prefix
    window = summarized[-IDENTIFIER_WINDOW_MESSAGES:]
    identifiers = tuple(extract_identifiers(render_messages(m.message for m in window)))
    latest = latest_user_text(prep.turn_prefix if prep.is_split_turn else prep.history)
    summarized_users = _user_texts([prep.path[i] for i in range(len(prep.path))
                                    if prep.path[i].id in set(prep.summarized_entry_ids())])
    previous = prep.previous_summary or ""
    register = tuple(merge_register(constraints_from_summary(previous),
                                    extract_constraints(summarized_users)))
    strict = settings.identifier_policy == "strict"
    prompt = PromptContext(settings, prep.reserve_tokens, model_max_output,
                           identifiers if strict else (), latest, register)
    audit = AuditContext(identifiers, latest, tuple(_user_texts(prep.path)), register, strict)
    chunk_messages = [chunk.messages for chunk in plan.chunks.chunks]
    prefix = (turn_prefix_request(_render(prep.turn_prefix), prompt)
              if prep.turn_prefix else None)
    return CompactionJob(plan, plan_settings, settings, compaction_id or uuid.uuid4().hex,
                         prompt, audit, register, chunk_messages, prefix)


# --- one unit down the chain --------------------------------------------------------------------


@dataclass(slots=True)
class UnitOutcome:
    ok: bool
    text: str = ""
    summarizer: str = ""
    model: str = ""
    usage: SummaryUsage = field(default_factory=SummaryUsage)
    attempts: int = 0
    error: str | None = None
    overflow_splits: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "summarizer": self.summarizer, "model": self.model,
                "attempts": self.attempts, "error": self.error,
                "overflowSplits": self.overflow_splits,
                "usage": {"input": self.usage.input_tokens, "output": self.usage.output_tokens,
                          "cacheRead": self.usage.cache_read_tokens,
                          "cacheWrite": self.usage.cache_write_tokens}}


def split_request(request: SummaryRequest) -> tuple[SummaryRequest, SummaryRequest] | None:
    """Halve a request's conversation at a message boundary (None if it cannot be split)."""
    turns = parse_rendered(request.conversation)
    if len(turns) < 2:
        return None
    middle = len(turns) // 2
    for offset in range(len(turns) // 2):
        for candidate in (middle + offset, middle - offset):
            if 0 < candidate < len(turns) and turns[candidate].role in ("User", "Assistant"):
                middle = candidate
                break
        else:
            continue
        break

    def part(selected: Sequence[Any]) -> SummaryRequest:
        text = "\n\n".join(f"[{t.role}]: {t.text}" for t in selected)
        return SummaryRequest(request.kind, request.system_prompt, text, request.instructions,
                              request.max_output_tokens, request.previous_summary,
                              request.required_identifiers, request.latest_ask,
                              request.constraints)

    return part(turns[:middle]), part(turns[middle:])


def summarize_unit(request: SummaryRequest, chain: Sequence[Summarizer],
                   cancel: CancelToken | None = None, depth: int = 0) -> UnitOutcome:
    """Try each model in order; an overflow halves the input and tries again (bounded)."""
    errors: list[str] = []
    attempts = 0
    for summarizer in chain:
        if cancel is not None and cancel.cancelled:
            raise SummarizerCancelledError("compaction cancelled")
        try:
            result = summarizer.summarize(request, cancel=cancel)
        except SummarizerCancelledError:
            raise
        except ContextOverflowError as exc:
            attempts += 1
            halves = split_request(request) if depth < MAX_OVERFLOW_SPLITS else None
            if halves is None:
                errors.append(f"{summarizer.model}: overflow ({exc})")
                continue
            outcomes = [summarize_unit(h, chain, cancel, depth + 1) for h in halves]
            if all(o.ok for o in outcomes):
                return UnitOutcome(True, "\n\n".join(o.text for o in outcomes),
                                   outcomes[-1].summarizer, outcomes[-1].model,
                                   outcomes[0].usage + outcomes[1].usage,
                                   attempts + sum(o.attempts for o in outcomes),
                                   overflow_splits=1 + sum(o.overflow_splits for o in outcomes))
            errors.append(f"{summarizer.model}: overflow, split parts failed")
            continue
        except SummarizerError as exc:
            attempts += 1
            errors.append(f"{summarizer.model}: {type(exc).__name__}: {exc}")
            continue
        attempts += result.attempts
        if not result.text.strip():
            errors.append(f"{summarizer.model}: empty summary")
            continue
        return UnitOutcome(True, result.text, result.summarizer, result.model, result.usage,
                           attempts)
    return UnitOutcome(False, attempts=attempts, error="; ".join(errors)[-2000:] or "no models")


# --- finishing: merge, audit, fallbacks ------------------------------------------------------


@dataclass(slots=True)
class FinalSummary:
    text: str
    audit: AuditResult
    fallback_level: FallbackLevel
    summarizer: str
    model: str
    audit_attempts: int
    notes: list[str]
    usage: SummaryUsage
    failed_audits: list[list[str]] = field(default_factory=list)


def _assemble(job: CompactionJob, body: str, prefix_text: str | None,
              notes: Sequence[str]) -> str:
    prep = job.plan.preparation
    assert prep is not None
    messages = [m.message for m in prep.history + prep.turn_prefix]
    return assemble_summary(
        body, register=job.register, turn_prefix_summary=prefix_text,
        failures_section=tool_failures(messages),
        read_files=prep.file_ops.read_files, modified_files=prep.file_ops.modified_files,
        notes=notes, max_chars=job.settings.max_summary_chars,
    )


def _audited_final(job: CompactionJob, partials: Sequence[str], chain: Sequence[Summarizer],
                   prefix_text: str | None, notes: Sequence[str], level: FallbackLevel,
                   cancel: CancelToken | None, omit: frozenset[str],
                   log: list[list[str]]) -> FinalSummary | None:
    """Final step with audit retries (with feedback) for each model of the chain."""
    usage = SummaryUsage()
    attempts = 0
    for summarizer in chain:
        feedback: tuple[str, ...] = ()
        for _ in range(1 + job.settings.audit_retries):
            request = job.final_request(partials, feedback, omit)
            outcome = summarize_unit(request, [summarizer], cancel)
            usage = usage + outcome.usage
            attempts += 1
            if not outcome.ok:
                log.append([f"summarizer_failed:{summarizer.model}"])
                break
            text = _assemble(job, outcome.text, prefix_text, notes)
            verdict = audit_summary(text, job.audit)
            if verdict.passed:
                return FinalSummary(text, verdict, level, outcome.summarizer, outcome.model,
                                    attempts, list(notes), usage, log)
            log.append(list(verdict.failures))
            feedback = verdict.failures
    return None


def _prefix_text(job: CompactionJob, outcome: UnitOutcome | None,
                 cancel: CancelToken | None) -> str | None:
    if job.prefix_request is None:
        return None
    if outcome is not None and outcome.ok:
        return outcome.text
    return EXTRACTIVE.summarize(job.prefix_request, cancel=cancel).text


MapFn = Callable[[Callable[[SummaryRequest], UnitOutcome], Sequence[SummaryRequest]],
                 list[UnitOutcome]]


def _serial_map(fn: Callable[[SummaryRequest], UnitOutcome],
                items: Sequence[SummaryRequest]) -> list[UnitOutcome]:
    return [fn(item) for item in items]


def finish(job: CompactionJob, chunk_outcomes: Sequence[UnitOutcome],
           prefix_outcome: UnitOutcome | None, chain: Sequence[Summarizer],
           cancel: CancelToken | None = None, map_fn: MapFn = _serial_map) -> FinalSummary:
    """Walk the fallback levels until a summary passes the audit; raise if none does."""
    log: list[list[str]] = []
    prefix_text = _prefix_text(job, prefix_outcome, cancel)
    plan_chunks = job.plan.chunks
    assert plan_chunks is not None
    oversized_ids = frozenset(plan_chunks.omitted_entry_ids)
    oversized_notes = [o.note for o in plan_chunks.oversized]

    if chain:
        partials = [o.text for o in chunk_outcomes]
        if not job.multi_chunk or all(o.ok for o in chunk_outcomes):
            final = _audited_final(job, partials, chain, prefix_text, [], "full", cancel,
                                   frozenset(), log)
            if final:
                return final
        outcomes = list(chunk_outcomes)
        if oversized_ids:
            if job.multi_chunk:
                requests = job.chunk_requests(oversized_ids)
                outcomes = map_fn(lambda r: summarize_unit(r, chain, cancel), requests)
            if not job.multi_chunk or all(o.ok for o in outcomes):
                final = _audited_final(job, [o.text for o in outcomes], chain, prefix_text,
                                       oversized_notes, "without_oversized", cancel,
                                       oversized_ids, log)
                if final:
                    return final
        if job.multi_chunk and any(o.ok for o in outcomes):
            requests = job.chunk_requests()
            failed = [i for i, o in enumerate(outcomes) if not o.ok]
            texts = [o.text if o.ok else EXTRACTIVE.summarize(requests[i], cancel=cancel).text
                     for i, o in enumerate(outcomes)]
            notes = []
            if failed:
                names = ", ".join(str(i + 1) for i in failed)
                notes.append(f"[Partial summary: chunks {names} of {len(outcomes)} could not be "
                             "summarized by a model; they were condensed extractively.]")
            final = _audited_final(job, texts, chain, prefix_text, notes, "partial", cancel,
                                   frozenset(), log)
            if final:
                return final

    texts = [EXTRACTIVE.summarize(r, cancel=cancel).text for r in job.chunk_requests()] \
        if job.multi_chunk else []
    level: FallbackLevel = "extractive" if chain else "full"
    # The last level is entirely deterministic: the turn prefix is redone extractively too.
    last_prefix = _prefix_text(job, None, cancel)
    final = _audited_final(job, texts, [EXTRACTIVE], last_prefix, [], level, cancel,
                           frozenset(), log)
    if final:
        return final
    raise CompactionFailed("no summary passed the quality audit; nothing was committed",
                           AuditResult(False, tuple(log[-1]) if log else ()))


def run_job(job: CompactionJob, chain: Sequence[Summarizer], cancel: CancelToken | None = None,
            map_fn: MapFn = _serial_map) -> tuple[FinalSummary, list[UnitOutcome]]:
    """Summarize all units (through `map_fn`, e.g. a thread pool) and finish."""
    primary = list(chain) or [EXTRACTIVE]
    requests = job.chunk_requests() if job.multi_chunk else []
    if job.prefix_request is not None:
        requests = [*requests, job.prefix_request]
    outcomes = map_fn(lambda r: summarize_unit(r, primary, cancel), requests)
    prefix_outcome = outcomes.pop() if job.prefix_request is not None else None
    return finish(job, outcomes, prefix_outcome, chain, cancel, map_fn), outcomes


# --- the entry -------------------------------------------------------------------------------


def iso_now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.") + \
        f"{datetime.now(UTC).microsecond // 1000:03d}Z"


def compaction_entry(job: CompactionJob, final: FinalSummary, *, entry_id: str,
                     parent_id: str, chunk_count: int, extra: dict[str, Any] | None = None
                     ) -> dict[str, Any]:
    """The `compaction` entry pi writes, with our own keys under `details.compactd`."""
    prep = job.plan.preparation
    assert prep is not None
    ours: dict[str, Any] = {
        "compactionId": job.compaction_id,
        "audit": final.audit.to_dict(),
        "auditAttempts": final.audit_attempts,
        "fallbackLevel": final.fallback_level,
        "summarizer": final.summarizer,
        "model": final.model,
        "chunks": chunk_count,
        "summarizedEntryIds": len(prep.summarized_entry_ids()),
        "constraints": list(job.register),
    }
    ours.update(extra or {})
    return {
        "type": "compaction",
        "id": entry_id,
        "parentId": parent_id,
        "timestamp": iso_now(),
        "summary": final.text,
        "firstKeptEntryId": prep.first_kept_entry_id,
        "tokensBefore": prep.tokens_before,
        "details": {**prep.file_ops.details(), "compactd": ours},
    }


def tokens_after(path_with_entry: Sequence[Entry]) -> int:
    """Estimated size of the model view after the compaction (estimates only: the kept
    tail's recorded usage describes the old, larger context)."""
    return sum(estimate_tokens(m) for m in build_session_context(path_with_entry).payloads)


def is_effective(tokens: int, settings: PlanSettings, reserve: int) -> bool:
    return not should_compact(tokens, settings.context_window, reserve)


def elapsed_ms(started: float) -> float:
    return round((time.perf_counter() - started) * 1000, 1)
