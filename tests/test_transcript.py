"""Reading and writing pi session transcripts (DESIGN §2, spec §1): versions, migration,
byte-for-byte preservation, the tree, and every kind of bad input with its code and line."""

from __future__ import annotations

import json
from typing import Any

import orjson
import pytest

from pipeline.errors import TranscriptError
from pipeline.transcript import MAX_LINE_BYTES, Transcript, parse_transcript
from tests.support.builders import SessionBuilder
from tests.support.data import PI_SESSIONS

DATA = PI_SESSIONS
BEFORE = DATA / "before-compaction.jsonl"
LARGE = DATA / "large-session.jsonl"

HEADER_V3 = {
    "type": "session",
    "version": 3,
    "id": "sess-1",
    "timestamp": "2026-03-01T10:00:00Z",
    "cwd": "/p",
}


def jsonl(*objs: Any) -> bytes:
    return b"".join(orjson.dumps(o) + b"\n" for o in objs)


def msg(entry_id: str, parent: str | None, message: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {
        "type": "message",
        "id": entry_id,
        "parentId": parent,
        "timestamp": "2026-03-01T10:00:01Z",
        "message": message,
        **extra,
    }


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text, "timestamp": 1}


def assistant(text: str) -> dict[str, Any]:
    return {"role": "assistant", "content": [{"type": "text", "text": text}], "stopReason": "stop"}


def raises(data: bytes, code: str, line: int | None, *, lenient: bool = False) -> TranscriptError:
    with pytest.raises(TranscriptError) as info:
        parse_transcript(data, lenient=lenient)
    assert info.value.code == code, info.value
    assert info.value.line == line, info.value
    return info.value


# --- v3 -------------------------------------------------------------------------------------


def test_v3_parse_header_entries_and_lines() -> None:
    b = SessionBuilder()
    u = b.user("hello")
    a = b.assistant("hi", calls=[("read", {"path": "a.txt"})])
    r = b.tool_result(b.last_call_ids[0], "content")
    m = b.add("model_change", provider="openai", modelId="gpt-4o")
    t = parse_transcript(b.to_bytes())
    assert t.source_version == 3
    assert t.session_id == b.header["id"]
    assert t.header["version"] == 3
    assert [e.id for e in t.entries] == [u, a, r, m]
    assert [e.line for e in t.entries] == [2, 3, 4, 5]
    assert [e.type for e in t.entries] == ["message"] * 3 + ["model_change"]
    assert [e.role for e in t.entries] == ["user", "assistant", "toolResult", None]
    assert t.entries[1].parent_id == u and t.entries[0].parent_id is None
    assert t.skipped == []


def test_blank_lines_and_crlf_keep_real_line_numbers() -> None:
    data = (
        orjson.dumps(HEADER_V3)
        + b"\r\n\r\n"
        + orjson.dumps(msg("u1", None, user("x")))
        + b"\r\n   \n"
        + orjson.dumps(msg("a1", "u1", assistant("y")))
        + b"\r\n"
    )
    t = parse_transcript(data)
    assert [(e.id, e.line) for e in t.entries] == [("u1", 3), ("a1", 5)]
    # The carriage return is not part of the preserved line.
    assert not t.entries[0].to_bytes().endswith(b"\r")


# --- v1 / v2 migration ------------------------------------------------------------------------


