"""Latency vs chunk count, and throughput vs worker processes, with plots.

Against the scripted LLM server with a fixed per-call latency: for 1, 2, 4, 8 and 16 chunks,
the end-to-end latency of one compaction on the Celery workers vs the same requests
summarized one after another in-process; then the same batch of jobs on 1 and 2 worker
processes. Writes bench/latency_vs_chunks.png, bench/scaling.png and the `sweep` section of
bench/RESULTS.md.

    .venv/bin/python -m bench.sweep [--latency 0.5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import orjson
import redis

from bench.fanout import MODEL, ROOT, run_batch, run_serial, workers
from bench.results import machine_line, write_section
from compactd.settings import CompactdSettings, ModelConfig
from pipeline.settings import PlanSettings
from storage.objectstore import open_store
from storage.sessions import SessionStore
from tasks.producer import submit_compaction, wait_job
from tests.support.builders import generate_session
from tests.support.llmserver import ScriptedLLMServer

BENCH = ROOT / "bench"
CHUNK_COUNTS = (1, 2, 4, 8, 16)


def plan_for(chunks: int) -> dict[str, int]:
    return {"keep_recent_tokens": 2000, "reserve_tokens": 1000, "reserve_floor": 0,
            "context_window": 40000, "target_chunk_tokens": 600, "max_chunks": chunks}


def one_job(store_url: str, url: str, session: str, seed: int, plan: dict[str, int]
            ) -> tuple[float, int]:
    SessionStore(open_store(store_url), "bench", session).create(
        generate_session(240, seed, 1500))
    started = time.perf_counter()
    job_id = submit_compaction(f"store://bench/{session}", plan=plan, redis_url=url)
    job = wait_job(job_id, timeout=600, poll=0.005, redis_url=url)
    assert job["state"] == "succeeded", job
    return time.perf_counter() - started, int(job.get("chunks") or 0)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--redis", default="redis://127.0.0.1:6379/14")
    parser.add_argument("--latency", type=float, default=0.5)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--jobs", type=int, default=8)
    args = parser.parse_args()
    redis.Redis.from_url(args.redis).flushdb()
    tmp = Path(tempfile.mkdtemp(prefix="compactd-sweep-"))
    (tmp / "store").mkdir()
    store_url = f"file://{tmp / 'store'}"
    llm = ScriptedLLMServer(latency=args.latency).start()
    model = ModelConfig(summarizer="openai", base_url=llm.url, model=MODEL, api_key="k")
    env = {**os.environ, "COMPACTD_REDIS_URL": args.redis, "COMPACTD_STORE_URL": store_url,
           "COMPACTD_CHAIN": orjson.dumps([model.model_dump(mode="json") | {"api_key": "k"}])
           .decode(), "PYTHONPATH": str(ROOT)}
    rows: list[tuple[int, float, float]] = []
    scaling: dict[int, float] = {}
    try:
        with workers(env, tmp, args.redis, 1, 32):
            for count in CHUNK_COUNTS:
                plan = plan_for(count)
                walls = [one_job(store_url, args.redis, f"c{count}-{i}", 10 * count + i, plan)
                         for i in range(args.runs)]
                settings = CompactdSettings(chain=[model], plan=PlanSettings(**plan),
                                            redis_url=args.redis, store_url=store_url)
                serial = run_serial(settings, 10 * count)[1]
                rows.append((count, statistics.median(w for w, _ in walls), serial))
        for procs in (1, 2):
            with workers(env, tmp, args.redis, procs, 8):
                sessions = {f"s{procs}-{i}": generate_session(240, 900 + 10 * procs + i, 1500)
                            for i in range(args.jobs)}
                scaling[procs] = run_batch(open_store(store_url), args.redis, sessions,
                                           plan_for(8))
    finally:
        llm.stop()

    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot([r[0] for r in rows], [r[2] for r in rows], "o-", label="one after another")
    ax.plot([r[0] for r in rows], [r[1] for r in rows], "o-", label="Celery fan-out (1 worker)")
    ax.set_xlabel("chunks per compaction")
    ax.set_ylabel("end-to-end latency (s)")
    ax.set_title(f"Compaction latency, LLM call = {args.latency:g} s")
    ax.set_xticks(list(CHUNK_COUNTS))
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(BENCH / "latency_vs_chunks.png", dpi=100)

    fig, ax = plt.subplots(figsize=(5, 4))
    rates = {p: args.jobs / t * 60 for p, t in scaling.items()}
    ax.bar([f"{p} worker{'s' if p > 1 else ''}" for p in rates], list(rates.values()))
    ax.set_ylabel("compactions per minute")
    ax.set_title(f"{args.jobs} jobs × 8 chunks, 8 threads per worker")
    fig.tight_layout()
    fig.savefig(BENCH / "scaling.png", dpi=100)

    table = [f"| chunks | fan-out (median of {args.runs}) | one after another | speed-up |",
             "|---|---|---|---|"]
    table += [f"| {c} | {d:.2f} s | {s:.2f} s | {s / d:.1f}x |" for c, d, s in rows]
    ratio = scaling[1] / scaling[2]
    body = "\n".join([
        "## Latency vs chunk count, and worker scaling (bench/sweep.py)",
        "",
        f"Command: `.venv/bin/python -m bench.sweep --latency {args.latency:g}`  ",
        machine_line(),
        "",
        f"Scripted LLM server with {args.latency:g} s per call. \"One after another\" runs the "
        "same requests (chunks, turn prefix, merge) sequentially in one process.",
        "",
        *table,
        "",
        "![latency vs chunk count](latency_vs_chunks.png)",
        "",
        f"Throughput, {args.jobs} jobs of 8 chunks submitted at once, 8 threads per worker "
        "process: 1 process "
        f"{scaling[1]:.1f} s ({rates[1]:.0f}/min), 2 processes {scaling[2]:.1f} s "
        f"({rates[2]:.0f}/min): **{ratio:.2f}x**.",
        "",
        "![scaling](scaling.png)",
    ])
    write_section("sweep", body)
    print(body)


if __name__ == "__main__":
    main()
