"""How long planning takes: parse + plan of a transcript, in process, by transcript size.

Deterministic coding sessions of 50, 300, 2000 and 8000 entries (tests.support.builders;
tool results sized so that 2000 entries are about 6 MB) are each parsed and planned once to
warm up, then timed over several repetitions; we report medians. Per-entry time should stay
roughly flat as sessions grow (the target is < 150 ms for 2000 entries / ~6 MB). Writes the
`plan` section of bench/RESULTS.md.

    .venv/bin/python bench/plan.py [--reps 9]
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.results import machine_line, write_section  # noqa: E402
from pipeline.plan import plan_bytes  # noqa: E402
from pipeline.settings import PlanSettings  # noqa: E402
from tests.support.builders import generate_session  # noqa: E402

SIZES = (50, 300, 2000, 8000)
RESULT_CHARS = 6800  # tool-result size that makes 2000 entries about 6 MB
SEED = 7
TARGET_MS_2000 = 150.0


def measure(entries: int, reps: int) -> dict[str, float]:
    data = generate_session(entries, seed=SEED, result_chars=RESULT_CHARS)
    settings = PlanSettings()
    for _ in range(2):  # warm-up: imports, regex compilation, allocator
        plan_bytes(data, settings)
    totals: list[float] = []
    parses: list[float] = []
    plans: list[float] = []
    count = 0
    for _ in range(reps):
        # Start every repetition from the same heap: the previous plan is freed and collected
        # outside the timed region, so one run's garbage is not charged to the next.
        gc.collect()
        started = time.perf_counter()
        plan = plan_bytes(data, settings)
        totals.append((time.perf_counter() - started) * 1000)
        parses.append(plan.parse_ms)
        plans.append(plan.plan_ms)
        count = len(plan.transcript.entries)
        del plan
    total = statistics.median(totals)
    return {
        "entries": count,
        "mb": len(data) / 1e6,
        "total_ms": total,
        "parse_ms": statistics.median(parses),
        "plan_ms": statistics.median(plans),
        "min_ms": min(totals),
        "us_per_entry": total * 1000 / count,
    }


def table(rows: list[dict[str, float]]) -> str:
    lines = [
        "| entries | size (MB) | parse (ms) | plan (ms) | parse + plan (ms) | min (ms) "
        "| µs / entry |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['entries']:.0f} | {r['mb']:.2f} | {r['parse_ms']:.1f} | {r['plan_ms']:.1f} | "
            f"{r['total_ms']:.1f} | {r['min_ms']:.1f} | {r['us_per_entry']:.1f} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=9, help="timed repetitions per size (>= 7)")
    args = parser.parse_args()
    reps = max(7, args.reps)

    load = os.getloadavg()[0]  # other work on the machine shows up as noise in the numbers
    rows = [measure(n, reps) for n in SIZES]
    by_size = dict(zip(SIZES, rows, strict=True))
    ratio = by_size[8000]["us_per_entry"] / by_size[300]["us_per_entry"]
    two_k = by_size[2000]
    verdict = "meets" if two_k["total_ms"] < TARGET_MS_2000 else "MISSES"

    text = table(rows)
    print(text)
    print(f"\nper-entry time 8000 vs 300 entries: {ratio:.2f}x")
    print(f"2000 entries ({two_k['mb']:.1f} MB): {two_k['total_ms']:.1f} ms median "
          f"({verdict} the {TARGET_MS_2000:.0f} ms target)")

    command = "Command: `.venv/bin/python bench/plan.py`" + "  "  # markdown line break
    body = f"""## Planning time (parse + plan, in process)

{command}
{machine_line()} nproc: {len(os.sched_getaffinity(0))}.

Deterministic sessions from `tests.support.builders.generate_session` (seed {SEED}, tool results
of ~{RESULT_CHARS} chars, default plan settings). Each size is parsed and planned twice to warm
up, then {reps} times; the table gives medians (and the fastest run). A `gc.collect()` runs
before each repetition, outside the timed region. Load average when the run started: {load:.2f}.

{text}

- Per-entry time, 8000 vs 300 entries: **{ratio:.2f}x** (1.0 = perfectly linear).
- 2000 entries / {two_k['mb']:.1f} MB: **{two_k['total_ms']:.1f} ms** median ({verdict} the
  {TARGET_MS_2000:.0f} ms target).
"""
    write_section("plan", body)


if __name__ == "__main__":
    main()
