"""Chunk planning and the summarizer's view of messages (spec §4.1, §4.5, §5; TV7, TV10–TV12)."""

from __future__ import annotations

import math
from typing import Any

import pytest

from pipeline.chunks import (
    adaptive_chunk_ratio,
    atomic_groups,
    max_chunk_tokens,
    oversized_note,
    plan_chunks,
)
from pipeline.context import ContextMessage
from pipeline.fileops import FileOps, format_file_ops
from pipeline.render import (
    IMAGE_MARKER,
    MORE_OMITTED_MARKER,
    NON_TEXT_MARKER,
    render_messages,
    truncate_tool_result,
)
from pipeline.settings import PlanSettings
from pipeline.tokens import estimate_tokens

# --- helpers ------------------------------------------------------------------------------------


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def assistant(text: str = "", calls: list[tuple[str, str, dict[str, Any]]] = (),  # type: ignore[assignment]
              stop: str | None = None) -> dict[str, Any]:
    content: list[dict[str, Any]] = []
    if text:
        content.append({"type": "text", "text": text})
    for call_id, name, args in calls:
        content.append({"type": "toolCall", "id": call_id, "name": name, "arguments": args})
    return {"role": "assistant", "content": content,
            "stopReason": stop or ("toolUse" if calls else "stop")}


def result(call_id: str, text: str, **extra: Any) -> dict[str, Any]:
    return {"role": "toolResult", "toolCallId": call_id, "toolName": "bash",
            "content": [{"type": "text", "text": text}], "isError": False, **extra}


def cms(*messages: dict[str, Any]) -> list[ContextMessage]:
    return [ContextMessage(f"e{i}", m) for i, m in enumerate(messages)]


# --- TV7 ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(("avg", "window", "ratio", "max_tokens"), [
    (5000, 100000, 0.4, 35904),
    (10000, 100000, 0.16, 11904),
    (30000, 100000, 0.15, 10904),
    (20000, 200000, 0.16, 27904),
])
def test_tv7_adaptive_ratio(avg: int, window: int, ratio: float, max_tokens: int) -> None:
    got = adaptive_chunk_ratio([avg] * 5, window)
    assert got == pytest.approx(ratio)
    assert max_chunk_tokens(got, window) == max_tokens


def test_adaptive_ratio_edges() -> None:
    assert adaptive_chunk_ratio([], 100000) == 0.4
    # avg x 1.2 / window == 0.1 exactly is not "> 0.1".
    assert adaptive_chunk_ratio([25000, 25000], 300000) == 0.4
    assert max_chunk_tokens(0.4, 1000) == 1


# --- TV10 oversized -------------------------------------------------------------------------------


def test_tv10_oversized_tool_result_and_its_group() -> None:
    big = "x" * (83334 * 4)
    history = cms(
        user("please run it"),
        assistant("running", [("c1", "bash", {"command": "cat big"})]),
        result("c1", big),
        user("thanks"),
    )
    assert estimate_tokens(history[2].message) == 83334
    plan = plan_chunks(history, PlanSettings(context_window=200000))
    assert len(plan.oversized) == 1
    item = plan.oversized[0]
    assert item.note == "[Large toolResult (~83K tokens) omitted from summary]"
    assert (item.entry_id, item.role, item.tokens) == ("e2", "toolResult", 83334)
    # The group's assistant and result go; the user turns survive.
    assert item.omitted_entry_ids == ("e1", "e2")
    assert plan.omitted_entry_ids == {"e1", "e2"}


def test_just_below_oversized_threshold() -> None:
    history = cms(user("x" * (83333 * 4)))  # 83333 x 1.2 = 99999.6 <= 100000
    assert plan_chunks(history, PlanSettings(context_window=200000)).oversized == []


def test_oversized_user_message_omits_only_itself() -> None:
    history = cms(user("u" * 40000), assistant("ok"))
    plan = plan_chunks(history, PlanSettings(context_window=10000))
    assert [o.omitted_entry_ids for o in plan.oversized] == [("e0",)]
    assert plan.oversized[0].note == "[Large user (~10K tokens) omitted from summary]"


def test_oversized_note_rounds_half_up_like_javascript() -> None:
    # Math.round(4.5) == 5 in OpenClaw; Python's round() would give 4 (banker's rounding).
    assert oversized_note("toolResult", 4500) == (
        "[Large toolResult (~5K tokens) omitted from summary]")
    assert oversized_note("assistant", 2500) == (
        "[Large assistant (~3K tokens) omitted from summary]")
    assert oversized_note("user", 83334) == "[Large user (~83K tokens) omitted from summary]"


