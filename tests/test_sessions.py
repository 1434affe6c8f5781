"""SessionStore: create/read, CAS appends, compaction commits (idempotent, superseded), and the
concurrency property: nothing an agent appends during a compaction is ever lost.

Store-level tests run against LocalFileStore and against S3Store over a real moto HTTP server.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import orjson
import pytest

from compactd.embedded import Compaction, compact_transcript
from pipeline.commit import Superseded
from pipeline.extractive import ExtractiveSummarizer
from pipeline.settings import PlanSettings, SummarySettings
from pipeline.summarizer import CancelToken, SummaryRequest, SummaryResult
from pipeline.transcript import Transcript, parse_transcript
from storage.localfs import LocalFileStore
from storage.objectstore import ObjectStore
from storage.sessions import (
    EntryRejected,
    SessionExists,
    SessionNotFound,
    SessionStore,
    append_entries,
    parse_target,
)
from tests.support.builders import SessionBuilder, generate_session


@pytest.fixture(params=["local", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> ObjectStore:
    if request.param == "local":
        return LocalFileStore(tmp_path / "store")
    s3: ObjectStore = request.getfixturevalue("s3_store")
    return s3


def new_session(store: ObjectStore, entries: int = 60, seed: int = 1) -> SessionStore:
    ss = SessionStore(store, "acme", f"sess-{seed}")
    ss.create(generate_session(entries, seed=seed, result_chars=600))
    return ss


def user(text: str) -> dict[str, Any]:
    return {"type": "message", "message": {"role": "user", "content": text, "timestamp": 1}}


def compact(transcript: Transcript, chain: list[Any] | None = None) -> Compaction:
    done = compact_transcript(transcript, chain or [],
                              plan_settings=PlanSettings(keep_recent_tokens=1500),
                              summary_settings=SummarySettings())
    assert done.entry is not None and done.facts is not None, done.result
    return done


def raw(ss: SessionStore) -> bytes:
    return ss.store.get(ss.read().segment_key).data


# --- create / read -----------------------------------------------------------------------------


def test_create_read_and_exists(store: ObjectStore) -> None:
    ss = new_session(store)
    snap = ss.read()
    assert snap.segment_key.startswith(ss.segments_prefix)
    assert ss.active_key() == snap.segment_key
    assert len(snap.transcript) >= 59
    with pytest.raises(SessionExists):
        ss.create(generate_session(10, seed=2))
    with pytest.raises(SessionNotFound):
        SessionStore(store, "acme", "missing").read()


def test_create_refuses_broken_transcript(store: ObjectStore) -> None:
    ss = SessionStore(store, "acme", "bad")
    with pytest.raises(ValueError):
        ss.create(b'{"type":"message"}\n')
    assert not ss.exists()


# --- append ------------------------------------------------------------------------------------


def test_append_without_ids_chains_to_current_leaf(store: ObjectStore) -> None:
    ss = new_session(store)
    leaf = ss.read().transcript.leaf_id
    ids = ss.append([user("one"), user("two")])
    t = ss.read().transcript
    assert [e.id for e in t.path()][-3:] == [leaf, *ids]
    first = t.get(ids[0])
    assert first is not None and first.parent_id == leaf and first.data["timestamp"]


def test_append_with_explicit_ids_and_branch(store: ObjectStore) -> None:
    ss = new_session(store)
    t0 = ss.read().transcript
    root = t0.entries[0].id
    ids = ss.append([{**user("branch"), "id": "feedbeef", "parentId": root},
                     {**user("child"), "id": "feedbee2"}])
    assert ids == ["feedbeef", "feedbee2"]
    t = ss.read().transcript
    assert [e.id for e in t.path()] == [root, "feedbeef", "feedbee2"]
    # A retried batch with the same explicit ids is recognised, not duplicated.
    assert ss.append([{**user("branch"), "id": "feedbeef", "parentId": root}]) == ["feedbeef"]
    assert len(ss.read().transcript) == len(t)
    with pytest.raises(EntryRejected) as info:
        ss.append([{**user("different"), "id": "feedbeef"}])
    assert info.value.code == "duplicate_id"


def test_bad_parent_refused_and_nothing_written(store: ObjectStore) -> None:
    ss = new_session(store)
    before = raw(ss)
    with pytest.raises(EntryRejected) as info:
        ss.append([user("ok"), {**user("orphan"), "parentId": "nope0000"}])
    assert info.value.index == 1 and info.value.code == "unknown_parent"
    assert raw(ss) == before


@pytest.mark.parametrize("bad, code", [
    ({"type": "message", "message": {"role": "user"}}, "invalid_entry"),
    ({"message": {"role": "user", "content": "x"}}, "invalid_entry"),
    ({"type": "compaction", "summary": "s"}, "invalid_entry"),
    ([1, 2], "not_an_object"),
    ({"type": "session", "id": "x"}, "invalid_entry"),
    ({"type": "custom", "customType": "compactd.sealed", "data": {"successor": "x"}},
     "reserved_type"),
])
def test_malformed_entry_refused_transcript_unchanged(store: ObjectStore, bad: Any,
                                                      code: str) -> None:
    ss = new_session(store)
    before = raw(ss)
    with pytest.raises(EntryRejected) as info:
        ss.append([user("fine"), bad])
    assert info.value.index == 1 and info.value.code == code
    assert "entry 1" in str(info.value)
    assert raw(ss) == before


def test_append_entries_plain_object(tmp_path: Path) -> None:
    path = tmp_path / "session.jsonl"
    path.write_bytes(generate_session(20, seed=3))
    store, key = LocalFileStore.for_file(path)
    ids = append_entries(store, key, [user("hello")])
    t = parse_transcript(path.read_bytes())
    assert t.leaf_id == ids[0]
    before = path.read_bytes()
    with pytest.raises(EntryRejected):
        append_entries(store, key, [{"type": "message"}])
    assert path.read_bytes() == before


# --- commit --------------------------------------------------------------------------------------


def test_commit_is_idempotent(store: ObjectStore) -> None:
    ss = new_session(store)
    done = compact(ss.read().transcript)
    assert done.entry is not None and done.facts is not None
    first = ss.commit(done.entry, done.facts)
    second = ss.commit(done.entry, done.facts)
    assert first.status == "committed" and second.status == "already_committed"
    assert first.entry_id == second.entry_id
    assert first.checkpoint_id is not None and second.checkpoint_id is None
    t = ss.read().transcript
    assert sum(1 for e in t.entries if e.type == "compaction") == 1
    assert t.leaf_id == first.entry_id


def test_superseded_when_another_compaction_landed(store: ObjectStore) -> None:
    ss = new_session(store)
    snapshot = ss.read().transcript
    a = compact(snapshot)
    b = compact(parse_transcript(snapshot.to_bytes()))
    assert a.entry and a.facts and b.entry and b.facts
    ss.commit(a.entry, a.facts)
    before = raw(ss)
    with pytest.raises(Superseded) as info:
        ss.commit(b.entry, b.facts)
    assert "another compaction" in info.value.reason
    assert raw(ss) == before


def test_superseded_when_summarized_entry_changed(store: ObjectStore) -> None:
    ss = new_session(store)
    done = compact(ss.read().transcript)
    assert done.entry and done.facts
    # Someone rewrites a summarized entry behind our back (e.g. a transcript repair).
    key = ss.active_key()
    t = parse_transcript(store.get(key).data)
    target_id = done.facts.summarized[0][0]
    entry = t.get(target_id)
    assert entry is not None
    entry.data["message"]["content"] = "edited"
    entry.raw = None
    store.put(key, t.to_bytes())
    before = raw(ss)
    with pytest.raises(Superseded) as info:
        ss.commit(done.entry, done.facts)
    assert "changed" in info.value.reason
    assert raw(ss) == before
    assert not list(store.list(ss.checkpoints_prefix))  # no checkpoint for a doomed commit


# --- concurrency property -------------------------------------------------------------------


class SlowExtractive(ExtractiveSummarizer):
    """The offline summarizer, slowed down so the agent gets to append during the compaction."""

    def summarize(self, request: SummaryRequest, *,
                  cancel: CancelToken | None = None) -> SummaryResult:
        time.sleep(0.03)
        return super().summarize(request, cancel=cancel)


@pytest.mark.parametrize("rotate", [False, True])
@pytest.mark.parametrize("seed", [11, 12])
def test_appends_during_slow_compaction_are_never_lost(store: ObjectStore, seed: int,
                                                       rotate: bool) -> None:
    ss = new_session(store, entries=50, seed=seed)
    appended: list[str] = []
    stop = threading.Event()
    errors: list[BaseException] = []

    def agent() -> None:
        n = 0
        try:
            while not stop.is_set() or n < 3:
                n += 1
                appended.extend(ss.append([user(f"agent {seed} msg {n}")]))
                time.sleep(0.002)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    thread = threading.Thread(target=agent)
    thread.start()
    try:
        snapshot = ss.read().transcript
        done = compact(snapshot, [SlowExtractive()])
        assert done.entry and done.facts
        result = ss.commit(done.entry, done.facts, rotate=rotate)
        time.sleep(0.02)  # the agent keeps appending after the commit (and rotation)
    finally:
        stop.set()
        thread.join(10)
    assert not errors, errors
    assert len(appended) >= 3
    t = ss.read().transcript
    on_path = [e.id for e in t.path()]
    assert result.entry_id in on_path
    missing = [i for i in appended if i not in on_path]
    assert not missing, f"appended entries lost from the active path: {missing}"
    # The race really happened: entries appended while summarizing sit before the compaction
    # entry (the kept tail), entries appended after the commit come after it.
    position = on_path.index(result.entry_id)
    during = [i for i in appended if i not in snapshot and on_path.index(i) < position]
    after = [i for i in appended if on_path.index(i) > position]
    assert during and after, (len(during), len(after))
    # Appends keep their order on the active path.
    assert [i for i in on_path if i in set(appended)] == appended
    if rotate:
        assert result.rotation is not None and result.rotation.rotated
        assert ss.active_key() == result.rotation.successor_key


# --- targets -------------------------------------------------------------------------------------


def test_parse_target(tmp_path: Path, moto_server: str) -> None:
    plain = parse_target(str(tmp_path / "x.jsonl"))
    assert plain.session is None and plain.key == "x.jsonl"
    s3 = parse_target(f"s3://bucket/a/b.jsonl?endpoint_url={moto_server}")
    assert s3.session is None and s3.key == "a/b.jsonl"
    target = parse_target("store://acme/s1", store_url=f"file://{tmp_path}/st")
    assert target.session is not None and target.session.tenant == "acme"
    target.session.create(SessionBuilder().to_bytes() + orjson.dumps(user("x") | {
        "id": "aaaa0000", "parentId": None}) + b"\n")
    assert target.read_bytes().count(b"\n") == 2
    assert target.append([user("y")])
    with pytest.raises(ValueError):
        parse_target("store://only-tenant")
    with pytest.raises(ValueError):
        parse_target("store://../x/s")


# --- CLI -----------------------------------------------------------------------------------------


def test_cli_append_init_checkpoints(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    import compactd.cli_store  # noqa: F401  (registers the commands)
    from compactd.cli import app

    runner = CliRunner()
    monkeypatch.setenv("COMPACTD_STORE_URL", f"file://{tmp_path}/store")
    source = tmp_path / "s.jsonl"
    source.write_bytes(generate_session(40, seed=5, result_chars=600))

    # Plain file: a bad line is refused with exit 2, naming the line; the file is unchanged.
    before = source.read_bytes()
    bad = tmp_path / "bad.jsonl"
    bad.write_text(orjson.dumps(user("ok")).decode() + "\n\n" + '{"type": "message"}\n')
    result = runner.invoke(app, ["append", str(source), "--from", str(bad)])
    assert result.exit_code == 2 and "line 3" in result.output, result.output
    assert source.read_bytes() == before
    result = runner.invoke(app, ["append", str(source)], input="{not json\n")
    assert result.exit_code == 2 and "line 1" in result.output
    result = runner.invoke(app, ["append", str(source), "--json"],
                           input=orjson.dumps(user("hi")).decode() + "\n")
    assert result.exit_code == 0, result.output
    new_id = orjson.loads(result.stdout)["appended"][0]
    assert parse_transcript(source.read_bytes()).leaf_id == new_id

    # store:// session: init, append, checkpoints list/restore.
    assert runner.invoke(app, ["init", "store://acme/cli", "--from", str(source)]).exit_code == 0
    assert runner.invoke(app, ["init", "store://acme/cli", "--from", str(source)]).exit_code == 2
    good = tmp_path / "good.jsonl"
    good.write_text(orjson.dumps(user("via store")).decode() + "\n")
    result = runner.invoke(app, ["append", "store://acme/cli", "--from", str(good)])
    assert result.exit_code == 0, result.output
    target = parse_target("store://acme/cli")
    assert target.session is not None
    ss = target.session
    done = compact(ss.read().transcript)
    assert done.entry and done.facts
    committed = target.commit(done.entry, done.facts, rotate=True)
    assert committed.rotation is not None and committed.rotation.rotated
    result = runner.invoke(app, ["checkpoints", "list", "store://acme/cli", "--json"])
    assert result.exit_code == 0, result.output
    listed = orjson.loads(result.stdout)
    assert [m["id"] for m in listed] == [committed.checkpoint_id]
    result = runner.invoke(app, ["checkpoints", "restore", "store://acme/cli", listed[0]["id"]])
    assert result.exit_code == 0, result.output
    assert sum(e.type == "compaction" for e in ss.read().transcript.entries) == 0
    result = runner.invoke(app, ["checkpoints", "restore", "store://acme/cli", "nope"])
    assert result.exit_code == 2 and "no checkpoint" in result.output
    result = runner.invoke(app, ["checkpoints", "list", str(source)])
    assert result.exit_code == 2
