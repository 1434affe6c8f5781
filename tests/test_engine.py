"""Engine tests: audit rules, fallback levels, register across compactions, retention.

The summarizers here are small in-process implementations of the `Summarizer` protocol: the
engine is pure, and these scripts are the cheapest way to make every level happen on demand.
(HTTP summarizers are tested against a real local server in test_providers/test_llm_e2e.)
"""

from __future__ import annotations

import threading
from dataclasses import replace

import pytest

from compactd.embedded import compact_transcript
from pipeline.audit import AuditContext, audit_summary
from pipeline.context import build_session_context, convert_to_llm
from pipeline.engine import CompactionFailed, prepare_job, run_job, split_request
from pipeline.extractive import ExtractiveSummarizer
from pipeline.plan import plan_transcript
from pipeline.sections import REQUIRED_HEADINGS, section_items
from pipeline.settings import PlanSettings, SummarySettings
from pipeline.summarizer import (
    ContextOverflowError,
    SummarizerError,
    SummaryRequest,
    SummaryResult,
)
from pipeline.transcript import parse_transcript
from tests.support.builders import SessionBuilder, generate_session

GOOD = "\n\n".join(f"{h}\nNone." for h in REQUIRED_HEADINGS)
SMALL = PlanSettings(keep_recent_tokens=2000, context_window=60000, target_chunk_tokens=3000)


def _session_with_facts() -> SessionBuilder:
    b = SessionBuilder()
    b.user("Never push to main. Don't touch the database.")
    b.assistant("Understood, I will work on a branch.")
    b.user("Deploy id is 6f1c2a3b-9d8e-4f70-8a1b-2c3d4e5f6a7b and the commit is deadbeef0123.")
    b.assistant("Noted.", calls=[("read", {"path": "/srv/app/config.yaml"})])
    b.tool_result(b.last_call_ids[0], "port: 8443\nhost: db.internal:5432\n" * 40, name="read")
    for i in range(30):
        b.user(f"Step {i}: refactor module_{i} and run the tests " + "please " * 40)
        b.assistant(f"Refactored module_{i}; tests passed. " + "detail " * 120)
    b.user("Now migrate the billing service to the new queue at https://queue.example.com/v2")
    b.assistant("Starting the billing migration. " + "work " * 200)
    return b


class Scripted:
    """A protocol summarizer whose behaviour per call is a function of the request."""

    def __init__(self, name: str, behave) -> None:  # type: ignore[no-untyped-def]
        self.name = name
        self.model = name
        self.behave = behave
        self.requests: list[SummaryRequest] = []
        self.lock = threading.Lock()

    def summarize(self, request: SummaryRequest, *, cancel=None) -> SummaryResult:  # type: ignore[no-untyped-def]
        with self.lock:
            self.requests.append(request)
        text = self.behave(request)
        return SummaryResult(text=text, summarizer=self.name, model=self.model)


def _good_from_extractive(request: SummaryRequest) -> str:
    return ExtractiveSummarizer().summarize(request).text


def _fail(request: SummaryRequest) -> str:
    raise SummarizerError("provider down")


def _job(builder: SessionBuilder, settings: PlanSettings = SMALL,
         summary: SummarySettings | None = None):  # type: ignore[no-untyped-def]
    transcript = parse_transcript(builder.to_bytes())
    plan = plan_transcript(transcript, settings)
    return transcript, prepare_job(plan, settings, summary or SummarySettings())


# --- audit ---------------------------------------------------------------------------------


def test_audit_passes_a_complete_summary() -> None:
    assert audit_summary(GOOD, AuditContext()).passed


@pytest.mark.parametrize("heading", REQUIRED_HEADINGS)
def test_audit_missing_section(heading: str) -> None:
    text = GOOD.replace(heading + "\n", "")
    assert f"missing_section:{heading}" in audit_summary(text, AuditContext()).failures


def test_audit_duplicate_and_order() -> None:
    dup = GOOD + "\n\n## Decisions\nNone."
    assert "duplicate_section:## Decisions" in audit_summary(dup, AuditContext()).failures
    parts = GOOD.split("\n\n")
    swapped = "\n\n".join([parts[1], parts[0], *parts[2:]])
    assert "sections_out_of_order" in audit_summary(swapped, AuditContext()).failures


def test_audit_identifiers_hex_case_insensitive_and_missing() -> None:
    ctx = AuditContext(identifiers=("DEADBEEF01", "https://x.example.com/a"))
    ok = GOOD + "\n- deadbeef01 https://x.example.com/a"
    assert audit_summary(ok, ctx).passed
    result = audit_summary(GOOD + "\n- deadbeef01", ctx)
    assert result.failures == ("missing_identifiers:https://x.example.com/a",)
    off = replace(ctx, strict_identifiers=False)
    assert audit_summary(GOOD, off).passed


