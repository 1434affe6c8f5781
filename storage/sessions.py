"""Sessions in an object store: a ``HEAD`` pointer, transcript segments, CAS appends and commits.

Layout (see :mod:`storage.keys`)::

    tenants/{t}/sessions/{s}/HEAD                   {"segment": "<segment key>", "updated": ...}
    tenants/{t}/sessions/{s}/segments/{id}.jsonl    transcript segments (live one + archives)
    tenants/{t}/sessions/{s}/checkpoints/...        pre-compaction snapshots

Why a pointer: rotation (:mod:`storage.rotation`) and checkpoint restore
(:mod:`storage.checkpoints`) replace the *whole* live transcript. Writing the new segment
create-only and then swapping a tiny ``HEAD`` object by compare-and-swap makes that switch atomic
and keeps the old segment intact as an archive.

Why seals: there is no multi-object transaction, so an agent that read ``HEAD`` just before a
swap could still append to the old segment and its entry would silently miss the successor. To
close that window, whoever switches segments first *seals* the old one by CAS (a ``custom``
entry, ``customType = "compactd.sealed"``, naming the successor) and only then creates the
successor from the sealed bytes and swaps ``HEAD``. Every writer re-reads after a lost CAS,
sees the seal, finishes the switch itself (deterministically, see
:func:`storage.rotation.complete_sealed`) and retries on the successor. So an entry that
was written before the seal is in the successor, and an entry written after it is written
*to* the successor. A crash at any step leaves a state that the next reader repairs.
"""

from __future__ import annotations

import random
import secrets
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, NamedTuple, TypeVar
from urllib.parse import urlsplit

import orjson
from pydantic import ValidationError

from pipeline.commit import SnapshotFacts, Superseded, find_compaction, rebase_compaction
from pipeline.errors import TranscriptError
from pipeline.models import validate_entry
from pipeline.transcript import Transcript, parse_transcript
from storage.errors import Conflict, NotFound, PreconditionFailed, StoreError
from storage.keys import (
    checkpoints_prefix,
    head_key,
    segment_key,
    segments_prefix,
    session_prefix,
    validate_id,
)
from storage.objectstore import ObjectStore, open_store

if TYPE_CHECKING:
    from storage.checkpoints import CheckpointLimits, CheckpointMeta
    from storage.rotation import RotationResult

__all__ = [
    "EntryRejected",
    "HeadPointer",
    "SessionCommitResult",
    "SessionExists",
    "SessionNotFound",
    "SessionSnapshot",
    "SessionStore",
    "StoreBusy",
    "Target",
    "append_entries",
    "backoff_sleep",
    "iso_now",
    "parse_target",
]

#: Attempts of a CAS loop before giving up with :class:`StoreBusy`. Contention is short (a
#: commit or an append rewrites one object), so this is generous on purpose.
MAX_ATTEMPTS = 60
#: Mirror of :data:`storage.rotation.SEAL_TYPE` (kept here to avoid an import cycle).
_SEAL_TYPE = "compactd.sealed"

T = TypeVar("T")


def iso_now() -> str:
    """pi's entry timestamp format (ISO-8601, milliseconds, ``Z``)."""
    now = datetime.now(UTC)
    return now.strftime("%Y-%m-%dT%H:%M:%S.") + f"{now.microsecond // 1000:03d}Z"


def backoff_sleep(attempt: int, *, base: float = 0.005, cap: float = 0.25) -> None:
    """Full-jitter exponential backoff: losers of a CAS race spread out instead of re-colliding."""
    time.sleep(random.uniform(0, min(cap, base * (2 ** min(attempt, 16)))))


# --- errors -----------------------------------------------------------------------------------


class SessionNotFound(NotFound):
    """The session has no ``HEAD`` (never created) or ``HEAD`` names a missing segment."""


class SessionExists(PreconditionFailed):
    """``create`` on a session that already has a ``HEAD``."""


