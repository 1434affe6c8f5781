"""Successor rotation (end to end, crash repair, entry selection) and checkpoints (bounds,
restore, undo of a restore). Store-level tests run on LocalFileStore and S3Store (moto)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from compactd.embedded import Compaction, compact_transcript
from pipeline.context import build_session_context
from pipeline.settings import PlanSettings, SummarySettings
from pipeline.transcript import Transcript, parse_transcript
from storage.checkpoints import (
    CheckpointLimits,
    create_checkpoint,
    list_checkpoints,
    restore_checkpoint,
)
from storage.localfs import LocalFileStore
from storage.objectstore import ObjectStore
from storage.rotation import (
    RotationError,
    build_successor,
    create_successor,
    rotate_after_commit,
    seal_for_rotation,
    seal_of,
    views_match,
)
from storage.sessions import SessionStore
from tests.support.builders import SessionBuilder, generate_session


@pytest.fixture(params=["local", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> ObjectStore:
    if request.param == "local":
        return LocalFileStore(tmp_path / "store")
    s3: ObjectStore = request.getfixturevalue("s3_store")
    return s3


def new_session(store: ObjectStore, seed: int = 1, **kw: Any) -> SessionStore:
    ss = SessionStore(store, "acme", f"s{seed}", **kw)
    ss.create(generate_session(60, seed=seed, result_chars=600))
    return ss


def compact(transcript: Transcript) -> Compaction:
    done = compact_transcript(transcript, [], plan_settings=PlanSettings(keep_recent_tokens=1500),
                              summary_settings=SummarySettings())
    assert done.entry is not None and done.facts is not None
    return done


def user(text: str) -> dict[str, Any]:
    return {"type": "message", "message": {"role": "user", "content": text, "timestamp": 1}}


def view(t: Transcript, leaf: str | None = None) -> list[tuple[str, dict[str, Any]]]:
    return [(m.entry_id, m.message) for m in build_session_context(t.path(leaf)).messages]


# --- rotation ------------------------------------------------------------------------------------


def test_rotation_end_to_end(store: ObjectStore) -> None:
    ss = new_session(store)
    done = compact(ss.read().transcript)
    assert done.entry and done.facts
    ss.append([user("appended before commit")])
    old_key = ss.active_key()
    result = ss.commit(done.entry, done.facts, rotate=True)
    rot = result.rotation
    assert rot is not None and rot.rotated and rot.head_swapped and rot.mode == "compact"
    assert rot.archive_key == old_key and rot.successor_key == ss.active_key() != old_key
    head, _ = ss.read_head()
    assert head.segment == rot.successor_key and head.previous == old_key

    archive = parse_transcript(store.get(old_key).data)
    seal = seal_of(archive)
    assert seal is not None and seal.successor == rot.successor_key
    new = ss.read().transcript
    assert new.header["parentSession"] == old_key
    assert new.session_id != archive.session_id
    assert view(new) == view(archive, seal.leaf_id)  # the model sees exactly the same thing
    assert len(new) < len(archive) and new.leaf_id == result.entry_id
    # The archive still holds the full history (everything but the seal is untouched).
    assert len(archive) == len(parse_transcript(store.get(old_key).data))
    assert all(e.id in archive for e in new.entries)

    # Idempotent: a redelivered commit+rotate changes nothing.
    again = ss.commit(done.entry, done.facts, rotate=True)
    assert again.status == "already_committed"
    assert again.rotation is not None and not again.rotation.rotated
    assert rotate_after_commit(ss, done.facts.compaction_id).reason == "already rotated"
    # Appends now go to the successor.
    ids = ss.append([user("after rotation")])
    assert ss.read().transcript.leaf_id == ids[0]
    assert ids[0] not in parse_transcript(store.get(old_key).data)


def test_crash_between_create_successor_and_head_swap_is_repaired(store: ObjectStore) -> None:
    ss = new_session(store)
    done = compact(ss.read().transcript)
    assert done.entry and done.facts
    ss.commit(done.entry, done.facts)
    before_view = view(ss.read().transcript)
    step = seal_for_rotation(ss, done.facts.compaction_id)
    assert isinstance(step, tuple)
    segment, sealed, seal = step
    created = create_successor(ss, segment, sealed, seal)  # ...and crash before the HEAD swap
    assert store.head(seal.successor) is not None
    assert ss.read_head()[0].segment == segment
    snap = ss.read()  # a reader finishes the switch
    assert snap.segment_key == seal.successor == created.successor_key
    assert ss.read_head()[0].segment == seal.successor
    assert view(snap.transcript) == before_view


def test_crash_after_seal_repaired_by_a_writer(store: ObjectStore) -> None:
    ss = new_session(store)
    done = compact(ss.read().transcript)
    assert done.entry and done.facts
    ss.commit(done.entry, done.facts)
    step = seal_for_rotation(ss, done.facts.compaction_id)  # crash right after sealing
    assert isinstance(step, tuple)
    segment, _, seal = step
    assert store.head(seal.successor) is None
    ids = ss.append([user("agent keeps going")])  # the writer builds the successor and swaps
    assert ss.read_head()[0].segment == seal.successor
    t = ss.read().transcript
    assert t.leaf_id == ids[0] and t.header["parentSession"] == segment
    assert ids[0] not in parse_transcript(store.get(segment).data)


def test_rotation_skipped_when_a_later_compaction_landed(store: ObjectStore) -> None:
    ss = new_session(store)
    done = compact(ss.read().transcript)
    assert done.entry and done.facts
    ss.commit(done.entry, done.facts)
    result = rotate_after_commit(ss, "not-a-committed-compaction")
    assert not result.rotated and "not in the live segment" in result.reason


def _selection_session() -> tuple[Transcript, str]:
    b = SessionBuilder()
    b.add("model_change", provider="openai", modelId="gpt-4o")
    b.add("thinking_level_change", thinkingLevel="low")
    b.add("session_info", name="old name")
    first = b.user("summarized ask")
    b.assistant("summarized answer")
    b.add("thinking_level_change", thinkingLevel="high")
    b.add("custom", customType="ext", data={"n": 1})
    b.add("label", targetId=first, label="gone")
    b.add("session_info", name="new name")
    kept = b.user("kept ask")
    side_parent = b.assistant("kept answer")
    b.add("label", targetId=kept, label="stays")
    main = b.leaf
    side = b.user("side branch", parent=side_parent)
    b.leaf = main
    comp = b.add("compaction", summary="S", firstKeptEntryId=kept, tokensBefore=100)
    b.add("label", targetId=first, label="gone too")
    b.user("after compaction")
    t = parse_transcript(b.to_bytes())
    assert side in t
    return t, comp


def test_successor_selection_state_labels_branches() -> None:
    old, comp = _selection_session()
    leaf = old.leaf_id
    assert leaf is not None
    new = build_successor(old, leaf_id=leaf, compaction_entry_id=comp, parent_key="seg/old")
    reparsed = parse_transcript(new.to_bytes())
    kinds = [(e.type, e.data.get("name") or e.data.get("thinkingLevel") or e.data.get("label"))
             for e in reparsed.entries]
    assert ("model_change", None) in kinds
    assert ("thinking_level_change", "high") in kinds and ("thinking_level_change", "low") \
        not in kinds
    assert ("session_info", "new name") in kinds and ("session_info", "old name") not in kinds
    assert ("label", "stays") in kinds
    assert ("label", "gone") not in kinds and ("label", "gone too") not in kinds
    assert ("custom", None) in kinds
    assert not any(e.role == "user" and e.message and e.message["content"] == "summarized ask"
                   for e in reparsed.entries)
    assert any(e.message and e.message.get("content") == "side branch" for e in reparsed.entries)
    assert reparsed.leaf_id == leaf  # the active leaf stays last in the file
    assert views_match(old, leaf, reparsed)
    assert reparsed.header["parentSession"] == "seg/old"


def test_rotation_refused_when_view_would_change(store: ObjectStore,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    import storage.rotation as rotation

    ss = new_session(store)
    done = compact(ss.read().transcript)
    assert done.entry and done.facts
    ss.commit(done.entry, done.facts)
    before = store.get(ss.active_key()).data
    monkeypatch.setattr(rotation, "views_match", lambda *a: False)
    with pytest.raises(RotationError):
        rotate_after_commit(ss, done.facts.compaction_id)
    assert store.get(ss.active_key()).data == before  # not sealed, not swapped


# --- checkpoints ---------------------------------------------------------------------------------


def test_checkpoint_count_bound_keeps_newest(store: ObjectStore) -> None:
    ss = new_session(store)
    limits = CheckpointLimits(max_count=3)
    made = []
    for n in range(5):
        ss.append([user(f"turn {n}")])
        made.append(create_checkpoint(ss, f"manual {n}", limits=limits).id)
    listed = [m.id for m in list_checkpoints(ss)]
    assert listed == made[::-1][:3]
    keys = store.list(ss.checkpoints_prefix)
    assert not any(made[0] in k or made[1] in k for k in keys)  # snapshots deleted too


def test_checkpoint_bytes_bound_newest_always_kept(store: ObjectStore) -> None:
    ss = new_session(store)
    size = len(store.get(ss.active_key()).data)
    limits = CheckpointLimits(max_count=25, max_bytes=2 * size + size // 2)
    ids = [create_checkpoint(ss, "m", limits=limits).id for _ in range(4)]
    assert [m.id for m in list_checkpoints(ss)] == ids[::-1][:2]
    tiny = CheckpointLimits(max_bytes=10)
    newest = create_checkpoint(ss, "m", limits=tiny)
    assert [m.id for m in list_checkpoints(ss)] == [newest.id]


def test_session_limits_apply_to_commit_checkpoints(store: ObjectStore) -> None:
    ss = new_session(store)
    ss.checkpoint_limits = CheckpointLimits(max_count=1)
    create_checkpoint(ss, "manual")
    done = compact(ss.read().transcript)
    assert done.entry and done.facts
    result = ss.commit(done.entry, done.facts)
    assert [m.id for m in list_checkpoints(ss)] == [result.checkpoint_id]


def test_restore_and_undo_restore(store: ObjectStore) -> None:
    ss = new_session(store)
    original = store.get(ss.active_key()).data
    done = compact(ss.read().transcript)
    assert done.entry and done.facts
    result = ss.commit(done.entry, done.facts, rotate=True)
    assert result.checkpoint_id is not None
    meta = list_checkpoints(ss)[0]
    assert meta.id == result.checkpoint_id and meta.bytes == len(original)
    assert meta.compaction_id == done.facts.compaction_id and meta.reason == "pre-compaction"
    compacted_key = ss.active_key()
    compacted_view = view(ss.read().transcript)

    restored = restore_checkpoint(ss, meta.id)
    assert restored.previous_segment == compacted_key
    assert ss.active_key() == restored.segment_key not in (compacted_key,)
    assert store.get(restored.segment_key).data == original
    assert seal_of(parse_transcript(store.get(compacted_key).data)) is not None
    assert restored.pre_restore_checkpoint is not None

    # Undo the restore: back to the compacted transcript.
    undo = restore_checkpoint(ss, restored.pre_restore_checkpoint)
    assert view(ss.read().transcript) == compacted_view
    assert ss.active_key() == undo.segment_key
    # An agent appending after all this lands on the live segment.
    ids = ss.append([user("still here")])
    assert ss.read().transcript.leaf_id == ids[0]


def test_checkpoint_meta_is_json(store: ObjectStore) -> None:
    ss = new_session(store)
    meta = create_checkpoint(ss, "manual")
    raw = orjson.loads(store.get(f"{ss.checkpoints_prefix}{meta.id}.meta.json").data)
    assert raw["id"] == meta.id and raw["sourceSegment"] == ss.active_key()
    assert raw["leafId"] == ss.read().transcript.leaf_id and raw["createdAt"].endswith("Z")
