"""Fan-out benchmark of the distributed runner (Celery workers on Redis, LLM over HTTP).

Measures, against the scripted LLM server (fixed latency per request):

1. Latency of one 8-chunk compaction on the workers vs the same summary requests made one
   after another in-process (target: >= 3x faster).
2. Per-job overhead with a zero-latency server: distributed end-to-end wall time minus the
   in-process embedded runner on the same transcript (median of N jobs; target < 100 ms).
3. Throughput with 1 vs 2 worker processes (several LLM-bound jobs submitted at once).

Writes a section between `<!-- fanout:start -->` and `<!-- fanout:end -->` in bench/RESULTS.md
(appended if missing; other sections are never touched).

    .venv/bin/python -m bench.fanout [--redis redis://127.0.0.1:6379/14] [--latency 1.0]

Uses (and FLUSHES) the given Redis DB: never point it at a production database.
"""

from __future__ import annotations

import argparse
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import orjson
import redis

from compactd.chain import build_chain
from compactd.embedded import compact_transcript
from compactd.settings import CompactdSettings, ModelConfig
from pipeline.engine import EXTRACTIVE, prepare_job, summarize_unit
from pipeline.plan import plan_transcript
from pipeline.settings import PlanSettings
from pipeline.transcript import parse_transcript
from storage.objectstore import open_store
from storage.sessions import SessionStore
from tasks.producer import producer_app, submit_compaction, wait_job
from tests.support.builders import generate_session
from tests.support.llmserver import ScriptedLLMServer

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "RESULTS.md"
START, END = "<!-- fanout:start -->", "<!-- fanout:end -->"
MODEL = "bench-model"
PLAN = {"keep_recent_tokens": 2000, "reserve_tokens": 1000, "reserve_floor": 0,
        "context_window": 20000, "target_chunk_tokens": 2000, "max_chunks": 8}
QUEUES = "compactd.interactive,compactd.background"


class Workers:
    """Worker subprocesses sharing one Redis DB and one store."""

    def __init__(self, env: dict[str, str], logdir: Path) -> None:
        self.env = env
        self.logdir = logdir
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, name: str, concurrency: int) -> None:
        log = (self.logdir / f"{name}.log").open("wb")
        self.procs[name] = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "tasks.app", "worker", "--pool", "threads",
             "-c", str(concurrency), "-Q", QUEUES, "--without-gossip", "--without-mingle",
             "-n", f"{name}@%h", "--loglevel", "WARNING"],
            cwd=ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True)

    def wait_ready(self, url: str, timeout: float = 60) -> None:
        app = producer_app(url)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            replies = app.control.ping(timeout=0.5) or []
            seen = {n.split("@")[0] for reply in replies for n in reply}
            if set(self.procs) <= seen:
                return
        raise RuntimeError("workers did not start")

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.procs.values():
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
        self.procs.clear()


@contextmanager
def workers(env: dict[str, str], logdir: Path, url: str, count: int,
            concurrency: int) -> Iterator[Workers]:
    w = Workers(env, logdir)
    try:
        for i in range(count):
            w.start(f"bench{i}", concurrency)
        w.wait_ready(url)
        yield w
    finally:
        w.stop()


def run_distributed(store: Any, url: str, seed: int, tag: str) -> tuple[float, dict[str, Any]]:
    session = f"{tag}-{seed}"
    SessionStore(store, "bench", session).create(generate_session(120, seed, 1500))
    started = time.perf_counter()
    job_id = submit_compaction(f"store://bench/{session}", plan=PLAN, redis_url=url)
    job = wait_job(job_id, timeout=300, poll=0.002, redis_url=url)
    wall = time.perf_counter() - started
    assert job["state"] == "succeeded", job
    return wall, job


def run_batch(store: Any, url: str, sessions: dict[str, bytes],
              plan: dict[str, int]) -> float:
    """Create the sessions, submit them all at once, wait for all: wall seconds from the
    first submit to the last final record."""
    for name, data in sessions.items():
        SessionStore(store, "bench", name).create(data)
    started = time.perf_counter()
    ids = [submit_compaction(f"store://bench/{name}", plan=plan, redis_url=url)
           for name in sessions]
    for job_id in ids:
        job = wait_job(job_id, timeout=600, poll=0.01, redis_url=url)
        assert job["state"] == "succeeded", job
    return time.perf_counter() - started