class StoreBusy(StoreError):
    """A CAS loop lost :data:`MAX_ATTEMPTS` races in a row; nothing was written by this call."""


class EntryRejected(ValueError):
    """An entry given to ``append`` is malformed or does not fit the transcript.

    ``index`` is the 0-based position in the batch (the CLI turns it into a line number),
    ``code`` is machine-readable. Raised before anything is written: a batch is all or nothing.
    """

    def __init__(self, index: int, code: str, detail: str) -> None:
        self.index = index
        self.code = code
        self.detail = detail
        super().__init__(f"entry {index}: {code}: {detail}")

    def to_dict(self) -> dict[str, object]:
        return {"index": self.index, "code": self.code, "detail": self.detail}


# --- HEAD ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class HeadPointer:
    """The decoded ``HEAD`` object."""

    segment: str
    updated: str
    reason: str = "create"
    previous: str | None = None

    def to_bytes(self) -> bytes:
        data: dict[str, Any] = {"segment": self.segment, "updated": self.updated,
                                "reason": self.reason}
        if self.previous is not None:
            data["previous"] = self.previous
        return orjson.dumps(data)


class SessionSnapshot(NamedTuple):
    """A parsed live transcript with the etag and key it was read at (for a later CAS)."""

    transcript: Transcript
    etag: str
    segment_key: str


@dataclass(slots=True)
class SessionCommitResult:
    """What :meth:`SessionStore.commit` did, for the CLI/API and job records."""

    status: Literal["committed", "already_committed"]
    entry_id: str
    segment_key: str
    attempts: int
    checkpoint_id: str | None = None
    rotation: RotationResult | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "status": self.status, "entryId": self.entry_id, "segment": self.segment_key,
            "attempts": self.attempts, "checkpointId": self.checkpoint_id,
            "rotation": self.rotation.to_json() if self.rotation is not None else None,
        }


# --- preparing appended entries (shared by sessions and plain objects) -----------------------


def _describe(exc: ValidationError | ValueError) -> str:
    if isinstance(exc, ValidationError):
        first = exc.errors()[0]
        loc = ".".join(str(p) for p in first["loc"]) or "entry"
        more = f" (+{exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
        return f"{loc}: {first['msg']}{more}"
    return str(exc)


def precheck_entries(entries: Sequence[object]) -> list[dict[str, Any]]:
    """Validate the *shape* of each entry before any I/O; return deep-ish copies.

    ``id``/``parentId``/``timestamp`` may be missing (filled at write time), so they are
    validated with placeholders here; the final entry is validated again once they are known.
    """
    checked: list[dict[str, Any]] = []
    for index, raw in enumerate(entries):
        if not isinstance(raw, dict):
            raise EntryRejected(index, "not_an_object",
                                f"expected a JSON object, got {type(raw).__name__}")
        kind = raw.get("type")
        if not isinstance(kind, str) or not kind:
            raise EntryRejected(index, "invalid_entry", "entry has no string 'type'")
        if kind == "session":
            raise EntryRejected(index, "invalid_entry",
                                "a 'session' header cannot be appended as an entry")
        if "id" in raw and (not isinstance(raw["id"], str) or not raw["id"]):
            raise EntryRejected(index, "invalid_entry", "id must be a non-empty string")
        if "parentId" in raw and raw["parentId"] is not None and not isinstance(
                raw["parentId"], str):
            raise EntryRejected(index, "invalid_entry", "parentId must be a string or null")
        if kind == "custom" and raw.get("customType") == _SEAL_TYPE:
            raise EntryRejected(index, "reserved_type",
                                f"customType {_SEAL_TYPE!r} is reserved for compactd")
        probe = orjson.loads(orjson.dumps(raw))  # deep copy; also proves it is JSON-serializable
        probe.setdefault("id", "00000000")
        probe.setdefault("parentId", None)
        try:
            validate_entry(probe)
        except (ValidationError, ValueError) as exc:
            raise EntryRejected(index, "invalid_entry", _describe(exc)) from exc
        checked.append(orjson.loads(orjson.dumps(raw)))
    return checked


