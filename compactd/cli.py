"""The `compactd` command line: plan and compact transcripts, run workers, submit jobs."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Any, NoReturn

import orjson
import typer
from rich.console import Console
from rich.table import Table

from compactd.embedded import CompactResult
from compactd.settings import CompactdSettings, ModelConfig, load_settings
from pipeline.errors import TranscriptError
from pipeline.plan import Plan, plan_bytes
from pipeline.settings import PlanSettings
from storage.sessions import Target

app = typer.Typer(
    name="compactd",
    help="LLM context compaction for agent platforms (pi/OpenClaw session transcripts).",
    no_args_is_help=True,
    add_completion=False,
)
out = Console()
err = Console(stderr=True)

KeepRecent = Annotated[
    int, typer.Option("--keep-recent", help="Tokens of recent history kept verbatim.")
]
Reserve = Annotated[
    int, typer.Option("--reserve", help="Tokens reserved for the summary and next reply.")
]
Window = Annotated[int, typer.Option("--window", help="Context window of the agent's model.")]


@app.callback()
def root() -> None:
    """LLM context compaction for agent platforms (pi/OpenClaw session transcripts)."""


def fail(message: str, code: int = 2) -> NoReturn:
    err.print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


def print_json(value: Any) -> None:
    sys.stdout.write(orjson.dumps(value, option=orjson.OPT_INDENT_2).decode() + "\n")


def open_target(target: str) -> Target:
    """A plain path, `s3://bucket/key` or `store://tenant/session` (the configured store)."""
    from storage.errors import StoreError
    from storage.sessions import parse_target

    try:
        return parse_target(target)
    except (ValueError, StoreError) as exc:
        fail(f"{target}: {exc}")


def read_input(target: str) -> bytes:
    """The transcript bytes of a target, with a clear error when it cannot be read."""
    from storage.errors import NotFound, StoreError

    if "://" not in target:
        path = Path(target)
        if path.is_dir():
            fail(f"{target}: is a directory")
        if not path.exists():
            fail(f"{target}: no such file")
    try:
        return open_target(target).read_bytes()
    except NotFound:
        fail(f"{target}: not found")
    except PermissionError:
        fail(f"{target}: permission denied")
    except (StoreError, OSError) as exc:
        fail(f"{target}: {exc}")


def _render_plan(plan: Plan, target: str) -> None:
    data = plan.to_json()
    prep = plan.preparation
    out.print(f"[bold]{target}[/]  session {data['sessionId']}  leaf {data['leafId']}")
    if prep is None or plan.chunks is None:
        out.print(f"[yellow]{data['reason']}[/]")
        return
    summary = Table(show_header=False, box=None, pad_edge=False)
    summary.add_column(style="dim")
    summary.add_column()
    summary.add_row("tokens before", f"{prep.tokens_before:,}")
    summary.add_row("trigger", "[red]compact[/]" if prep.should_compact else "below threshold")
    summary.add_row("first kept entry", f"{prep.first_kept_entry_id} (path index "
                    f"{prep.first_kept_index} of {len(prep.path)})")
    summary.add_row("split turn", f"yes, turn starts at {prep.turn_start_entry_id}"
                    if prep.is_split_turn else "no")
    summary.add_row("to summarize", f"{len(prep.history)} messages + "
                    f"{len(prep.turn_prefix)} turn-prefix messages")
    summary.add_row("previous compaction", prep.previous_compaction.id
                    if prep.previous_compaction else "none")
    summary.add_row("files", f"{len(prep.file_ops.read_files)} read, "
                    f"{len(prep.file_ops.modified_files)} modified")
    summary.add_row("timing", f"parse {plan.parse_ms:.1f} ms, plan {plan.plan_ms:.1f} ms")
    out.print(summary)
    table = Table(title=plan.chunks.reason, title_justify="left", title_style="dim")
    table.add_column("chunk", justify="right")
    table.add_column("messages", justify="right")
    table.add_column("tokens", justify="right")
    table.add_column("first entry")
    table.add_column("last entry")
    for number, chunk in enumerate(plan.chunks.chunks, start=1):
        table.add_row(str(number), str(len(chunk.messages)), f"{chunk.tokens:,}",
                      chunk.entry_ids[0], chunk.entry_ids[-1])
    if plan.chunks.chunks:
        out.print(table)
    for item in plan.chunks.oversized:
        out.print(f"[yellow]oversized[/] {item.entry_id}: {item.note}")
    for skipped in plan.transcript.skipped:
        out.print(f"[yellow]skipped line {skipped.line}[/] {skipped.code}: {skipped.detail}")


@app.command()
def plan(
    file: Annotated[str, typer.Argument(
        help="Transcript: a JSONL path, s3://bucket/key or store://tenant/session.")],
    keep_recent: KeepRecent = 20000,
    reserve: Reserve = 16384,
    window: Window = 200000,
    leaf: Annotated[str | None, typer.Option("--leaf", help="Plan the branch ending here.")] = None,
    lenient: Annotated[bool, typer.Option("--lenient", help="Skip bad lines (reported).")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Show what a compaction would keep, summarize and fan out, without calling any model."""
    data = read_input(file)
    try:
        settings = PlanSettings(keep_recent_tokens=keep_recent, reserve_tokens=reserve,
                                context_window=window)
        result = plan_bytes(data, settings, leaf_id=leaf, lenient=lenient)
    except TranscriptError as exc:
        fail(f"{file}: {exc}")
    except ValueError as exc:
        fail(str(exc))
    if as_json:
        print_json(result.to_json())
    else:
        _render_plan(result, file)


