"""Cut point, preparation and the model view (spec §1.6, §3; TV3–TV6)."""

from __future__ import annotations

from typing import Any

import pytest

from pipeline.context import BRANCH_PREFIX, build_session_context, convert_to_llm
from pipeline.cutpoint import (
    CutPoint,
    find_cut_point,
    find_turn_start,
    is_valid_cut_point,
    tool_group_ranges,
)
from pipeline.fileops import format_file_ops
from pipeline.prepare import prepare_compaction
from pipeline.settings import PlanSettings
from pipeline.transcript import Entry, parse_transcript
from tests.support.builders import SessionBuilder


def entries_of(b: SessionBuilder) -> list[Entry]:
    return parse_transcript(b.to_bytes()).path()


def tv3() -> tuple[list[Entry], list[str]]:
    b = SessionBuilder()
    ids = [
        b.user("u" * 400),                                       # 0: 100
        b.assistant("a" * 800),                                  # 1: 200
        b.user("v" * 400),                                       # 2: 100
        b.assistant(calls=[("read", {"path": "a.txt"})]),        # 3: 5
        b.tool_result("call_1", "r" * 1200, name="read"),        # 4: 300
        b.assistant("b" * 400),                                  # 5: 100
    ]
    return entries_of(b), ids


def settings(keep: int, **kw: Any) -> PlanSettings:
    return PlanSettings(keep_recent_tokens=keep, **kw)


# --- TV3 --------------------------------------------------------------------------------------


def test_tv3_valid_cut_points() -> None:
    entries, _ = tv3()
    assert [i for i, e in enumerate(entries) if is_valid_cut_point(e)] == [0, 1, 2, 3, 5]


@pytest.mark.parametrize(("keep", "expected"), [
    (50, CutPoint(5, 2, True)),
    (100, CutPoint(5, 2, True)),
    (350, CutPoint(5, 2, True)),
    (400, CutPoint(5, 2, True)),
    (405, CutPoint(3, 2, True)),
    (406, CutPoint(2, -1, False)),
    (500, CutPoint(2, -1, False)),
    (505, CutPoint(2, -1, False)),
    (506, CutPoint(1, 0, True)),
    (10000, CutPoint(0, -1, False)),
])
def test_tv3_find_cut_point(keep: int, expected: CutPoint) -> None:
    entries, _ = tv3()
    assert find_cut_point(entries, 0, len(entries), keep) == expected


# --- TV4 --------------------------------------------------------------------------------------


def test_tv4_prepare_compaction() -> None:
    entries, ids = tv3()
    prep = prepare_compaction(entries, settings(350))
    assert prep is not None
    assert [m.entry_id for m in prep.history] == ids[0:2]
    assert [m.entry_id for m in prep.turn_prefix] == ids[2:5]
    assert prep.first_kept_entry_id == ids[5]
    assert prep.is_split_turn and prep.turn_start_entry_id == ids[2]
    assert prep.tokens_before == 805
    assert prep.file_ops.read_files == ["a.txt"]
    assert prep.file_ops.details() == {"readFiles": ["a.txt"], "modifiedFiles": []}
    assert format_file_ops(prep.file_ops.read_files, prep.file_ops.modified_files) == (
        "\n\n<read-files>\na.txt\n</read-files>")
    assert prep.previous_summary is None and prep.boundary_start == 0


def test_tv4_keep_everything_leaves_nothing_to_summarize() -> None:
    entries, ids = tv3()
    prep = prepare_compaction(entries, settings(10000))
    assert prep is not None
    assert prep.history == [] and prep.turn_prefix == []
    assert prep.first_kept_entry_id == ids[0]
    assert prep.nothing_to_summarize


# --- TV5: repeated compaction starts at the previous firstKeptEntryId --------------------------


def tv5() -> tuple[list[Entry], list[str]]:
    b = SessionBuilder()
    u0 = b.user("q" * 400)
    a1 = b.assistant("w" * 400)
    u2 = b.user("e" * 400)
    a3 = b.assistant("r" * 400)
    c4 = b.add("compaction", summary="S1", firstKeptEntryId=u2, tokensBefore=400,
               details={"readFiles": ["old.txt"], "modifiedFiles": ["mod.txt"]})
    u5 = b.user("t" * 400)
    a6 = b.assistant("y" * 400)
    return entries_of(b), [u0, a1, u2, a3, c4, u5, a6]


