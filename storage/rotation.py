"""Successor-segment rotation after a compaction, and finishing interrupted segment switches.

After a compaction the live segment still holds the whole summarized history. Rotation writes a
*successor* segment with only what the model view needs (spec §7.3: the compaction entry, the
kept tail from ``firstKeptEntryId``, what was appended after the compaction, and the newest
state entries), points ``HEAD`` at it, and leaves the old segment untouched as an archive that
the successor's header (``parentSession``) points back to.

Protocol (crash-safe at every step; see the :mod:`storage.sessions` docstring for why):

1. Build the successor in memory from the live segment and check that its model view equals
   the old one. If not, nothing is written (rotation is an optimisation, never a risk).
2. **Seal** the old segment by CAS: append a ``custom`` entry ``compactd.sealed`` naming the
   successor key. From here on nobody writes to the old segment; a writer whose CAS loses sees
   the seal and finishes steps 3-4 itself.
3. Create the successor create-only under a key derived from the compaction id, so a retry (or
   a repairing reader) finds the same key and the first writer wins.
4. Swap ``HEAD`` by CAS (only if it still points at the sealed segment).

A reader that finds a sealed live segment (crash after 2 or 3) runs :func:`complete_sealed`,
which rebuilds the successor from the sealed bytes if it is missing and swaps ``HEAD``.
Checkpoint restore (:mod:`storage.checkpoints`) uses the same seal with reason ``restore``.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pipeline.commit import find_compaction
from pipeline.context import build_session_context
from pipeline.transcript import CURRENT_VERSION, Entry, Transcript, parse_transcript
from storage.errors import Conflict, PreconditionFailed, StoreError
from storage.keys import ID_PATTERN

if TYPE_CHECKING:
    from storage.sessions import SessionSnapshot, SessionStore

__all__ = [
    "SEAL_TYPE",
    "RotationError",
    "RotationResult",
    "SealInfo",
    "build_successor",
    "complete_sealed",
    "copy_successor",
    "create_successor",
    "rotate_after_commit",
    "seal_for_rotation",
    "seal_of",
    "seal_segment",
    "successor_segment_id",
    "views_match",
]

#: ``customType`` of the seal entry. Reserved: ``append`` refuses entries that use it, so an
#: agent cannot forge a seal and redirect ``HEAD``.
SEAL_TYPE = "compactd.sealed"

_STATE_TYPES = ("model_change", "thinking_level_change", "session_info")


class RotationError(StoreError):
    """The successor could not be built safely; nothing was sealed or swapped."""


@dataclass(frozen=True, slots=True)
class SealInfo:
    """A decoded seal entry: the old segment's last word."""

    entry_id: str
    successor: str
    reason: str
    compaction_id: str | None
    compaction_entry_id: str | None
    leaf_id: str | None


@dataclass(slots=True)
class RotationResult:
    """Outcome of a rotation (``rotated`` False with a ``reason`` when it was not needed)."""

    rotated: bool
    reason: str = ""
    successor_key: str | None = None
    archive_key: str | None = None
    session_id: str | None = None
    compaction_entry_id: str | None = None
    leaf_id: str | None = None
    entries_written: int = 0
    mode: str | None = None  # "compact" (spec §7.3 selection) or "copy" (fallback)
    head_swapped: bool = False

    def to_json(self) -> dict[str, Any]:
        return {
            "rotated": self.rotated, "reason": self.reason, "sessionFile": self.successor_key,
            "archive": self.archive_key, "sessionId": self.session_id,
            "compactionEntryId": self.compaction_entry_id, "leafId": self.leaf_id,
            "entriesWritten": self.entries_written, "mode": self.mode,
            "headSwapped": self.head_swapped,
        }


def successor_segment_id(compaction_id: str) -> str:
    """Deterministic segment id of the successor for a compaction (retries find the same key)."""
    candidate = f"c-{compaction_id}"
    if len(candidate) <= 128 and ID_PATTERN.fullmatch(candidate) and ".." not in candidate:
        return candidate
    return "c-" + hashlib.sha256(compaction_id.encode()).hexdigest()[:40]


