"""Which files the summarized history read and modified (spec §4.5).

The lists are appended to every summary and stored in `details`, cumulatively across
compactions, so the agent still knows what it touched after the messages themselves are gone.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

MAX_FILE_OPS_LIST_CHARS = 900

_PATH_KEYS = ("path", "file_path", "filePath")


def _tool_name(name: str) -> str:
    """Lower-case, and drop an MCP-style `server__` prefix (OpenClaw's normalisation)."""
    lowered = name.lower()
    if lowered.startswith("mcp__"):
        lowered = lowered[len("mcp__") :]
    if "__" in lowered:
        lowered = lowered.split("__", 1)[1]
    return lowered


@dataclass(slots=True)
class FileOps:
    read: set[str] = field(default_factory=set)
    written: set[str] = field(default_factory=set)
    edited: set[str] = field(default_factory=set)

    def add_messages(self, messages: Iterable[Mapping[str, Any]]) -> None:
        for message in messages:
            role = message.get("role")
            if role == "assistant":
                for block in message.get("content") or []:
                    if isinstance(block, Mapping) and block.get("type") == "toolCall":
                        self._add_call(str(block.get("name", "")), block.get("arguments"))
            elif role == "toolResult" and _tool_name(str(message.get("toolName", ""))) == (
                "apply_patch"
            ):
                details = message.get("details")
                summary = details.get("summary") if isinstance(details, Mapping) else None
                if isinstance(summary, Mapping):
                    self.written.update(str(p) for p in summary.get("added") or [])
                    self.edited.update(str(p) for p in summary.get("modified") or [])

    def _add_call(self, name: str, arguments: Any) -> None:
        if not isinstance(arguments, Mapping):
            return
        path = next((arguments[k] for k in _PATH_KEYS if isinstance(arguments.get(k), str)), None)
        if path is None:
            return
        tool = _tool_name(name)
        if tool == "read":
            self.read.add(path)
        elif tool == "write":
            self.written.add(path)
        elif tool == "edit":
            self.edited.add(path)

    def add_details(self, details: Any) -> None:
        """Merge a previous compaction's `details` (cumulative lists)."""
        if not isinstance(details, Mapping):
            return
        self.read.update(str(p) for p in details.get("readFiles") or [] if isinstance(p, str))
        self.edited.update(
            str(p) for p in details.get("modifiedFiles") or [] if isinstance(p, str)
        )

    @property
    def modified_files(self) -> list[str]:
        return sorted(self.written | self.edited)

    @property
    def read_files(self) -> list[str]:
        return sorted(self.read - self.written - self.edited)

    def details(self) -> dict[str, list[str]]:
        return {"readFiles": self.read_files, "modifiedFiles": self.modified_files}


def _capped_list(paths: list[str]) -> list[str]:
    out: list[str] = []
    used = 0
    for index, path in enumerate(paths):
        if used + len(path) + 1 > MAX_FILE_OPS_LIST_CHARS:
            out.append(f"...and {len(paths) - index} more")
            break
        out.append(path)
        used += len(path) + 1
    return out


def format_file_ops(read_files: list[str], modified_files: list[str]) -> str:
    """The `<read-files>` / `<modified-files>` suffix, each block only when non-empty.

    Each list is capped at 900 characters, which keeps the whole section near 2000.
    """
    text = ""
    if read_files:
        text += "\n\n<read-files>\n" + "\n".join(_capped_list(read_files)) + "\n</read-files>"
    if modified_files:
        text += (
            "\n\n<modified-files>\n" + "\n".join(_capped_list(modified_files))
            + "\n</modified-files>"
        )
    return text
