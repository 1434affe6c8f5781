"""The compaction canvas: compact_session → chord(summarize_chunk ×N) → merge_and_audit.

Every task takes ids only and returns small dicts: transcript text never travels through task
messages, results, Flower events or logs. The text a job needs is staged in Redis under
`compactd:job:{id}:…` with a TTL (the snapshot bytes, each chunk's serialized SummaryRequest,
each chunk's outcome) and deleted when the job ends.

Delivery is at-least-once (acks_late, SIGKILL → redelivery after the visibility timeout), so
every task is idempotent:

* `compact_session` stages the snapshot with SET NX (a redelivered run re-plans from the SAME
  bytes, so chunk indexes keep their meaning) and launches the chord at most once per
  `launched` flag (a crash between launch and flag means a second chord, which is harmless:
  chunk outputs are reused and the final transition is atomic).
* `summarize_chunk` reuses an existing output, then a per-content cache, before paying for an
  LLM call; it never raises, so one bad chunk cannot fail the chord (the callback decides).
* `merge_and_audit` re-plans deterministically from the staged snapshot, commits by CAS with
  the compaction id = job id (a second commit finds its own entry), and the final state is set
  by an atomic "only if not final" transition.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
import time
from collections.abc import Iterator, Sequence
from functools import lru_cache
from typing import Any

import orjson
import redis
from celery import chord, signals
from celery.app.task import Task

from compactd import logs, metrics
from compactd.chain import build_chain
from compactd.settings import CompactdSettings, load_settings
from pipeline.commit import Superseded, snapshot_facts
from pipeline.engine import (
    EXTRACTIVE,
    CompactionFailed,
    CompactionJob,
    UnitOutcome,
    compaction_entry,
    is_effective,
    prepare_job,
    tokens_after,
)
from pipeline.plan import Plan, plan_transcript
from pipeline.summarizer import CancelToken, SummarizerCancelledError, SummaryRequest, SummaryUsage
from pipeline.transcript import Entry, parse_transcript
from storage.errors import NotFound, StoreError
from tasks.admission import llm_slot
from tasks.app import app
from tasks.jobs import (
    STAGING_TTL,
    JobStore,
    done_key,
    input_key,
    launched_key,
    output_key,
    snapshot_key,
)
from tasks.lease import SessionLease
from tasks.redis_values import as_bytes
from tasks.targets import Target, open_target, parse_target

log = logging.getLogger(__name__)


_CONTEXT_TOKENS: dict[str, Any] = {}


@signals.task_prerun.connect
def _enter_log_context(task_id: str | None = None, task: Task | None = None,
                       args: Sequence[Any] | None = None, **_: Any) -> None:
    """Put job, tenant, session and stage on every log line of a compaction task."""
    if task is None or not task.name.startswith("tasks.compaction.") or not args:
        return
    job_id = str(args[-1] if task.name.endswith("merge_and_audit") else args[0])
    record = jobs().get(job_id) or {}
    token = logs._CONTEXT.set({"job_id": job_id, "tenant": str(record.get("tenant", "")),
                               "session": str(record.get("session", "")),
                               "stage": task.name.rsplit(".", 1)[-1]})
    if task_id:
        _CONTEXT_TOKENS[task_id] = token


@signals.task_postrun.connect
def _leave_log_context(task_id: str | None = None, **_: Any) -> None:
    token = _CONTEXT_TOKENS.pop(task_id or "", None)
    if token is not None:
        logs._CONTEXT.reset(token)


def on_job_end(job_id: str) -> None:
    """Hook run once when a job reaches a final state (webhook delivery plugs in here)."""
    from tasks import webhooks

    webhooks.job_ended(job_id)
CACHE_TTL = 24 * 3600
CANCEL_POLL_S = 0.25

# --- per-process resources ------------------------------------------------------------------

_lock = threading.Lock()
_chains: dict[str, list[Any]] = {}


@lru_cache(maxsize=1)
def base_settings() -> CompactdSettings:
    """Settings of this worker process (environment), read once."""
    return load_settings()


@lru_cache(maxsize=1)
def redis_client() -> redis.Redis:
    """One pooled client per process, shared by all threads (redis-py is thread-safe)."""
    return redis.Redis.from_url(base_settings().redis_url,
                                max_connections=max(64, base_settings().llm_concurrency * 2))


def jobs() -> JobStore:
    return _jobstore()


@lru_cache(maxsize=1)
def _jobstore() -> JobStore:
    return JobStore(redis_client())


def job_settings(record: dict[str, Any]) -> CompactdSettings:
    """Worker settings with the job's overrides (plan knobs, instructions, summarizer) and the
    tenant's policy (summary cap, identifier policy, rotation)."""
    base = base_settings()
    opts = record.get("options") or {}
    policy = record.get("policy") or {}
    update: dict[str, Any] = {"plan": base.plan.model_copy(update=opts.get("plan") or {})}
    summary: dict[str, Any] = {}
    if opts.get("instructions"):
        summary["instructions"] = opts["instructions"]
    if policy.get("maxSummaryChars"):
        summary["max_summary_chars"] = int(policy["maxSummaryChars"])
    if policy.get("identifierPolicy"):
        summary["identifier_policy"] = policy["identifierPolicy"]
    if summary:
        update["summary"] = base.summary.model_copy(update=summary)
    if policy.get("rotate") is not None:
        update["rotate"] = bool(policy["rotate"])
    if opts.get("summarizer") == "extractive":
        update["chain"] = []
    return base.model_copy(update=update)


