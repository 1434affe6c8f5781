"""Keyword overlap between user asks and a summary: is the ask reflected, is a listed ask real?

The worst thing a compaction can do to a live session is forget what the user just asked for,
or invent a request nobody made (the agent would then act on it). Both are checked with the
same cheap, deterministic tool: reduce a text to its meaningful keywords and count how many
appear on the other side (spec §6.4).

The upstream keyword extractor's stop-word list is not available to us, so the list below is
our own: common English function words, pronouns, auxiliaries and politeness fillers, i.e.
words that appear in almost any request and therefore prove nothing about a specific one.
"""

from __future__ import annotations

import json
import re
import unicodedata
from collections.abc import Iterable, Sequence


def _wordset(words: str) -> frozenset[str]:
    """A set of whitespace-separated words: keeps long word lists readable in the source."""
    return frozenset(words.split())


MAX_ASK_OVERLAP_TOKENS = 12
MIN_TOKENS_FOR_DOUBLE_MATCH = 3
PENDING_ASKS_HEADING = "## Pending user asks"
LATEST_ASK_PREFIX = "Latest user request context:"

# Our own list (see module docstring). Contractions appear split, because the tokenizer
# splits "don't" into "don" and "t".
STOP_WORDS: frozenset[str] = _wordset(
    """
    a about above after again against all also am an and any anything are aren as at be
    because been before being below between both but by can cannot could couldn d did didn do
    does doesn doing don down during each either else etc even ever every few for from further
    get gets getting got had hadn has hasn have haven having he hello her here hers herself hey
    hi him himself his how i if in into is isn it its itself just kindly let lets like ll m may
    me might more most much must mustn my myself need no nor not now o of off ok okay on once
    one only or other our ours ourselves out over own per please pls re really s same shall
    shan she should shouldn so some something still such sure t than thank thanks that the
    their theirs them themselves then there these they thing things this those though through
    thus to too under until up upon us ve very via want wanted was wasn we were weren what when
    where whether which while who whom whose why will with within without won would wouldn y
    yeah yes yet you your yours yourself yourselves
    """
)

# Words that describe a pending ask rather than its content ("User asked to ..."). They are
# ignored when grounding a summary line, or every line mentioning "the user" would match any
# user message that happens to say "user".
_ASK_META_WORDS: frozenset[str] = _wordset(
    """
    user users asked asks ask asking wants wanted request requested requests requesting
    pending latest context still outstanding open unresolved todo follow followup item
    """
)

# Lines under "## Pending user asks" that say "nothing here" rather than state an ask.
_PLACEHOLDER_RE = re.compile(
    r"""^\(?\s*(?:
        none(?:\s+(?:captured|recorded|identified|so\s+far|yet|at\s+this\s+time))?
      | nothing(?:\s+(?:pending|outstanding|open))?
      | n/?a
      | no\s+(?:pending|open|outstanding|unresolved)?\s*(?:user\s+)?(?:asks?|requests?)
        (?:\s+(?:pending|outstanding|remain(?:ing)?))?
    )\s*\)?\s*[.!]?$""",
    re.IGNORECASE | re.VERBOSE,
)
_LIST_MARKER_RE = re.compile(r"^\s*(?:[-*+•]|\d{1,3}[.)])\s+")
_TOKEN_RE = re.compile(r"[^\W_]+")
_QUOTED_SPAN_RE = re.compile(r"\"([^\"]+)\"|“([^”]+)”|'([^']{2,})'|`([^`]+)`|‘([^’]+)’")
_MIN_QUOTE_CHARS = 8


def _normalize(text: str) -> str:
    """NFKC then case-fold, so full-width letters, ligatures and case never block a match."""
    return unicodedata.normalize("NFKC", text).casefold()


def raw_tokens(text: str) -> list[str]:
    """Every run of letters or digits in the normalized text, in order (duplicates kept)."""
    return _TOKEN_RE.findall(_normalize(text))


def _unique(items: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(items))


def _is_keyword(token: str) -> bool:
    return len(token) > 1 and token not in STOP_WORDS


def ask_tokens(text: str) -> list[str]:
    """The tokens an ask is judged by: unique keywords in order, at most 12.

    Stop words and one-character tokens are dropped only when something remains, so an ask
    made entirely of common words ("do it now") is still checked on those words rather than
    passing vacuously.
    """
    unique = _unique(raw_tokens(text))
    keywords = [token for token in unique if _is_keyword(token)]
    return (keywords or unique)[:MAX_ASK_OVERLAP_TOKENS]


