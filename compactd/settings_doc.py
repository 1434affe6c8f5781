"""The configuration reference, generated from the settings model (README stays in sync).

`python -m compactd.settings_doc --write` rewrites the README section between the
`<!-- settings:start -->` / `<!-- settings:end -->` markers; a test fails when they differ.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from pydantic.fields import FieldInfo

from compactd.settings import CompactdSettings

README = Path(__file__).resolve().parents[1] / "README.md"
START, END = "<!-- settings:start -->", "<!-- settings:end -->"


def _default(field: FieldInfo) -> str:
    if field.default_factory is not None:
        value: Any = field.default_factory()  # type: ignore[call-arg]
        if isinstance(value, BaseModel):
            return "(section)"
    else:
        value = field.default
    if value is None:
        return "unset"
    return f"`{json.dumps(value) if not isinstance(value, str) else value}`"


def _rows(model: type[BaseModel], prefix: str = "") -> list[str]:
    rows: list[str] = []
    for name, field in model.model_fields.items():
        annotation = field.annotation
        dotted = f"{prefix}{name}"
        env = "COMPACTD_" + dotted.replace(".", "__").upper()
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            rows += _rows(annotation, dotted + ".")
            continue
        description = (field.description or "").replace("|", "\\|")
        rows.append(f"| `{dotted}` | `{env}` | {_default(field)} | {description} |")
    return rows


def render() -> str:
    lines = ["| setting | environment | default | meaning |", "|---|---|---|---|",
             *_rows(CompactdSettings)]
    return "\n".join(lines)


def update_readme(text: str) -> str:
    block = f"{START}\n{render()}\n{END}"
    pattern = re.compile(re.escape(START) + ".*?" + re.escape(END), re.DOTALL)
    return pattern.sub(lambda _: block, text)


if __name__ == "__main__":
    if "--write" in sys.argv:
        README.write_text(update_readme(README.read_text()))
    else:
        print(render())