def test_tv5_context_after_compaction() -> None:
    entries, (_, _, u2, a3, c4, u5, a6) = tv5()
    ctx = build_session_context(entries)
    assert [m.entry_id for m in ctx.messages] == [c4, u2, a3, u5, a6]
    assert [m.message["role"] for m in ctx.messages] == [
        "compactionSummary", "user", "assistant", "user", "assistant"]
    assert ctx.compaction_id == c4


def test_tv5_second_compaction_summarizes_from_previous_first_kept() -> None:
    entries, (_, _, u2, a3, c4, u5, _) = tv5()
    prep = prepare_compaction(entries, settings(150))  # keeps u5, a6
    assert prep is not None
    assert prep.boundary_start == 2
    assert prep.first_kept_entry_id == u5 and not prep.is_split_turn
    # pi 0.58 would start after C4 and silently drop u2, a3; the compaction itself is skipped.
    assert [m.entry_id for m in prep.history] == [u2, a3]
    assert prep.previous_summary == "S1"
    assert prep.previous_compaction is not None and prep.previous_compaction.id == c4
    # tokensBefore is over the model view: summary (1) + u2 a3 u5 a6 (4 x 100).
    assert prep.tokens_before == 401
    # Previous file lists are carried over.
    assert prep.file_ops.details() == {"readFiles": ["old.txt"], "modifiedFiles": ["mod.txt"]}


def test_previous_first_kept_not_on_path_starts_after_compaction() -> None:
    b = SessionBuilder()
    b.user("a" * 400)
    b.add("compaction", summary="S", firstKeptEntryId="elsewhere", tokensBefore=1)
    u2 = b.user("b" * 400)
    a3 = b.assistant("c" * 400)
    u4 = b.user("d" * 400)
    b.assistant("e" * 400)
    prep = prepare_compaction(entries_of(b), settings(150))
    assert prep is not None
    assert prep.boundary_start == 2
    assert prep.first_kept_entry_id == u4
    assert [m.entry_id for m in prep.history] == [u2, a3]


def test_hook_compaction_file_ops_are_ignored() -> None:
    b = SessionBuilder()
    u0 = b.user("a" * 400)
    b.add("compaction", summary="S", firstKeptEntryId=u0, tokensBefore=1, fromHook=True,
          details={"readFiles": ["hook.txt"], "modifiedFiles": []})
    b.user("b" * 400)
    prep = prepare_compaction(entries_of(b), settings(50))
    assert prep is not None
    assert prep.file_ops.details() == {"readFiles": [], "modifiedFiles": []}


def test_last_entry_compaction_returns_none() -> None:
    b = SessionBuilder()
    u0 = b.user("a")
    b.assistant("b")
    b.add("compaction", summary="S", firstKeptEntryId=u0, tokensBefore=1)
    assert prepare_compaction(entries_of(b), settings(1)) is None
    assert prepare_compaction([], settings(1)) is None


# --- TV6: branches ------------------------------------------------------------------------------


def test_tv6_branch_summary_context() -> None:
    b = SessionBuilder()
    u1 = b.user("one")
    a2 = b.assistant("two")
    u3 = b.user("three")
    bs4 = b.add("branch_summary", parent=a2, fromId=u3, summary="explored three")
    u5 = b.user("five")
    t = parse_transcript(b.to_bytes())
    path = t.path(u5)
    assert [e.id for e in path] == [u1, a2, bs4, u5]
    ctx = build_session_context(path)
    assert [m.message["role"] for m in ctx.messages] == ["user", "assistant", "branchSummary",
                                                         "user"]
    assert u3 not in [m.entry_id for m in ctx.messages]
    llm = convert_to_llm(ctx.payloads)
    assert llm[2]["role"] == "user"
    assert llm[2]["content"][0]["text"] == (
        f"{BRANCH_PREFIX}\n\n<summary>\nexplored three</summary>")


def test_empty_branch_summary_is_not_a_message() -> None:
    b = SessionBuilder()
    b.user("one")
    b.add("branch_summary", fromId="x", summary="")
    assert [m.message["role"] for m in build_session_context(entries_of(b)).messages] == ["user"]


# --- metadata back-scan -------------------------------------------------------------------------