def test_audit_latest_ask_reflected() -> None:
    ctx = AuditContext(latest_ask="Migrate the billing service to the new queue")
    assert "latest_user_ask_not_reflected" in audit_summary(GOOD, ctx).failures
    text = GOOD.replace("## Pending user asks\nNone.",
                        "## Pending user asks\n- migrate billing service to new queue")
    assert audit_summary(text, replace(ctx, user_texts=(ctx.latest_ask or "",))).passed


def test_audit_rejects_invented_pending_ask() -> None:
    users = ("Please rename the logger module",)
    invented = GOOD.replace("## Pending user asks\nNone.",
                            "## Pending user asks\n- Delete the production database backups")
    assert any(f.startswith("pending_ask_not_grounded")
               for f in audit_summary(invented, AuditContext(user_texts=users)).failures)
    grounded = GOOD.replace("## Pending user asks\nNone.",
                            "## Pending user asks\n- rename the logger module")
    assert audit_summary(grounded, AuditContext(user_texts=users)).passed


def test_audit_requires_register_rules() -> None:
    ctx = AuditContext(constraints=("Never push to main.",))
    assert "constraints_missing:1" in audit_summary(GOOD, ctx).failures
    text = GOOD.replace("## Constraints/Rules\nNone.",
                        "## Constraints/Rules\n- Never push to main.")
    assert audit_summary(text, ctx).passed


# --- levels --------------------------------------------------------------------------------


def test_extractive_only_passes_audit_and_keeps_facts() -> None:
    _transcript, job = _job(_session_with_facts())
    assert job.multi_chunk
    final, _ = run_job(job, [])
    assert final.audit.passed and final.fallback_level == "full"
    assert final.summarizer == "extractive"
    for fact in ("Never push to main.", "Don't touch the database."):
        assert fact in section_items(final.text, "## Constraints/Rules")


def test_model_that_always_fails_hands_over_to_extractive() -> None:
    _, job = _job(_session_with_facts())
    broken = Scripted("broken", _fail)
    final, outcomes = run_job(job, [broken])
    assert final.fallback_level == "extractive" and final.audit.passed
    assert all(not o.ok for o in outcomes)


def test_chain_second_model_takes_over() -> None:
    _, job = _job(_session_with_facts())
    first, second = Scripted("first", _fail), Scripted("second", _good_from_extractive)
    final, _ = run_job(job, [first, second])
    assert final.fallback_level == "full" and final.model == "second"
    assert first.requests and second.requests


def test_missing_headings_retried_with_feedback_then_passes() -> None:
    _, job = _job(_session_with_facts())
    calls = {"merge": 0}

    def behave(request: SummaryRequest) -> str:
        if request.kind == "merge":
            calls["merge"] += 1
            if calls["merge"] == 1:
                return "## Decisions\nNothing much."
        return _good_from_extractive(request)

    model = Scripted("flaky", behave)
    final, _ = run_job(job, [model])
    assert final.audit.passed and final.fallback_level == "full"
    merges = [r for r in model.requests if r.kind == "merge"]
    assert len(merges) == 2
    assert "Quality check feedback" in merges[1].instructions
    assert "missing_section:## Open TODOs" in merges[1].instructions
    assert final.failed_audits and "missing_section:## Open TODOs" in final.failed_audits[0]


def test_summary_that_never_passes_is_never_committed() -> None:
    _, job = _job(_session_with_facts())
    liar = Scripted("liar", lambda r: "## Decisions\nAll done.")
    final, _ = run_job(job, [liar])
    # every model level failed the audit: the committed text comes from extractive
    assert final.fallback_level == "extractive" and final.audit.passed
    assert "All done." not in final.text


def test_partial_level_when_one_chunk_fails() -> None:
    _, job = _job(_session_with_facts())
    requests = job.chunk_requests()
    poisoned = requests[1].conversation

    def behave(request: SummaryRequest) -> str:
        if request.conversation == poisoned:
            raise SummarizerError("this chunk always fails")
        return _good_from_extractive(request)

    final, _ = run_job(job, [Scripted("m", behave)])
    assert final.fallback_level == "partial" and final.audit.passed
    assert "[Partial summary: chunks 2 of" in final.text


def test_overflow_splits_the_chunk() -> None:
    _, job = _job(_session_with_facts())
    limit = max(len(r.conversation) for r in job.chunk_requests()) // 2 + 10

    def behave(request: SummaryRequest) -> str:
        if request.kind != "merge" and len(request.conversation) > limit:
            raise ContextOverflowError("prompt is too long")
        return _good_from_extractive(request)

    final, outcomes = run_job(job, [Scripted("m", behave)])
    assert final.fallback_level == "full"
    assert any(o.overflow_splits for o in outcomes)