# --- atomic groups ------------------------------------------------------------------------------


def test_atomic_groups_keep_parallel_calls_with_all_results() -> None:
    history = cms(
        user("go"),
        assistant("", [("c1", "read", {"path": "a"}), ("c2", "read", {"path": "b"})]),
        result("c2", "b"),
        result("c1", "a"),
        assistant("done"),
        user("next"),
    )
    assert atomic_groups(history) == [[0], [1, 2, 3], [4], [5]]


def test_result_arriving_after_a_user_message_stays_with_its_call() -> None:
    history = cms(
        user("go"),
        assistant("", [("c1", "bash", {"command": "make"})]),
        user("also check the docs"),
        result("c1", "built"),
        assistant("done"),
    )
    assert atomic_groups(history) == [[0], [1, 2, 3], [4]]


def test_abandoned_calls_do_not_glue_history() -> None:
    history = cms(
        user("go"),
        assistant("", [("c1", "bash", {"command": "sleep 100"})]),  # never answered
        user("never mind"),
        assistant("ok"),
        user("next"),
        assistant("", [("c2", "bash", {"command": "ls"})]),
        result("c2", "x"),
    )
    assert atomic_groups(history) == [[0], [1], [2], [3], [4], [5, 6]]


def test_aborted_assistant_opens_no_group_and_idless_result_clears() -> None:
    history = cms(
        assistant("", [("c1", "bash", {})], stop="aborted"),
        user("hm"),
        assistant("", [("c2", "bash", {}), ("c3", "bash", {})]),
        {"role": "toolResult", "content": [{"type": "text", "text": "?"}]},  # no toolCallId
        user("after"),
    )
    assert atomic_groups(history) == [[0], [1], [2, 3], [4]]


# --- chunk counts -------------------------------------------------------------------------------


def _turns(n: int, chars: int = 400) -> list[ContextMessage]:
    """n groups of three messages (assistant call + result + user): about 3 x chars/4 tokens."""
    out: list[dict[str, Any]] = []
    for i in range(n):
        out.append(assistant("a" * (chars - 30), [(f"c{i}", "bash", {"command": "ls"})]))
        out.append(result(f"c{i}", "r" * chars))
        out.append(user("u" * chars))
    return cms(*out)


def _check_chunks(history: list[ContextMessage], plan: Any, limit: int) -> None:
    flat = [m.entry_id for c in plan.chunks for m in c.messages]
    assert flat == [m.entry_id for m in history]
    groups = atomic_groups(history)
    starts = {history[g[0]].entry_id for g in groups}
    for chunk in plan.chunks:
        assert chunk.entry_ids[0] in starts  # chunks start at group boundaries
        assert chunk.tokens == sum(estimate_tokens(m.message) for m in chunk.messages)


def test_chunks_respect_target_size() -> None:
    history = _turns(20)  # 20 groups of ~300 tokens = ~6000 tokens
    settings = PlanSettings(target_chunk_tokens=1000, max_chunks=16)
    plan = plan_chunks(history, settings)
    assert plan.chunk_limit == 1000
    assert all(c.tokens <= 1000 for c in plan.chunks)
    assert len(plan.chunks) == math.ceil(20 / 3)
    _check_chunks(history, plan, 1000)


def test_chunks_respect_max_chunks() -> None:
    history = _turns(20)
    settings = PlanSettings(target_chunk_tokens=1000, max_chunks=4)
    plan = plan_chunks(history, settings)
    assert len(plan.chunks) <= 4
    assert plan.chunk_limit == math.ceil(plan.total_tokens / 4)
    _check_chunks(history, plan, plan.chunk_limit)
    one = plan_chunks(history, PlanSettings(target_chunk_tokens=100, max_chunks=1))
    assert len(one.chunks) == 1


def test_chunk_limit_capped_by_model_window() -> None:
    history = _turns(30)
    plan = plan_chunks(history, PlanSettings(context_window=20000, target_chunk_tokens=12000))
    # floor(20000 x 0.4) - 4096 = 3904; / 1.2 -> 3253
    assert plan.max_chunk_tokens == 3904
    assert plan.chunk_limit == 3253
    assert all(c.tokens <= 3253 for c in plan.chunks)
    assert "chunk limit 3253" in plan.reason