def test_v1_real_file_before_compaction_migrates() -> None:
    raw = BEFORE.read_bytes()
    t = parse_transcript(raw)
    source = [json.loads(line) for line in raw.decode().splitlines() if line.strip()]
    assert t.source_version == 1
    assert t.header["version"] == 3
    assert len(t.entries) == len(source) - 1 == 1002
    # A linear chain with 8-hex ids.
    previous = None
    for entry in t.entries:
        assert len(entry.id) == 8 and int(entry.id, 16) >= 0
        assert entry.parent_id == previous
        previous = entry.id
    # firstKeptEntryIndex (an index into the file's entries, header = 0) -> firstKeptEntryId.
    compactions = [e for e in t.entries if e.type == "compaction"]
    src_compactions = [o for o in source if o.get("type") == "compaction"]
    assert len(compactions) == 2
    for entry, src in zip(compactions, src_compactions, strict=True):
        index = src["firstKeptEntryIndex"]
        assert "firstKeptEntryIndex" not in entry.data
        target = t.get(entry.data["firstKeptEntryId"])
        assert target is not None
        assert target is t.entries[index - 1]
        assert target.line == index + 1  # no blank lines in this file
        assert target.data["timestamp"] == source[index]["timestamp"]


def test_v1_real_large_session_parses() -> None:
    t = parse_transcript(LARGE.read_bytes())
    assert t.source_version == 1
    assert len(t.entries) == 1018
    assert len(t.path()) == 1018
    roles = [e.role for e in t.entries if e.type == "message"]
    assert roles.count("user") == 88 and roles.count("toolResult") == 373


def test_v1_ids_are_deterministic() -> None:
    raw = BEFORE.read_bytes()
    first = [e.id for e in parse_transcript(raw).entries]
    second = [e.id for e in parse_transcript(raw).entries]
    assert first == second
    assert len(set(first)) == len(first)
    # A different session id gives different ids (they are derived from it).
    other = raw.replace(
        b"ffae836b-9420-4060-ac13-7745215f90ff", b"00000000-9420-4060-ac13-7745215f90ff", 1
    )
    assert [e.id for e in parse_transcript(other).entries] != first


def _v1_small() -> bytes:
    header = {"type": "session", "id": "v1-sess", "timestamp": "2025-01-01T00:00:00Z", "cwd": "/p"}
    return jsonl(
        header,
        {"type": "message", "timestamp": "t1", "message": user("one")},  # index 1
        {"type": "message", "timestamp": "t2", "message": assistant("two")},  # index 2
        {"type": "message", "timestamp": "t3", "message": user("three")},  # index 3
        {
            "type": "message",
            "timestamp": "t4",
            "message": {
                "role": "hookMessage",
                "customType": "ext",
                "content": "hook",
                "display": True,
            },
        },  # index 4
        {
            "type": "compaction",
            "timestamp": "t5",
            "summary": "S",
            "firstKeptEntryIndex": 3,
            "tokensBefore": 10,
        },
        {"type": "message", "timestamp": "t6", "message": user("four")},
    )


def test_v1_first_kept_index_counts_header_as_zero() -> None:
    t = parse_transcript(_v1_small())
    compaction = next(e for e in t.entries if e.type == "compaction")
    # Index 3 is the third entry after the header: the user message "three" on line 4.
    target = t.get(compaction.data["firstKeptEntryId"])
    assert target is not None and target.line == 4
    assert target.message == user("three")
    assert "firstKeptEntryIndex" not in compaction.data


def test_v1_hook_message_becomes_custom_and_serializes_as_v3() -> None:
    t = parse_transcript(_v1_small())
    hook = t.entries[3]
    assert hook.role == "custom"
    out = t.to_bytes()
    lines = out.splitlines()
    assert orjson.loads(lines[0])["version"] == 3
    again = parse_transcript(out)
    assert again.source_version == 3
    assert [e.data for e in again.entries] == [e.data for e in t.entries]
    assert b"hookMessage" not in out and b"firstKeptEntryIndex" not in out


def test_v2_migration_keeps_ids_and_renames_hook_message() -> None:
    header = {"type": "session", "version": 2, "id": "v2-sess", "timestamp": "x", "cwd": "/p"}
    data = jsonl(
        header,
        msg("aaaa0001", None, user("hi")),
        msg(
            "aaaa0002",
            "aaaa0001",
            {
                "role": "hookMessage",
                "customType": "ext",
                "content": [{"type": "text", "text": "h"}],
                "display": False,
            },
        ),
    )
    t = parse_transcript(data)
    assert t.source_version == 2
    assert [e.id for e in t.entries] == ["aaaa0001", "aaaa0002"]
    assert t.entries[1].role == "custom"
    assert orjson.loads(t.to_bytes().splitlines()[0])["version"] == 3
    assert parse_transcript(t.to_bytes()).entries[1].role == "custom"


