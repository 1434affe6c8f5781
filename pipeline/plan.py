"""The full deterministic plan of a compaction: preparation + chunk plan, as one value.

This is what `compactd plan` prints and what the runners execute. Parsing and planning are
timed inside the process so the numbers exclude interpreter start-up.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from pipeline.chunks import ChunkPlan, plan_chunks
from pipeline.prepare import Preparation, prepare_compaction
from pipeline.settings import PlanSettings
from pipeline.transcript import Transcript, parse_transcript


@dataclass(slots=True)
class Plan:
    transcript: Transcript
    leaf_id: str | None
    preparation: Preparation | None
    chunks: ChunkPlan | None
    parse_ms: float
    plan_ms: float

    @property
    def has_work(self) -> bool:
        return self.preparation is not None and not self.preparation.nothing_to_summarize

    def to_json(self) -> dict[str, Any]:
        prep = self.preparation
        timing = {"parseMs": round(self.parse_ms, 3), "planMs": round(self.plan_ms, 3)}
        skipped = [
            {"line": s.line, "code": s.code, "detail": s.detail} for s in self.transcript.skipped
        ]
        if prep is None or self.chunks is None:
            return {
                "sessionId": self.transcript.session_id, "leafId": self.leaf_id,
                "firstKeptEntryId": None, "isSplitTurn": False, "turnStartEntryId": None,
                "tokensBefore": 0, "shouldCompact": False, "messagesToSummarize": [],
                "turnPrefixMessages": [], "chunks": [], "oversized": [],
                "fileOps": {"readFiles": [], "modifiedFiles": []},
                "reason": "nothing to compact (empty branch or the leaf is a compaction)",
                "skippedLines": skipped, "timing": timing,
            }
        return {
            "sessionId": self.transcript.session_id,
            "leafId": self.leaf_id,
            "firstKeptEntryId": prep.first_kept_entry_id,
            "isSplitTurn": prep.is_split_turn,
            "turnStartEntryId": prep.turn_start_entry_id,
            "tokensBefore": prep.tokens_before,
            "reserveTokens": prep.reserve_tokens,
            "shouldCompact": prep.should_compact,
            "previousCompactionId": (
                prep.previous_compaction.id if prep.previous_compaction else None
            ),
            "messagesToSummarize": [m.entry_id for m in prep.history],
            "turnPrefixMessages": [m.entry_id for m in prep.turn_prefix],
            "chunks": [{"entryIds": c.entry_ids, "tokens": c.tokens} for c in self.chunks.chunks],
            "chunkLimitTokens": self.chunks.chunk_limit,
            "chunkReason": self.chunks.reason,
            "oversized": [
                {"entryId": o.entry_id, "role": o.role, "tokens": o.tokens, "note": o.note,
                 "omittedEntryIds": list(o.omitted_entry_ids)}
                for o in self.chunks.oversized
            ],
            "fileOps": prep.file_ops.details(),
            "skippedLines": skipped,
            "timing": timing,
        }


def plan_transcript(transcript: Transcript, settings: PlanSettings,
                    leaf_id: str | None = None, parse_ms: float = 0.0) -> Plan:
    started = time.perf_counter()
    path = transcript.path(leaf_id)
    prep = prepare_compaction(path, settings)
    chunks = plan_chunks(prep.history, settings) if prep is not None else None
    plan_ms = (time.perf_counter() - started) * 1000
    leaf = path[-1].id if path else None
    return Plan(transcript, leaf, prep, chunks, parse_ms, plan_ms)


def plan_bytes(data: bytes, settings: PlanSettings, *, leaf_id: str | None = None,
               lenient: bool = False) -> Plan:
    started = time.perf_counter()
    transcript = parse_transcript(data, lenient=lenient)
    parse_ms = (time.perf_counter() - started) * 1000
    return plan_transcript(transcript, settings, leaf_id, parse_ms)