def test_metadata_back_scan_pulls_settings_into_kept_side() -> None:
    b = SessionBuilder()
    b.user("a" * 400)                                            # 0
    b.assistant("b" * 400)                                       # 1
    mc = b.add("model_change", provider="openai", modelId="gpt")  # 2
    b.add("thinking_level_change", thinkingLevel="high")         # 3
    b.add("label", targetId=mc, label="here")                    # 4
    b.user("c" * 400)                                            # 5
    b.assistant("d" * 400)                                       # 6
    entries = entries_of(b)
    cut = find_cut_point(entries, 0, len(entries), 200)
    # The walk lands on the user at 5; the scan steps back over 4, 3, 2 and stops at message 1.
    assert cut.first_kept_index == 2
    # pi's rule: the cut entry is not a user message, so it looks back for the turn start.
    assert cut == CutPoint(2, 0, True)


def test_back_scan_stops_at_compaction() -> None:
    b = SessionBuilder()
    u0 = b.user("a" * 400)
    b.add("compaction", summary="S", firstKeptEntryId=u0, tokensBefore=1)  # 1
    b.add("model_change", provider="p", modelId="m")                       # 2
    b.user("c" * 400)                                                      # 3
    entries = entries_of(b)
    assert find_cut_point(entries, 0, len(entries), 100).first_kept_index == 2


def test_no_cut_points_keeps_from_start() -> None:
    b = SessionBuilder()
    b.add("model_change", provider="p", modelId="m")
    b.add("custom", customType="ext", data={})
    entries = entries_of(b)
    assert find_cut_point(entries, 0, 2, 1) == CutPoint(0, -1, False)


# --- tool groups --------------------------------------------------------------------------------


def test_tool_group_not_split_by_user_between_call_and_result() -> None:
    b = SessionBuilder()
    b.user("a" * 400)                                          # 0
    b.assistant("plan", calls=[("bash", {"command": "make"})])  # 1
    call = b.last_call_ids[0]
    b.user("steer" * 80)                                       # 2: a user message mid-group
    b.tool_result(call, "r" * 40)                              # 3
    b.assistant("e" * 400)                                     # 4
    entries = entries_of(b)
    assert tool_group_ranges(entries, 0, len(entries)) == [(1, 3)]
    # pi alone would cut at the user message 2, leaving call 1 on the summarized side and its
    # result 3 on the kept side.
    cut = find_cut_point(entries, 0, len(entries), 200)
    assert cut.first_kept_index == 1
    assert cut == CutPoint(1, 0, True)


def test_parallel_calls_form_one_group() -> None:
    b = SessionBuilder()
    b.user("go")                                                             # 0
    b.assistant(calls=[("read", {"path": "x"}), ("read", {"path": "y"})])   # 1
    c1, c2 = b.last_call_ids
    b.tool_result(c2, "y" * 40)                                              # 2 (out of order)
    b.user("s" * 400)                                                        # 3 mid-group
    b.tool_result(c1, "x" * 40)                                              # 4
    b.assistant("done" * 100)                                                # 5
    b.assistant(calls=[("bash", {"command": "ls"})])                        # 6
    b.tool_result(b.last_call_ids[0], "out")                                # 7
    entries = entries_of(b)
    assert tool_group_ranges(entries, 0, len(entries)) == [(1, 4), (6, 7)]
    cut = find_cut_point(entries, 0, len(entries), 150)
    assert cut.first_kept_index == 1


def test_overlapping_groups_merge() -> None:
    b = SessionBuilder()
    b.user("go")                                                # 0
    b.assistant(calls=[("bash", {"command": "a"})])            # 1
    first = b.last_call_ids[0]
    b.assistant(calls=[("bash", {"command": "b"})])            # 2
    second = b.last_call_ids[0]
    b.tool_result(first, "a")                                  # 3
    b.tool_result(second, "b")                                 # 4
    entries = entries_of(b)
    assert tool_group_ranges(entries, 0, len(entries)) == [(1, 4)]


def test_aborted_call_opens_no_group() -> None:
    b = SessionBuilder()
    b.user("go")
    b.assistant(calls=[("bash", {"command": "a"})], stop="aborted")
    b.tool_result(b.last_call_ids[0], "aborted")
    entries = entries_of(b)
    assert tool_group_ranges(entries, 0, len(entries)) == []


