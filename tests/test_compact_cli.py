"""`compactd compact` as a user runs it, and its output loaded by pi 0.73 itself."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from pipeline.context import build_session_context, convert_to_llm
from pipeline.transcript import parse_transcript
from tests.support.builders import generate_session
from tests.support.data import PI_SESSIONS
from tests.support.pioracle import oracle_available, pi_context

ROOT = Path(__file__).resolve().parents[1]
SESSIONS = PI_SESSIONS
REAL = [SESSIONS / "before-compaction.jsonl", SESSIONS / "large-session.jsonl"]


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "compactd", *args], capture_output=True,
                          text=True, timeout=120, cwd=ROOT)


def compact_json(*args: str) -> dict[str, Any]:
    proc = cli("compact", *args, "--json")
    assert proc.returncode == 0, proc.stderr
    return dict(json.loads(proc.stdout))


def _no_orphan_results(path: Path) -> None:
    transcript = parse_transcript(path.read_bytes())
    messages = convert_to_llm(build_session_context(transcript.path()).payloads)
    calls: set[str] = set()
    for message in messages:
        if message["role"] == "assistant":
            calls |= {b["id"] for b in message["content"] if b.get("type") == "toolCall"}
        elif message["role"] == "toolResult":
            assert message["toolCallId"] in calls, message["toolCallId"]


@pytest.fixture(scope="module")
def compacted(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    out_dir = tmp_path_factory.mktemp("compacted")
    generated = out_dir / "generated.jsonl"
    generated.write_bytes(generate_session(3000, seed=11, result_chars=2000))
    outputs = []
    for source in [*REAL, generated]:
        before = hashlib.sha256(source.read_bytes()).hexdigest()
        out = out_dir / f"{source.stem}.out.jsonl"
        result = compact_json(str(source), "--summarizer", "extractive", "--out", str(out))
        assert result["status"] in ("compacted", "ineffective")
        assert result["auditPassed"] and result["compactionEntryId"]
        assert hashlib.sha256(source.read_bytes()).hexdigest() == before, "input modified"
        outputs.append(out)
    return outputs


def test_outputs_keep_tool_pairs_in_our_model_view(compacted: list[Path]) -> None:
    for path in compacted:
        _no_orphan_results(path)


@pytest.mark.skipif(not oracle_available(), reason="pi oracle (node + npm package) unavailable")
def test_outputs_load_in_pi(compacted: list[Path]) -> None:
    for path in compacted:
        view = pi_context(path)
        assert view["ok"] and view["skippedLines"] == 0
        assert view["hasCompaction"] and view["messages"][0]["role"] == "compactionSummary"
        assert view["orphanToolResults"] == 0
        ours = parse_transcript(path.read_bytes())
        assert len(build_session_context(ours.path()).messages) == len(view["messages"])


def test_in_place_commits_by_cas(tmp_path: Path) -> None:
    target = tmp_path / "s.jsonl"
    target.write_bytes(generate_session(300, seed=5))
    result = compact_json(str(target), "--in-place", "--keep-recent", "4000")
    assert result["status"] == "compacted"
    transcript = parse_transcript(target.read_bytes())
    assert transcript.entries[-1].type == "compaction"
    assert transcript.entries[-1].id == result["compactionEntryId"]


def test_if_needed_skips_below_the_trigger(tmp_path: Path) -> None:
    target = tmp_path / "s.jsonl"
    target.write_bytes(generate_session(60, seed=2))
    before = target.read_bytes()
    result = compact_json(str(target), "--in-place", "--if-needed", "--keep-recent", "1000")
    assert result["status"] == "skipped" and "below the trigger" in result["reason"]
    assert target.read_bytes() == before


def test_bad_input_exits_2_and_writes_nothing(tmp_path: Path) -> None:
    target = tmp_path / "bad.jsonl"
    target.write_bytes(b'{"type":"session","id":"x","version":3}\n{"type":"message",\n')
    proc = cli("compact", str(target), "--in-place")
    assert proc.returncode == 2 and proc.stdout == ""
    assert "line 2: not_json" in proc.stderr
    assert target.read_bytes().endswith(b'{"type":"message",\n')


def test_dry_run_writes_nothing(tmp_path: Path) -> None:
    target = tmp_path / "s.jsonl"
    target.write_bytes(generate_session(300, seed=5))
    before = target.read_bytes()
    result = compact_json(str(target), "--keep-recent", "4000")
    assert "dry run" in result["reason"] and target.read_bytes() == before
