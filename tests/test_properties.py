"""Invariants of planning over generated transcripts (DESIGN §7): no tool call/result group is
ever split by the cut, the turn-prefix boundary or the chunks; every message on the active path
before the cut is summarized exactly once (also after a previous compaction); the chunks are the
summarized history; parse -> to_bytes -> parse is the identity, unknown fields included."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline.chunks import plan_chunks
from pipeline.context import build_session_context, entry_message
from pipeline.prepare import prepare_compaction
from pipeline.render import sanitize
from pipeline.settings import PlanSettings
from pipeline.transcript import Entry, parse_transcript
from tests.support.builders import SessionBuilder

PROFILE = settings(max_examples=200, deadline=None, derandomize=True,
                   suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

# --- generated transcripts ----------------------------------------------------------------------

sizes = st.integers(min_value=0, max_value=1600)

step = st.one_of(
    st.tuples(st.just("user"), sizes),
    st.tuples(st.just("assistant"), sizes, st.booleans()),
    # tool loop: number of parallel calls, result order, interjected user, abandoned last call
    st.tuples(st.just("tools"), st.integers(1, 3), st.randoms(use_true_random=False),
              st.booleans(), st.booleans(), sizes, sizes),
    st.tuples(st.just("meta"), st.sampled_from(
        ["model_change", "thinking_level_change", "label", "custom", "session_info"])),
    st.tuples(st.just("custom_message"), sizes),
    st.tuples(st.just("branch_summary"), sizes),
    st.tuples(st.just("bash"), sizes, st.booleans()),
    st.tuples(st.just("runtime"), sizes),
    st.tuples(st.just("compaction"), st.integers(0, 10**6)),
    st.tuples(st.just("side_branch"), st.integers(0, 10**6)),
)


@dataclass
class Generated:
    data: bytes
    leaf: str


def build(steps: list[tuple[Any, ...]]) -> Generated:
    b = SessionBuilder()
    main: list[str] = []      # entry ids on the main line, in order
    users: list[int] = []     # positions in `main` of user messages (compaction targets)
    floor = 0                 # a new compaction keeps from at or after the previous one's target

    def on_main(entry_id: str) -> str:
        main.append(entry_id)
        return entry_id

    for item in steps:
        kind = item[0]
        if kind == "user":
            users.append(len(main))
            on_main(b.user("u" * item[1]))
        elif kind == "assistant":
            on_main(b.assistant("a" * item[1], usage=(1000 + len(main)) if item[2] else None))
        elif kind == "tools":
            _, calls, rng, interject, abandon, size, steer = item
            on_main(b.assistant("t", calls=[("read", {"path": f"f{len(main)}_{k}.py"})
                                            for k in range(calls)]))
            ids = list(b.last_call_ids)
            if abandon:
                ids = ids[:-1]
            rng.shuffle(ids)
            for position, call_id in enumerate(ids):
                if interject and position == len(ids) // 2:
                    users.append(len(main))
                    on_main(b.user("s" * steer))
                on_main(b.tool_result(call_id, "r" * size, name="read"))
        elif kind == "meta":
            fields = {
                "model_change": {"provider": "openai", "modelId": "gpt"},
                "thinking_level_change": {"thinkingLevel": "high"},
                "label": {"targetId": main[0] if main else "x", "label": "l"},
                "custom": {"customType": "ext", "data": {"n": 1}},
                "session_info": {"name": "n"},
            }[item[1]]
            on_main(b.add(item[1], **fields))
        elif kind == "custom_message":
            on_main(b.add("custom_message", customType="ext", content="c" * item[1],
                          display=True))
        elif kind == "branch_summary":
            on_main(b.add("branch_summary", fromId="elsewhere", summary="s" * item[1]))
        elif kind == "bash":
            on_main(b.message({"role": "bashExecution", "command": "ls", "output": "o" * item[1],
                               "exitCode": 0, "cancelled": False, "truncated": False,
                               "excludeFromContext": item[2]}))
        elif kind == "runtime":
            on_main(b.message({"role": "custom", "customType": "openclaw.runtime-context",
                               "content": "x" * item[1], "display": False}))
        elif kind == "compaction":
            candidates = [p for p in users if p >= floor]
            if not candidates:
                continue
            target = candidates[item[1] % len(candidates)]
            floor = target
            on_main(b.add("compaction", summary=f"summary {len(main)}",
                          firstKeptEntryId=main[target], tokensBefore=1234,
                          details={"readFiles": ["prev.py"], "modifiedFiles": []}))
            users.append(len(main))
            on_main(b.user("after compaction"))
        elif kind == "side_branch" and main:
            parent = main[item[1] % len(main)]
            b.add("message", parent=parent, message={"role": "user", "content": "side"})
            b.leaf = main[-1]
    if not main:
        on_main(b.user("only"))
    return Generated(b.to_bytes(), main[-1])


transcripts = st.lists(step, min_size=1, max_size=60).map(build)
keeps = st.one_of(st.sampled_from([0, 1, 20000]), st.integers(0, 4000))


# --- helpers ------------------------------------------------------------------------------------


def call_result_pairs(path: list[Entry], start: int) -> list[tuple[int, int]]:
    """(call index, result index) for every answered, non-aborted call at or after `start`."""
    open_calls: dict[str, list[int]] = {}
    pairs: list[tuple[int, int]] = []
    for index in range(start, len(path)):
        message = path[index].message
        if message is None:
            continue
        if message.get("role") == "assistant" and message.get("stopReason") not in (
                "aborted", "error"):
            for block in message.get("content") or []:
                if block.get("type") == "toolCall":
                    open_calls.setdefault(block["id"], []).append(index)
        elif message.get("role") == "toolResult":
            waiting = open_calls.get(message.get("toolCallId", ""))
            if waiting:
                pairs.append((waiting.pop(), index))
    return pairs


def expected_start(path: list[Entry]) -> int:
    previous = [i for i, e in enumerate(path) if e.type == "compaction"]
    if not previous:
        return 0
    last = previous[-1]
    target = path[last].data["firstKeptEntryId"]
    return next((i for i in range(last) if path[i].id == target), last + 1)


# --- properties ---------------------------------------------------------------------------------


@settings(PROFILE, max_examples=600)
@given(transcripts, keeps, st.sampled_from([(12000, 16), (300, 16), (200, 3), (1, 64)]))
def test_plan_invariants(generated: Generated, keep: int, chunking: tuple[int, int]) -> None:
    transcript = parse_transcript(generated.data)
    path = transcript.path(generated.leaf)
    plan_settings = PlanSettings(keep_recent_tokens=keep, target_chunk_tokens=chunking[0],
                                 max_chunks=chunking[1])
    prep = prepare_compaction(path, plan_settings)
    if path[-1].type == "compaction":
        assert prep is None
        return
    assert prep is not None
    start = expected_start(path)
    assert prep.boundary_start == start
    first_kept = prep.first_kept_index
    assert start <= first_kept < len(path) or first_kept == start
    assert prep.first_kept_entry_id == path[first_kept].id
    history_end = prep.turn_start_index if prep.is_split_turn else first_kept
    if prep.is_split_turn:
        assert start <= prep.turn_start_index <= first_kept

    # Every message before the cut, from the boundary on, is summarized exactly once, in order.
    expected = [e.id for e in path[start:first_kept] if entry_message(e) is not None]
    summarized = prep.summarized_entry_ids()
    assert summarized == expected
    assert len(set(summarized)) == len(summarized)
    kept = {e.id for e in path[first_kept:]}
    assert not kept & set(summarized)
    # ... and everything else on the path stays in the model view once the summary is in place.
    view = {m.entry_id for m in build_session_context(path).messages}
    if start == 0 and not any(e.type == "compaction" for e in path):
        assert view == set(expected) | {e.id for e in path[first_kept:]
                                        if entry_message(e) is not None}

    # No call/result group is split by the cut or by the history/turn-prefix boundary.
    def side(index: int) -> int:
        if index >= first_kept:
            return 2
        return 0 if index < history_end else 1

    for call, result in call_result_pairs(path, start):
        assert side(call) == side(result), (call, result, first_kept, history_end)

    # Chunks are the history minus what never reaches a summarizer, and keep groups whole.
    chunk_plan = plan_chunks(prep.history, plan_settings)
    flat = [m.entry_id for c in chunk_plan.chunks for m in c.messages]
    assert flat == [m.entry_id for m in prep.history if sanitize([m.message])]
    assert len(chunk_plan.chunks) <= plan_settings.max_chunks
    chunk_of = {m.entry_id: n for n, c in enumerate(chunk_plan.chunks) for m in c.messages}
    for call, result in call_result_pairs(path, start):
        call_id, result_id = path[call].id, path[result].id
        if call_id in chunk_of and result_id in chunk_of:
            assert chunk_of[call_id] == chunk_of[result_id]


# --- round trip -----------------------------------------------------------------------------------

json_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(st.characters(blacklist_categories=("Cs",)), max_size=20),
)
json_values = st.recursive(
    json_scalars,
    lambda children: st.one_of(
        st.lists(children, max_size=4),
        st.dictionaries(st.text(max_size=8), children, max_size=4),
    ),
    max_leaves=12,
)
extra_keys = st.text(st.characters(min_codepoint=97, max_codepoint=122), min_size=1, max_size=8) \
    .map(lambda k: "x_" + k)
extras = st.dictionaries(extra_keys, json_values, max_size=3)


@st.composite
def odd_sessions(draw: st.DrawFn) -> bytes:
    header = {"type": "session", "version": 3, "id": "s", "cwd": "/p", **draw(extras)}
    lines = [header]
    parent = None
    for n in range(draw(st.integers(1, 8))):
        kind = draw(st.sampled_from(["user", "assistant", "unknown_type", "unknown_role"]))
        base: dict[str, Any] = {"id": f"e{n}", "parentId": parent, "timestamp": "t"}
        if kind == "user":
            entry = {"type": "message", **base,
                     "message": {"role": "user", "content": [
                         {"type": "text", "text": draw(st.text(max_size=10)), **draw(extras)}],
                         **draw(extras)}}
        elif kind == "assistant":
            entry = {"type": "message", **base,
                     "message": {"role": "assistant", "content": [], "usage": {
                         "input": 1, "totalTokens": 1, **draw(extras)}, **draw(extras)}}
        elif kind == "unknown_type":
            entry = {"type": "future_" + draw(extra_keys), **base}
        else:
            entry = {"type": "message", **base, "message": {"role": "futureRole"}}
        entry.update(draw(extras))
        lines.append(entry)
        parent = entry["id"]
    # Non-canonical JSON (spaces, ASCII escapes): a re-dump would not give these bytes back.
    ascii_escapes = draw(st.booleans())
    text = "\n".join(json.dumps(o, ensure_ascii=ascii_escapes, separators=(", ", ": "))
                     for o in lines)
    return text.encode() + b"\n"


@PROFILE
@given(odd_sessions())
def test_parse_serialize_parse_is_identity(data: bytes) -> None:
    first = parse_transcript(data)
    out = first.to_bytes()
    assert out == data
    second = parse_transcript(out)
    assert second.header == first.header
    assert [e.data for e in second.entries] == [e.data for e in first.entries]
    assert [e.data for e in first.entries] == [json.loads(line) for line in
                                               data.split(b"\n")[1:-1]]


@PROFILE
@given(odd_sessions())
def test_reserialized_entries_keep_their_content(data: bytes) -> None:
    # Entries without their source bytes (e.g. appended or migrated) are re-dumped; the
    # content, unknown fields included, must still come back equal.
    first = parse_transcript(data)
    for entry in first.entries:
        entry.raw = None
    second = parse_transcript(first.to_bytes())
    assert [e.data for e in second.entries] == [e.data for e in first.entries]