# --- byte-for-byte preservation ---------------------------------------------------------------


def test_unknown_types_and_fields_survive_byte_for_byte() -> None:
    lines = [
        # Unusual spacing, key order and escapes: a re-dump would change these bytes.
        b'{"version": 3, "type": "session", "id": "s", "cwd": "/p", "x-header": {"a": [1, 2]}}',
        b'{"type":"message","id":"u1","parentId":null,"timestamp":"t","extraTop":{"deep":[1,'
        b'{"k":"\\u00e9"}]},"message":{"role":"user","content":[{"type":"text","text":"hi",'
        b'"cache_control":{"type":"ephemeral"}}],"__openclaw":{"senderId":"42"},"timestamp":1}}',
        b'{"type":"reset","id":"r1","parentId":"u1","timestamp":"t","firstKeptEntryId":"u1",'
        b'"whatever":[null,true,1.5e3]}',
        b'{"type":"message","id":"x1","parentId":"r1","timestamp":"t","message":{"role":'
        b'"futureRole","payload":{"n":1}}}',
        b'{ "type" : "label", "id" : "l1", "parentId" : "x1", "timestamp" : "t", '
        b'"targetId" : "u1", "label" : "start", "color": "red" }',
    ]
    data = b"\n".join(lines) + b"\n"
    t = parse_transcript(data)
    assert [e.type for e in t.entries] == ["message", "reset", "message", "label"]
    assert t.to_bytes() == data
    again = parse_transcript(t.to_bytes())
    assert [e.data for e in again.entries] == [e.data for e in t.entries]
    assert again.entries[0].data["extraTop"] == {"deep": [1, {"k": "é"}]}
    assert again.entries[0].message is not None
    assert again.entries[0].message["__openclaw"] == {"senderId": "42"}


def test_appending_leaves_untouched_lines_identical() -> None:
    data = (
        b'{"type":"session","version":3,"id":"s",  "cwd":"/p"}\n'
        b'{"type":"message","id":"u1","parentId":null,"timestamp":"t","message":'
        b'{"role":"user","content":"a","odd":  [1,2]}}\n'
    )
    t = parse_transcript(data)
    t.append(
        {
            "type": "message",
            "id": t.new_id(),
            "parentId": "u1",
            "timestamp": "t2",
            "message": assistant("b"),
        }
    )
    out = t.to_bytes()
    assert out.startswith(data)
    assert parse_transcript(out).entries[-1].message == assistant("b")


# --- tree -------------------------------------------------------------------------------------


def test_tree_leaf_path_and_branches() -> None:
    b = SessionBuilder()
    u1 = b.user("one")
    a2 = b.assistant("two")
    u3 = b.user("three")
    a4 = b.assistant("four")
    bs5 = b.add("branch_summary", parent=a2, fromId=a4, summary="tried three")
    u6 = b.user("six")
    t = parse_transcript(b.to_bytes())
    assert t.leaf_id == u6  # last entry in file order
    assert [e.id for e in t.path()] == [u1, a2, bs5, u6]
    assert [e.id for e in t.path(a4)] == [u1, a2, u3, a4]
    assert [e.id for e in t.children(a2)] == [u3, bs5]
    assert [e.id for e in t.children(None)] == [u1]
    assert u3 in t and "nope" not in t
    with pytest.raises(TranscriptError) as info:
        t.path("nope")
    assert info.value.code == "unknown_leaf"


