"""Typed errors for bad transcripts.

One exception type with a machine-readable `code` and the 1-based `line` it concerns, so the CLI
(exit code 2), a job record and the API (422) can all say exactly what was wrong and where.
"""

from __future__ import annotations

from typing import Literal

TranscriptErrorCode = Literal[
    "empty_file",
    "invalid_utf8",
    "line_too_long",
    "not_json",
    "not_an_object",
    "no_header",
    "invalid_header",
    "unsupported_version",
    "invalid_entry",
    "duplicate_id",
    "dangling_parent",
    "parent_cycle",
    "unknown_leaf",
]


class TranscriptError(ValueError):
    """A transcript that cannot be read safely. Nothing is written when this is raised."""

    def __init__(self, code: TranscriptErrorCode, detail: str, line: int | None = None) -> None:
        self.code = code
        self.detail = detail
        self.line = line
        where = f"line {line}: " if line is not None else ""
        super().__init__(f"{where}{code}: {detail}")

    def to_dict(self) -> dict[str, object]:
        return {"code": self.code, "line": self.line, "detail": self.detail}