def chain_for(record: dict[str, Any]) -> list[Any]:
    """The model chain, built once per process and summarizer choice (the providers share
    one pooled HTTP client per process)."""
    choice = (record.get("options") or {}).get("summarizer") or "config"
    with _lock:
        if choice not in _chains:
            _chains[choice] = [] if choice == "extractive" else build_chain(base_settings())
        return _chains[choice]


def chain_id(chain: Sequence[Any]) -> str:
    """Identifies the chain for the content cache: a different model never reuses a text."""
    return "|".join(f"{s.name}:{s.model}" for s in chain) or "extractive"


def target_of(record: dict[str, Any]) -> Target:
    return parse_target(record["target"], tenant=record["tenant"], session=record["session"])


def lease_of(record: dict[str, Any]) -> SessionLease:
    return SessionLease(redis_client(), record["tenant"], record["session"],
                        record["leaseToken"])


@contextlib.contextmanager
def cancel_watch(job_id: str) -> Iterator[CancelToken]:
    """A CancelToken that trips when the job's cancel flag appears in Redis (polled), so an
    in-flight LLM retry loop stops between attempts instead of running to the end."""
    token = CancelToken()
    stop = threading.Event()
    store = jobs()

    def run() -> None:
        while not stop.wait(CANCEL_POLL_S):
            with contextlib.suppress(redis.RedisError):
                if store.cancel_requested(job_id):
                    token.cancel()
                    return

    if store.cancel_requested(job_id):
        token.cancel()
    thread = threading.Thread(target=run, name=f"cancel:{job_id}", daemon=True)
    thread.start()
    try:
        yield token
    finally:
        stop.set()
        thread.join(timeout=1.0)


# --- helpers --------------------------------------------------------------------------------


def _elapsed_ms(started: float) -> float:
    return (time.perf_counter() - started) * 1000


def _outcome_to_json(outcome: UnitOutcome, cached: bool) -> bytes:
    data = outcome.to_dict()
    data["text"] = outcome.text
    data["cached"] = cached
    return orjson.dumps(data)


def _outcome_from_json(raw: bytes | str) -> UnitOutcome:
    d = orjson.loads(raw)
    u = d.get("usage") or {}
    return UnitOutcome(bool(d["ok"]), d.get("text", ""), d.get("summarizer", ""),
                       d.get("model", ""),
                       SummaryUsage(u.get("input", 0), u.get("output", 0),
                                    u.get("cacheRead", 0), u.get("cacheWrite", 0)),
                       int(d.get("attempts", 0)), d.get("error"), int(d.get("overflowSplits", 0)))


