"""Cutting the summarized history into chunks that can be summarized in parallel.

Chunks are built from atomic groups (an assistant's tool calls stay with their results), sized
by OpenClaw's adaptive ratio with its 1.2 safety margin, and additionally capped by a target
chunk size so that a long history fans out over several workers instead of one long call.
Oversized messages (tokens × 1.2 > half the window) are listed with the note that replaces them
when the engine falls back to summarizing without them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from pipeline.context import ContextMessage
from pipeline.render import sanitize
from pipeline.settings import PlanSettings
from pipeline.tokens import estimate_tokens

SAFETY_MARGIN = 1.2
BASE_CHUNK_RATIO = 0.4
MIN_CHUNK_RATIO = 0.15
SUMMARIZATION_OVERHEAD_TOKENS = 4096
OVERSIZED_WINDOW_SHARE = 0.5


@dataclass(slots=True)
class Chunk:
    messages: list[ContextMessage]
    tokens: int

    @property
    def entry_ids(self) -> list[str]:
        return [m.entry_id for m in self.messages]


@dataclass(frozen=True, slots=True)
class Oversized:
    """A message too large to summarize, the note that stands in for it, and its group."""

    entry_id: str
    role: str
    tokens: int
    note: str
    omitted_entry_ids: tuple[str, ...]


@dataclass(slots=True)
class ChunkPlan:
    chunks: list[Chunk]
    oversized: list[Oversized]
    ratio: float
    max_chunk_tokens: int
    chunk_limit: int
    total_tokens: int
    reason: str
    groups: int = 0
    notes: list[str] = field(default_factory=list)

    @property
    def omitted_entry_ids(self) -> set[str]:
        return {i for o in self.oversized for i in o.omitted_entry_ids}


def adaptive_chunk_ratio(tokens: Sequence[int], context_window: int) -> float:
    """OpenClaw's `computeAdaptiveChunkRatio`: smaller chunks when messages are large."""
    if not tokens:
        return BASE_CHUNK_RATIO
    avg_ratio = (sum(tokens) / len(tokens) * SAFETY_MARGIN) / context_window
    if avg_ratio > 0.1:
        return max(MIN_CHUNK_RATIO, BASE_CHUNK_RATIO - min(2 * avg_ratio, 0.25))
    return BASE_CHUNK_RATIO


def max_chunk_tokens(ratio: float, context_window: int) -> int:
    return max(1, math.floor(context_window * ratio) - SUMMARIZATION_OVERHEAD_TOKENS)


def _answered_calls(messages: Sequence[ContextMessage]) -> set[tuple[int, str]]:
    """(assistant index, call id) of every call whose result appears later in `messages`.

    A result answers the nearest earlier open call with its id (providers may reuse ids).
    """
    open_calls: dict[str, list[int]] = {}
    answered: set[tuple[int, str]] = set()
    for index, item in enumerate(messages):
        message = item.message
        role = message.get("role")
        if role == "assistant" and message.get("stopReason") not in ("aborted", "error"):
            for block in message.get("content") or []:
                if isinstance(block, dict) and block.get("type") == "toolCall":
                    open_calls.setdefault(str(block.get("id")), []).append(index)
        elif role == "toolResult" and message.get("toolCallId") is None:
            # An id-less result closes every open call (OpenClaw clears its pending set).
            answered.update((i, c) for c, indices in open_calls.items() for i in indices)
            open_calls.clear()
        elif role == "toolResult":
            waiting = open_calls.get(str(message.get("toolCallId")))
            if waiting:
                answered.add((waiting.pop(), str(message.get("toolCallId"))))
    return answered


def atomic_groups(messages: Sequence[ContextMessage]) -> list[list[int]]:
    """Indices partitioned so no group ends while a tool call is still waiting for its result.

    Only calls whose result does arrive are waited for. A call whose result never comes (an
    interrupted turn) would otherwise glue the whole remaining history into one group, and
    closing groups at the next user turn instead would separate a result that arrives after an
    interjected user message from its call.
    """
    answered = _answered_calls(messages)
    groups: list[list[int]] = []
    current: list[int] = []
    pending: set[str] = set()
    for index, item in enumerate(messages):
        message = item.message
        current.append(index)
        role = message.get("role")
        if role == "assistant" and message.get("stopReason") not in ("aborted", "error"):
            for block in message.get("content") or []:
                if (isinstance(block, dict) and block.get("type") == "toolCall"
                        and (index, str(block.get("id"))) in answered):
                    pending.add(str(block.get("id")))
        elif role == "toolResult":
            result_id = message.get("toolCallId")
            if result_id is None:
                pending.clear()
            else:
                pending.discard(str(result_id))
        if not pending:
            groups.append(current)
            current = []
    if current:
        groups.append(current)
    return groups


def oversized_note(role: str, tokens: int) -> str:
    # Half-up like JavaScript's Math.round (Python's round() rounds 4.5 to 4).
    thousands = math.floor(tokens / 1000 + 0.5)
    return f"[Large {role} (~{thousands}K tokens) omitted from summary]"


def plan_chunks(history: Sequence[ContextMessage], settings: PlanSettings) -> ChunkPlan:
    """Group, measure and cut the history; list oversized messages with their notes."""
    items = [m for m in history if sanitize([m.message])]
    window = settings.context_window
    tokens = [estimate_tokens(m.message) for m in items]
    total = sum(tokens)
    ratio = adaptive_chunk_ratio(tokens, window)
    model_cap = max_chunk_tokens(ratio, window)
    effective = max(1, math.floor(model_cap / SAFETY_MARGIN))
    by_count = math.ceil(total / settings.max_chunks) if total else 0
    limit = max(1, min(effective, max(settings.target_chunk_tokens, by_count)))

    groups = atomic_groups(items)
    oversized: list[Oversized] = []
    for group in groups:
        for index in group:
            if tokens[index] * SAFETY_MARGIN > OVERSIZED_WINDOW_SHARE * window:
                role = str(items[index].message.get("role"))
                omitted = (
                    tuple(
                        items[i].entry_id for i in group
                        if items[i].message.get("role") in ("assistant", "toolResult")
                    )
                    if role in ("assistant", "toolResult") else (items[index].entry_id,)
                )
                oversized.append(
                    Oversized(items[index].entry_id, role, tokens[index],
                              oversized_note(role, tokens[index]), omitted)
                )

    chunks: list[Chunk] = []
    current: list[int] = []
    current_tokens = 0
    for group in groups:
        group_tokens = sum(tokens[i] for i in group)
        if (current and len(chunks) < settings.max_chunks - 1
                and current_tokens + group_tokens > limit):
            chunks.append(Chunk([items[i] for i in current], current_tokens))
            current, current_tokens = [], 0
        current.extend(group)
        current_tokens += group_tokens
    if current:
        chunks.append(Chunk([items[i] for i in current], current_tokens))

    reason = (
        f"{total} tokens in {len(groups)} atomic groups; chunk limit {limit} tokens "
        f"(adaptive ratio {ratio:.2f} -> model cap {effective} after /1.2, target "
        f"{settings.target_chunk_tokens}, at most {settings.max_chunks} chunks) -> "
        f"{len(chunks)} chunk(s)"
    )
    return ChunkPlan(chunks, oversized, ratio, model_cap, limit, total, reason, len(groups))
