"""The summary format: the five audited headings, in order, and helpers to read sections.

Every summary we commit has `## Decisions`, `## Open TODOs`, `## Constraints/Rules`,
`## Pending user asks` and `## Exact identifiers` exactly once and in this order (optional
`## Goal` and `## Progress` before them, `## Next Steps` after). Fixed headings are what let
the audit check a summary mechanically and let the next compaction re-read the previous one.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

DECISIONS = "## Decisions"
OPEN_TODOS = "## Open TODOs"
CONSTRAINTS = "## Constraints/Rules"
PENDING_ASKS = "## Pending user asks"
IDENTIFIERS = "## Exact identifiers"
REQUIRED_HEADINGS: tuple[str, ...] = (DECISIONS, OPEN_TODOS, CONSTRAINTS, PENDING_ASKS,
                                      IDENTIFIERS)
GOAL = "## Goal"
PROGRESS = "## Progress"
NEXT_STEPS = "## Next Steps"
SECTION_ORDER: tuple[str, ...] = (GOAL, PROGRESS, *REQUIRED_HEADINGS, NEXT_STEPS)
EMPTY_ITEM = "None."

_BULLET = re.compile(r"^\s*(?:[-*+•]|\d{1,3}[.)]|\[[ xX]\])\s+")
_PLACEHOLDER = re.compile(r"^\(?(none|n/a|nothing|no prior history|none captured)\.?\)?$",
                          re.IGNORECASE)


def parse_sections(text: str) -> list[tuple[str | None, list[str]]]:
    """Split markdown into (heading, body lines) at `## ` headings; preamble has heading None."""
    sections: list[tuple[str | None, list[str]]] = [(None, [])]
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("## ") and not stripped.startswith("### "):
            sections.append((stripped, []))
        else:
            sections[-1][1].append(line)
    return sections


def section_body(text: str, heading: str) -> list[str]:
    """Body lines of the first section with this heading (empty when absent)."""
    for name, lines in parse_sections(text):
        if name == heading:
            return lines
    return []


def is_placeholder(item: str) -> bool:
    return bool(_PLACEHOLDER.match(item.strip()))


def section_items(text: str, heading: str) -> list[str]:
    """Non-empty items of a section with their list markers removed, placeholders dropped."""
    items: list[str] = []
    for line in section_body(text, heading):
        item = _BULLET.sub("", line).strip()
        if item and not is_placeholder(item) and not item.startswith("###"):
            items.append(item)
    return items


def bullet(items: Sequence[str]) -> list[str]:
    return [f"- {item}" for item in items] if items else [EMPTY_ITEM]


def render_sections(sections: Mapping[str, Sequence[str]]) -> str:
    """Render sections in canonical order; required sections always appear."""
    parts: list[str] = []
    for heading in SECTION_ORDER:
        if heading in sections or heading in REQUIRED_HEADINGS:
            lines = list(sections.get(heading) or [EMPTY_ITEM])
            parts.append(heading + "\n" + "\n".join(lines))
    return "\n\n".join(parts)
