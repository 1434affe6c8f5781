"""Where to cut: keep at least `keep_recent_tokens` of recent history verbatim.

This is pi's `findCutPoint` (same walk, same valid cut points, same metadata back-scan, same
split-turn rule) so that on ordinary transcripts we cut exactly where pi cuts. On top of it we
never let a cut fall strictly inside a tool call/result group (an assistant with tool calls up
to its last matched result), which pi only guarantees when results directly follow their call.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pipeline.tokens import estimate_tokens
from pipeline.transcript import Entry

_CUT_ROLES = frozenset(
    {"user", "assistant", "bashExecution", "custom", "branchSummary", "compactionSummary"}
)


@dataclass(frozen=True, slots=True)
class CutPoint:
    first_kept_index: int
    turn_start_index: int  # -1 when the turn is not split
    is_split_turn: bool


def is_valid_cut_point(entry: Entry) -> bool:
    kind = entry.type
    if kind in ("branch_summary", "custom_message"):
        return True
    return kind == "message" and entry.role in _CUT_ROLES


def find_turn_start(entries: Sequence[Entry], index: int, start: int) -> int:
    """Walk back from `index` to the user turn (or equivalent) that opened it; -1 if none."""
    for i in range(index, start - 1, -1):
        entry = entries[i]
        if entry.type in ("branch_summary", "custom_message"):
            return i
        if entry.type == "message" and entry.role in ("user", "bashExecution"):
            return i
    return -1


def tool_group_ranges(entries: Sequence[Entry], start: int, end: int) -> list[tuple[int, int]]:
    """[first, last] index ranges from a call-bearing assistant to its last matched result.

    Overlapping ranges are merged, so parallel calls and interleaved results form one group.
    """
    ranges: list[tuple[int, int]] = []
    open_calls: dict[str, int] = {}
    for i in range(start, end):
        msg = entries[i].message
        if msg is None:
            continue
        if msg.get("role") == "assistant" and msg.get("stopReason") not in ("aborted", "error"):
            for block in msg.get("content") or []:
                if isinstance(block, dict) and block.get("type") == "toolCall":
                    open_calls[str(block.get("id"))] = i
        elif msg.get("role") == "toolResult":
            origin = open_calls.pop(str(msg.get("toolCallId")), None)
            if origin is not None and origin < i:
                ranges.append((origin, i))
    ranges.sort()
    merged: list[tuple[int, int]] = []
    for first, last in ranges:
        if merged and first <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], last))
        else:
            merged.append((first, last))
    return merged


def _outside_groups(index: int, groups: Sequence[tuple[int, int]]) -> int:
    for first, last in groups:
        if first < index <= last:
            return first
    return index


def find_cut_point(
    entries: Sequence[Entry], start: int, end: int, keep_recent_tokens: int
) -> CutPoint:
    """pi's `findCutPoint` over `entries[start:end]`, plus the tool-group guard."""
    cut_points = [i for i in range(start, end) if is_valid_cut_point(entries[i])]
    if not cut_points:
        return CutPoint(start, -1, False)

    cut_index = cut_points[0]
    accumulated = 0
    for i in range(end - 1, start - 1, -1):
        entry = entries[i]
        if entry.type != "message" or entry.message is None:
            continue
        accumulated += estimate_tokens(entry.message)
        if accumulated >= keep_recent_tokens:
            cut_index = next((c for c in cut_points if c >= i), cut_index)
            break

    groups = tool_group_ranges(entries, start, end)
    cut_index = _outside_groups(cut_index, groups)

    while cut_index > start and entries[cut_index - 1].type not in ("message", "compaction"):
        cut_index -= 1

    entry = entries[cut_index]
    if entry.type == "message" and entry.role == "user":
        return CutPoint(cut_index, -1, False)
    turn_start = find_turn_start(entries, cut_index, start)
    # The turn start splits history from the turn prefix, two separate summaries: a user
    # message between a call and its result must not put them on different sides either.
    while turn_start != -1 and (first := _outside_groups(turn_start, groups)) != turn_start:
        turn_start = find_turn_start(entries, first, start)
    return CutPoint(cut_index, turn_start, turn_start != -1)
