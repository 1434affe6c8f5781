"""`compactd worker | submit | status | cancel | flower`: the distributed runner's commands.

Registered onto the main typer app (`compactd.cli.app`); `compactd/cli.py` imports this module
at the end so the commands exist whenever the CLI runs. Heavy imports (celery, redis) happen
inside the commands so `compactd plan` stays fast.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path
from typing import Annotated, Any

import typer

from compactd.cli import app, err, fail, out, print_json

TERMINAL_COLOURS = {"succeeded": "green", "skipped": "yellow", "superseded": "yellow",
                    "cancelled": "yellow", "failed": "red"}


@app.command()
def worker(
    concurrency: Annotated[int, typer.Option("--concurrency", "-c",
                                             help="Threads (in-flight LLM calls) per process.")
                           ] = 32,
    queues: Annotated[str, typer.Option(
        "--queues", "-Q", help="Comma-separated queues to consume.")
    ] = "compactd.interactive,compactd.background,compactd.webhooks",
    pool: Annotated[str, typer.Option("--pool", help="threads (default) | prefork | solo")
                    ] = "threads",
    name: Annotated[str | None, typer.Option("--name", "-n", help="Worker node name.")] = None,
    loglevel: Annotated[str, typer.Option("--loglevel", "-l")] = "INFO",
    metrics_port: Annotated[int | None, typer.Option(
        "--metrics-port", help="Serve Prometheus /metrics on this port.")] = None,
) -> None:
    """Run a Celery worker for compaction jobs (threads pool: LLM calls are I/O-bound)."""
    from compactd import metrics
    from tasks.app import app as celery_app

    if metrics_port:
        metrics.serve(metrics_port)

    argv = ["worker", "--pool", pool, "--concurrency", str(concurrency), "--queues", queues,
            "--loglevel", loglevel]
    if name:
        argv += ["--hostname", name]
    celery_app.worker_main(argv=argv)


def _render_job(job: dict[str, Any]) -> None:
    from rich.table import Table

    state = job.get("state", "?")
    colour = TERMINAL_COLOURS.get(state, "cyan")
    out.print(f"[bold]{job['jobId']}[/]  [bold {colour}]{state}[/]"
              + (f" — {job['reason']}" if job.get("reason") else "")
              + (f" — [red]{job['error']}[/]" if job.get("error") else ""), highlight=False)
    table = Table(show_header=False, box=None, pad_edge=False)
    table.add_column(style="dim")
    table.add_column()
    progress = job.get("progress") or {}
    table.add_row("session", f"{job.get('tenant')}/{job.get('session')} ({job.get('target')})")
    table.add_row("chunks", f"{progress.get('chunksDone', 0)}/{progress.get('chunksTotal', 0)}")
    if job.get("tokensBefore") is not None:
        before, after = job.get("tokensBefore") or 0, job.get("tokensAfter") or 0
        table.add_row("tokens", f"{before:,} -> {after:,}")
    for label, field in (("fallback level", "fallbackLevel"), ("summarizer", "summarizer"),
                         ("model", "model"), ("compaction entry", "compactionEntryId"),
                         ("fence", "fence"), ("retries", "retries"),
                         ("redeliveries", "redeliveries")):
        if job.get(field) not in (None, ""):
            table.add_row(label, str(job[field]))
    timings = job.get("timings") or {}
    if timings:
        table.add_row("timings", ", ".join(f"{k} {v:.0f}" for k, v in timings.items()))
    out.print(table)


def _finish(job: dict[str, Any], as_json: bool) -> None:
    if as_json:
        print_json(job)
    else:
        _render_job(job)
    if job.get("state") in ("failed", "superseded"):
        raise typer.Exit(1)


@app.command()
def submit(
    target: Annotated[str, typer.Argument(
        help="store://TENANT/SESSION or file:///abs/path.jsonl (or an absolute path).")],
    tenant: Annotated[str | None, typer.Option("--tenant")] = None,
    session: Annotated[str | None, typer.Option("--session")] = None,
    summarizer: Annotated[str, typer.Option(
        "--summarizer", help="config (the workers' model chain) | extractive")] = "config",
    keep_recent: Annotated[int | None, typer.Option("--keep-recent")] = None,
    reserve: Annotated[int | None, typer.Option("--reserve")] = None,
    window: Annotated[int | None, typer.Option("--window")] = None,
    instructions: Annotated[str | None, typer.Option(
        "--instructions", help="Focus text (treated as data, capped at 4000 chars).")] = None,
    if_needed: Annotated[bool, typer.Option("--if-needed", help="Only above the trigger.")
                         ] = False,
    interactive: Annotated[bool, typer.Option(
        "--interactive", help="Use the interactive queue (a user is waiting).")] = False,
    wait: Annotated[bool, typer.Option("--wait", help="Wait and print the final record.")
                    ] = False,
    timeout: Annotated[float, typer.Option("--timeout", help="Seconds to wait.")] = 600.0,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Submit a compaction job; prints the job id (joins a running job of the session)."""
    from tasks.app import BACKGROUND_QUEUE, INTERACTIVE_QUEUE
    from tasks.jobs import CircuitOpen
    from tasks.producer import submit_compaction, wait_job

    plan = {k: v for k, v in {"keep_recent_tokens": keep_recent, "reserve_tokens": reserve,
                              "context_window": window}.items() if v is not None}
    try:
        job_id = submit_compaction(
            target, tenant=tenant, session=session, summarizer=summarizer, plan=plan,
            instructions=instructions, if_needed=if_needed,
            queue=INTERACTIVE_QUEUE if interactive else BACKGROUND_QUEUE)
    except CircuitOpen as exc:
        fail(str(exc), code=3)
    except ValueError as exc:
        fail(str(exc))
    if not wait:
        if as_json:
            print_json({"jobId": job_id})
        else:
            sys.stdout.write(job_id + "\n")
        return
    try:
        job = wait_job(job_id, timeout)
    except TimeoutError as exc:
        fail(str(exc), code=4)
    _finish(job, as_json)