def required_matches(token_count: int) -> int:
    """2 matches once an ask has 3+ keywords (one shared word is too easy), else 1."""
    return 2 if token_count >= MIN_TOKENS_FOR_DOUBLE_MATCH else 1


def _overlaps(tokens: Sequence[str], other_text: str) -> bool:
    if not tokens:
        return True
    # The other side keeps all raw tokens, stop words included: a match is a match.
    other = set(raw_tokens(other_text))
    hits = sum(1 for token in tokens if token in other)
    return hits >= required_matches(len(tokens))


def ask_reflected(ask: str, summary: str) -> bool:
    """True when the summary shares enough keywords with the latest user ask.

    An ask with no tokens at all (empty, or only punctuation/emoji) passes: there is nothing
    the summary could be checked against.
    """
    return _overlaps(ask_tokens(ask), summary)


def _strip_list_marker(line: str) -> str:
    return _LIST_MARKER_RE.sub("", line, count=1).strip()


def is_placeholder_line(line: str) -> bool:
    """True for "None.", "(none)", "No pending asks" and the like: not an ask at all."""
    body = _strip_list_marker(line).strip("*_ ")
    return not body or _PLACEHOLDER_RE.match(body) is not None


def _unwrap_latest_ask(body: str) -> str:
    """`Latest user request context: "<JSON string>"` → the decoded request text."""
    if not body.startswith(LATEST_ASK_PREFIX):
        return body
    rest = body[len(LATEST_ASK_PREFIX) :].strip()
    try:
        decoded = json.loads(rest)
    except ValueError:
        return rest
    return decoded if isinstance(decoded, str) else rest


def _squash(text: str) -> str:
    return " ".join(_normalize(text).split())


def _quotes_user(body: str, users: Sequence[str]) -> bool:
    """True when the line reproduces user text: a quoted span, the whole line, or a message."""
    spans = [
        next(group for group in match.groups() if group is not None)
        for match in _QUOTED_SPAN_RE.finditer(body)
    ]
    candidates = [_squash(span) for span in spans] + [_squash(body)]
    for user in users:
        if not user:
            continue
        if len(user) >= _MIN_QUOTE_CHARS and user in _squash(body):
            return True
        if any(len(c) >= _MIN_QUOTE_CHARS and c in user for c in candidates):
            return True
    return False


def ask_grounded(ask_line: str, user_texts: Sequence[str]) -> bool:
    """True when a line listed under "## Pending user asks" is backed by a real user message.

    This rule is ours (upstream has no equivalent). A line is grounded when either
      * it quotes a user message: a quoted span of the line (or the whole line, or a whole user
        message inside the line) of at least 8 characters occurs in a user message, compared
        after NFKC, case-folding and whitespace collapsing; or
      * its keywords overlap ONE user message by the latest-ask rule run in reverse: the line's
        keywords (minus words that merely describe an ask, like "user asked") must be found in
        that message, 2 of them when the line has 3 or more, else 1.
    Keywords spread over several messages do not count: an invented ask stitched together from
    vocabulary of the whole conversation is exactly what this check exists to catch.
    Placeholder lines ("None.", "(none)", "No pending asks") are not asks and pass. The
    foregrounded `Latest user request context: "<JSON>"` line is judged on its decoded text.
    """
    if is_placeholder_line(ask_line):
        return True
    body = _unwrap_latest_ask(_strip_list_marker(ask_line))
    users = [_squash(text) for text in user_texts]
    if _quotes_user(body, users):
        return True
    tokens = ask_tokens(body)
    content = [token for token in tokens if token not in _ASK_META_WORDS]
    tokens = content or tokens
    if not tokens:
        return True
    return any(_overlaps(tokens, text) for text in user_texts)


def pending_ask_lines(summary: str) -> list[str]:
    """The non-empty, non-placeholder lines under `## Pending user asks`, list markers kept.

    The section ends at the next `## ` heading. Returns [] when the heading is absent.
    """
    lines = summary.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    collected: list[str] = []
    inside = False
    for line in lines:
        stripped = line.strip()
        if stripped == PENDING_ASKS_HEADING:
            inside = True
            continue
        if inside and stripped.startswith("## "):
            break
        if inside and stripped and not is_placeholder_line(stripped):
            collected.append(stripped)
    return collected