def run_serial(settings: CompactdSettings, seed: int) -> tuple[float, float, int]:
    """The same requests one after another in this process: (units-only s, end-to-end s,
    units)."""
    from pipeline.engine import finish

    chain = build_chain(settings)
    transcript = parse_transcript(generate_session(120, seed, 1500))
    started = time.perf_counter()
    plan = plan_transcript(transcript, settings.plan)
    job = prepare_job(plan, settings.plan, settings.summary)
    units = job.chunk_requests() if job.multi_chunk else []
    if job.prefix_request is not None:
        units.append(job.prefix_request)
    outcomes = [summarize_unit(u, chain or [EXTRACTIVE]) for u in units]
    units_done = time.perf_counter() - started
    prefix = outcomes.pop() if job.prefix_request is not None else None
    finish(job, outcomes, prefix, chain)
    return units_done, time.perf_counter() - started, len(units)


def run_embedded(settings: CompactdSettings, store: Any, seed: int) -> float:
    """The embedded runner (thread pool) + CAS commit on the same kind of session."""
    session = SessionStore(store, "bench", f"emb-{seed}")
    session.create(generate_session(120, seed, 1500))
    started = time.perf_counter()
    data = session.read_bytes()
    done = compact_transcript(parse_transcript(data), build_chain(settings),
                              plan_settings=settings.plan, summary_settings=settings.summary)
    assert done.entry is not None and done.facts is not None
    session.commit(done.entry, done.facts)
    return time.perf_counter() - started


def machine() -> str:
    r = redis.Redis()
    info = r.info("server")
    cpu = platform.processor() or platform.machine()
    try:
        model = next(line.split(":", 1)[1].strip() for line in
                     Path("/proc/cpuinfo").read_text().splitlines()
                     if line.startswith("model name"))
    except (OSError, StopIteration):
        model = cpu
    return (f"{platform.system()} {platform.release()}, {os.cpu_count()} CPUs ({model}), "
            f"Python {platform.python_version()}, Redis {info.get('redis_version')}")