@app.command()
def status(
    job_id: Annotated[str, typer.Argument(help="Job id printed by submit.")],
    wait: Annotated[bool, typer.Option("--wait", help="Wait until the job ends.")] = False,
    timeout: Annotated[float, typer.Option("--timeout")] = 600.0,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Show a job record: state, progress, tokens, fallback level, timings, error."""
    from tasks.producer import get_job, wait_job

    try:
        job = wait_job(job_id, timeout) if wait else get_job(job_id)
    except TimeoutError as exc:
        fail(str(exc), code=4)
    except KeyError:
        job = None
    if job is None:
        fail(f"no such job {job_id}")
    _finish(job, as_json)


@app.command()
def cancel(job_id: Annotated[str, typer.Argument(help="Job id.")],
           as_json: Annotated[bool, typer.Option("--json")] = False) -> None:
    """Cancel a job: it ends 'cancelled' with the transcript unchanged (unless it already
    committed)."""
    from tasks.producer import cancel_job

    try:
        job = cancel_job(job_id)
    except KeyError:
        fail(f"no such job {job_id}")
    if as_json:
        print_json(job)
    else:
        out.print(f"{job_id}: {job.get('state')}"
                  + (" (cancel requested)" if job.get("cancelRequested") else ""))


def flower_format_task(task: Any) -> Any:
    """Flower `format_task` hook: never show arguments or results, only ids and state.
    Our args are ids anyway; this also hides anything a future task might pass."""
    task.args = "<hidden>"
    task.kwargs = "<hidden>"
    task.result = "<hidden>" if task.result else task.result
    return task


@app.command()
def flower(
    port: Annotated[int, typer.Option("--port")] = 5555,
    address: Annotated[str, typer.Option("--address", help="Bind address (keep internal).")
                       ] = "127.0.0.1",
    basic_auth: Annotated[str | None, typer.Option(
        "--basic-auth", help="user:password (required; comma-separate several).")] = None,
) -> None:
    """Run Flower read-only with basic auth and task payloads hidden.

    Note: Flower exempts /metrics and /healthcheck from auth; bind to an internal address.
    """
    if not basic_auth or ":" not in basic_auth:
        fail("refusing to start Flower without --basic-auth user:password "
             "(it shows every tenant's jobs)")
    from tasks.app import app as celery_app

    conf = Path(tempfile.mkdtemp(prefix="compactd-flower-")) / "flowerconfig.py"
    conf.write_text("from compactd.cli_jobs import flower_format_task as format_task\n")
    os.chmod(conf, 0o600)
    err.print(f"flower on http://{address}:{port} (read-only, basic auth, payloads hidden)")
    celery_app.start(argv=["flower", f"--conf={conf}", f"--port={port}",
                           f"--address={address}", f"--basic-auth={basic_auth}",
                           "--read_only"])
