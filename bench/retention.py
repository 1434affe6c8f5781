"""Retention of planted facts after compaction, and how much smaller the context gets.

Each run plants facts of every kind early in a long generated coding session (standing rules,
a decision, a TODO, a UUID, a commit hash, a URL, host:port, a path), compacts it with the
extractive summarizer (and, with --llm, also through the scripted LLM server), and checks
which facts are still visible in the model view afterwards. Writes the `retention` section of
bench/RESULTS.md.

    .venv/bin/python bench/retention.py [--sessions 12]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.results import machine_line, write_section  # noqa: E402
from compactd.embedded import compact_transcript  # noqa: E402
from pipeline.context import build_session_context, convert_to_llm  # noqa: E402
from pipeline.settings import PlanSettings, SummarySettings  # noqa: E402
from pipeline.transcript import parse_transcript  # noqa: E402
from tests.support.builders import SessionBuilder  # noqa: E402


def planted(seed: int) -> dict[str, tuple[str, str]]:
    """kind -> (sentence planted in a user turn, the fact that must survive)."""
    rng = random.Random(seed)
    uid = f"{rng.getrandbits(32):08x}-{rng.getrandbits(16):04x}-4{rng.getrandbits(12):03x}-" \
          f"a{rng.getrandbits(12):03x}-{rng.getrandbits(48):012x}"
    sha = f"{rng.getrandbits(160):040x}"
    port = rng.randint(1025, 65000)
    return {
        "constraint": (f"Never run migrations against prod-{seed}.", f"Never run migrations "
                       f"against prod-{seed}."),
        "constraint2": ("Don't touch the billing tables.", "Don't touch the billing tables."),
        "uuid": (f"The tenant id is {uid}.", uid),
        "hash": (f"We are based on commit {sha}.", sha),
        "url": (f"Docs live at https://docs.example-{seed}.com/api/v3.",
                f"https://docs.example-{seed}.com/api/v3"),
        "host_port": (f"The cache is at cache-{seed}.internal:{port}.",
                      f"cache-{seed}.internal:{port}"),
        "path": (f"Config is in /etc/app-{seed}/settings.toml.", f"/etc/app-{seed}/settings.toml"),
    }


def session(seed: int, turns: int = 60) -> tuple[bytes, dict[str, str]]:
    rng = random.Random(seed)
    facts = planted(seed)
    b = SessionBuilder(session_id=f"retention-{seed}")
    b.user(" ".join(sentence for sentence, _ in facts.values()))
    b.assistant("Decided to use the adapter pattern because the legacy client is everywhere. "
                "TODO: remove the legacy client after the migration.")
    for turn in range(turns):
        b.user(f"Task {turn}: update module_{turn} and run its tests. " + "context " * 30)
        for _ in range(rng.randint(1, 3)):
            b.assistant(f"Editing module_{turn}.",
                        calls=[("edit", {"path": f"/repo/src/module_{turn}.py",
                                         "oldText": "a", "newText": "b"})])
            b.tool_result(b.last_call_ids[0], "ok\n" + "line of output\n" * 120, name="edit")
        b.assistant(f"Module {turn} updated; tests pass. " + "detail " * 80,
                    usage=2000 + turn * 2500)
    expect = {kind: fact for kind, (_, fact) in facts.items()}
    expect["decision"] = "adapter pattern"
    expect["todo"] = "remove the legacy client"
    return b.to_bytes(), expect


def visible_text(data: bytes) -> str:
    transcript = parse_transcript(data)
    parts: list[str] = []
    for message in convert_to_llm(build_session_context(transcript.path()).payloads):
        content = message.get("content")
        if isinstance(content, str):
            parts.append(content)
        else:
            parts += [str(b.get("text", "")) for b in content or [] if isinstance(b, dict)]
    return "\n".join(parts).lower()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sessions", type=int, default=12)
    args = parser.parse_args()
    settings = PlanSettings(keep_recent_tokens=8000, context_window=128000)
    kept: dict[str, int] = {}
    total: dict[str, int] = {}
    ratios: list[float] = []
    for seed in range(args.sessions):
        data, expect = session(seed)
        transcript = parse_transcript(data)
        done = compact_transcript(transcript, [], plan_settings=settings,
                                  summary_settings=SummarySettings())
        assert done.entry is not None, done.result.reason
        transcript.append(done.entry)
        view = visible_text(transcript.to_bytes())
        for kind, fact in expect.items():
            total[kind] = total.get(kind, 0) + 1
            kept[kind] = kept.get(kind, 0) + (fact.lower() in view)
        ratios.append(done.result.tokens_after / done.result.tokens_before)
    overall = sum(kept.values()) / sum(total.values())
    rows = [f"| {kind} | {kept[kind]}/{total[kind]} |" for kind in total]
    median_ratio = statistics.median(ratios)
    body = "\n".join([
        "## Retention of planted facts (extractive summarizer)",
        "",
        f"Command: `.venv/bin/python bench/retention.py --sessions {args.sessions}`  ",
        machine_line(),
        "",
        f"{args.sessions} generated sessions (~{len(session(0)[0]) // 1024} KiB each), facts "
        "planted in the first user turn, compacted once with keepRecentTokens 8000; a fact is "
        "retained when it is visible in the model view after the compaction.",
        "",
        "| fact kind | retained |",
        "|---|---|",
        *rows,
        "",
        f"**Overall retention: {overall:.0%}.** Compacted context size relative to the original "
        f"(tokensAfter / tokensBefore): median **{median_ratio:.3f}** "
        f"(min {min(ratios):.3f}, max {max(ratios):.3f}).",
    ])
    write_section("retention", body)
    print(body)


if __name__ == "__main__":
    main()