def test_without_oversized_level() -> None:
    b = SessionBuilder()
    b.user("Never delete the audit log.")
    b.assistant("ok", calls=[("read", {"path": "/big.log"})])
    b.tool_result(b.last_call_ids[0], "x" * 200_000, name="read")
    for i in range(20):
        b.user(f"question {i} " * 30)
        b.assistant(f"answer {i} " * 200)
    settings = PlanSettings(keep_recent_tokens=2000, context_window=60000,
                            target_chunk_tokens=3000)
    _, job = _job(b, settings)
    assert job.plan.chunks and job.plan.chunks.oversized

    def behave(request: SummaryRequest) -> str:
        if "x" * 1000 in request.conversation:
            raise ContextOverflowError("prompt is too long")
        return _good_from_extractive(request)

    final, _ = run_job(job, [Scripted("m", behave)])
    assert final.fallback_level == "without_oversized"
    assert "[Large toolResult (~50K tokens) omitted from summary]" in final.text


def test_split_request_halves_at_message_boundary() -> None:
    request = SummaryRequest("history", "s", "[User]: a\n\n[Assistant]: b\n\n[User]: c\n\n"
                             "[Assistant]: d", "i", 100)
    halves = split_request(request)
    assert halves is not None
    assert halves[0].conversation == "[User]: a\n\n[Assistant]: b"
    assert halves[1].conversation == "[User]: c\n\n[Assistant]: d"


def test_extractive_failure_raises_compaction_failed() -> None:
    # an impossible audit (identifier the transcript never mentions) cannot be satisfied by
    # anything but the required-identifier mechanism; break that to prove fail-closed.
    _, job = _job(_session_with_facts())
    job.audit = replace(job.audit, constraints=("a rule nobody stated",))
    with pytest.raises(CompactionFailed):
        run_job(job, [])


# --- repeated compactions, register, retention ----------------------------------------------

PLANTED = [
    "Never push to main.",
    "Don't touch the database.",
    "6f1c2a3b-9d8e-4f70-8a1b-2c3d4e5f6a7b",
    "deadbeef0123",
    "https://queue.example.com/v2",
    "db.internal:5432",
    "/srv/app/config.yaml",
]


def _visible(transcript_bytes: bytes) -> str:
    transcript = parse_transcript(transcript_bytes)
    messages = convert_to_llm(build_session_context(transcript.path()).payloads)
    parts = []
    for message in messages:
        content = message.get("content")
        if isinstance(content, str):
            parts.append(content)
        else:
            parts += [str(b.get("text", "")) + str(b.get("arguments", ""))
                      for b in content or [] if isinstance(b, dict)]
    return "\n".join(parts)


def _append_turns(data: bytes, tag: str, count: int = 12) -> bytes:
    more = parse_transcript(data)
    leaf = more.leaf_id
    for i in range(count):
        entry_id = more.new_id(seed=f"{tag}-{i}")
        message = ({"role": "user", "content": f"{tag} step {i} " * 60} if i % 2 == 0 else
                   {"role": "assistant", "content": [{"type": "text", "text": f"done {i} " * 200}],
                    "stopReason": "stop"})
        more.append({"type": "message", "id": entry_id, "parentId": leaf,
                     "timestamp": "2026-03-02T00:00:00.000Z", "message": message})
        leaf = entry_id
    return more.to_bytes()


def test_register_and_facts_survive_three_compactions() -> None:
    b = _session_with_facts()
    data = b.to_bytes()
    for round_ in range(3):
        transcript = parse_transcript(data)
        done = compact_transcript(transcript, [], plan_settings=SMALL,
                                  summary_settings=SummarySettings())
        assert done.result.status in ("compacted", "ineffective"), done.result.reason
        assert done.entry is not None
        transcript.append(done.entry)
        data = transcript.to_bytes()
        summary = done.entry["summary"]
        rules = section_items(summary, "## Constraints/Rules")
        assert "Never push to main." in rules and "Don't touch the database." in rules
        # more work after each compaction, so the next one has something to summarize
        data = _append_turns(data, f"r{round_}")
    visible = _visible(data)
    kept = [fact for fact in PLANTED if fact.lower() in visible.lower()]
    assert len(kept) >= len(PLANTED) - 1, f"lost: {set(PLANTED) - set(kept)}"
    assert visible.count("Never push to main.") >= 1


def test_no_message_lost_across_repeated_compactions() -> None:
    """Every message on the path is either in the model view or covered by a summary."""
    data = generate_session(400, seed=3)
    settings = PlanSettings(keep_recent_tokens=8000, context_window=60000)
    covered: set[str] = set()
    for _ in range(2):
        transcript = parse_transcript(data)
        done = compact_transcript(transcript, [], plan_settings=settings,
                                  summary_settings=SummarySettings())
        assert done.job is not None and done.entry is not None
        prep = done.job.plan.preparation
        assert prep is not None
        covered |= set(prep.summarized_entry_ids())
        transcript.append(done.entry)
        data = _append_turns(transcript.to_bytes(), f"n{len(covered)}", count=40)
    transcript = parse_transcript(data)
    view = {m.entry_id for m in build_session_context(transcript.path()).messages}
    for entry in transcript.path():
        if entry.type == "message":
            assert entry.id in view or entry.id in covered, entry.id
