"""The quality audit, run on the exact bytes that would be committed. It fails closed.

A summary passes only when every required heading appears once and in order, the identifiers
extracted from the last messages are present (strict policy), the latest user ask is
reflected, every pending ask is grounded in a real user message, and every standing rule of
the register is there verbatim. Failures are reason codes, fed back to the model on retry.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from pipeline.asks import ask_grounded, ask_reflected, pending_ask_lines
from pipeline.constraints import constraint_key, constraints_from_summary
from pipeline.identifiers import missing_identifiers
from pipeline.sections import REQUIRED_HEADINGS

MAX_IDENTIFIER_REASON_CHARS = 3400


@dataclass(frozen=True, slots=True)
class AuditContext:
    """What a summary of this compaction must contain."""

    identifiers: tuple[str, ...] = ()
    latest_ask: str | None = None
    user_texts: tuple[str, ...] = ()
    constraints: tuple[str, ...] = ()
    strict_identifiers: bool = True


@dataclass(frozen=True, slots=True)
class AuditResult:
    passed: bool
    failures: tuple[str, ...] = field(default=())

    def to_dict(self) -> dict[str, object]:
        return {"passed": self.passed, "failures": list(self.failures)}


def _heading_failures(summary: str) -> list[str]:
    lines = [line.strip() for line in summary.splitlines()]
    failures: list[str] = []
    positions: list[int] = []
    for heading in REQUIRED_HEADINGS:
        found = [i for i, line in enumerate(lines) if line == heading]
        if not found:
            failures.append(f"missing_section:{heading}")
        elif len(found) > 1:
            failures.append(f"duplicate_section:{heading}")
        else:
            positions.append(found[0])
    if not failures and positions != sorted(positions):
        failures.append("sections_out_of_order")
    return failures


def _identifier_failures(missing: Sequence[str]) -> list[str]:
    if not missing:
        return []
    named: list[str] = []
    used = 0
    for value in missing:
        if used + len(value) + 1 > MAX_IDENTIFIER_REASON_CHARS:
            break
        named.append(value)
        used += len(value) + 1
    failures = [f"missing_identifiers:{','.join(named)}"]
    if len(named) < len(missing):
        failures.append(f"missing_identifiers_omitted:{len(missing) - len(named)}")
    return failures


def audit_summary(summary: str, ctx: AuditContext) -> AuditResult:
    failures = _heading_failures(summary)
    if ctx.strict_identifiers:
        failures += _identifier_failures(missing_identifiers(ctx.identifiers, summary))
    if ctx.latest_ask and not ask_reflected(ctx.latest_ask, summary):
        failures.append("latest_user_ask_not_reflected")
    invented = [line for line in pending_ask_lines(summary)
                if not ask_grounded(line, ctx.user_texts)]
    if invented:
        failures.append(f"pending_ask_not_grounded:{len(invented)}")
    if ctx.constraints:
        present = {constraint_key(item) for item in constraints_from_summary(summary)}
        lost = [rule for rule in ctx.constraints if constraint_key(rule) not in present]
        if lost:
            failures.append(f"constraints_missing:{len(lost)}")
    return AuditResult(not failures, tuple(failures))
