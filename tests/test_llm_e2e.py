"""`compactd compact` end to end against the scripted LLM server over real HTTP.

The CLI runs as a subprocess (as a user would run it); the server runs in this process and
records what it saw. Every case ends with a committed summary that passes the audit, or with
nothing committed.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from pipeline.context import build_session_context
from pipeline.transcript import parse_transcript
from tests.support.builders import SessionBuilder
from tests.support.llmserver import Behavior, ScriptedLLMServer

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "session.jsonl"
SMALL = ["--keep-recent", "4000", "--window", "128000"]


def run_cli(*args: str, env: dict[str, str] | None = None,
            timeout: float = 120) -> tuple[int, dict[str, Any], str]:
    proc = subprocess.run([sys.executable, "-m", "compactd", *args], capture_output=True,
                          text=True, timeout=timeout, cwd=ROOT, env=env)
    data = json.loads(proc.stdout) if proc.stdout.strip().startswith("{") else {}
    return proc.returncode, data, proc.stderr


def compact(server: ScriptedLLMServer, out: Path, *extra: str, protocol: str = "openai",
            model: str = "m1", source: Path = EXAMPLE, **kw: Any) -> dict[str, Any]:
    code, data, err = run_cli("compact", str(source), "--summarizer", protocol, "--base-url",
                              server.url, "--model", model, "--out", str(out), "--json",
                              *SMALL, *extra, **kw)
    assert data, err
    return {"code": code, **data}


def summary_of(path: Path) -> str:
    transcript = parse_transcript(path.read_bytes())
    first = build_session_context(transcript.path()).messages[0].message
    assert first["role"] == "compactionSummary"
    return str(first["summary"])


@pytest.mark.parametrize("protocol", ["openai", "anthropic"])
def test_compact_with_a_model_end_to_end(llm_server: ScriptedLLMServer, tmp_path: Path,
                                         protocol: str) -> None:
    llm_server.latency = 0.3
    out = tmp_path / "out.jsonl"
    result = compact(llm_server, out, protocol=protocol)
    assert result["status"] == "compacted" and result["auditPassed"]
    assert result["summarizer"] == protocol and result["fallbackLevel"] == "full"
    paths = {r.path for r in llm_server.requests}
    assert paths == {"/v1/chat/completions" if protocol == "openai" else "/v1/messages"}
    # 3 chunks + the turn prefix go out together, then the merge
    assert llm_server.max_in_flight >= 3
    assert len(llm_server.requests) == result["chunks"] + 2
    assert "Never push to main; open a PR." in summary_of(out)
    assert EXAMPLE.read_bytes() == EXAMPLE.read_bytes()  # input untouched (read twice)


def test_model_down_falls_back_to_extractive(llm_server: ScriptedLLMServer,
                                             tmp_path: Path) -> None:
    llm_server.always("m1", Behavior.server_error(500))
    out = tmp_path / "out.jsonl"
    result = compact(llm_server, out, "--config", str(_fast_retry_config(tmp_path)))
    assert result["status"] == "compacted" and result["auditPassed"]
    assert result["fallbackLevel"] == "extractive" and result["summarizer"] == "extractive"
    assert "## Exact identifiers" in summary_of(out)


def _fast_retry_config(tmp_path: Path, extra: str = "") -> Path:
    path = tmp_path / "settings.toml"
    path.write_text("[retry]\nmin_wait = 0.05\nmax_wait = 0.1\n" + extra)
    return path


def test_chain_hands_over_to_the_next_model(llm_server: ScriptedLLMServer,
                                            tmp_path: Path) -> None:
    llm_server.always("broken", Behavior.server_error(503))
    config = _fast_retry_config(tmp_path, f"""
[[chain]]
summarizer = "openai"
base_url = "{llm_server.url}"
model = "broken"

[[chain]]
summarizer = "anthropic"
base_url = "{llm_server.url}"
model = "backup"
""")
    out = tmp_path / "out.jsonl"
    code, data, err = run_cli("compact", str(EXAMPLE), "--config", str(config), "--out",
                              str(out), "--json", *SMALL)
    assert code == 0, err
    assert data["fallbackLevel"] == "full" and data["model"] == "backup"
    models = {r.model for r in llm_server.requests}
    assert models == {"broken", "backup"}


def _single_chunk_session(tmp_path: Path) -> Path:
    builder = SessionBuilder()
    builder.user("Never edit the generated files under /srv/gen. Refactor the parser please.")
    for i in range(12):
        builder.assistant(f"Step {i}: refactored part {i} of the parser. " + "x" * 760)
        builder.user(f"Continue with part {i + 1} of the parser refactor. " + "y" * 350)
    builder.assistant("Parser refactor finished and tests pass. " + "z" * 760)
    path = tmp_path / "single.jsonl"
    path.write_bytes(builder.to_bytes())
    return path


def test_missing_headings_retried_with_feedback(llm_server: ScriptedLLMServer,
                                                tmp_path: Path) -> None:
    source = _single_chunk_session(tmp_path)
    llm_server.script(Behavior.missing_headings("## Open TODOs"), Behavior.summary())
    out = tmp_path / "out.jsonl"
    code, data, err = run_cli("compact", str(source), "--summarizer", "openai", "--base-url",
                              llm_server.url, "--model", "m1", "--keep-recent", "550",
                              "--out", str(out), "--json")
    assert code == 0, err
    assert data["chunks"] == 1 and data["fallbackLevel"] == "full" and data["auditPassed"]
    prompts = [r.prompt for r in llm_server.requests]
    assert len(prompts) == 2
    assert "Quality check feedback" not in prompts[0]
    assert "missing_section:## Open TODOs" in prompts[1]
    assert summary_of(out).count("## Open TODOs") == 1


def test_rate_limit_is_ridden_out(llm_server: ScriptedLLMServer, tmp_path: Path) -> None:
    source = _single_chunk_session(tmp_path)
    llm_server.script(Behavior.rate_limited(1))
    out = tmp_path / "out.jsonl"
    code, data, err = run_cli("compact", str(source), "--summarizer", "openai", "--base-url",
                              llm_server.url, "--model", "m1", "--keep-recent", "550",
                              "--out", str(out), "--json")
    assert code == 0, err
    assert data["fallbackLevel"] == "full"
    first, second = llm_server.requests[:2]
    assert second.arrived - first.arrived >= 0.95


def test_overflow_replans_the_chunk(llm_server: ScriptedLLMServer, tmp_path: Path) -> None:
    llm_server.script(Behavior.overflow())
    out = tmp_path / "out.jsonl"
    result = compact(llm_server, out)
    assert result["status"] == "compacted" and result["fallbackLevel"] == "full"
    # one request was refused and its chunk was summarized again in two halves
    assert len(llm_server.requests) == result["chunks"] + 2 + 2


def test_hung_server_is_stopped_by_the_deadline(llm_server: ScriptedLLMServer,
                                                tmp_path: Path) -> None:
    llm_server.always("m1", Behavior.hang())
    config = _fast_retry_config(tmp_path, "[timeouts]\ntotal = 1.0\nread = 1.0\n")
    out = tmp_path / "out.jsonl"
    started = time.monotonic()
    result = compact(llm_server, out, "--config", str(config))
    assert time.monotonic() - started < 40
    assert result["status"] == "compacted" and result["fallbackLevel"] == "extractive"
