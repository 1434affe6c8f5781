"""The `compactd` command line: plan and compact transcripts, run workers, submit jobs."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Any, NoReturn

import orjson
import typer
from rich.console import Console
from rich.table import Table

from pipeline.errors import TranscriptError
from pipeline.plan import Plan, plan_bytes
from pipeline.settings import PlanSettings

app = typer.Typer(
    name="compactd",
    help="LLM context compaction for agent platforms (pi/OpenClaw session transcripts).",
    no_args_is_help=True,
    add_completion=False,
)
out = Console()
err = Console(stderr=True)

KeepRecent = Annotated[int, typer.Option("--keep-recent", help="Tokens of recent history kept verbatim.")]
Reserve = Annotated[int, typer.Option("--reserve", help="Tokens reserved for the summary and next reply.")]
Window = Annotated[int, typer.Option("--window", help="Context window of the agent's model.")]


@app.callback()
def root() -> None:
    """LLM context compaction for agent platforms (pi/OpenClaw session transcripts)."""


def fail(message: str, code: int = 2) -> NoReturn:
    err.print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


def print_json(value: Any) -> None:
    sys.stdout.write(orjson.dumps(value, option=orjson.OPT_INDENT_2).decode() + "\n")


def read_input(target: str) -> bytes:
    path = Path(target)
    try:
        return path.read_bytes()
    except FileNotFoundError:
        fail(f"{target}: no such file")
    except IsADirectoryError:
        fail(f"{target}: is a directory")
    except PermissionError:
        fail(f"{target}: permission denied")


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
    file: Annotated[str, typer.Argument(help="Session transcript (JSONL).")],
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


def main() -> None:
    app()


if __name__ == "__main__":
    main()
