"""`extractive`: a deterministic, offline summarizer built from the transcript itself.

It needs no model, so a compaction never depends on one being up: it is the default when no
LLM is configured and the last level of every fallback chain. It reads the same rendered text a
model would read (`[User]: …`, `[Assistant]: …` blocks), picks sentences by simple cues, and
always writes the identifiers, latest ask and standing rules the audit requires, so its output
passes the audit by construction. For merges it unions the sections of the partial summaries.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from pipeline.constraints import constraints_from_summary, extract_constraints, merge_register
from pipeline.identifiers import extract_identifiers, identifier_present
from pipeline.sections import (
    CONSTRAINTS,
    DECISIONS,
    GOAL,
    IDENTIFIERS,
    OPEN_TODOS,
    PENDING_ASKS,
    PROGRESS,
    bullet,
    render_sections,
    section_items,
)
from pipeline.summarizer import CancelToken, SummarizerCancelledError, SummaryRequest, SummaryResult

ITEM_CHARS = 240
ASK_CHARS = 600
MAX_ITEMS = 8
MAX_IDENTIFIERS = 24

_BLOCK = re.compile(r"(?:^|\n\n)\[(User|Assistant|Assistant tool calls|Tool result)\]: ")
_CHUNK_HEADER = re.compile(r"^\[Chunk \d+ — [^\]]*\]\s*$", re.MULTILINE)
_SENTENCE = re.compile(r"(?<=[.!?])\s+(?=[A-Z0-9\"'`(])|\n+")
_DECISION = re.compile(
    r"\b(decid\w*|going with|go with|chose|choos\w*|instead of|we'll use|i'll use|switch\w* to|"
    r"opt(?:ed)? for|settled on|because|rather than|the plan is|approach)\b", re.IGNORECASE)
_DONE = re.compile(
    r"\b(done|fixed|implemented|added|updated|created|passed|passing|works|working now|"
    r"completed|merged|removed|refactored|renamed|wrote|committed)\b", re.IGNORECASE)
_TODO = re.compile(
    r"\b(todo|to do|next,? i|next step|remaining|still need|still needs|need to|will need|"
    r"follow[- ]up|left to|not yet|pending|later|afterwards)\b", re.IGNORECASE)


_COVERED = "Covered "
_COVERED_RE = re.compile(r"Covered (\d+) user turn\(s\), (\d+) tool-call batch\(es\), (\d+) ")


def _covered(users: int, calls: int, failures: int) -> str:
    return (f"{_COVERED}{users} user turn(s), {calls} tool-call batch(es), {failures} failing "
            "tool result(s).")


@dataclass(frozen=True, slots=True)
class Turn:
    role: str
    text: str


def parse_rendered(conversation: str) -> list[Turn]:
    """Split rendered text back into (role, text) blocks."""
    turns: list[Turn] = []
    matches = list(_BLOCK.finditer(conversation))
    for index, match in enumerate(matches):
        end = matches[index + 1].start() if index + 1 < len(matches) else len(conversation)
        turns.append(Turn(match.group(1), conversation[match.end():end].strip()))
    return turns


def _clip(text: str, limit: int = ITEM_CHARS) -> str:
    text = " ".join(text.split())
    if len(text) <= limit:
        return text
    cut = text[: limit - 1]
    if " " in cut[limit // 2 :]:
        cut = cut[: cut.rindex(" ")]
    return cut.rstrip() + "…"


def _sentences(text: str) -> list[str]:
    return [s.strip() for s in _SENTENCE.split(text) if len(s.strip()) > 12]


def _recent_unique(items: Iterable[str], limit: int) -> list[str]:
    """The last `limit` distinct items, most recent first."""
    seen: set[str] = set()
    out: list[str] = []
    for item in reversed(list(items)):
        key = item.casefold()
        if key not in seen:
            seen.add(key)
            out.append(item)
        if len(out) == limit:
            break
    return out


def rank_identifiers(turns: Sequence[Turn], required: Sequence[str],
                     limit: int = MAX_IDENTIFIERS) -> list[str]:
    """Required first, then the ones the user named, then by mentions and recency.

    A value the user typed is usually a fact the agent must not lose (a tenant id, an
    endpoint); values the assistant repeats in tool calls (file paths) come after them.
    """
    score: Counter[str] = Counter()
    last_seen: dict[str, int] = {}
    named: set[str] = set()
    for position, turn in enumerate(turns):
        for value in extract_identifiers(turn.text, limit=64):
            score[value] += 1
            last_seen[value] = position
            if turn.role == "User":
                named.add(value)
    ranked = sorted(score, key=lambda v: (v not in named, -score[v], -last_seen[v], v))
    out = list(dict.fromkeys(required))
    for value in ranked:
        if len(out) >= limit:
            break
        if not any(identifier_present(value, existing) for existing in out):
            out.append(value)
    return out


def _pending(turns: Sequence[Turn], latest_ask: str | None) -> list[str]:
    """The latest ask first, then the other user turns since the last completion report."""
    asks: list[str] = []
    if latest_ask:
        asks.append(_clip(latest_ask, ASK_CHARS))
    for turn in reversed(turns):
        if turn.role == "Assistant" and _DONE.search(turn.text) and asks:
            break
        if turn.role == "User" and len(asks) < 3:
            ask = _clip(turn.text, ASK_CHARS)
            if ask not in asks and not (latest_ask and ask.startswith(asks[0][:80])):
                asks.append(ask)
    return asks


def _history_sections(request: SummaryRequest) -> dict[str, list[str]]:
    turns = parse_rendered(request.conversation)
    users = [t.text for t in turns if t.role == "User"]
    said = [s for t in turns if t.role == "Assistant" for s in _sentences(t.text)]
    calls = [t for t in turns if t.role == "Assistant tool calls"]
    failures = sum(1 for t in turns if t.role == "Tool result" and re.search(
        r"\b(error|failed|traceback|exception)\b", t.text, re.IGNORECASE))

    previous = request.previous_summary or ""
    rules = merge_register([*constraints_from_summary(previous), *request.constraints],
                           extract_constraints(users))
    sections: dict[str, list[str]] = {}
    goal = section_items(previous, GOAL)[:1] or ([_clip(users[0], 300)] if users else [])
    sections[GOAL] = bullet(goal)
    progress = [_clip(s) for s in reversed(
        _recent_unique((s for s in said if _DONE.search(s)), 6))]
    progress.append(_covered(len(users), len(calls), failures))
    sections[PROGRESS] = bullet(progress + section_items(previous, PROGRESS)[:4])
    decisions = [_clip(s) for s in _recent_unique((s for s in said if _DECISION.search(s)),
                                                  MAX_ITEMS)]
    sections[DECISIONS] = bullet(decisions + section_items(previous, DECISIONS)[:4])
    todos = [_clip(s) for s in _recent_unique((s for s in said if _TODO.search(s)), MAX_ITEMS)]
    sections[OPEN_TODOS] = bullet(todos + section_items(previous, OPEN_TODOS)[:4])
    sections[CONSTRAINTS] = bullet(rules)
    sections[PENDING_ASKS] = bullet(_pending(turns, request.latest_ask))
    sections[IDENTIFIERS] = bullet(rank_identifiers(turns, request.required_identifiers))
    return sections


def _merge_sections(request: SummaryRequest) -> dict[str, list[str]]:
    """Union the sections of partial summaries; recent parts first where recency matters."""
    parts = [p for p in _CHUNK_HEADER.split(request.conversation) if p.strip()]
    sources = ([request.previous_summary] if request.previous_summary else []) + parts
    newest_first = list(reversed(sources))

    def union(heading: str, limit: int) -> list[str]:
        """The newest `limit` distinct items, kept in chronological order."""
        items = [i for s in sources for i in section_items(s, heading)
                 if not i.startswith(_COVERED)]
        return list(reversed(_recent_unique(items, limit)))

    covered = [tuple(int(n) for n in m.groups()) for s in sources
               for i in section_items(s, PROGRESS) if (m := _COVERED_RE.match(i))]
    totals = [sum(c[k] for c in covered) for k in range(3)] if covered else None

    rules = merge_register([r for s in sources for r in constraints_from_summary(s)],
                           list(request.constraints))
    asks = [_clip(request.latest_ask, ASK_CHARS)] if request.latest_ask else []
    # Older parts' asks were usually answered by later parts: only the newest part's count.
    for item in section_items(newest_first[0], PENDING_ASKS) if newest_first else []:
        if len(asks) < 4 and item not in asks:
            asks.append(item)
    # Round-robin over the parts by rank, so every part keeps its best identifiers (each part
    # lists the user-named ones first) instead of the newest part filling the whole list.
    identifiers = list(dict.fromkeys(request.required_identifiers))
    ranked = [section_items(source, IDENTIFIERS) for source in newest_first]
    for rank in range(max((len(r) for r in ranked), default=0)):
        for items in ranked:
            if rank < len(items) and len(identifiers) < MAX_IDENTIFIERS \
                    and items[rank] not in identifiers:
                identifiers.append(items[rank])
    goal = next((section_items(s, GOAL)[:1] for s in sources if section_items(s, GOAL)), [])
    return {
        GOAL: bullet(goal),
        PROGRESS: bullet(union(PROGRESS, 10) + ([_covered(*totals)] if totals else [])),
        DECISIONS: bullet(union(DECISIONS, 12)),
        OPEN_TODOS: bullet(union(OPEN_TODOS, 12)),
        CONSTRAINTS: bullet(rules),
        PENDING_ASKS: bullet(asks),
        IDENTIFIERS: bullet(identifiers),
    }


def _turn_prefix(request: SummaryRequest) -> str:
    turns = parse_rendered(request.conversation)
    users = [t.text for t in turns if t.role == "User"]
    said = [s for t in turns if t.role == "Assistant" for s in _sentences(t.text)]
    calls = [t.text for t in turns if t.role == "Assistant tool calls"]
    ids = rank_identifiers(turns, (), limit=12)
    lines = ["## Original Request", _clip(users[0], ASK_CHARS) if users else "None.", "",
             "## Early Progress"]
    lines += [f"- {_clip(s)}" for s in said[-4:]] or ["None."]
    lines += [f"- Tool calls: {_clip('; '.join(calls[-6:]), 400)}"] if calls else []
    lines += ["", "## Context for Suffix"]
    lines += [f"- {value}" for value in ids] or ["None."]
    return "\n".join(lines)


class ExtractiveSummarizer:
    """The offline summarizer. Stateless and thread-safe."""

    name = "extractive"
    model = "extractive"

    def summarize(self, request: SummaryRequest, *,
                  cancel: CancelToken | None = None) -> SummaryResult:
        if cancel is not None and cancel.cancelled:
            raise SummarizerCancelledError("compaction cancelled")
        if request.kind == "turn_prefix":
            text = _turn_prefix(request)
        elif request.kind == "merge":
            text = render_sections(_merge_sections(request))
        else:
            text = render_sections(_history_sections(request))
        return SummaryResult(text=text, summarizer=self.name, model=self.model)