def test_header_only_file_has_no_entries() -> None:
    t = parse_transcript(jsonl(HEADER_V3))
    assert t.entries == [] and t.leaf_id is None and t.path() == []


# --- bad input --------------------------------------------------------------------------------


def test_empty_file() -> None:
    raises(b"", "empty_file", None)


def test_whitespace_only_file() -> None:
    raises(b"  \n\n\t \r\n", "empty_file", None)
    raises(b"  \n\n\t \r\n", "empty_file", None, lenient=True)


def test_not_json_names_the_line() -> None:
    data = jsonl(HEADER_V3, msg("u1", None, user("x"))) + b'{"type":"message",\n'
    raises(data, "not_json", 3)


def test_not_json_header_after_blank_lines() -> None:
    raises(b"\n\n{nope\n", "not_json", 3)


def test_not_an_object() -> None:
    raises(jsonl(HEADER_V3, [1, 2]), "not_an_object", 2)
    raises(b'"just a string"\n', "not_an_object", 1)


def test_no_header() -> None:
    raises(jsonl(msg("u1", None, user("x"))), "no_header", 1)


def test_invalid_header() -> None:
    raises(jsonl({"type": "session", "version": 3}), "invalid_header", 1)  # no id
    raises(jsonl({"type": "session", "version": 3, "id": 7}), "invalid_header", 1)


def test_unsupported_version() -> None:
    for version in (4, 0, "3", 3.0, True):
        raises(jsonl({**HEADER_V3, "version": version}), "unsupported_version", 1)


def test_invalid_entries() -> None:
    no_role = msg("u1", None, {"content": "x"})
    raises(jsonl(HEADER_V3, no_role), "invalid_entry", 2)
    no_summary = {
        "type": "compaction",
        "id": "c1",
        "parentId": None,
        "timestamp": "t",
        "firstKeptEntryId": "c1",
        "tokensBefore": 1,
    }
    raises(jsonl(HEADER_V3, msg("u1", None, user("x")), no_summary), "invalid_entry", 3)
    no_type = {"id": "e1", "parentId": None}
    raises(jsonl(HEADER_V3, no_type), "invalid_entry", 2)
    no_id = {"type": "message", "parentId": None, "message": user("x")}
    raises(jsonl(HEADER_V3, no_id), "invalid_entry", 2)
    bad_tool_result = msg("t1", None, {"role": "toolResult", "content": []})  # no toolCallId
    raises(jsonl(HEADER_V3, bad_tool_result), "invalid_entry", 2)


def test_duplicate_ids() -> None:
    data = jsonl(
        HEADER_V3,
        msg("u1", None, user("a")),
        msg("a1", "u1", assistant("b")),
        msg("u1", "a1", user("c")),
    )
    err = raises(data, "duplicate_id", 4)
    assert "line 2" in err.detail


def test_dangling_parent() -> None:
    data = jsonl(HEADER_V3, msg("u1", None, user("a")), msg("a1", "ghost", assistant("b")))
    raises(data, "dangling_parent", 3)


def test_parent_cycles() -> None:
    two = jsonl(
        HEADER_V3,
        msg("r0", None, user("root")),
        msg("a1", "b1", user("a")),
        msg("b1", "a1", assistant("b")),
    )
    raises(two, "parent_cycle", 3)
    self_loop = jsonl(HEADER_V3, msg("u1", None, user("a")), msg("s1", "s1", user("s")))
    raises(self_loop, "parent_cycle", 3)


def test_invalid_utf8() -> None:
    bad = orjson.dumps(msg("u1", None, user("PLACEHOLDER"))).replace(b"PLACEHOLDER", b"\xff\xfe")
    raises(orjson.dumps(HEADER_V3) + b"\n" + bad + b"\n", "invalid_utf8", 2)


