"""CLI commands on stored sessions: ``append``, ``init``, ``checkpoints list|restore``.

Registered on the main ``app`` as a side effect of importing this module (``compactd.cli``
imports it). Targets are ``store://TENANT/SESSION`` (the configured store), ``s3://BUCKET/KEY``
or a plain file path; see :func:`storage.sessions.parse_target`. Input errors exit with 2 and
name the offending line; nothing is written in that case.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Any, NoReturn

import orjson
import typer
from rich.table import Table

from compactd.cli import app, fail, out, print_json
from pipeline.errors import TranscriptError
from storage.errors import NotFound, StoreError
from storage.sessions import EntryRejected, SessionStore, Target, parse_target

checkpoints_app = typer.Typer(help="List and restore pre-compaction checkpoints.",
                              no_args_is_help=True)
app.add_typer(checkpoints_app, name="checkpoints")

TargetArg = Annotated[str, typer.Argument(
    help="store://TENANT/SESSION, s3://BUCKET/KEY or a file path.")]


def _target(target: str) -> Target:
    try:
        return parse_target(target)
    except (ValueError, StoreError) as exc:
        fail(f"{target}: {exc}")


def _session(target: str) -> SessionStore:
    resolved = _target(target)
    if resolved.session is None:
        fail(f"{target}: checkpoints need a store://TENANT/SESSION target")
    return resolved.session


def _store_error(target: str, exc: Exception) -> NoReturn:
    if isinstance(exc, NotFound | TranscriptError):
        fail(f"{target}: {exc}")
    fail(f"{target}: storage error: {exc}", code=1)


def _read_lines(source: Path | None) -> tuple[list[Any], list[int]]:
    """Parse JSONL input into entries and their 1-based line numbers (blank lines skipped)."""
    if source is None:
        data = sys.stdin.buffer.read()
        name = "<stdin>"
    else:
        try:
            data = source.read_bytes()
        except OSError as exc:
            fail(f"{source}: {exc.strerror or exc}")
        name = str(source)
    entries: list[Any] = []
    lines: list[int] = []
    for number, line in enumerate(data.split(b"\n"), start=1):
        if not line.strip():
            continue
        try:
            entries.append(orjson.loads(line))
        except orjson.JSONDecodeError as exc:
            fail(f"{name} line {number}: not valid JSON ({exc}); nothing was appended")
        lines.append(number)
    if not entries:
        fail(f"{name}: no entries to append")
    return entries, lines


@app.command()
def append(
    target: TargetArg,
    source: Annotated[Path | None, typer.Option(
        "--from", help="JSONL file with one entry per line (default: stdin).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Append entries (CAS-safe). Entries without id/parentId are chained to the current leaf."""
    entries, lines = _read_lines(source)
    resolved = _target(target)
    try:
        ids = resolved.append(entries)
    except EntryRejected as exc:
        where = f"line {lines[exc.index]}" if exc.index < len(lines) else f"entry {exc.index}"
        fail(f"{source or '<stdin>'} {where}: {exc.code}: {exc.detail}; nothing was appended")
    except (StoreError, TranscriptError) as exc:
        _store_error(target, exc)
    if as_json:
        print_json({"appended": ids})
    else:
        sys.stdout.write("".join(f"{entry_id}\n" for entry_id in ids))


@app.command()
def init(
    target: TargetArg,
    source: Annotated[Path, typer.Option("--from", help="Transcript (JSONL) to start from.")],
) -> None:
    """Create a store:// session from a transcript file."""
    ss = _session(target)
    try:
        data = source.read_bytes()
    except OSError as exc:
        fail(f"{source}: {exc.strerror or exc}")
    try:
        key = ss.create(data)
    except TranscriptError as exc:
        fail(f"{source}: {exc}")
    except ValueError as exc:
        fail(f"{source}: {exc}")
    except StoreError as exc:
        fail(f"{target}: {exc}", code=2 if "already exists" in str(exc) else 1)
    out.print(f"created {target} (segment {key})", highlight=False)


@checkpoints_app.command("list")
def checkpoints_list(
    target: TargetArg,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """List a session's checkpoints, newest first."""
    from storage.checkpoints import list_checkpoints

    ss = _session(target)
    try:
        if not ss.exists():
            fail(f"{target}: no such session")
        metas = list_checkpoints(ss)
    except StoreError as exc:
        _store_error(target, exc)
    if as_json:
        print_json([m.to_json() for m in metas])
        return
    table = Table()
    for column in ("id", "created", "reason", "bytes", "leaf", "compaction"):
        table.add_column(column)
    for m in metas:
        table.add_row(m.id, m.created_at, m.reason, f"{m.bytes:,}", str(m.leaf_id),
                      str(m.compaction_id))
    out.print(table)


@checkpoints_app.command("restore")
def checkpoints_restore(
    target: TargetArg,
    checkpoint_id: Annotated[str, typer.Argument(help="Checkpoint id (see `list`).")],
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Make a checkpoint the live transcript (the current state is checkpointed first)."""
    from storage.checkpoints import restore_checkpoint

    ss = _session(target)
    try:
        if not ss.exists():
            fail(f"{target}: no such session")
        result = restore_checkpoint(ss, checkpoint_id)
    except NotFound:
        fail(f"{target}: no checkpoint {checkpoint_id!r}")
    except (StoreError, TranscriptError) as exc:
        _store_error(target, exc)
    if as_json:
        print_json(result.to_json())
    else:
        out.print(f"restored {checkpoint_id}: live segment {result.segment_key}; undo with "
                  f"`compactd checkpoints restore {target} {result.pre_restore_checkpoint}`",
                  highlight=False)