def write_results(section: str) -> None:
    block = f"{START}\n{section.rstrip()}\n{END}\n"
    text = RESULTS.read_text() if RESULTS.exists() else "# Benchmark results\n"
    if START in text and END in text:
        head, rest = text.split(START, 1)
        _, tail = rest.split(END, 1)
        text = head + block.rstrip("\n") + tail
    else:
        text = text.rstrip("\n") + "\n\n" + block
    RESULTS.write_text(text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--redis", default="redis://127.0.0.1:6379/14")
    parser.add_argument("--latency", type=float, default=1.0)
    parser.add_argument("--runs", type=int, default=3, help="runs of the latency scenario")
    parser.add_argument("--overhead-jobs", type=int, default=20)
    parser.add_argument("--throughput-jobs", type=int, default=8)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args(argv)

    r = redis.Redis.from_url(args.redis)
    r.flushdb()
    tmp = Path(tempfile.mkdtemp(prefix="compactd-bench-"))
    (tmp / "store").mkdir()
    store_url = f"file://{tmp / 'store'}"
    store = open_store(store_url)
    llm = ScriptedLLMServer(latency=args.latency).start()
    model_cfg = ModelConfig(summarizer="openai", base_url=llm.url, model=MODEL, api_key="k")
    settings = CompactdSettings(chain=[model_cfg], plan=PlanSettings(**PLAN),
                                redis_url=args.redis, store_url=store_url)
    env = {**os.environ, "COMPACTD_REDIS_URL": args.redis, "COMPACTD_STORE_URL": store_url,
           "COMPACTD_CHAIN": orjson.dumps([model_cfg.model_dump(mode="json") | {"api_key": "k"}])
           .decode(), "PYTHONPATH": str(ROOT)}
    lines: list[str] = []
    try:
        # 1. latency of one 8-chunk job vs serial in-process
        llm.latency = args.latency
        with workers(env, tmp, args.redis, 1, 32):
            dist = [run_distributed(store, args.redis, 100 + i, "lat") for i in range(args.runs)]
        serial = [run_serial(settings, 200 + i) for i in range(args.runs)]
        d_med = statistics.median(w for w, _ in dist)
        s_units = statistics.median(s[0] for s in serial)
        s_e2e = statistics.median(s[1] for s in serial)
        units = serial[0][2]
        chunks = dist[0][1].get("chunks")
        # 2. overhead with a zero-latency server
        llm.latency = 0.0
        with workers(env, tmp, args.redis, 1, 32):
            over_d = [run_distributed(store, args.redis, 300 + i, "ovh")[0]
                      for i in range(args.overhead_jobs)]
        over_e = [run_embedded(settings, store, 400 + i) for i in range(args.overhead_jobs)]
        od, oe = statistics.median(over_d), statistics.median(over_e)
        # 3. throughput, 1 vs 2 worker processes (16 threads each)
        llm.latency = args.latency
        tput: dict[int, float] = {}
        for count in (1, 2):
            with workers(env, tmp, args.redis, count, 16):
                sessions = {f"tp{count}-{i}": generate_session(120, 500 + 100 * count + i, 1500)
                            for i in range(args.throughput_jobs)}
                tput[count] = run_batch(store, args.redis, sessions, PLAN)
    finally:
        llm.stop()
        r.flushdb()

    jobs_per_min = {c: args.throughput_jobs / t * 60 for c, t in tput.items()}
    cmd = "python -m bench.fanout " + " ".join(argv if argv is not None else sys.argv[1:])
    lines += [
        "## Fan-out on Celery workers (bench/fanout.py)",
        "",
        f"Machine: {machine()}. Command: `{cmd.strip()}`. LLM: scripted HTTP server "
        f"(tests/support/llmserver.py) with {args.latency:.1f} s per request; worker pool "
        "`threads`; broker and backend Redis on 127.0.0.1.",
        "",
        "| Scenario | Result | Target |",
        "|---|---|---|",
        f"| One compaction, {chunks} chunks + turn prefix = {units} parallel units + merge, "
        f"on 1 worker (32 threads), median of {args.runs} | **{d_med:.2f} s** | |",
        f"| Same requests one after another in-process: units only / units + merge "
        f"(median of {args.runs}) | {s_units:.2f} s / {s_e2e:.2f} s | |",
        f"| Speed-up vs serial (units + merge) | **{s_e2e / d_med:.1f}x** "
        f"(units only: {s_units / d_med:.1f}x) | >= 3x |",
        f"| Zero-latency server: distributed end-to-end, median of {args.overhead_jobs} jobs "
        f"| {od * 1000:.0f} ms | |",
        f"| Zero-latency server: embedded runner + CAS commit, same size, median "
        f"| {oe * 1000:.0f} ms | |",
        f"| Overhead per job (difference of medians) | **{(od - oe) * 1000:.0f} ms** "
        "| < 100 ms |",
        f"| Throughput, {args.throughput_jobs} jobs at once, 1 worker x 16 threads "
        f"| {tput[1]:.1f} s ({jobs_per_min[1]:.0f} jobs/min) | |",
        f"| Throughput, {args.throughput_jobs} jobs at once, 2 workers x 16 threads "
        f"| {tput[2]:.1f} s ({jobs_per_min[2]:.0f} jobs/min, "
        f"{tput[1] / tput[2]:.2f}x) | scales with processes |",
        "",
        "Distributed wall time is measured by the producer from submit until the job record "
        "is final (polled every 2 ms). Each run uses a different transcript, so the per-content "
        "cache never hits. Throughput jobs are LLM-bound: "
        f"{args.throughput_jobs} x {units} units exceed one worker's 16 threads.",
    ]
    section = "\n".join(lines)
    print(section)
    if not args.no_write:
        write_results(section)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