# --- custom_message / branch_summary as cut points ----------------------------------------------


def test_custom_message_is_a_turn_start_and_costs_nothing_in_the_walk() -> None:
    b = SessionBuilder()
    b.user("u" * 400)                                                      # 0
    b.assistant(calls=[("bash", {"command": "ls"})])                       # 1
    b.tool_result(b.last_call_ids[0], "r" * 400)                           # 2
    cm = b.add("custom_message", customType="ext", content="x" * 4000, display=True)  # 3
    b.assistant("a" * 40)                                                  # 4
    entries = entries_of(b)
    assert is_valid_cut_point(entries[3])
    assert find_turn_start(entries, 4, 0) == 3
    # 10 (a4) + 100 (r2) >= 100 at the tool result: the next cut point is the custom message.
    cut = find_cut_point(entries, 0, len(entries), 100)
    # pi quirk (spec §10 item 6): a cut on a custom_message is a "split turn" with an empty prefix.
    assert cut == CutPoint(3, 3, True)
    prep = prepare_compaction(entries, settings(100))
    assert prep is not None
    assert prep.first_kept_entry_id == cm and prep.turn_prefix == []
    assert len(prep.history) == 3


def test_branch_summary_adds_no_tokens_in_the_walk() -> None:
    b = SessionBuilder()
    b.user("u" * 400)                                           # 0: 100
    b.add("branch_summary", fromId="x", summary="s" * 4000)     # 1: would be 1000
    b.user("v" * 400)                                           # 2: 100
    entries = entries_of(b)
    assert is_valid_cut_point(entries[1])
    # 100 (u2) then 200 (u0) >= 150: cut at u0. Counting the summary would cut at 1.
    assert find_cut_point(entries, 0, 3, 150) == CutPoint(0, -1, False)


def test_custom_role_message_is_a_cut_point_but_not_a_turn_start() -> None:
    b = SessionBuilder()
    b.user("u")                                                                       # 0
    b.assistant("a")                                                                  # 1
    b.message({"role": "custom", "customType": "ext", "content": "c", "display": True})  # 2
    b.assistant("b")                                                                  # 3
    entries = entries_of(b)
    assert is_valid_cut_point(entries[2])
    assert find_turn_start(entries, 3, 0) == 0


def test_bash_execution_is_a_turn_start() -> None:
    b = SessionBuilder()
    b.user("u" * 400)
    b.message({"role": "bashExecution", "command": "ls", "output": "o" * 400, "exitCode": 0,
               "cancelled": False, "truncated": False})
    b.assistant("a" * 400)
    entries = entries_of(b)
    assert find_cut_point(entries, 0, 3, 50) == CutPoint(2, 1, True)


def test_turn_start_never_separates_a_call_from_its_result() -> None:
    b = SessionBuilder()
    u0 = b.user("a" * 40)                                      # 0
    a1 = b.assistant(calls=[("bash", {"command": "make"})])   # 1
    call = b.last_call_ids[0]
    u2 = b.user("steer")                                       # 2: would be the turn start
    r3 = b.tool_result(call, "r" * 40)                         # 3
    a4 = b.assistant("e" * 400)                                # 4
    entries = entries_of(b)
    cut = find_cut_point(entries, 0, len(entries), 100)
    # Cut at a4; pi's turn start would be the user at 2, putting call 1 in the history summary
    # and its result 3 in the turn-prefix summary. The turn starts at u0 instead.
    assert cut == CutPoint(4, 0, True)
    prep = prepare_compaction(entries, settings(100))
    assert prep is not None
    assert prep.history == []
    assert [m.entry_id for m in prep.turn_prefix] == [u0, a1, u2, r3]
    assert prep.first_kept_entry_id == a4


def test_turn_start_inside_a_group_without_earlier_turn_is_not_split() -> None:
    b = SessionBuilder()
    b.assistant(calls=[("bash", {"command": "make"})])        # 0
    call = b.last_call_ids[0]
    b.user("steer")                                            # 1
    b.tool_result(call, "r" * 40)                              # 2
    b.assistant("e" * 400)                                     # 3
    entries = entries_of(b)
    assert find_cut_point(entries, 0, len(entries), 100) == CutPoint(3, -1, False)