def _units(job: CompactionJob) -> list[SummaryRequest]:
    """The parallel units: chunk requests when fanned out, plus the turn prefix (last)."""
    units = job.chunk_requests() if job.multi_chunk else []
    if job.prefix_request is not None:
        units.append(job.prefix_request)
    return units


def _load_plan(record: dict[str, Any], settings: CompactdSettings) -> Plan | None:
    raw = redis_client().get(snapshot_key(record["jobId"]))
    if raw is None:
        return None
    return plan_transcript(parse_transcript(as_bytes(raw)), settings.plan)


def _skip_reason(plan: Plan, settings: CompactdSettings, if_needed: bool) -> str | None:
    """Mirror of the embedded runner's skipped statuses."""
    prep = plan.preparation
    if prep is None or plan.chunks is None:
        return "nothing to compact (empty branch or the leaf is already a compaction)"
    if prep.nothing_to_summarize:
        return "nothing to summarize: everything fits in the kept recent history"
    if if_needed and not prep.should_compact:
        return (f"below the trigger: {prep.tokens_before} tokens <= window "
                f"{settings.plan.context_window} - reserve {prep.reserve_tokens}")
    return None


def end_job(job_id: str, state: str, *, units: int | None = None, bad: bool | None = None,
            **fields: Any) -> bool:
    """Final transition + cleanup: staged text deleted, lease and session slot released,
    circuit breaker fed. Safe to call twice (the second call only re-runs the cleanup)."""
    store = jobs()
    record = store.get(job_id) or {}
    total = units if units is not None else int(record.get("unitsTotal") or 0)
    fields.setdefault("chunksDone", record.get("progress", {}).get("chunksDone", 0))
    created = record.get("createdAt")
    if created:
        timings = dict(record.get("timings") or {})
        timings["totalMs"] = round(time.time() * 1000 - created, 1)
        fields["timings"] = timings
    applied = store.finalize(job_id, state, **fields)
    store.cleanup_staging(job_id, total)
    if record:
        if record.get("leaseToken"):
            lease_of(record).release()
        store.release_session(record["tenant"], record["session"], job_id)
        if applied and bad is not None:
            store.record_outcome(record["tenant"], record["session"], bad=bad)
    if applied:
        metrics.JOBS.labels(state, str(record.get("tenant", ""))).inc()
        for stage, ms in (fields.get("timings") or {}).items():
            metrics.STAGE_SECONDS.labels(stage.removesuffix("Ms")).observe(float(ms) / 1000)
        log.info("job ended", extra={"ctx_state": state})
        on_job_end(job_id)
    return applied


def _redelivered(task: Task) -> bool:
    info = task.request.delivery_info or {}
    return bool(info.get("redelivered"))


# --- tasks ----------------------------------------------------------------------------------