def apply_entries(transcript: Transcript, prepared: Sequence[dict[str, Any]]) -> list[str]:
    """Append prepared entries to ``transcript`` in memory; return their ids.

    Missing ids get a fresh pi-shaped id; a missing ``parentId`` chains the entry to the leaf
    *as it is now* (the previous entry of the batch, or the transcript's current leaf), which is
    what an agent means by "append". An explicit ``parentId`` must name an existing entry. An
    explicit id that already exists with identical content counts as already appended, so a
    retried batch after an ambiguous write does not fail or duplicate.
    """
    ids: list[str] = []
    leaf = transcript.leaf_id
    for index, original in enumerate(prepared):
        data = dict(original)
        explicit_id = data.get("id")
        if explicit_id is not None and explicit_id in transcript:
            existing = transcript.get(explicit_id)
            assert existing is not None
            if all(existing.data.get(k) == v for k, v in data.items()):
                ids.append(explicit_id)
                leaf = explicit_id
                continue
            raise EntryRejected(index, "duplicate_id",
                                f"id {explicit_id!r} already exists in the transcript")
        if explicit_id is None:
            data["id"] = transcript.new_id(seed=secrets.token_hex(4))
        if "parentId" not in data:
            data["parentId"] = leaf
        elif data["parentId"] is not None and data["parentId"] not in transcript:
            raise EntryRejected(index, "unknown_parent",
                                f"parentId {data['parentId']!r} is not an entry of the "
                                "transcript")
        data.setdefault("timestamp", iso_now())
        try:
            validate_entry(data)
        except (ValidationError, ValueError) as exc:
            raise EntryRejected(index, "invalid_entry", _describe(exc)) from exc
        transcript.append(data)
        ids.append(data["id"])
        leaf = data["id"]
    return ids


def _cas_loop(attempt_once: Callable[[], T | None], what: str) -> T:
    """Run ``attempt_once`` until it returns non-None; it returns None after a lost race."""
    for attempt in range(MAX_ATTEMPTS):
        result = attempt_once()
        if result is not None:
            return result
        backoff_sleep(attempt)
    raise StoreBusy(f"{what}: lost {MAX_ATTEMPTS} compare-and-swap races in a row; retry later")


def append_entries(store: ObjectStore, key: str, entries: Sequence[object]) -> list[str]:
    """Append entries to a plain transcript object (no ``HEAD``; e.g. a local file) by CAS.

    Raises :class:`EntryRejected` (nothing written), :class:`TranscriptError` when the stored
    transcript itself is unreadable, :class:`NotFound` when the object is missing.
    """
    prepared = precheck_entries(entries)

    def once() -> list[str] | None:
        stored = store.get(key)
        transcript = parse_transcript(stored.data)
        ids = apply_entries(transcript, prepared)
        try:
            store.put(key, transcript.to_bytes(), if_match=stored.etag)
        except (PreconditionFailed, Conflict):
            return None
        return ids

    return _cas_loop(once, f"append to {key}")


# --- sessions --------------------------------------------------------------------------------