def test_line_over_64_mib() -> None:
    prefix = orjson.dumps(HEADER_V3) + b"\n" + orjson.dumps(msg("u1", None, user("x"))) + b"\n"
    head = (
        b'{"type":"message","id":"big","parentId":"u1","timestamp":"t","message":'
        b'{"role":"user","content":"'
    )
    tail = b'"}}'
    filler = MAX_LINE_BYTES + 1 - len(head) - len(tail)
    data = b"".join((prefix, head, b"a" * filler, tail, b"\n"))
    assert len(data) - len(prefix) - 1 == MAX_LINE_BYTES + 1
    raises(data, "line_too_long", 3)
    del data


# --- lenient mode -----------------------------------------------------------------------------


def test_lenient_skips_and_reports_bad_lines_and_their_descendants() -> None:
    data = b"".join(
        [
            orjson.dumps(HEADER_V3),
            b"\n",
            orjson.dumps(msg("u1", None, user("a"))),
            b"\n",  # 2 ok
            b"{not json\n",  # 3 not_json
            b"[1]\n",  # 4 not_an_object
            orjson.dumps(msg("a1", "u1", assistant("b"))),
            b"\n",  # 5 ok
            orjson.dumps(msg("bad", "a1", {"content": "no role"})),
            b"\n",  # 6 invalid_entry
            orjson.dumps(msg("c1", "bad", user("child of bad"))),
            b"\n",  # 7 dangling (parent dropped)
            orjson.dumps(msg("c2", "c1", user("grandchild"))),
            b"\n",  # 8 descendant of dropped
            orjson.dumps(msg("a1", "u1", assistant("dup"))),
            b"\n",  # 9 duplicate_id
            b"\xff\xfe\n",  # 10 invalid_utf8
            orjson.dumps(msg("g1", "ghost", user("dangling"))),
            b"\n",  # 11 dangling_parent
            orjson.dumps(msg("y1", "x1", user("cycle"))),
            b"\n",  # 12 parent_cycle
            orjson.dumps(msg("x1", "y1", user("cycle"))),
            b"\n",  # 13 parent_cycle
            orjson.dumps(msg("z1", "x1", user("below cycle"))),
            b"\n",  # 14 descendant of cycle
            orjson.dumps(msg("u2", "a1", user("fine"))),
            b"\n",  # 15 ok
        ]
    )
    with pytest.raises(TranscriptError):
        parse_transcript(data)
    t = parse_transcript(data, lenient=True)
    assert [(e.id, e.line) for e in t.entries] == [("u1", 2), ("a1", 5), ("u2", 15)]
    skipped = {s.line: s.code for s in t.skipped}
    assert skipped == {
        3: "not_json",
        4: "not_an_object",
        6: "invalid_entry",
        7: "dangling_parent",
        8: "dangling_parent",
        9: "duplicate_id",
        10: "invalid_utf8",
        11: "dangling_parent",
        12: "parent_cycle",
        13: "parent_cycle",
        14: "dangling_parent",
    }
    assert [e.id for e in t.path()] == ["u1", "a1", "u2"]


@pytest.mark.parametrize(
    ("data", "code"),
    [
        (jsonl(msg("u1", None, user("x"))), "no_header"),
        (jsonl({"type": "session", "version": 3}), "invalid_header"),
        (jsonl({**HEADER_V3, "version": 9}), "unsupported_version"),
        (b"{broken\n" + jsonl(msg("u1", None, user("x"))), "not_json"),
    ],
)
def test_lenient_still_rejects_header_errors(data: bytes, code: str) -> None:
    raises(data, code, 1, lenient=True)


def test_error_message_and_dict_name_code_and_line() -> None:
    err = raises(jsonl(HEADER_V3) + b"oops\n", "not_json", 2)
    assert str(err).startswith("line 2: not_json")
    assert err.to_dict()["line"] == 2 and err.to_dict()["code"] == "not_json"


def test_transcript_type_is_returned() -> None:
    assert isinstance(parse_transcript(jsonl(HEADER_V3)), Transcript)
