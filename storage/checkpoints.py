"""Pre-compaction checkpoints: bounded, listable, restorable snapshots of a session's transcript.

Why: a compaction replaces most of the model's context with a summary. If the summary turns out
bad, an operator must be able to go back (spec §7.2, OpenClaw's compaction checkpoints). Each
checkpoint is two objects under ``checkpoints/``: the exact segment bytes (``{id}.jsonl``) and a
small metadata JSON (``{id}.meta.json``) so listing and pruning never download snapshots.

Bounds (default 25 snapshots / 128 MiB per session, configurable): the newest checkpoint is
always kept, then newer-first until either bound would be exceeded; everything older is
deleted (metadata first, so a listing never shows a checkpoint whose snapshot is gone).

Restore never rewrites history: the snapshot becomes a *new* segment (create-only), the live
segment is sealed and ``HEAD`` swapped by CAS (the same switch as rotation), and the state
before the restore is itself checkpointed, so a restore can be undone like a compaction.
"""

from __future__ import annotations

import hashlib
import secrets
import time
from contextlib import suppress
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson

from pipeline.transcript import parse_transcript
from storage.errors import NotFound, PreconditionFailed, StoreError
from storage.keys import ID_PATTERN, checkpoint_key, checkpoint_meta_key, validate_id

if TYPE_CHECKING:
    from storage.sessions import SessionSnapshot, SessionStore

__all__ = [
    "DEFAULT_MAX_BYTES",
    "DEFAULT_MAX_COUNT",
    "CheckpointLimits",
    "CheckpointMeta",
    "RestoreResult",
    "checkpoint_id_for",
    "create_checkpoint",
    "get_checkpoint",
    "list_checkpoints",
    "prune_checkpoints",
    "restore_checkpoint",
]

DEFAULT_MAX_COUNT = 25
DEFAULT_MAX_BYTES = 128 * 1024 * 1024
_META_SUFFIX = ".meta.json"


@dataclass(frozen=True, slots=True)
class CheckpointLimits:
    """Per-session retention bounds."""

    max_count: int = DEFAULT_MAX_COUNT
    max_bytes: int = DEFAULT_MAX_BYTES

    def __post_init__(self) -> None:
        if self.max_count < 1 or self.max_bytes < 1:
            raise ValueError("checkpoint limits must be at least 1")


@dataclass(frozen=True, slots=True)
class CheckpointMeta:
    """What ``{id}.meta.json`` holds."""

    id: str
    created_at: str
    created_ns: int
    reason: str
    compaction_id: str | None
    leaf_id: str | None
    session_id: str
    bytes: int
    source_segment: str
    source_etag: str

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id, "createdAt": self.created_at, "createdNs": self.created_ns,
            "reason": self.reason, "compactionId": self.compaction_id, "leafId": self.leaf_id,
            "sessionId": self.session_id, "bytes": self.bytes,
            "sourceSegment": self.source_segment, "sourceEtag": self.source_etag,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> CheckpointMeta:
        return cls(
            id=validate_id("checkpoint", data["id"]), created_at=str(data["createdAt"]),
            created_ns=int(data["createdNs"]), reason=str(data.get("reason", "")),
            compaction_id=data.get("compactionId"), leaf_id=data.get("leafId"),
            session_id=str(data.get("sessionId", "")), bytes=int(data["bytes"]),
            source_segment=str(data["sourceSegment"]), source_etag=str(data.get("sourceEtag", "")),
        )


@dataclass(frozen=True, slots=True)
class RestoreResult:
    checkpoint_id: str
    segment_key: str
    previous_segment: str
    pre_restore_checkpoint: str | None

    def to_json(self) -> dict[str, Any]:
        return {"checkpointId": self.checkpoint_id, "segment": self.segment_key,
                "previousSegment": self.previous_segment,
                "preRestoreCheckpoint": self.pre_restore_checkpoint}


def checkpoint_id_for(compaction_id: str | None) -> str:
    """Deterministic id for a compaction's checkpoint (a redelivered commit reuses it); a
    time-ordered random id otherwise."""
    if compaction_id is None:
        return f"cp-{time.time_ns():020d}-{secrets.token_hex(4)}"
    candidate = f"cp-{compaction_id}"
    if len(candidate) <= 120 and ID_PATTERN.fullmatch(candidate) and ".." not in candidate:
        return candidate
    return "cp-" + hashlib.sha256(compaction_id.encode()).hexdigest()[:40]


def _limits(ss: SessionStore, limits: CheckpointLimits | None) -> CheckpointLimits:
    return limits or ss.checkpoint_limits or CheckpointLimits()


def get_checkpoint(ss: SessionStore, checkpoint_id: str) -> CheckpointMeta:
    """One checkpoint's metadata; :class:`NotFound` if there is none."""
    stored = ss.store.get(checkpoint_meta_key(ss.tenant, ss.session, checkpoint_id))
    return CheckpointMeta.from_json(orjson.loads(stored.data))