@dataclass(slots=True)
class SessionStore:
    """One session (``tenant``/``session``) in ``store``.

    Every method is safe against concurrent writers in other threads and processes: writes are
    CAS on one object each, and a sealed segment is finished (never written again) by whoever
    sees it first.
    """

    store: ObjectStore
    tenant: str
    session: str
    checkpoint_limits: CheckpointLimits | None = None
    _prefix: str = field(init=False, repr=False)

    def __post_init__(self) -> None:
        validate_id("tenant", self.tenant)
        validate_id("session", self.session)
        self._prefix = session_prefix(self.tenant, self.session)

    # keys
    @property
    def head_key(self) -> str:
        return head_key(self.tenant, self.session)

    @property
    def segments_prefix(self) -> str:
        return segments_prefix(self.tenant, self.session)

    @property
    def checkpoints_prefix(self) -> str:
        return checkpoints_prefix(self.tenant, self.session)

    def segment_key(self, segment_id: str) -> str:
        return segment_key(self.tenant, self.session, segment_id)

    # HEAD
    def read_head(self) -> tuple[HeadPointer, str]:
        """Return the decoded ``HEAD`` and its etag; :class:`SessionNotFound` if absent."""
        try:
            stored = self.store.get(self.head_key)
        except NotFound as exc:
            raise SessionNotFound(f"session {self.tenant}/{self.session} does not exist",
                                  key=self.head_key) from exc
        try:
            data = orjson.loads(stored.data)
            segment = data["segment"]
            if not isinstance(segment, str) or not segment.startswith(self.segments_prefix):
                raise ValueError(f"segment {segment!r} is outside {self.segments_prefix}")
            head = HeadPointer(segment, str(data.get("updated", "")),
                               str(data.get("reason", "create")), data.get("previous"))
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            raise StoreError(f"corrupt HEAD of {self.tenant}/{self.session}: {exc}",
                             key=self.head_key) from exc
        return head, stored.etag

    def exists(self) -> bool:
        return self.store.head(self.head_key) is not None

    def active_key(self) -> str:
        """The key of the live segment (after finishing any interrupted switch)."""
        return self.read().segment_key

    def swap_head(self, expected_segment: str, new_segment: str, reason: str) -> bool:
        """Point ``HEAD`` from ``expected_segment`` to ``new_segment`` by CAS.

        Returns False (and changes nothing) when ``HEAD`` no longer points at
        ``expected_segment``: someone else finished the switch, or moved on. Retries lost races.
        """
        if not new_segment.startswith(self.segments_prefix):
            raise ValueError(f"segment {new_segment!r} is not a segment of this session")

        def once() -> bool | None:
            head, etag = self.read_head()
            if head.segment != expected_segment:
                return False
            pointer = HeadPointer(new_segment, iso_now(), reason, expected_segment)
            try:
                self.store.put(self.head_key, pointer.to_bytes(), if_match=etag)
            except (PreconditionFailed, Conflict):
                return None
            return True

        return _cas_loop(once, f"swap HEAD of {self.tenant}/{self.session}")

    # lifecycle
    def create(self, data: bytes, *, segment_id: str | None = None) -> str:
        """Create the session from transcript bytes; return the segment key.

        The bytes are parsed strictly first (a broken transcript never becomes a session). The
        segment is written create-only, then ``HEAD`` create-only: a concurrent second ``create``
        loses with :class:`SessionExists` and leaves at most an unreferenced segment behind.
        """
        from storage.rotation import seal_of

        if seal_of(parse_transcript(data)) is not None:
            raise ValueError("the transcript ends with a compactd seal entry; create the "
                             "session from its successor instead")
        if self.exists():
            raise SessionExists(f"session {self.tenant}/{self.session} already exists",
                                key=self.head_key)
        key = self.segment_key(segment_id or f"s-{secrets.token_hex(12)}")
        self.store.put(key, data, create_only=True)
        try:
            self.store.put(self.head_key, HeadPointer(key, iso_now()).to_bytes(),
                           create_only=True)
        except PreconditionFailed as exc:
            self.store.delete(key)
            raise SessionExists(f"session {self.tenant}/{self.session} already exists",
                                key=self.head_key) from exc
        return key

    def read(self) -> SessionSnapshot:
        """Read and parse the live segment, finishing an interrupted rotation/restore first.

        Raises :class:`SessionNotFound` or :class:`TranscriptError` (a corrupt segment).
        """
        return self.read_raw()[1]

    def read_raw(self) -> tuple[bytes, SessionSnapshot]:
        """:meth:`read`, plus the segment's exact bytes (for checkpoints and ``plan``)."""
        from storage.rotation import complete_sealed, seal_of

        for attempt in range(MAX_ATTEMPTS):
            head, _ = self.read_head()
            try:
                stored = self.store.get(head.segment)
            except NotFound as exc:
                raise SessionNotFound(
                    f"HEAD of {self.tenant}/{self.session} names a missing segment",
                    key=head.segment) from exc
            transcript = parse_transcript(stored.data)
            seal = seal_of(transcript)
            if seal is None:
                return stored.data, SessionSnapshot(transcript, stored.etag, head.segment)
            complete_sealed(self, head.segment, transcript, seal)
            if attempt:
                backoff_sleep(attempt)
        raise StoreBusy(f"read of {self.tenant}/{self.session}: the live segment kept moving")

    def read_bytes(self) -> bytes:
        """The live segment's bytes (unparsed callers such as ``plan`` re-parse them)."""
        return self.read_raw()[0]

    # writes
    def append(self, entries: Sequence[object]) -> list[str]:
        """Append entries to the live segment by CAS; all or nothing. Returns their ids.

        See :func:`apply_entries` for id/parent rules. Raises :class:`EntryRejected` before
        anything is written.
        """
        prepared = precheck_entries(entries)

        def once() -> list[str] | None:
            snap = self.read()
            ids = apply_entries(snap.transcript, prepared)
            try:
                self.store.put(snap.segment_key, snap.transcript.to_bytes(),
                               if_match=snap.etag)
            except (PreconditionFailed, Conflict):
                return None
            return ids

        return _cas_loop(once, f"append to {self.tenant}/{self.session}")

    def commit(self, entry: dict[str, Any], facts: SnapshotFacts, *, rotate: bool = False,
               checkpoint: bool = True, reason: str = "pre-compaction"
               ) -> SessionCommitResult:
        """Commit a finished compaction: checkpoint, CAS-append the entry, optionally rotate.

        1. ``checkpoint``: snapshot the live segment first (deterministic id from the compaction
           id, so a redelivered commit does not make a second one), so the compaction can be
           undone with :func:`storage.checkpoints.restore_checkpoint`.
        2. The CAS loop of :func:`storage.commit.commit_compaction` (same
           :func:`pipeline.commit.rebase_compaction` checks: idempotent by compaction id,
           :class:`Superseded` when the snapshot no longer holds), but run through
           :meth:`read` so a sealed segment is never written to.
        3. ``rotate``: :func:`storage.rotation.rotate_after_commit`.
        """
        from storage.checkpoints import create_checkpoint
        from storage.rotation import rotate_after_commit

        checkpoint_id: str | None = None
        if checkpoint:
            data, snap = self.read_raw()
            if find_compaction(snap.transcript, facts.compaction_id) is None:
                # Fail early (Superseded) rather than checkpoint a transcript we cannot commit
                # to; the check runs on a scratch copy because it appends in memory.
                rebase_compaction(parse_transcript(data), entry, facts)
                meta: CheckpointMeta = create_checkpoint(
                    self, reason, facts.compaction_id, source=(data, snap))
                checkpoint_id = meta.id

        attempts = 0

        def once() -> tuple[Literal["committed", "already_committed"], str, str] | None:
            nonlocal attempts
            attempts += 1
            snap = self.read()
            status, entry_id = rebase_compaction(snap.transcript, entry, facts)
            if status == "already_committed":
                return "already_committed", entry_id, snap.segment_key
            try:
                self.store.put(snap.segment_key, snap.transcript.to_bytes(),
                               if_match=snap.etag)
            except (PreconditionFailed, Conflict):
                return None
            return "committed", entry_id, snap.segment_key

        status, entry_id, key = _cas_loop(once, f"commit to {self.tenant}/{self.session}")
        result = SessionCommitResult(status, entry_id, key, attempts, checkpoint_id)
        if rotate:
            result.rotation = rotate_after_commit(self, facts.compaction_id)
            if result.rotation.rotated and result.rotation.successor_key:
                result.segment_key = result.rotation.successor_key
        return result


