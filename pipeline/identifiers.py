"""Find the opaque literals a summary must carry over exactly, and check that it did.

Models paraphrase. That is fine for prose, but a commit hash, a UUID, a URL or a port that
comes back slightly wrong is worse than one that is left out, because the agent will use the
wrong value with confidence. The audit therefore pulls a bounded list of such literals out of
the summarized text (spec §6.3) and requires each one to appear in the summary. Extraction is
deliberately conservative: ordinary words must never qualify, or the audit would fail summaries
for rephrasing English.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

MAX_EXTRACTED_IDENTIFIERS = 12
MIN_IDENTIFIER_CHARS = 4

# Characters that may touch a literal in prose but are not part of it.
_LEADING_NOISE = "(\"'`[{<"
_TRAILING_NOISE = ")]\"'`,;:.!?<>"

# One alternation, scanned left to right, so matches never overlap and come out in text order.
# Where two kinds could start at the same place the earlier alternative wins: a URL swallows
# its own path and port, and host:port wins over a dotted number such as an IP address.
_IDENTIFIER_RE = re.compile(
    r"""
      https?://\S+                                      # URL, up to whitespace
    | (?<![A-Za-z0-9_])[A-Za-z]:\\[\w\\.-]+             # Windows drive path  C:\dir\file
    | (?<![\w.~/:-])/[\w.-]+(?:/[\w.-]+)+               # absolute POSIX path, >= 2 segments
    | (?<![\w.-])[A-Za-z0-9_-]+(?:\.[A-Za-z0-9_-]+)+:\d{1,5}(?!\d)   # host.name:port
    | (?<![\w.-])                                       # decimal / scientific number,
      (?:\d+(?:\.\d+)+(?:[eE][+-]?\d+)?                 #   3.14  10.0.0.1  6.02e23
        | \d+[eE][+-]?\d+                               #   1e-5  3E8
        | \.\d+(?:[eE][+-]?\d+)?)                       #   .5
      (?:%|[A-Za-zµ°]+(?!\w|\.\w))?                     #   optional unit: 3.5GB 2.5ms 99.9%
      (?![\w-]|\.\w)                                    #   a sentence's final dot may follow
    | (?<![\w-])                                        # token holding a long hex or digit run
      (?=[A-Za-z0-9_-]*?(?:[A-Fa-f0-9]{8}|\d{6}))
      [A-Za-z0-9_-]+
    """,
    re.VERBOSE,
)

_PURE_HEX_RE = re.compile(r"[A-Fa-f0-9]{8,}")


def is_pure_hex(value: str) -> bool:
    """True for values made only of hex digits, at least 8 long (hashes, short shas, ids).

    These are compared case-insensitively, because models and tools freely change the case of
    hex but the value stays the same.
    """
    return _PURE_HEX_RE.fullmatch(value) is not None


def _clean(raw: str) -> str:
    """Remove the punctuation prose wraps around a literal, and canonicalise hex case."""
    value = raw.strip().lstrip(_LEADING_NOISE).rstrip(_TRAILING_NOISE)
    return value.upper() if is_pure_hex(value) else value


def extract_identifiers(text: str, limit: int = MAX_EXTRACTED_IDENTIFIERS) -> list[str]:
    """List the opaque literals in `text`, in order of first appearance, at most `limit`.

    Kinds (spec §6.3, latest version): URLs; absolute POSIX paths with at least two segments;
    Windows drive paths; `host.name:port`; tokens of `[A-Za-z0-9_-]` holding a run of at least
    8 hex characters or 6 digits (hashes, UUIDs, long numeric ids); decimal or scientific numbers
    with an optional attached unit. Our one widening: a dotted number may have more than one
    dot, so versions (`3.11.4`) and IPv4 addresses are taken whole instead of being cut into
    pieces. Values shorter than 4 characters after cleaning are dropped, pure hex is upper-cased,
    and duplicates keep their first position.
    """
    if limit <= 0:
        return []
    found: list[str] = []
    seen: set[str] = set()
    for match in _IDENTIFIER_RE.finditer(text):
        value = _clean(match.group(0))
        if len(value) < MIN_IDENTIFIER_CHARS or value in seen:
            continue
        seen.add(value)
        found.append(value)
        if len(found) >= limit:
            break
    return found


def identifier_present(identifier: str, text: str) -> bool:
    """True when `identifier` appears in `text`: hex ignoring case, anything else exactly.

    An exact substring check is the point of the audit: a URL or path that differs by one
    character is a different URL or path.
    """
    if not identifier:
        return True
    if is_pure_hex(identifier):
        return identifier.casefold() in text.casefold()
    return identifier in text


def missing_identifiers(identifiers: Iterable[str], text: str) -> list[str]:
    """The identifiers (in the given order) that `text` does not contain."""
    return [ident for ident in identifiers if not identifier_present(ident, text)]