def create_checkpoint(ss: SessionStore, reason: str, compaction_id: str | None = None, *,
                      source: tuple[bytes, SessionSnapshot] | None = None,
                      limits: CheckpointLimits | None = None) -> CheckpointMeta:
    """Snapshot the live segment (or ``source``: its exact bytes and the parsed snapshot).

    Idempotent for a compaction id: a second call returns the existing checkpoint. Prunes the
    session's checkpoints to the bounds afterwards (the new one, being newest, always stays).
    """
    data, snap = source if source is not None else ss.read_raw()
    cid = checkpoint_id_for(compaction_id)
    meta_key = checkpoint_meta_key(ss.tenant, ss.session, cid)
    if compaction_id is not None:
        try:
            return get_checkpoint(ss, cid)
        except NotFound:
            pass
    now_ns = time.time_ns()
    from storage.sessions import iso_now

    meta = CheckpointMeta(cid, iso_now(), now_ns, reason, compaction_id,
                          snap.transcript.leaf_id, snap.transcript.session_id, len(data),
                          snap.segment_key, snap.etag)
    # PreconditionFailed: a previous attempt wrote the snapshot and crashed before the meta.
    with suppress(PreconditionFailed):
        ss.store.put(checkpoint_key(ss.tenant, ss.session, cid), data, create_only=True)
    try:
        ss.store.put(meta_key, orjson.dumps(meta.to_json()), create_only=True)
    except PreconditionFailed:
        return get_checkpoint(ss, cid)
    prune_checkpoints(ss, limits, keep=cid)
    return meta


def list_checkpoints(ss: SessionStore) -> list[CheckpointMeta]:
    """All checkpoints of the session, newest first (unreadable metadata is skipped)."""
    metas: list[CheckpointMeta] = []
    for key in ss.store.list(ss.checkpoints_prefix):
        if not key.endswith(_META_SUFFIX):
            continue
        try:
            metas.append(CheckpointMeta.from_json(orjson.loads(ss.store.get(key).data)))
        except (NotFound, orjson.JSONDecodeError, KeyError, TypeError, ValueError):
            continue
    metas.sort(key=lambda m: (m.created_ns, m.id), reverse=True)
    return metas


def prune_checkpoints(ss: SessionStore, limits: CheckpointLimits | None = None, *,
                      keep: str | None = None) -> list[str]:
    """Delete checkpoints beyond the bounds; return the deleted ids (newest is always kept)."""
    bounds = _limits(ss, limits)
    metas = list_checkpoints(ss)
    if keep is not None:  # clock skew between writers must not trim the one just written
        metas.sort(key=lambda m: m.id != keep)
    count = 0
    total = 0
    deleted: list[str] = []
    trimming = False
    for index, meta in enumerate(metas):
        if index > 0 and (trimming or count + 1 > bounds.max_count
                          or total + meta.bytes > bounds.max_bytes):
            trimming = True
            ss.store.delete(checkpoint_meta_key(ss.tenant, ss.session, meta.id))
            ss.store.delete(checkpoint_key(ss.tenant, ss.session, meta.id))
            deleted.append(meta.id)
            continue
        count += 1
        total += meta.bytes
    return deleted


def restore_checkpoint(ss: SessionStore, checkpoint_id: str, *,
                       checkpoint_current: bool = True) -> RestoreResult:
    """Make a checkpoint the live transcript again (new segment + seal + HEAD swap by CAS).

    The snapshot is parsed before anything is written. The current state is checkpointed first
    (``checkpoint_current``), so the restore can be undone.
    """
    from storage.rotation import complete_sealed, seal_segment
    from storage.sessions import MAX_ATTEMPTS, StoreBusy, backoff_sleep

    meta = get_checkpoint(ss, checkpoint_id)
    data = ss.store.get(checkpoint_key(ss.tenant, ss.session, meta.id)).data
    parse_transcript(data)
    pre: str | None = None
    if checkpoint_current:
        pre = create_checkpoint(ss, f"before restore of {meta.id}").id
    new_key = ss.segment_key(f"r-{time.time_ns():020d}-{secrets.token_hex(4)}")
    ss.store.put(new_key, data, create_only=True)
    for attempt in range(MAX_ATTEMPTS):
        snap = ss.read()
        sealed = seal_segment(ss, snap, new_key, "restore", {"checkpointId": meta.id})
        if sealed is not None:
            complete_sealed(ss, snap.segment_key, sealed[0], sealed[1])
            return RestoreResult(meta.id, new_key, snap.segment_key, pre)
        backoff_sleep(attempt)
    raise StoreBusy(f"restore of {ss.tenant}/{ss.session}: lost too many races")


# Keep StoreError importable from here for callers catching checkpoint failures.
CheckpointError = StoreError
