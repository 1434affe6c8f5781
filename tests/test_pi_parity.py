"""Parity with the real pi (0.73.1, run under node by tests/support/pioracle.py).

On the two real v1 session files and on generated v3 transcripts, our preparation must equal
pi's: the first kept entry, the split-turn flag and turn start, the messages to summarize and
the turn prefix (compared as indices into the active path, because pi gives migrated v1
entries random ids), tokensBefore and the file lists. pi 0.73 also starts a repeated
compaction at the previous compaction's firstKeptEntryId, as we do. About 13 oracle calls.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pipeline.context import build_session_context
from pipeline.prepare import prepare_compaction
from pipeline.settings import PlanSettings
from pipeline.tokens import estimate_tokens
from pipeline.transcript import Transcript, parse_transcript
from tests.support.builders import SessionBuilder, generate_session
from tests.support.data import PI_SESSIONS
from tests.support.pioracle import oracle_available, pi_context, pi_prepare

pytestmark = pytest.mark.skipif(
    not oracle_available(),
    reason="pi oracle unavailable: needs node on PATH and tools/pi-oracle/node_modules "
           "(run scripts/ensure-pi-oracle.sh)",
)

DATA = PI_SESSIONS
BEFORE = DATA / "before-compaction.jsonl"
LARGE = DATA / "large-session.jsonl"


def _leaf_for_line(transcript: Transcript, line: int | None) -> str | None:
    if line is None:
        return None
    return next(e.id for e in transcript.entries if e.line == line)


def ours(path: Path, keep: int, leaf_line: int | None = None) -> dict[str, Any]:
    transcript = parse_transcript(path.read_bytes())
    branch = transcript.path(_leaf_for_line(transcript, leaf_line))
    prep = prepare_compaction(branch, PlanSettings(keep_recent_tokens=keep))
    assert prep is not None
    index = {e.id: i for i, e in enumerate(branch)}
    return {
        "pathLines": [e.line for e in branch],
        "firstKeptIndex": prep.first_kept_index,
        "isSplitTurn": prep.is_split_turn,
        "turnStartIndex": prep.turn_start_index,
        "boundaryStart": prep.boundary_start,
        "messagesToSummarize": [index[m.entry_id] for m in prep.history],
        "turnPrefixMessages": [index[m.entry_id] for m in prep.turn_prefix],
        "tokensBefore": prep.tokens_before,
        "fileOps": prep.file_ops.details(),
    }


def theirs(path: Path, keep: int, leaf_line: int | None = None) -> dict[str, Any]:
    result = pi_prepare(path, keep_recent=keep, leaf_line=leaf_line)
    assert result.get("result", True) is not None, "pi found nothing to compact"
    return {
        "pathLines": result["pathLineNumbers"],
        "firstKeptIndex": result["firstKeptIndex"],
        "isSplitTurn": result["isSplitTurn"],
        "turnStartIndex": result["turnStartIndex"],
        "boundaryStart": result["boundaryStart"],
        "messagesToSummarize": [m["index"] for m in result["messagesToSummarize"]],
        "turnPrefixMessages": [m["index"] for m in result["turnPrefixMessages"]],
        "tokensBefore": result["tokensBefore"],
        "fileOps": result["fileOps"],
    }


def assert_parity(path: Path, keep: int, leaf_line: int | None = None) -> dict[str, Any]:
    mine = ours(path, keep, leaf_line)
    pi = theirs(path, keep, leaf_line)
    for key in pi:
        assert mine[key] == pi[key], f"{key} differs from pi on {path.name} (keep={keep})"
    return pi


# --- real files ---------------------------------------------------------------------------------


def test_before_compaction_default_keep() -> None:
    pi = assert_parity(BEFORE, 20000)
    # The file has two compactions: pi 0.73 and we start at the last one's firstKeptEntryId.
    assert pi["boundaryStart"] > 0 and pi["isSplitTurn"]


def test_before_compaction_earlier_leaf_small_keep() -> None:
    # Leaf on line 600: between the two compactions (the first one is on line 296).
    pi = assert_parity(BEFORE, 3000, leaf_line=600)
    assert len(pi["pathLines"]) < 1002


def test_large_session_default_keep() -> None:
    assert_parity(LARGE, 20000)


def test_large_session_no_split() -> None:
    pi = assert_parity(LARGE, 60000)
    assert not pi["isSplitTurn"]


# --- generated transcripts ------------------------------------------------------------------------


@pytest.mark.parametrize(("entries", "seed", "result_chars", "keep"), [
    (40, 1, 300, 1500),
    (120, 2, 800, 4000),
    (300, 3, 1500, 20000),
    (600, 4, 3000, 20000),
])
def test_generated_split_turns(tmp_path: Path, entries: int, seed: int, result_chars: int,
                               keep: int) -> None:
    file = tmp_path / "gen.jsonl"
    file.write_bytes(generate_session(entries, seed=seed, result_chars=result_chars))
    pi = assert_parity(file, keep)
    assert pi["isSplitTurn"] and pi["turnPrefixMessages"]


def _keep_landing_on_user(data: bytes, users_back: int) -> int:
    """A keep budget whose walk stops exactly on a user message (an unsplit cut)."""
    path = parse_transcript(data).path()
    user_indices = [i for i, e in enumerate(path) if e.role == "user"]
    start = user_indices[-users_back]
    return sum(estimate_tokens(e.message) for e in path[start:] if e.message is not None)


@pytest.mark.parametrize(("entries", "seed", "users_back"), [(90, 5, 2), (250, 6, 5)])
def test_generated_unsplit_cut(tmp_path: Path, entries: int, seed: int, users_back: int) -> None:
    data = generate_session(entries, seed=seed, result_chars=600)
    file = tmp_path / "gen.jsonl"
    file.write_bytes(data)
    pi = assert_parity(file, _keep_landing_on_user(data, users_back))
    assert not pi["isSplitTurn"] and pi["turnStartIndex"] == -1
    assert pi["messagesToSummarize"] and not pi["turnPrefixMessages"]


# --- a v3 transcript with every entry kind and a previous compaction ----------------------------


def rich_session() -> bytes:
    b = SessionBuilder(session_id="rich-0001")
    kept_from = ""
    for turn in range(12):
        u = b.user(f"turn {turn}: " + "please " * (20 + 7 * turn))
        if turn == 5:
            kept_from = u
        b.assistant("looking", calls=[("read", {"path": f"src/m{turn}.py"}),
                                      ("edit", {"path": f"src/e{turn}.py", "oldText": "a",
                                                "newText": "b"})],
                    thinking="hmm " * 30)
        first, second = b.last_call_ids
        b.tool_result(second, "edited " * 40, name="edit")
        b.tool_result(first, "x = 1\n" * (50 + 10 * turn), name="read")
        if turn % 3 == 0:
            b.add("model_change", provider="openai", modelId=f"gpt-{turn}")
            b.add("thinking_level_change", thinkingLevel="high")
        if turn % 4 == 1:
            b.message({"role": "bashExecution", "command": "git status", "output": "clean " * 30,
                       "exitCode": 0, "cancelled": False, "truncated": False})
        if turn % 4 == 2:
            b.add("custom_message", customType="ext", content="reminder " * 25, display=True)
        if turn == 3:
            main = b.leaf
            b.user("an abandoned branch")       # a side branch off the main line
            b.leaf = main
            b.add("branch_summary", fromId=main, summary="tried another approach " * 10)
        b.assistant("done " * (15 + turn), usage=4000 + 900 * turn)
        if turn == 8:
            b.add("compaction", summary="## Goal\nearlier work", firstKeptEntryId=kept_from,
                  tokensBefore=12000, details={"readFiles": ["old/a.py"],
                                               "modifiedFiles": ["old/b.py"]})
            b.add("label", targetId=kept_from, label="checkpoint")
    return b.to_bytes()


def test_rich_v3_with_previous_compaction(tmp_path: Path) -> None:
    file = tmp_path / "rich.jsonl"
    file.write_bytes(rich_session())
    pi = assert_parity(file, 1500)
    assert pi["boundaryStart"] > 0  # started at the previous firstKeptEntryId
    assert pi["messagesToSummarize"][0] == pi["boundaryStart"]
    assert "old/a.py" in pi["fileOps"]["readFiles"]


def _context_refs(path: Path) -> list[tuple[int, str]]:
    transcript = parse_transcript(path.read_bytes())
    branch = transcript.path()
    index = {e.id: i for i, e in enumerate(branch)}
    return [(index[m.entry_id], m.message["role"])
            for m in build_session_context(branch).messages]


@pytest.mark.parametrize("name", ["rich", "before-compaction"])
def test_session_context_matches_pi(tmp_path: Path, name: str) -> None:
    if name == "rich":
        file = tmp_path / "rich.jsonl"
        file.write_bytes(rich_session())
    else:
        file = BEFORE
    pi = pi_context(file)
    expected = [(m["index"], m["role"]) for m in pi["messages"]]
    assert _context_refs(file) == expected
    assert expected[0][1] == "compactionSummary"
