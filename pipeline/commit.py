"""Rebasing a finished compaction onto the transcript as it is now (pure; no I/O).

Summaries are made off-lock from a snapshot while the agent keeps appending. At commit time
the storage layer re-reads the transcript and calls `rebase_compaction`: the summarized
entries must be unchanged and the first kept entry still on the active branch; then the
compaction entry becomes a child of the *current* leaf, so whatever was appended meanwhile
stays in the kept tail. A redelivered commit finds its own entry (same compaction id) and
changes nothing.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import orjson

from pipeline.transcript import Transcript


class Superseded(Exception):
    """The transcript moved in a way that makes this compaction wrong to commit."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class SnapshotFacts:
    """What the compaction assumed about the transcript when it was planned."""

    compaction_id: str
    first_kept_entry_id: str
    summarized: tuple[tuple[str, str], ...]  # (entry id, content digest)
    previous_compaction_id: str | None


def entry_digest(data: dict[str, Any]) -> str:
    return hashlib.sha256(orjson.dumps(data, option=orjson.OPT_SORT_KEYS)).hexdigest()[:16]


def snapshot_facts(transcript: Transcript, compaction_id: str, first_kept_entry_id: str,
                   summarized_ids: Sequence[str], previous_compaction_id: str | None
                   ) -> SnapshotFacts:
    digests = []
    for entry_id in summarized_ids:
        entry = transcript.get(entry_id)
        if entry is not None:
            digests.append((entry_id, entry_digest(entry.data)))
    return SnapshotFacts(compaction_id, first_kept_entry_id, tuple(digests),
                         previous_compaction_id)


def find_compaction(transcript: Transcript, compaction_id: str) -> str | None:
    """The entry id of the compaction with this compaction id, if already committed."""
    for entry in reversed(transcript.entries):
        if entry.type != "compaction":
            continue
        details = entry.data.get("details")
        ours = details.get("compactd") if isinstance(details, dict) else None
        if isinstance(ours, dict) and ours.get("compactionId") == compaction_id:
            return entry.id
    return None


RebaseStatus = Literal["appended", "already_committed"]


def rebase_compaction(current: Transcript, entry: dict[str, Any],
                      facts: SnapshotFacts) -> tuple[RebaseStatus, str]:
    """Append `entry` to `current` (in memory) as a child of its leaf, after the checks.

    Returns ("already_committed", id) when this compaction is already there, else
    ("appended", id). Raises `Superseded` when the checks fail.
    """
    existing = find_compaction(current, facts.compaction_id)
    if existing is not None:
        return "already_committed", existing
    for entry_id, digest in facts.summarized:
        found = current.get(entry_id)
        if found is None:
            raise Superseded(f"summarized entry {entry_id} no longer exists")
        if entry_digest(found.data) != digest:
            raise Superseded(f"summarized entry {entry_id} changed since the snapshot")
    path = current.path()
    on_path = {e.id for e in path}
    if facts.first_kept_entry_id not in on_path:
        raise Superseded(f"first kept entry {facts.first_kept_entry_id} is no longer on the "
                         "active branch")
    latest = next((e.id for e in reversed(path) if e.type == "compaction"), None)
    if latest != facts.previous_compaction_id:
        raise Superseded(f"another compaction ({latest}) landed since the snapshot")
    new_entry = dict(entry)
    if new_entry["id"] in current:
        new_entry["id"] = current.new_id(seed=facts.compaction_id)
    new_entry["parentId"] = path[-1].id if path else None
    current.append(new_entry)
    return "appended", new_entry["id"]