def _write_atomic(path: Path, data: bytes) -> None:
    """Temp file in the same directory, fsync, rename: readers see old or new, never half."""
    import os
    import tempfile

    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _settings(config: Path | None, summarizer: str, base_url: str | None, model: str | None,
              keep_recent: int | None, reserve: int | None, window: int | None,
              instructions: str | None) -> CompactdSettings:
    base = load_settings(config)
    plan_over = {k: v for k, v in {"keep_recent_tokens": keep_recent, "reserve_tokens": reserve,
                                   "context_window": window}.items() if v is not None}
    overrides: dict[str, Any] = {
        "plan": base.plan.model_copy(update=plan_over),
        "summary": base.summary.model_copy(update={"instructions": instructions}
                                           if instructions else {}),
    }
    if summarizer == "extractive":
        overrides["chain"] = []
    elif summarizer in ("openai", "anthropic"):
        if not base_url or not model:
            fail(f"--summarizer {summarizer} needs --base-url and --model")
        overrides["chain"] = [ModelConfig(summarizer=summarizer, base_url=base_url, model=model)]
    elif summarizer != "config":
        fail(f"unknown summarizer {summarizer!r}: use extractive, openai, anthropic or config")
    return base.model_copy(update=overrides)


@app.command()
def compact(
    file: Annotated[str, typer.Argument(
        help="Transcript: a JSONL path, s3://bucket/key or store://tenant/session.")],
    out_path: Annotated[Path | None, typer.Option("--out", help="Write the result here.")] = None,
    in_place: Annotated[
        bool, typer.Option("--in-place", help="Commit into FILE (CAS-safe).")
    ] = False,
    summarizer: Annotated[str, typer.Option(
        "--summarizer", help="extractive | openai | anthropic | config (the configured chain)"
    )] = "config",
    base_url: Annotated[
        str | None, typer.Option("--base-url", help="LLM endpoint base URL.")
    ] = None,
    model: Annotated[str | None, typer.Option("--model", help="LLM model name.")] = None,
    keep_recent: Annotated[int | None, typer.Option("--keep-recent")] = None,
    reserve: Annotated[int | None, typer.Option("--reserve")] = None,
    window: Annotated[int | None, typer.Option("--window")] = None,
    instructions: Annotated[str | None, typer.Option(
        "--instructions", help="Focus text (treated as data, capped at 4000 chars).")] = None,
    if_needed: Annotated[bool, typer.Option("--if-needed", help="Only above the trigger.")] = False,
    rotate: Annotated[bool | None, typer.Option(
        "--rotate/--no-rotate",
        help="After an --in-place commit to store://, start a successor segment.")] = None,
    config: Annotated[Path | None, typer.Option("--config", help="TOML settings file.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Compact a transcript: summarize the old part, keep the recent part, audit, write."""
    from compactd.chain import build_chain
    from compactd.embedded import compact_transcript
    from pipeline.commit import Superseded
    from pipeline.transcript import parse_transcript

    if out_path is not None and in_place:
        fail("use either --out or --in-place, not both")
    try:
        settings = _settings(config, summarizer, base_url, model, keep_recent, reserve, window,
                             instructions)
    except (ValueError, OSError) as exc:
        fail(f"settings: {exc}")
    data = read_input(file)
    try:
        transcript = parse_transcript(data)
    except TranscriptError as exc:
        fail(f"{file}: {exc}")

    chain = build_chain(settings)
    progress_ctx = None
    if not as_json and err.is_terminal:
        from rich.progress import Progress

        progress_ctx = Progress(console=err, transient=True)
    task_id = None

    def on_progress(stage: str, done: int, total: int) -> None:
        nonlocal task_id
        if progress_ctx is None:
            return
        if task_id is None:
            task_id = progress_ctx.add_task(stage, total=total)
        progress_ctx.update(task_id, completed=done, total=total, description=stage)

    if progress_ctx is not None:
        progress_ctx.start()
    try:
        done = compact_transcript(transcript, chain, plan_settings=settings.plan,
                                  summary_settings=settings.summary, if_needed=if_needed,
                                  progress=on_progress)
    finally:
        if progress_ctx is not None:
            progress_ctx.stop()
    result = done.result
    if done.entry is not None and done.facts is not None:
        if in_place:
            target = open_target(file)
            try:
                committed = target.commit(done.entry, done.facts,
                                          rotate=settings.rotate if rotate is None else rotate)
            except Superseded as exc:
                result.status = "superseded"
                result.reason = exc.reason
            except ValueError as exc:
                fail(str(exc))
            else:
                result.compaction_entry_id = committed.entry_id
        elif out_path is not None:
            transcript.append(done.entry)
            _write_atomic(out_path, transcript.to_bytes())
        else:
            result.reason = (result.reason + "; " if result.reason else "") + \
                "dry run: pass --out FILE or --in-place to write"
    if as_json:
        print_json(result.to_json())
    else:
        _render_result(result, done.final.text if done.final else None)
    if result.status in ("failed", "superseded"):
        raise typer.Exit(1)


def _render_result(result: CompactResult, summary: str | None) -> None:
    colour = {"compacted": "green", "ineffective": "yellow", "skipped": "yellow"}.get(
        result.status, "red")
    out.print(f"[bold {colour}]{result.status}[/]" + (f" — {result.reason}" if result.reason
                                                     else ""))
    table = Table(show_header=False, box=None, pad_edge=False)
    table.add_column(style="dim")
    table.add_column()
    table.add_row("tokens", f"{result.tokens_before:,} -> {result.tokens_after:,}")
    table.add_row("chunks", str(result.chunks))
    table.add_row("first kept entry", str(result.first_kept_entry_id))
    table.add_row("compaction entry", str(result.compaction_entry_id))
    table.add_row("audit", "passed" if result.audit_passed else
                  ", ".join(result.audit_failures) or "-")
    table.add_row("summarizer", f"{result.summarizer} / {result.model} "
                  f"(fallback level: {result.fallback_level})")
    table.add_row("elapsed", f"{result.elapsed_ms:.0f} ms")
    out.print(table)


import compactd.cli_gateway  # noqa: E402  (registers serve/tenants/remote)
import compactd.cli_jobs  # noqa: E402  (registers worker/submit/status/cancel/flower)
import compactd.cli_store  # noqa: E402, F401  (registers append/init/checkpoints)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