@app.task(bind=True, acks_late=True, name="tasks.compaction.compact_session")
def compact_session(self: Task, job_id: str) -> dict[str, Any]:
    """Plan the job, take the session lease, stage inputs and launch the chord."""
    store = jobs()
    record = store.get(job_id)
    if record is None or store.is_final(job_id):
        return {"jobId": job_id, "launched": False}
    if _redelivered(self):
        store.count(job_id, "redeliveries")
    if store.cancel_requested(job_id):
        end_job(job_id, "cancelled", error="cancelled before start")
        return {"jobId": job_id, "launched": False}
    started = time.perf_counter()
    lease = lease_of(record)
    got = lease.acquire()
    if not got.ok:
        metrics.LEASE_CONFLICTS.inc()
        end_job(job_id, "skipped", error=f"another compaction (job {got.holder}) holds the "
                "session lease")
        return {"jobId": job_id, "launched": False}
    queue = record.get("queue")
    try:
        with lease.heartbeat():
            if got.fence is not None:
                store.update(job_id, fence=got.fence)
            store.set_state(job_id, "planning",
                            startedAt=int(time.time() * 1000))
            store.add_timing(job_id, "queueMs", time.time() * 1000 - record["createdAt"])
            settings = job_settings(record)
            target = target_of(record)
            snap = snapshot_key(job_id)
            r = redis_client()
            if not r.exists(snap):
                data = open_target(target, base_settings().store_url).read_bytes()
                # NX: a redelivered run keeps the first snapshot, so indexes stay stable.
                r.set(snap, data, nx=True, ex=STAGING_TTL)
            plan = _load_plan(record, settings)
            assert plan is not None
            reason = _skip_reason(plan, settings, bool(record.get("options", {}).get("ifNeeded")))
            prep = plan.preparation
            if reason is not None:
                end_job(job_id, "skipped", units=0, reason=reason,
                        tokensBefore=prep.tokens_before if prep else 0)
                return {"jobId": job_id, "launched": False}
            assert prep is not None and plan.chunks is not None
            job = prepare_job(plan, settings.plan, settings.summary, compaction_id=job_id)
            units = _units(job)
            pipe = r.pipeline()
            for i, request in enumerate(units):
                pipe.set(input_key(job_id, i), orjson.dumps(dataclasses.asdict(request)),
                         ex=STAGING_TTL)
            pipe.execute()
            store.add_timing(job_id, "planMs", _elapsed_ms(started))
            store.set_state(job_id, "summarizing", chunksTotal=len(units), unitsTotal=len(units),
                            chunks=len(plan.chunks.chunks), tokensBefore=prep.tokens_before,
                            firstKeptEntryId=prep.first_kept_entry_id,
                            summarizeStartedAt=time.time() * 1000)
            if r.exists(launched_key(job_id)):
                return {"jobId": job_id, "launched": False}
            body = merge_and_audit.s(job_id).set(queue=queue)
            if units:
                header = [summarize_chunk.si(job_id, i).set(queue=queue)
                          for i in range(len(units))]
                chord(header)(body)
            else:
                merge_and_audit.apply_async(args=([], job_id), queue=queue)
            r.set(launched_key(job_id), b"1", ex=STAGING_TTL)
            return {"jobId": job_id, "launched": True, "units": len(units)}
    except NotFound:
        end_job(job_id, "failed", units=0, bad=False, error="transcript not found")
    except Exception as exc:
        log.exception("job %s: planning failed", job_id)
        end_job(job_id, "failed", units=0, bad=True,
                error=f"planning failed: {type(exc).__name__}: {str(exc)[:300]}")
    return {"jobId": job_id, "launched": False}


@app.task(bind=True, acks_late=True, name="tasks.compaction.summarize_chunk")
def summarize_chunk(self: Task, job_id: str, index: int) -> dict[str, Any]:
    """Summarize one staged unit. Returns {i, ok, cached[, error]}; never raises."""
    try:
        return _summarize_chunk(self, job_id, index)
    except Exception as exc:  # the chord must not fail: the callback decides
        log.warning("job %s chunk %d: %s", job_id, index, type(exc).__name__)
        return {"i": index, "ok": False, "cached": False, "error": type(exc).__name__}


def _summarize_chunk(task: Task, job_id: str, index: int) -> dict[str, Any]:
    store = jobs()
    r = redis_client()
    record = store.get(job_id)
    if record is None or store.is_final(job_id):
        return {"i": index, "ok": False, "cached": False, "error": "job already ended"}
    if store.cancel_requested(job_id):
        return {"i": index, "ok": False, "cached": False, "error": "cancelled"}
    if _redelivered(task):
        store.count(job_id, "redeliveries")
    existing = r.get(output_key(job_id, index))
    if existing is not None:  # redelivered after the output was written
        outcome = _outcome_from_json(existing)
        return {"i": index, "ok": outcome.ok, "cached": True}
    raw = r.get(input_key(job_id, index))
    if raw is None:
        return {"i": index, "ok": False, "cached": False, "error": "staged input missing"}
    request = SummaryRequest(**_tuples(orjson.loads(raw)))
    chain = chain_for(record)
    primary = list(chain) or [EXTRACTIVE]
    cache = f"compactd:cache:{request.cache_key(chain_id(primary))}"
    lease = lease_of(record)
    lease.renew()
    cached_raw = r.get(cache)
    cached = cached_raw is not None
    if cached_raw is not None:
        outcome = _outcome_from_json(cached_raw)
    else:
        with lease.heartbeat(), cancel_watch(job_id) as cancel:
            try:
                limit = (record.get("policy") or {}).get("maxInflightLlmCalls")
                with llm_slot(r, record["tenant"], limit, cancel):
                    outcome = _summarize(request, primary, cancel)
            except SummarizerCancelledError:
                return {"i": index, "ok": False, "cached": False, "error": "cancelled"}
        if outcome.ok:
            r.set(cache, _outcome_to_json(outcome, False), ex=CACHE_TTL)
        model = outcome.model or primary[0].model
        metrics.LLM_CALLS.labels(model, "ok" if outcome.ok else "error").inc()
        if outcome.attempts > 1:
            metrics.LLM_RETRIES.labels(model).inc(outcome.attempts - 1)
    if store.is_final(job_id):  # ended meanwhile (cancel): stage nothing new
        return {"i": index, "ok": outcome.ok, "cached": cached, "error": "job already ended"}
    r.set(output_key(job_id, index), _outcome_to_json(outcome, cached), ex=STAGING_TTL)
    r.sadd(done_key(job_id), index)
    r.expire(done_key(job_id), STAGING_TTL)
    store.update(job_id)
    if store.is_final(job_id):
        r.delete(output_key(job_id, index))
    result: dict[str, Any] = {"i": index, "ok": outcome.ok, "cached": cached}
    if not outcome.ok:
        result["error"] = "all models failed"
    return result


