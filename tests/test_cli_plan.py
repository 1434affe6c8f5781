"""`compactd plan` as a user runs it: a subprocess, its stdout, stderr and exit code."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest

from pipeline.plan import plan_bytes
from pipeline.settings import PlanSettings
from tests.support.builders import SessionBuilder
from tests.support.data import PI_SESSIONS

BEFORE = PI_SESSIONS / "before-compaction.jsonl"

REQUIRED = {
    "firstKeptEntryId", "isSplitTurn", "turnStartEntryId", "tokensBefore", "shouldCompact",
    "messagesToSummarize", "turnPrefixMessages", "chunks", "oversized", "fileOps", "timing",
}


def run(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1", "TERM": "dumb"}
    return subprocess.run([sys.executable, "-m", "compactd", "plan", *args],
                          capture_output=True, text=True, timeout=120, env=env, check=False)


def run_json(*args: str) -> dict[str, Any]:
    proc = run(*args, "--json")
    assert proc.returncode == 0, proc.stderr
    result: dict[str, Any] = json.loads(proc.stdout)
    return result


def test_json_on_a_real_file_has_every_key() -> None:
    data = run_json(str(BEFORE))
    assert data.keys() >= REQUIRED
    assert isinstance(data["firstKeptEntryId"], str) and len(data["firstKeptEntryId"]) == 8
    assert data["isSplitTurn"] is True and isinstance(data["turnStartEntryId"], str)
    assert data["tokensBefore"] == 180820  # pi 0.73.1 says the same (see test_pi_parity)
    assert data["shouldCompact"] is True  # 180820 > 200000 - 20000
    assert len(data["messagesToSummarize"]) == 383 and len(data["turnPrefixMessages"]) == 7
    assert data["chunks"] and all(set(c) == {"entryIds", "tokens"} for c in data["chunks"])
    assert [i for c in data["chunks"] for i in c["entryIds"]] == data["messagesToSummarize"]
    assert all(isinstance(c["tokens"], int) and c["tokens"] > 0 for c in data["chunks"])
    assert data["oversized"] == []
    assert set(data["fileOps"]) == {"readFiles", "modifiedFiles"}
    assert len(data["fileOps"]["modifiedFiles"]) == 12
    assert set(data["timing"]) == {"parseMs", "planMs"}
    assert all(v >= 0 for v in data["timing"].values())
    # The ids are the deterministic migrated ids: the same as an in-process plan.
    local = plan_bytes(BEFORE.read_bytes(), PlanSettings()).to_json()
    assert data["firstKeptEntryId"] == local["firstKeptEntryId"]
    assert data["messagesToSummarize"] == local["messagesToSummarize"]


def test_options_reach_the_plan() -> None:
    data = run_json(str(BEFORE), "--keep-recent", "60000", "--window", "1000000",
                    "--reserve", "5000")
    assert len(data["messagesToSummarize"]) < 383
    assert data["shouldCompact"] is False
    assert data["reserveTokens"] == 20000


def test_human_output_has_the_summary_and_chunk_table() -> None:
    proc = run(str(BEFORE))
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    for text in ("tokens before", "180,820", "first kept entry", "split turn", "to summarize",
                 "383 messages + 7 turn-prefix messages", "chunk", "messages", "tokens",
                 "first entry", "last entry", "atomic groups"):
        assert text in out, text
    local = plan_bytes(BEFORE.read_bytes(), PlanSettings()).to_json()
    assert local["chunks"][0]["entryIds"][0] in out


def _bad_file(tmp_path: Path) -> Path:
    b = SessionBuilder()
    b.user("hello")
    lines = b.to_bytes().splitlines()
    path = tmp_path / "bad.jsonl"
    path.write_bytes(b"\n".join([*lines, b'{"type": "message", broken']) + b"\n")
    return path


@pytest.mark.parametrize("as_json", [False, True])
def test_bad_input_exits_2_with_the_line_on_stderr(tmp_path: Path, as_json: bool) -> None:
    path = _bad_file(tmp_path)
    proc = run(str(path), *(["--json"] if as_json else []))
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert "line 3" in proc.stderr and "not_json" in proc.stderr


def test_structural_errors_exit_2(tmp_path: Path) -> None:
    b = SessionBuilder()
    b.user("a")
    b.add("message", parent="ghost", message={"role": "user", "content": "x"})
    path = tmp_path / "dangling.jsonl"
    path.write_bytes(b.to_bytes())
    proc = run(str(path), "--json")
    assert proc.returncode == 2 and proc.stdout == ""
    assert "line 3" in proc.stderr and "dangling_parent" in proc.stderr
    missing = run(str(tmp_path / "nope.jsonl"))
    assert missing.returncode == 2 and "no such file" in missing.stderr


def test_leaf_selects_the_branch(tmp_path: Path) -> None:
    b = SessionBuilder()
    u1 = b.user("one " * 100)
    a2 = b.assistant("two " * 100)
    u3 = b.user("main line " * 100)
    b.assistant("four " * 100)
    side = b.user("side branch " * 100, parent=a2)
    side_a = b.assistant("side answer " * 100)
    path = tmp_path / "tree.jsonl"
    path.write_bytes(b.to_bytes())
    default = run_json(str(path), "--keep-recent", "10")
    assert default["leafId"] == side_a  # last entry in file order
    assert u3 not in default["messagesToSummarize"]
    chosen = run_json(str(path), "--keep-recent", "10", "--leaf", b.entries[3]["id"])
    assert chosen["leafId"] == b.entries[3]["id"]
    assert chosen["messagesToSummarize"] == [u1, a2]
    assert chosen["firstKeptEntryId"] == b.entries[3]["id"]
    assert side not in chosen["messagesToSummarize"]
    unknown = run(str(path), "--leaf", "deadbeef")
    assert unknown.returncode == 2 and "unknown_leaf" in unknown.stderr


def test_lenient_skips_and_reports(tmp_path: Path) -> None:
    path = _bad_file(tmp_path)
    with path.open("ab") as handle:
        handle.write(orjson.dumps({"type": "message", "id": "tail0001", "parentId": None,
                                   "timestamp": "t",
                                   "message": {"role": "user", "content": "later"}}) + b"\n")
    assert run(str(path), "--json").returncode == 2
    data = run_json(str(path), "--lenient")
    assert data["skippedLines"] == [
        {"line": 3, "code": "not_json", "detail": data["skippedLines"][0]["detail"]}]
    human = run(str(path), "--lenient")
    assert human.returncode == 0 and "skipped line 3" in human.stdout
