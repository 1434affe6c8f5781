"""Turning a summary body into the committed text: register, suffix, size cap.

The standing rules of the register are written into `## Constraints/Rules` whatever the model
wrote there. The suffix (split-turn context, tool failures, file lists) is deterministic and
always kept; when the whole text is over the cap it is the body that gives way, one line at a
time from its longest section, so that every heading survives.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pipeline.constraints import constraint_key
from pipeline.fileops import format_file_ops
from pipeline.sections import CONSTRAINTS, is_placeholder, parse_sections

MAX_SUMMARY_CHARS = 16000
MAX_SPLIT_TURN_CHARS = 8000
MAX_TOOL_FAILURES = 8
MAX_TOOL_FAILURE_CHARS = 240
TRUNCATED_MARKER = "\n\n[Compaction summary truncated to fit budget]"
SPLIT_TURN_HEADER = "\n\n---\n\n**Turn Context (split turn):**\n\n"


def _join(sections: list[tuple[str | None, list[str]]]) -> str:
    parts: list[str] = []
    for heading, lines in sections:
        body = "\n".join(lines).strip("\n")
        if heading is None:
            if body.strip():
                parts.append(body)
        else:
            parts.append(f"{heading}\n{body}" if body else heading)
    return "\n\n".join(parts)


def enforce_register(body: str, register: Sequence[str]) -> str:
    """Put every register rule, verbatim, first under `## Constraints/Rules`."""
    if not register:
        return body
    sections = parse_sections(body)
    known = {constraint_key(rule) for rule in register}
    for index, (heading, lines) in enumerate(sections):
        if heading != CONSTRAINTS:
            continue
        extra = []
        for line in lines:
            item = line.strip().lstrip("-*• ").strip()
            if item and not is_placeholder(item) and constraint_key(item) not in known:
                extra.append(line)
        sections[index] = (heading, [f"- {rule}" for rule in register] + extra)
        return _join(sections)
    return body


def demote_headings(text: str) -> str:
    return "\n".join(("#" + line) if line.startswith("## ") else line
                     for line in text.splitlines())


def tool_failures(messages: Sequence[Mapping[str, Any]]) -> str:
    """`## Tool Failures`: failing tool results, one line each, at most eight."""
    seen: set[str] = set()
    lines: list[str] = []
    for message in messages:
        if message.get("role") != "toolResult" or not message.get("isError"):
            continue
        call_id = str(message.get("toolCallId"))
        if call_id in seen:
            continue
        seen.add(call_id)
        content = message.get("content")
        text = content if isinstance(content, str) else " ".join(
            str(b.get("text", "")) for b in content or [] if isinstance(b, Mapping))
        text = " ".join(text.split()) or "failed (no output)"
        if len(text) > MAX_TOOL_FAILURE_CHARS:
            text = text[: MAX_TOOL_FAILURE_CHARS - 3] + "..."
        details = message.get("details")
        code = details.get("exitCode") if isinstance(details, Mapping) else None
        label = str(message.get("toolName") or "tool")
        if code not in (None, 0):
            label += f" (exitCode={code})"
        lines.append(f"- {label}: {text}")
    if not lines:
        return ""
    shown = lines[:MAX_TOOL_FAILURES]
    if len(lines) > MAX_TOOL_FAILURES:
        shown.append(f"- ...and {len(lines) - MAX_TOOL_FAILURES} more")
    return "\n\n## Tool Failures\n" + "\n".join(shown)


def _fit_body(body: str, budget: int) -> str:
    if len(body) <= budget:
        return body
    budget -= len(TRUNCATED_MARKER)
    sections = parse_sections(body)
    while len(_join(sections)) > budget:
        index = max(range(len(sections)), key=lambda i: sum(len(x) for x in sections[i][1]))
        heading, lines = sections[index]
        if not lines:
            break
        if len(lines) == 1 and len(lines[0]) > 80:
            lines = [lines[0][: len(lines[0]) // 2] + "…"]
        else:
            lines = lines[:-1]
        sections[index] = (heading, lines)
    return _join(sections) + TRUNCATED_MARKER


def assemble_summary(
    body: str,
    *,
    register: Sequence[str],
    turn_prefix_summary: str | None,
    failures_section: str,
    read_files: list[str],
    modified_files: list[str],
    notes: Sequence[str] = (),
    max_chars: int = MAX_SUMMARY_CHARS,
) -> str:
    """The final text: body (register enforced, notes appended) + suffix, within `max_chars`."""
    body = enforce_register(body.strip(), register)
    if notes:
        body += "\n\n" + "\n".join(notes)
    suffix = ""
    if turn_prefix_summary:
        prefix = demote_headings(turn_prefix_summary.strip())[:MAX_SPLIT_TURN_CHARS]
        suffix += SPLIT_TURN_HEADER + prefix
    suffix += failures_section
    suffix += format_file_ops(read_files, modified_files)
    return _fit_body(body, max(1000, max_chars - len(suffix))) + suffix