# --- CLI / API targets -----------------------------------------------------------------------


class Target(NamedTuple):
    """Where a transcript lives: ``(store, key, session)``.

    ``session`` is set for ``store://tenant/session`` targets; ``key`` is then the session's
    ``HEAD`` key (the live segment moves, so callers go through ``session``). For a plain file
    or ``s3://bucket/key`` the key is the transcript object itself.
    """

    store: ObjectStore
    key: str
    session: SessionStore | None

    def read_bytes(self) -> bytes:
        if self.session is not None:
            return self.session.read_bytes()
        return self.store.get(self.key).data

    def append(self, entries: Sequence[object]) -> list[str]:
        if self.session is not None:
            return self.session.append(entries)
        return append_entries(self.store, self.key, entries)

    def commit(self, entry: dict[str, Any], facts: SnapshotFacts, *, rotate: bool = False,
               checkpoint: bool = True) -> SessionCommitResult:
        """Commit a compaction to this target (sessions: checkpoint + CAS + optional rotation).

        Plain objects have no ``HEAD`` to swap, so ``rotate`` is refused for them and no
        checkpoint is taken.
        """
        if self.session is not None:
            return self.session.commit(entry, facts, rotate=rotate, checkpoint=checkpoint)
        if rotate:
            raise ValueError("--rotate needs a store://tenant/session target")
        from storage.commit import commit_compaction

        done = commit_compaction(self.store, self.key, entry, facts)
        return SessionCommitResult(done.status, done.entry_id, self.key, done.attempts)