def test_one_indivisible_group_may_exceed_the_limit() -> None:
    history = cms(
        assistant("", [("c1", "bash", {}), ("c2", "bash", {})]),
        result("c1", "x" * 8000),
        result("c2", "y" * 8000),
        user("z"),
    )
    plan = plan_chunks(history, PlanSettings(target_chunk_tokens=1000))
    assert [c.entry_ids for c in plan.chunks] == [["e0", "e1", "e2"], ["e3"]]


def test_sanitized_messages_are_not_chunked() -> None:
    history = cms(
        user("a"),
        {"role": "custom", "customType": "openclaw.runtime-context", "content": "RUNTIME"},
        {"role": "bashExecution", "command": "secret", "output": "x", "excludeFromContext": True},
        user("b"),
    )
    plan = plan_chunks(history, PlanSettings())
    assert [c.entry_ids for c in plan.chunks] == [["e0", "e3"]]


def test_empty_history_has_no_chunks() -> None:
    plan = plan_chunks([], PlanSettings())
    assert plan.chunks == [] and plan.total_tokens == 0 and plan.ratio == 0.4


# --- TV11 rendering -----------------------------------------------------------------------------


def test_tv11_tool_result_truncation() -> None:
    text = render_messages([result("c1", "x" * 2500)])
    assert text == "[Tool result]: " + "x" * 2000 + "\n\n[... 500 more characters truncated]"
    assert render_messages([result("c1", "x" * 2000)]) == "[Tool result]: " + "x" * 2000


def test_tv11_assistant_rendering_drops_thinking() -> None:
    message = {"role": "assistant", "stopReason": "toolUse", "content": [
        {"type": "thinking", "thinking": "t"},
        {"type": "text", "text": "hi"},
        {"type": "toolCall", "id": "c", "name": "bash", "arguments": {"command": "ls"}},
    ]}
    # pi would also emit "[Assistant thinking]: t"; we follow OpenClaw and drop it.
    assert render_messages([message]) == (
        '[Assistant]: hi\n\n[Assistant tool calls]: bash(command="ls")')


def test_tool_calls_joined_and_arguments_as_json() -> None:
    message = assistant("", [("a", "read", {"path": "x.py", "limit": 5}),
                             ("b", "edit", {"path": "y", "edits": [{"old": "ü"}]})])
    assert render_messages([message]) == (
        '[Assistant tool calls]: read(path="x.py", limit=5); edit(path="y", '
        'edits=[{"old":"ü"}])')


def test_user_and_roles_render() -> None:
    rendered = render_messages([
        user("hello"),
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        {"role": "custom", "customType": "ext", "content": "from extension"},
        {"role": "compactionSummary", "summary": "OLD"},
        user(""),
    ])
    parts = rendered.split("\n\n")
    assert parts[0] == "[User]: hello"
    assert parts[1] == "[User]: a\nb"
    assert parts[2] == "[User]: from extension"
    assert parts[3].startswith("[User]: The conversation history before this point")
    assert "OLD" in rendered
    assert not rendered.endswith("[User]: ")


def _log(lines: int) -> str:
    return "".join(f"line {i:04d} ok\n" for i in range(lines))  # 15 chars a line


def test_diagnostic_near_the_end_keeps_a_full_tail() -> None:
    text = _log(400) + "Traceback (most recent call last)\n  File x.py\nValueError: boom\n" \
        + "z" * 100
    out = truncate_tool_result(text)
    # Head of 2000 - 600 chars, one marker, and the last 600 chars (the diagnostic sits within
    # them, so the tail is moved back to be full and runs to the end: "more").
    omitted = len(text) - 1400 - 600
    assert out == (f"{text[:1400]}\n\n[... {omitted} more characters truncated]\n\n"
                   f"{text[-600:]}")
    assert "Traceback" in out and "ValueError: boom" in out
    rendered = render_messages([result("c1", text)])
    assert rendered == "[Tool result]: " + out


def test_diagnostic_further_back_starts_the_tail_and_marks_the_trailing_cut() -> None:
    text = _log(400) + "fatal: cannot lock ref\n" + _log(80)  # 1200 chars after the line
    start = text.index("fatal")
    out = truncate_tool_result(text)
    tail = text[start : start + 600]
    omitted = len(text) - 1400 - 600
    assert out == f"{text[:1400]}\n\n[... {omitted} middle/trailing characters truncated]\n\n{tail}"