# --- seals -----------------------------------------------------------------------------------


def seal_of(transcript: Transcript) -> SealInfo | None:
    """The seal of a segment, if its last entry is one (a sealed segment is never written to,
    so the seal is always the last entry)."""
    if not transcript.entries:
        return None
    last = transcript.entries[-1]
    if last.type != "custom" or last.data.get("customType") != SEAL_TYPE:
        return None
    data = last.data.get("data")
    if not isinstance(data, dict) or not isinstance(data.get("successor"), str):
        return None

    def opt(name: str) -> str | None:
        value = data.get(name)
        return value if isinstance(value, str) else None

    return SealInfo(last.id, data["successor"], str(data.get("reason", "rotate")),
                    opt("compactionId"), opt("compactionEntryId"), last.parent_id)


def seal_segment(ss: SessionStore, snap: SessionSnapshot, successor_key: str, reason: str,
                 extra: dict[str, Any] | None = None) -> tuple[Transcript, SealInfo] | None:
    """CAS-append the seal to the live segment read as ``snap``. None when the race was lost.

    ``snap.transcript`` is modified in memory (the seal is appended to it).
    """
    from storage.sessions import iso_now

    transcript = snap.transcript
    leaf = transcript.leaf_id
    data: dict[str, Any] = {"successor": successor_key, "reason": reason, **(extra or {})}
    entry = {"type": "custom", "id": transcript.new_id(seed=f"seal:{successor_key}"),
             "parentId": leaf, "timestamp": iso_now(), "customType": SEAL_TYPE, "data": data}
    transcript.append(entry)
    try:
        ss.store.put(snap.segment_key, transcript.to_bytes(), if_match=snap.etag)
    except (PreconditionFailed, Conflict):
        return None
    seal = seal_of(transcript)
    assert seal is not None
    return transcript, seal


# --- building the successor ------------------------------------------------------------------


def _header(old: Transcript, parent_key: str) -> dict[str, Any]:
    from storage.sessions import iso_now

    header: dict[str, Any] = {"type": "session", "version": CURRENT_VERSION,
                              "id": str(uuid.uuid4()), "timestamp": iso_now()}
    if "cwd" in old.header:
        header["cwd"] = old.header["cwd"]
    header["parentSession"] = parent_key
    return header


def _materialize(old: Transcript, kept: list[Entry], header: dict[str, Any]) -> Transcript:
    """Copy ``kept`` (in output order), re-parenting each entry to its nearest kept ancestor."""
    kept_ids = {e.id for e in kept}
    out: list[Entry] = []
    for entry in kept:
        parent = entry.parent_id
        while parent is not None and parent not in kept_ids:
            ancestor = old.get(parent)
            parent = ancestor.parent_id if ancestor is not None else None
        if parent == entry.parent_id:
            out.append(Entry(data=entry.data, raw=entry.raw))  # untouched: byte-identical
        else:
            out.append(Entry(data={**entry.data, "parentId": parent}))
    return Transcript(header=header, entries=out)


def _subtree(old: Transcript, root: Entry, active: set[str], excluded: set[str]) -> list[Entry]:
    """Preorder walk of ``root``'s subtree; the active-branch child is visited last at every
    level, so the active leaf ends up last in the file (pi's leaf after loading)."""
    children: dict[str, list[Entry]] = {}
    for entry in old.entries:
        if entry.parent_id is not None and entry.id not in excluded:
            children.setdefault(entry.parent_id, []).append(entry)
    order: list[Entry] = []
    stack = [root]
    while stack:
        node = stack.pop()
        order.append(node)
        kids = children.get(node.id, [])
        # LIFO: the active child goes in first (popped last, after the whole off-branch
        # subtrees); off-branch children in reverse so they come out in file order.
        on_branch = [k for k in kids if k.id in active]
        off_branch = [k for k in kids if k.id not in active]
        stack.extend(on_branch)
        stack.extend(reversed(off_branch))
    return order