def _configured_store(store_url: str | None) -> ObjectStore:
    from storage.localfs import LocalFileStore

    if store_url is None:
        from compactd.settings import load_settings

        store_url = load_settings().store_url
    parts = urlsplit(store_url)
    if parts.scheme == "file" and parts.netloc not in ("", "localhost"):
        # The default "file://./.data/store" is relative to the working directory.
        return LocalFileStore(Path(parts.netloc + parts.path).resolve())
    return open_store(store_url)


def parse_target(target: str, *, store_url: str | None = None,
                 checkpoint_limits: CheckpointLimits | None = None) -> Target:
    """Resolve a CLI/API target string.

    * ``store://tenant/session`` → the configured store (``store_url``, else
      ``COMPACTD_STORE_URL`` / settings) and a :class:`SessionStore`;
    * ``s3://bucket/key[?endpoint_url=...&region=...]`` → an S3 object;
    * anything else → a local file (``LocalFileStore.for_file``).
    """
    from storage.localfs import LocalFileStore

    if target.startswith("store://"):
        rest = target[len("store://"):]
        parts = rest.split("/")
        if len(parts) != 2 or not all(parts):
            raise ValueError(f"target {target!r}: expected store://TENANT/SESSION")
        tenant, session = parts
        validate_id("tenant", tenant)
        validate_id("session", session)
        if checkpoint_limits is None:
            from compactd.settings import load_settings
            from storage.checkpoints import CheckpointLimits as Limits

            settings = load_settings()
            checkpoint_limits = Limits(settings.checkpoints_max, settings.checkpoints_max_bytes)
        store = _configured_store(store_url)
        ss = SessionStore(store, tenant, session, checkpoint_limits=checkpoint_limits)
        return Target(store, ss.head_key, ss)
    if target.startswith("s3://"):
        parts_s3 = urlsplit(target)
        key = parts_s3.path.lstrip("/")
        if not parts_s3.netloc or not key:
            raise ValueError(f"target {target!r}: expected s3://BUCKET/KEY")
        query = f"?{parts_s3.query}" if parts_s3.query else ""
        return Target(open_store(f"s3://{parts_s3.netloc}{query}"), key, None)
    store_fs, key = LocalFileStore.for_file(target)
    return Target(store_fs, key, None)


# Re-exported for callers that catch everything a commit can raise in one place.
CommitErrors = (Superseded, TranscriptError, EntryRejected, StoreError)