def _summarize(request: SummaryRequest, chain: Sequence[Any],
               cancel: CancelToken) -> UnitOutcome:
    from pipeline.engine import summarize_unit

    return summarize_unit(request, chain, cancel)


def _tuples(d: dict[str, Any]) -> dict[str, Any]:
    """JSON turns the request's tuples into lists; the frozen dataclass wants tuples back
    (the cache key hashes them the same either way, but equality and hashing would not)."""
    for name in ("required_identifiers", "constraints"):
        if isinstance(d.get(name), list):
            d[name] = tuple(d[name])
    return d


@app.task(bind=True, acks_late=True, name="tasks.compaction.merge_and_audit")
def merge_and_audit(self: Task, results: list[dict[str, Any]] | None,
                    job_id: str) -> dict[str, Any]:
    """Merge, audit, commit by CAS and record the final state (idempotent)."""
    store = jobs()
    record = store.get(job_id)
    if record is None:
        return {"jobId": job_id, "state": "missing"}
    if store.is_final(job_id):
        end_job(job_id, record["state"])  # cleanup only (a crash may have interrupted it)
        return {"jobId": job_id, "state": record["state"]}
    try:
        return _merge_and_audit(self, record, results or [])
    except Exception as exc:
        log.exception("job %s: merge/commit failed", job_id)
        end_job(job_id, "failed", bad=True,
                error=f"{type(exc).__name__}: {str(exc)[:300]}")
        return {"jobId": job_id, "state": "failed"}