def build_successor(old: Transcript, *, leaf_id: str, compaction_entry_id: str,
                    parent_key: str, excluded: Iterable[str] = ()) -> Transcript:
    """The successor transcript for the compaction ``compaction_entry_id`` (pure; no I/O).

    Kept: the newest ``model_change`` / ``thinking_level_change`` / ``session_info`` and every
    ``custom`` (extension state) and ``label`` entry before the kept tail; the whole subtree of
    the first kept entry (kept tail, the compaction, everything after it, side branches off the
    kept part); minus labels whose target is gone. Not done (yet) from spec §7.3: keeping the
    last assistant before ``firstKeptEntryId``, thinking-signature stripping, duplicate-user
    removal — each of these would change the model view this function promises to preserve.
    """
    skip = set(excluded)
    path = old.path(leaf_id)
    ids = [e.id for e in path]
    if compaction_entry_id not in ids:
        raise RotationError(f"compaction {compaction_entry_id} is not on the active branch")
    c = ids.index(compaction_entry_id)
    compaction = path[c]
    first_kept = compaction.data.get("firstKeptEntryId")
    k = ids.index(first_kept) if first_kept in ids[:c] else c
    newest: dict[str, int] = {}
    for index, entry in enumerate(path[:c]):
        if entry.type in _STATE_TYPES:
            newest[entry.type] = index
    before = [e for i, e in enumerate(path[:k])
              if (e.type in _STATE_TYPES and newest[e.type] == i) or e.type in ("custom", "label")]
    tail = _subtree(old, path[k], set(ids), skip)
    kept = before + tail
    kept_ids = {e.id for e in kept}
    kept = [e for e in kept
            if e.type != "label" or e.data.get("targetId") in kept_ids]
    return _materialize(old, kept, _header(old, parent_key))


def copy_successor(old: Transcript, *, parent_key: str, excluded: Iterable[str] = ()
                   ) -> Transcript:
    """A successor that is the old segment verbatim under a new header: the safe fallback
    when the compacting selection cannot be validated (it cannot change the model view)."""
    skip = set(excluded)
    kept = [e for e in old.entries if e.id not in skip]
    return _materialize(old, kept, _header(old, parent_key))


def views_match(old: Transcript, old_leaf: str | None, new: Transcript) -> bool:
    """Same model view: the same messages from the same entries, and the same thinking level."""
    if old_leaf is None:
        return not new.entries
    before = build_session_context(old.path(old_leaf))
    after = build_session_context(new.path())
    return ([(m.entry_id, m.message) for m in before.messages]
            == [(m.entry_id, m.message) for m in after.messages]
            and before.thinking_level == after.thinking_level)


def _validated(data: bytes, old: Transcript, old_leaf: str | None) -> Transcript | None:
    parsed = parse_transcript(data)
    return parsed if views_match(old, old_leaf, parsed) else None


# --- the steps -------------------------------------------------------------------------------


def create_successor(ss: SessionStore, segment: str, sealed: Transcript, seal: SealInfo
                     ) -> RotationResult:
    """Step 3: create the successor named by ``seal`` create-only if it does not exist yet.

    Deterministic given the sealed bytes (only the header's fresh id/time differ, and
    create-only lets the first writer win), so any number of repairing readers agree.
    """
    result = RotationResult(True, archive_key=segment, successor_key=seal.successor,
                            compaction_entry_id=seal.compaction_entry_id)
    if not seal.successor.startswith(ss.segments_prefix) or seal.successor == segment:
        raise StoreError(f"seal of {segment} names an invalid successor {seal.successor!r}",
                         key=segment)
    if ss.store.head(seal.successor) is not None:
        existing = parse_transcript(ss.store.get(seal.successor).data)
        result.session_id = existing.session_id
        result.leaf_id = existing.leaf_id
        result.entries_written = len(existing)
        result.mode = "existing"
        return result
    leaf = seal.leaf_id
    new: Transcript | None = None
    if seal.reason == "rotate" and seal.compaction_entry_id and leaf is not None:
        try:
            candidate = build_successor(sealed, leaf_id=leaf, parent_key=segment,
                                        compaction_entry_id=seal.compaction_entry_id,
                                        excluded=[seal.entry_id])
            new = _validated(candidate.to_bytes(), sealed, leaf)
            result.mode = "compact"
        except (RotationError, ValueError):
            new = None
    if new is None:
        # A restore seal always finds its successor (created before sealing); anything else
        # here is unexpected, and a verbatim copy is the one successor that is always right.
        new = parse_transcript(copy_successor(sealed, parent_key=segment,
                                              excluded=[seal.entry_id]).to_bytes())
        result.mode = "copy"
    try:
        ss.store.put(seal.successor, new.to_bytes(), create_only=True)
    except PreconditionFailed:
        existing = parse_transcript(ss.store.get(seal.successor).data)
        new, result.mode = existing, "existing"
    result.session_id = new.session_id
    result.leaf_id = new.leaf_id
    result.entries_written = len(new)
    return result