def test_strong_diagnostic_preferred_over_a_later_weak_one() -> None:
    text = _log(400) + "ERROR: disk full\n" + _log(70) + "2 tests failed\n" + _log(20)
    out = truncate_tool_result(text)
    assert out.split("truncated]\n\n", 1)[1].startswith("ERROR: disk full")


def test_diagnostic_inside_the_head_keeps_the_plain_head() -> None:
    # The error sits where the shortened head would end: keep the full 2000-char head.
    text = "a" * 1500 + " error here " + "b" * 1000
    assert truncate_tool_result(text) == text[:2000] + (
        f"\n\n[... {len(text) - 2000} more characters truncated]")


def test_no_diagnostic_falls_back_to_head() -> None:
    text = "a" * 5000
    assert truncate_tool_result(text) == "a" * 2000 + "\n\n[... 3000 more characters truncated]"


def test_images_become_bounded_markers() -> None:
    image = {"type": "image", "data": "AAAA", "mimeType": "image/png"}
    first = render_messages([{"role": "user", "content": [
        {"type": "text", "text": "look"}, image, image, {"type": "audio", "data": "x"}]}])
    assert first == f"[User]: look\n{IMAGE_MARKER}\n{NON_TEXT_MARKER}"
    assert "AAAA" not in first
    results = [{"role": "toolResult", "toolCallId": f"c{i}", "content": [image]}
               for i in range(11)]
    rendered = render_messages(results)
    assert rendered.count(IMAGE_MARKER) == 8
    assert rendered.count(MORE_OMITTED_MARKER) == 1
    assert rendered.split("\n\n")[8] == f"[Tool result]: {MORE_OMITTED_MARKER}"
    assert len(rendered.split("\n\n")) == 9


def test_runtime_context_and_details_never_rendered() -> None:
    rendered = render_messages([
        {"role": "custom", "customType": "openclaw.runtime-context", "content": "RUNTIME-SECRET"},
        result("c1", "visible", details={"token": "DETAILS-SECRET", "diff": "..."}),
        {"role": "bashExecution", "command": "!!hidden", "output": "HIDDEN", "exitCode": 0,
         "excludeFromContext": True},
    ])
    assert rendered == "[Tool result]: visible"


def test_bash_execution_rendering() -> None:
    rendered = render_messages([
        {"role": "bashExecution", "command": "make", "output": "err", "exitCode": 2,
         "cancelled": False, "truncated": True, "fullOutputPath": "/tmp/out.txt"},
        {"role": "bashExecution", "command": "true", "output": "", "exitCode": 0},
        {"role": "bashExecution", "command": "sleep 9", "output": "", "cancelled": True},
    ])
    parts = rendered.split("\n\n[User]: ")
    assert parts[0] == ("[User]: Ran `make`\n```\nerr\n```\n\nCommand exited with code 2\n\n"
                        "[Output truncated. Full output: /tmp/out.txt]")
    assert parts[1] == "Ran `true`\n(no output)"
    assert parts[2] == "Ran `sleep 9`\n(no output)\n\n(command cancelled)"


# --- TV12 file ops ------------------------------------------------------------------------------


def test_tv12_file_ops_text() -> None:
    ops = FileOps()
    ops.add_messages([assistant("", [
        ("1", "read", {"path": "a.txt"}),
        ("2", "read", {"path": "b.txt"}),
        ("3", "edit", {"path": "b.txt"}),
        ("4", "write", {"path": "c.txt"}),
    ])])
    assert ops.read_files == ["a.txt"]
    assert ops.modified_files == ["b.txt", "c.txt"]
    assert format_file_ops(ops.read_files, ops.modified_files) == (
        "\n\n<read-files>\na.txt\n</read-files>\n\n<modified-files>\nb.txt\nc.txt\n"
        "</modified-files>")
    assert format_file_ops([], []) == ""


def test_file_ops_openclaw_extensions() -> None:
    ops = FileOps()
    ops.add_messages([
        assistant("", [("1", "mcp__fs__Read", {"file_path": "x.py"}),
                       ("2", "Edit", {"filePath": "y.py"}),
                       ("3", "bash", {"path": "ignored.sh"})]),
        {"role": "toolResult", "toolCallId": "p", "toolName": "apply_patch",
         "details": {"summary": {"added": ["new.py"], "modified": ["y.py"], "deleted": ["d"]}}},
    ])
    assert ops.read_files == ["x.py"]
    assert ops.modified_files == ["new.py", "y.py"]
