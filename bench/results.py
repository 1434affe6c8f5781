"""Shared helpers for the benchmarks: machine description and RESULTS.md sections."""

from __future__ import annotations

import os
import platform
import re
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "RESULTS.md"
HEADER = ("# Benchmark results\n\nEvery number below was produced by the command next to it, "
          "on the machine described there. Medians and ratios come from one run.\n")


def machine_line() -> str:
    cpu = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return (f"Machine: {os.cpu_count()} cores, {cpu}, Python {platform.python_version()}, "
            f"{platform.system()} {platform.release()}.")


def write_section(name: str, body: str) -> None:
    """Replace (or append) the section between `<!-- name:start -->` and `<!-- name:end -->`."""
    start, end = f"<!-- {name}:start -->", f"<!-- {name}:end -->"
    text = RESULTS.read_text() if RESULTS.exists() else HEADER
    block = f"{start}\n{body.strip()}\n{end}"
    pattern = re.compile(re.escape(start) + r".*?" + re.escape(end), re.DOTALL)
    text = pattern.sub(lambda _: block, text) if pattern.search(text) else \
        text.rstrip() + "\n\n" + block + "\n"
    RESULTS.write_text(text)