def _merge_and_audit(task: Task, record: dict[str, Any],
                     results: list[dict[str, Any]]) -> dict[str, Any]:
    job_id = record["jobId"]
    store = jobs()
    r = redis_client()
    if _redelivered(task):
        store.count(job_id, "redeliveries")
    if store.cancel_requested(job_id):
        end_job(job_id, "cancelled", error="cancelled")
        return {"jobId": job_id, "state": "cancelled"}
    started_at = record.get("summarizeStartedAt")
    if started_at:
        store.add_timing(job_id, "summarizeMs", time.time() * 1000 - started_at)
    lease = lease_of(record)
    got = lease.acquire()  # renews if ours; retakes it if it expired meanwhile
    if not got.ok:
        store.update(job_id, leaseLost=True)
    settings = job_settings(record)
    plan = _load_plan(record, settings)
    if plan is None:
        end_job(job_id, "failed", bad=True, error="staged snapshot expired")
        return {"jobId": job_id, "state": "failed"}
    prep = plan.preparation
    assert prep is not None and plan.chunks is not None
    job = prepare_job(plan, settings.plan, settings.summary, compaction_id=job_id)
    units = _units(job)
    outcomes: list[UnitOutcome] = []
    for i in range(len(units)):
        raw = r.get(output_key(job_id, i))
        outcomes.append(_outcome_from_json(raw) if raw is not None
                        else UnitOutcome(False, error="no output"))
    prefix_outcome = outcomes.pop() if job.prefix_request is not None else None
    chain = chain_for(record)
    store.set_state(job_id, "merging")
    started = time.perf_counter()
    with lease.heartbeat(), cancel_watch(job_id) as cancel:
        try:
            final = _finish(job, outcomes, prefix_outcome, chain, cancel)
        except SummarizerCancelledError:
            end_job(job_id, "cancelled", error="cancelled")
            return {"jobId": job_id, "state": "cancelled"}
        except CompactionFailed as exc:
            end_job(job_id, "failed", bad=True, error=str(exc),
                    auditFailures=list(exc.audit.failures) if exc.audit else [])
            return {"jobId": job_id, "state": "failed"}
    store.add_timing(job_id, "mergeMs", _elapsed_ms(started))
    store.set_state(job_id, "auditing")
    fence = (store.get(job_id) or {}).get("fence")
    snapshot = plan.transcript
    entry = compaction_entry(job, final, entry_id=snapshot.new_id(seed=job_id),
                             parent_id=prep.leaf_id, chunk_count=len(plan.chunks.chunks),
                             extra={"jobId": job_id, "fence": fence})
    after = tokens_after([*prep.path, Entry(data=entry)])
    entry["details"]["compactd"]["tokensAfter"] = after
    effective = is_effective(after, settings.plan, prep.reserve_tokens)
    facts = snapshot_facts(snapshot, job_id, prep.first_kept_entry_id,
                           prep.summarized_entry_ids(),
                           prep.previous_compaction.id if prep.previous_compaction else None)
    retries = sum(max(0, o.attempts - 1) for o in outcomes)
    summary_fields: dict[str, Any] = {
        "tokensBefore": prep.tokens_before, "tokensAfter": after, "effective": effective,
        "fallbackLevel": final.fallback_level, "summarizer": final.summarizer,
        "model": final.model, "auditAttempts": final.audit_attempts, "retries": retries,
        "chunksFailed": sum(1 for o in outcomes if not o.ok),
    }
    if store.cancel_requested(job_id):  # last point where a cancel still wins
        end_job(job_id, "cancelled", error="cancelled")
        return {"jobId": job_id, "state": "cancelled"}
    store.set_state(job_id, "committing", **summary_fields)
    started = time.perf_counter()
    target = open_target(target_of(record), base_settings().store_url)
    try:
        committed = target.commit(entry, facts, rotate=settings.rotate)
    except Superseded as exc:
        end_job(job_id, "superseded", bad=False, reason=exc.reason, **summary_fields)
        return {"jobId": job_id, "state": "superseded"}
    except StoreError as exc:
        end_job(job_id, "failed", bad=True, error=f"commit failed: {type(exc).__name__}: "
                f"{str(exc)[:300]}", **summary_fields)
        return {"jobId": job_id, "state": "failed"}
    store.add_timing(job_id, "commitMs", _elapsed_ms(started))
    metrics.FALLBACK.labels(final.fallback_level).inc()
    metrics.record_audit_failures(final.failed_audits)
    metrics.TOKENS_BEFORE.observe(prep.tokens_before)
    metrics.TOKENS_AFTER.observe(after)
    if prep.tokens_before:
        metrics.RATIO.observe(after / prep.tokens_before)
    if committed.attempts > 1:
        metrics.CAS_RETRIES.inc(committed.attempts - 1)
    end_job(job_id, "succeeded", bad=not effective, compactionEntryId=committed.entry_id,
            commitStatus=committed.status, commitAttempts=committed.attempts,
            reason="" if effective else "ineffective: the compacted context is still above "
            "the trigger", **summary_fields)
    return {"jobId": job_id, "state": "succeeded"}


def _finish(job: CompactionJob, outcomes: list[UnitOutcome], prefix: UnitOutcome | None,
            chain: Sequence[Any], cancel: CancelToken) -> Any:
    from pipeline.engine import finish

    return finish(job, outcomes, prefix, chain, cancel)