def complete_sealed(ss: SessionStore, segment: str, sealed: Transcript, seal: SealInfo
                    ) -> RotationResult:
    """Steps 3 and 4 for a sealed segment: ensure the successor exists, then swap ``HEAD``."""
    result = create_successor(ss, segment, sealed, seal)
    result.head_swapped = ss.swap_head(segment, seal.successor, seal.reason)
    return result


def seal_for_rotation(ss: SessionStore, compaction_id: str
                      ) -> tuple[str, Transcript, SealInfo] | RotationResult:
    """Steps 1-2: validate the successor, then seal the live segment.

    Returns ``(sealed segment key, sealed transcript, seal)``, or a not-rotated
    :class:`RotationResult` when there is nothing to do (already rotated, compaction not found,
    a later compaction landed). Raises :class:`RotationError` when the successor would change
    the model view (nothing written).
    """
    from storage.sessions import MAX_ATTEMPTS, backoff_sleep

    for attempt in range(MAX_ATTEMPTS):
        snap = ss.read()
        transcript = snap.transcript
        successor = ss.segment_key(successor_segment_id(compaction_id))
        if snap.segment_key == successor:
            return RotationResult(False, "already rotated", successor_key=successor,
                                  session_id=transcript.session_id)
        entry_id = find_compaction(transcript, compaction_id)
        if entry_id is None:
            return RotationResult(False, f"compaction {compaction_id} is not in the live segment")
        path = transcript.path()
        latest = next((e.id for e in reversed(path) if e.type == "compaction"), None)
        if latest != entry_id:
            return RotationResult(False, "a later compaction is on the active branch"
                                  if latest else "the compaction is not on the active branch")
        leaf = transcript.leaf_id
        assert leaf is not None
        candidate = build_successor(transcript, leaf_id=leaf, compaction_entry_id=entry_id,
                                    parent_key=snap.segment_key)
        if _validated(candidate.to_bytes(), transcript, leaf) is None:
            raise RotationError("the successor's model view differs from the live one; "
                                "not rotating", key=snap.segment_key)
        sealed = seal_segment(ss, snap, successor, "rotate",
                              {"compactionId": compaction_id, "compactionEntryId": entry_id})
        if sealed is not None:
            return snap.segment_key, sealed[0], sealed[1]
        backoff_sleep(attempt)
    from storage.sessions import StoreBusy

    raise StoreBusy(f"rotation of {ss.tenant}/{ss.session}: lost too many races")


def rotate_after_commit(ss: SessionStore, compaction_id: str) -> RotationResult:
    """Rotate the live segment to a successor for the (committed) compaction ``compaction_id``.

    Idempotent: a second call finds ``HEAD`` already on the successor and reports
    ``rotated=False, reason="already rotated"``.
    """
    step = seal_for_rotation(ss, compaction_id)
    if isinstance(step, RotationResult):
        return step
    segment, sealed, seal = step
    return complete_sealed(ss, segment, sealed, seal)

