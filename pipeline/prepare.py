"""What to summarize: pi's `prepareCompaction`, without pi's repeated-compaction data loss.

pi starts a second compaction right after the previous compaction entry, so the entries that
compaction kept (its `firstKeptEntryId` up to the entry) are neither kept nor summarized by the
next one. We start at the previous `firstKeptEntryId` instead, as OpenClaw does, so every message
on the active path before the new cut ends up in the history or the turn prefix.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pipeline.context import ContextMessage, build_session_context, entry_message
from pipeline.cutpoint import find_cut_point
from pipeline.fileops import FileOps
from pipeline.settings import PlanSettings
from pipeline.tokens import estimate_context_tokens
from pipeline.transcript import Entry
from pipeline.trigger import effective_reserve, should_compact


@dataclass(slots=True)
class Preparation:
    """The deterministic decision of one compaction, before any summarizer runs."""

    path: list[Entry]
    first_kept_index: int
    first_kept_entry_id: str
    is_split_turn: bool
    turn_start_index: int
    boundary_start: int
    history: list[ContextMessage]
    turn_prefix: list[ContextMessage]
    tokens_before: int
    reserve_tokens: int
    should_compact: bool
    previous_compaction: Entry | None
    file_ops: FileOps

    @property
    def previous_summary(self) -> str | None:
        if self.previous_compaction is None:
            return None
        summary = self.previous_compaction.data.get("summary")
        return summary if isinstance(summary, str) and summary else None

    @property
    def turn_start_entry_id(self) -> str | None:
        if not self.is_split_turn:
            return None
        return self.path[self.turn_start_index].id

    @property
    def leaf_id(self) -> str:
        return self.path[-1].id

    @property
    def nothing_to_summarize(self) -> bool:
        return not self.history and not self.turn_prefix

    def summarized_entry_ids(self) -> list[str]:
        """Every entry id whose content the summary replaces, oldest first."""
        return [m.entry_id for m in self.history] + [m.entry_id for m in self.turn_prefix]


def _messages(entries: Sequence[Entry]) -> list[ContextMessage]:
    out: list[ContextMessage] = []
    for entry in entries:
        message = entry_message(entry)
        if message is not None:
            out.append(ContextMessage(entry.id, message))
    return out


def _boundary_start(path: Sequence[Entry], previous_index: int) -> int:
    """Start at the previous compaction's kept tail when it is on the path before it."""
    previous = path[previous_index]
    first_kept = previous.data.get("firstKeptEntryId")
    for index in range(previous_index):
        if path[index].id == first_kept:
            return index
    return previous_index + 1


def prepare_compaction(path: Sequence[Entry], settings: PlanSettings) -> Preparation | None:
    """Plan one compaction of a root-to-leaf path; None when there is nothing to do.

    Like pi, a path whose last entry is already a compaction is not compacted again.
    """
    if not path or path[-1].type == "compaction":
        return None
    entries = list(path)
    previous_index = next(
        (i for i in range(len(entries) - 1, -1, -1) if entries[i].type == "compaction"), None
    )
    previous = entries[previous_index] if previous_index is not None else None
    start = 0 if previous_index is None else _boundary_start(entries, previous_index)

    context = build_session_context(entries)
    tokens_before = estimate_context_tokens(context.payloads).tokens
    reserve = effective_reserve(settings.reserve_tokens, settings.context_window,
                                settings.reserve_floor)

    cut = find_cut_point(entries, start, len(entries), settings.keep_recent_tokens)
    history_end = cut.turn_start_index if cut.is_split_turn else cut.first_kept_index
    history = _messages(entries[start:history_end])
    prefix = (
        _messages(entries[cut.turn_start_index : cut.first_kept_index])
        if cut.is_split_turn else []
    )

    file_ops = FileOps()
    if previous is not None and not previous.data.get("fromHook"):
        file_ops.add_details(previous.data.get("details"))
    file_ops.add_messages(m.message for m in history)
    file_ops.add_messages(m.message for m in prefix)

    return Preparation(
        path=entries,
        first_kept_index=cut.first_kept_index,
        first_kept_entry_id=entries[cut.first_kept_index].id,
        is_split_turn=cut.is_split_turn,
        turn_start_index=cut.turn_start_index,
        boundary_start=start,
        history=history,
        turn_prefix=prefix,
        tokens_before=tokens_before,
        reserve_tokens=reserve,
        should_compact=should_compact(tokens_before, settings.context_window, reserve),
        previous_compaction=previous,
        file_ops=file_ops,
    )


def latest_user_text(messages: Sequence[ContextMessage]) -> str | None:
    """The last non-empty user text in a message list (the 'latest ask')."""
    for item in reversed(messages):
        message: dict[str, Any] = item.message
        if message.get("role") != "user":
            continue
        content = message.get("content")
        if isinstance(content, str):
            text = content
        else:
            text = "\n".join(
                str(b.get("text", "")) for b in content or []
                if isinstance(b, dict) and b.get("type") == "text"
            )
        if text.strip():
            return text.strip()
    return None
