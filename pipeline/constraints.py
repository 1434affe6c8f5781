"""The constraint register: standing user rules, carried verbatim across every compaction.

A summarizer asked to condense a long session keeps what happened and tends to drop what must
not happen: "don't touch the database" said two hundred turns ago rarely survives a second
compaction. So we do not leave rules to the model. We pull them out of the user's own messages
with a deterministic extractor, merge them with the rules the previous summary carried, and the
assembler writes them under `## Constraints/Rules` whatever the model produced.

Extraction favours precision. A false rule sits in every later summary and steers the agent;
a missed one is the status quo. The heuristic, applied per sentence of user prose:

1. Prose only. Fenced code blocks, `>` quotes, indented code and lines that look like pasted
   tool output (tracebacks, `SomethingError:` lines, log levels, shell prompts, timestamps) are
   skipped, and inline code, URLs and paths are masked so a keyword inside them is not seen.
2. No questions. A sentence ending in `?` is a question. So is one opening with an interrogative
   ("what", "should", "is", "do we", ...) whose first trigger comes before any comma, unless it
   is a polite request ("could you please never ...").
3. The keyword must act as a directive, which depends on where it stands in its clause (a
   clause starts at the sentence start or after `, ; : ( —` or ". "; fillers such as
   "please", "and", "also", "ok" before it are ignored):
   * anywhere: "from now on", "henceforth", "under no circumstances", "as a rule", rule
     statements ("Rule: ...", "Rule of thumb: ...", "the rule is: / that / to ...", "make it a
     rule"), "X is not allowed / forbidden" with a non-narrative subject;
   * clause-initial, i.e. imperative: "don't" / "do not", "make sure", "be sure", "ensure",
     "avoid", "remember to", "stop <verb>ing", "only", "never", "always", "must"; also
     "<verb> only ..." and "<verb> ... only." for common imperative verbs ("use only X",
     "use pnpm only.");
   * addressed to the agent or team: "you/we/everyone + modal" ("you must not ...", "you
     should only ..."), "I'd like / I need you to ...", and, without a modal, group subjects
     only ("we never deploy on Fridays"; "you never listen" is a complaint, not a rule);
   * after any short subject that is not a narrative pronoun, with a modal: "commits should
     never ...", "the API must stay ..." (but not "I must", "it should never", "this must be");
   * after "and/but/then/or" when the sentence itself starts imperatively: "run the tests and
     never push to main" (not "we tried and never got it working").
4. One-off look-alikes are rejected: "only" followed by a number or quantifier ("only 3 tests
   failed"), "never mind", "don't worry", "don't you think", "always the same", epistemic
   "must" ("it must be the cache", "must have been"), task "must" ("we must fix the login
   bug"), "stop" not followed by a verb in -ing, predictions ("from now on it will be
   faster"), and sentences with no content beyond the keywords ("Always.", "Never again.").

The sentence that carries the rule is kept verbatim: list markers removed, whitespace collapsed,
at most 300 characters (longer ones are cut at a word boundary and end with "…").
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable, Sequence

CONSTRAINTS_HEADING = "## Constraints/Rules"
MAX_CONSTRAINT_CHARS = 300
MAX_SENTENCE_CHARS = 2000
DEFAULT_REGISTER_LIMIT = 40
DEFAULT_REGISTER_CHARS = 4000


def _wordset(words: str) -> frozenset[str]:
    """A set of whitespace-separated words: keeps long word lists readable in the source."""
    return frozenset(words.split())


# ---------------------------------------------------------------------------------------------
# Word lists (all lower-case, apostrophes as ASCII ')
# ---------------------------------------------------------------------------------------------

_FILLERS = _wordset(
    """
    please pls plz kindly and but so also then just ok okay oh hey again seriously really
    absolutely definitely important note reminder remember btw ps thanks honestly generally
    basically or plus anyway now yes yeah alright right fyi
    """
)
_ADDRESSEES = _wordset("you we u ya yall y'all everyone everybody nobody one")
_GROUP_ADDRESSEES = _wordset("we everyone everybody nobody one")
_WISH_VERBS = _wordset("like want need prefer expect ask asking")
_MODAL_WORDS = _wordset("should must shall gotta")
_MODAL_PAIRS = frozenset({("need", "to"), ("have", "to"), ("has", "to"), ("got", "to")})
# Subjects that make a sentence narrative or speculative rather than a rule for the agent.
_NARRATIVE_SUBJECTS = _wordset(
    """
    i i'm i've i'd i'll me my mine it it's its he he's she she's they they're their this that
    that's these those there there's what which who his her him them
    """
)
# A sentence starting with one of these cannot be a coordinated imperative ("we tried and ...").
_NON_IMPERATIVE_STARTS = _NARRATIVE_SUBJECTS | _wordset(
    "we we've we're you you're your our the a an some all everything nothing something"
)
_INTERROGATIVES = _wordset(
    """
    what why how who whom whose which where when is are am was were can could would will shall
    should does did have has isn't aren't doesn't didn't won't wouldn't shouldn't can't
    couldn't haven't hasn't
    """
)
_REQUEST_RE = re.compile(r"^(?:can|could|would|will)\s+(?:you|u)\s+(?:please|pls|plz|kindly)\b")
_REQUEST_VERBS = _wordset("can could would will")
_CONJUNCTIONS = _wordset("and but or then so plus")
_NUMBER_WORDS = _wordset(
    """
    one two three four five six seven eight nine ten eleven twelve twenty thirty fifty hundred
    a half about around like partly partially once twice now recently yesterday today just
    slightly marginally barely
    """
)
# Verbs that, directly followed by "only", make an imperative ("use only the staging bucket").
_VERBS_BEFORE_ONLY = _wordset(
    """
    use edit touch modify change run deploy read write push commit call install import test
    answer reply respond output return print show fetch query target work talk speak keep
    """
)
# "we must fix the login bug" is a task for today, not a standing rule.
_TASK_VERBS = _wordset(
    "fix finish complete implement ship solve debug investigate resolve figure find get hurry"
)
# Words that carry no rule content on their own: a sentence made only of these ("Always.",
# "Never again.", "Do not") states nothing to keep.
_NON_CONTENT = (
    _wordset(
        "never always don't dont do not must mustn't only make sure remember to stop avoid "
        "ensure be should shouldn't ever again"
    )
    | _FILLERS
)
_NOT_AFTER_DONT = _wordset("you we they i it worry mind know think care get")

# ---------------------------------------------------------------------------------------------
# Regular expressions
# ---------------------------------------------------------------------------------------------

_FENCE_RE = re.compile(r"^\s*(```|~~~)")
_LOG_LINE_RE = re.compile(
    r"""^\s*(?:
        \$\s | >>>\s | \.\.\.\s
      | Traceback\s\(most\srecent
      | File\s"
      | at\s[\w.$<>]+\(
      | [A-Z]?\w*(?:Error|Exception):
      | \[?(?:ERROR|WARN|WARNING|INFO|DEBUG|TRACE|FATAL|CRITICAL)\]?[:\s]
      | \d{4}-\d{2}-\d{2}[T\s]\d{2}:\d{2}
      | E\s{2,}
    )""",
    re.VERBOSE,
)
_LIST_MARKER_RE = re.compile(r"^(?:[-*+•]|\d{1,3}[.)]|#{1,6})\s+")
_INDENTED_CODE_RE = re.compile(r"^(?: {4,}|\t)")
# Tokens are matched from their first character only (the look-behind), which keeps this linear
# on long unbroken input.
_MASK_RE = re.compile(r"`[^`]*`|(?<!\S)[^\s/\\=]*[/\\=]\S*")
_ABBREVIATION_RE = re.compile(
    r"(?:^|\s)(?:e\.g|i\.e|etc|vs|cf|incl|approx|mr|mrs|ms|dr)\.$", re.IGNORECASE
)
_SENTENCE_END_RE = re.compile(r"[.!?]+[\"')\]]*\s+")
_CLAUSE_BOUNDARY_RE = re.compile(r"[,;:(\[—–]|\.\s|\s-\s")
_WORD_RE = re.compile(r"[a-z0-9']+")

_TRIGGER_RE = re.compile(
    r"""\b(?:
        (?P<anywhere>from\snow\son|henceforth|from\shere\son(?:\sout)?|under\sno\scircumstances
            |as\sa\s(?:general\s)?rule)
      | (?P<forward>going\sforward|moving\sforward)
      | (?P<dont>don'?t|do\snot)
      | (?P<initial>make\ssure|be\ssure|ensure|avoid|remember\sto)
      | (?P<stop>stop)
      | (?P<only>only)
      | (?P<adverb>never|always)
      | (?P<must>must(?:n'?t|\snot)?|should(?:n'?t|\snot)|shall\snot)
    )\b""",
    re.VERBOSE,
)
_RULE_STATEMENT_RE = re.compile(
    r"""(?:^|[\s(*_])(?:
        (?:(?:new|house|golden|hard|strict|general|important|key|one|my|our|the|a)\s+)?
            rules?\s*(?:\#?\d+\s*)?(?::|—|–|\s-\s)\s*\S
      | rules?\s+of\s+thumb\s*(?::|—|–|\s-\s|,)
      | (?:the|one|my|our|a|house|new|golden|hard)\s+rules?\s+(?:is|are)\s*(?::|that\b|to\b|["'“])
      | (?:make|made|making)\s+(?:it\s+|this\s+|that\s+)?a\s+rule\b
      | (?:it's|it\s+is)\s+a\s+(?:\w+\s+)?rule\s+(?:that|to)\b
    )""",
    re.VERBOSE,
)
_FORBIDDEN_RE = re.compile(
    r"\b(?:is|are|isn't|aren't)\s+(?:not\s+|never\s+)?(?:allowed|permitted|forbidden|prohibited)\b"
    r"|\bnot\s+(?:allowed|permitted)\s+to\b"
)
_EPISTEMIC_MUST_RE = re.compile(
    r"^(?:'ve\b|\s+have\s+(?:been|\w+ed|\w+en)\b|\s+be\s+(?:a|an|the|some|because|why|that|it|"
    r"joking|kidding|nice|tired|wrong|broken|missing|somewhere|related|caused|fine)\b)"
)
_PLACEHOLDER_RE = re.compile(
    r"""^\(?\s*(?:
        none | n/?a | nothing | -
      | no\s+(?:standing\s+|explicit\s+|user\s+)?(?:constraints?|rules?)(?:\s*/\s*rules?)?
    )(?:\s+(?:captured|recorded|stated|specified|identified|yet|so\s+far|given))?
    \s*\)?\s*[.!]?$""",
    re.IGNORECASE | re.VERBOSE,
)
_SUMMARY_BULLET_RE = re.compile(r"^\s*(?:[-*+•]|\d{1,3}[.)])\s+(.*)$")


# ---------------------------------------------------------------------------------------------
# Prose selection and sentence splitting
# ---------------------------------------------------------------------------------------------


def _prose_lines(text: str) -> list[str]:
    """The lines of a user message that are the user's own prose, soft wraps re-joined.

    A line that does not end a sentence, followed by a line starting in lower case, is one
    sentence hard-wrapped; otherwise each line stands alone (chat users end thoughts with a
    newline more often than with a full stop).
    """
    lines: list[str] = []
    in_fence = False
    previous_blank = True
    for raw in text.replace("\r\n", "\n").replace("\r", "\n").split("\n"):
        if _FENCE_RE.match(raw):
            in_fence = not in_fence
            previous_blank = True
            continue
        if in_fence:
            continue
        stripped = raw.strip()
        if not stripped:
            previous_blank = True
            continue
        is_list_item = _LIST_MARKER_RE.match(stripped) is not None
        if (
            stripped.startswith(">")
            or (_INDENTED_CODE_RE.match(raw) and not is_list_item)
            or _LOG_LINE_RE.match(raw)
        ):
            previous_blank = True
            continue
        body = _LIST_MARKER_RE.sub("", stripped, count=1)
        if (
            lines
            and not previous_blank
            and not is_list_item
            and body[:1].islower()
            and not lines[-1].rstrip().endswith((".", "!", "?", ":", ";"))
        ):
            lines[-1] = f"{lines[-1]} {body}"
        else:
            lines.append(body)
        previous_blank = False
    return lines


def _sentences(line: str) -> list[str]:
    """Split a prose line after `.`, `!` or `?` followed by whitespace, sparing abbreviations."""
    parts: list[str] = []
    start = 0
    for match in _SENTENCE_END_RE.finditer(line):
        candidate = line[start : match.end()].rstrip()
        # Only the tail can hold the abbreviation; looking at 9 characters keeps this linear.
        if _ABBREVIATION_RE.search(candidate[-9:]):
            continue
        parts.append(candidate)
        start = match.end()
    parts.append(line[start:].strip())
    return [" ".join(part.split()) for part in parts if part.strip()]


# ---------------------------------------------------------------------------------------------
# The directive test
# ---------------------------------------------------------------------------------------------


def _fold(text: str) -> str:
    """Lower-case with ASCII apostrophes; every position used later refers to this form."""
    return text.lower().replace("’", "'").replace("‘", "'")


def _mask(folded: str) -> str:
    """Blank out inline code, URLs and paths so keywords inside them are not seen."""
    return _MASK_RE.sub(lambda m: " " * len(m.group(0)), folded)


def _clause_prefix_words(masked: str, position: int) -> list[str]:
    """Words between the start of the trigger's clause and the trigger, leading fillers dropped."""
    clause_start = 0
    for boundary in _CLAUSE_BOUNDARY_RE.finditer(masked, 0, position):
        clause_start = boundary.end()
    words = _WORD_RE.findall(masked[clause_start:position])
    while words and words[0] in _FILLERS:
        words.pop(0)
    # A polite request addresses the agent directly: "could you (please) never ...".
    if len(words) >= 2 and words[0] in _REQUEST_VERBS and words[1] in ("you", "u"):
        words = words[2:]
        while words and words[0] in _FILLERS:
            words.pop(0)
    return words


def _first_word(masked: str) -> str:
    words = [w for w in _WORD_RE.findall(masked) if w not in _FILLERS]
    return words[0] if words else ""


def _split_modal(words: list[str]) -> tuple[list[str], bool]:
    """Remove a trailing modal ("should", "need to", ...) from `words`; report if there was one."""
    if words and words[-1] in _MODAL_WORDS:
        return words[:-1], True
    if len(words) >= 2 and (words[-2], words[-1]) in _MODAL_PAIRS:
        return words[:-2], True
    return words, False


def _addressee_with_modal(words: list[str], need_modal: bool) -> bool:
    """An addressee, usually with a modal ("you should", "we must"): a rule for the agent/team.

    Without a modal only group subjects count: "we never deploy on Fridays" states a team
    convention, while "you never listen" is a complaint, not a rule.
    """
    if len(words) >= 3 and words[-2:] == ["you", "to"] and words[-3] in _WISH_VERBS:
        return True  # "I'd like you to always ...", "I need you to never ..."
    subject, has_modal = _split_modal(words)
    if len(subject) != 1 or subject[0] not in _ADDRESSEES:
        return False
    return has_modal or (not need_modal and subject[0] in _GROUP_ADDRESSEES)


def _subject_with_modal(words: list[str], allow_bare: bool) -> bool:
    """A short non-narrative subject, then a modal: "commits should", "the API must"."""
    subject, has_modal = _split_modal(words)
    if not (has_modal or allow_bare) or not subject or len(subject) > 6:
        return False
    return subject[0] not in _NARRATIVE_SUBJECTS and not (set(subject) & _CONJUNCTIONS)


def _coordinated_imperative(words: list[str], masked: str) -> bool:
    """A conjunction right before the keyword, in a sentence that opens imperatively.

    Catches "run the tests and never push", not "we tried and never got it working".
    """
    return (
        bool(words)
        and words[-1] in _CONJUNCTIONS
        and (_first_word(masked) not in _NON_IMPERATIVE_STARTS)
    )


def _next_word(masked: str, end: int) -> str:
    match = _WORD_RE.search(masked, end)
    return match.group(0) if match else ""


def _is_question(sentence: str, masked: str) -> bool:
    if sentence.rstrip(" \"')]*_").endswith("?"):
        return True
    first = _first_word(masked)
    if first not in _INTERROGATIVES and not re.match(r"^\W*do\s+(?:you|we|i|they|it)\b", masked):
        return False
    if _REQUEST_RE.match(masked.lstrip(" *_\"'(")):
        return False
    first_trigger = _TRIGGER_RE.search(masked)
    first_comma = _CLAUSE_BOUNDARY_RE.search(masked)
    # "When deploying, always ...": the trigger lives in a clause after the opening one.
    return not (first_trigger and first_comma and first_comma.start() < first_trigger.start())


def _trigger_is_directive(kind: str, trigger: str, words: list[str], masked: str, end: int) -> bool:
    """Whether one keyword occurrence acts as a standing directive (rule 3 and 4 above)."""
    initial = not words
    coordinated = _coordinated_imperative(words, masked)
    following = masked[end:]
    next_word = _next_word(masked, end)

    if kind == "anywhere":
        # "From now on it will be faster" predicts; it does not instruct.
        return (
            re.match(r"^\W*(?:it|things|everything|this|that|there)\s+(?:will|'ll)\b", following)
            is None
        )
    if kind == "forward":
        return initial or re.match(r"^\s*(?:[.,;!]|$)", following) is not None
    if kind == "dont":
        return (initial or coordinated) and next_word not in _NOT_AFTER_DONT
    if kind == "initial":
        return initial or coordinated or _addressee_with_modal(words, need_modal=True)
    if kind == "stop":
        return (initial or coordinated or _addressee_with_modal(words, need_modal=True)) and (
            next_word.endswith("ing") and len(next_word) > 4
        )
    if kind == "only":
        if next_word.isdigit() or next_word in _NUMBER_WORDS:
            return False
        return (
            initial
            or coordinated
            or _addressee_with_modal(words, need_modal=True)
            or _subject_with_modal(words, allow_bare=False)
            or (len(words) == 1 and words[0] in _VERBS_BEFORE_ONLY)
            # "Use pnpm only." — an imperative clause closed by "only".
            or (
                bool(words)
                and words[0] in _VERBS_BEFORE_ONLY
                and re.match(r"^\s*(?:[.,;!)]|$)", following) is not None
            )
        )
    if kind == "adverb":
        if next_word == "mind" or (
            trigger == "always"
            and next_word in {"the", "a", "an", "same", "been", "was", "is", "were"}
        ):
            return False
        return (
            initial
            or coordinated
            or _addressee_with_modal(words, need_modal=False)
            or _subject_with_modal(words, allow_bare=False)
        )
    if kind == "must":
        if _EPISTEMIC_MUST_RE.match(following):
            return False
        if trigger == "must" and next_word in _TASK_VERBS:
            return False
        return (
            initial
            or coordinated
            or _addressee_with_modal(words, need_modal=False)
            or _subject_with_modal(words, allow_bare=True)
        )
    return False


def is_standing_rule(sentence: str) -> bool:
    """True when one prose sentence states a standing rule (the heuristic in the module doc).

    A "sentence" over `MAX_SENTENCE_CHARS` is pasted material (a log, a blob), not a rule, and
    is rejected without analysis, which also bounds the cost on hostile input.
    """
    if len(sentence) > MAX_SENTENCE_CHARS:
        return False
    folded = _fold(sentence)
    masked = _mask(folded)
    if not masked.strip() or _is_question(sentence, masked):
        return False
    if all(word in _NON_CONTENT for word in _WORD_RE.findall(masked)):
        return False
    if _RULE_STATEMENT_RE.search(masked) and "rule out" not in masked:
        return True
    forbidden = _FORBIDDEN_RE.search(masked)
    if forbidden and _subject_with_modal(
        _clause_prefix_words(masked, forbidden.start()), allow_bare=True
    ):
        return True
    for match in _TRIGGER_RE.finditer(masked):
        kind = match.lastgroup or ""
        words = _clause_prefix_words(masked, match.start())
        if _trigger_is_directive(kind, match.group(0), words, masked, match.end()):
            return True
    return False


# ---------------------------------------------------------------------------------------------
# Public API
# ---------------------------------------------------------------------------------------------


def _cap(text: str, limit: int = MAX_CONSTRAINT_CHARS) -> str:
    """Cut to `limit` characters at a word boundary, marking the cut with "…"."""
    if len(text) <= limit:
        return text
    head = text[: limit - 1]
    if " " in head:
        head = head[: head.rindex(" ")]
    return head.rstrip() + "…"


def constraint_key(text: str) -> str:
    """The identity of a rule for de-duplication: NFKC, case, spacing, apostrophes, end marks."""
    folded = _fold(unicodedata.normalize("NFKC", text))
    folded = _LIST_MARKER_RE.sub("", " ".join(folded.split()), count=1)
    return folded.rstrip(" .!;,:…")


def extract_constraints(user_texts: Sequence[str]) -> list[str]:
    """Standing rules stated in the user's messages, oldest first, verbatim and de-duplicated."""
    rules: list[str] = []
    seen: set[str] = set()
    for text in user_texts:
        for line in _prose_lines(text):
            for sentence in _sentences(line):
                if not is_standing_rule(sentence):
                    continue
                rule = _cap(sentence)
                key = constraint_key(rule)
                if key and key not in seen:
                    seen.add(key)
                    rules.append(rule)
    return rules


def _is_placeholder(item: str) -> bool:
    return not item.strip() or _PLACEHOLDER_RE.match(item.strip().strip("*_")) is not None


def constraints_from_summary(summary: str) -> list[str]:
    """The items a previous summary listed under `## Constraints/Rules`.

    The section runs to the next `## ` heading. List items are the rules; an indented line
    under an item continues it. A section written as plain lines (no list at all) is read one
    rule per line. Placeholders ("None.", "(none)", "No constraints") are ignored.
    """
    section: list[str] = []
    inside = False
    for line in summary.replace("\r\n", "\n").replace("\r", "\n").split("\n"):
        stripped = line.strip()
        if stripped == CONSTRAINTS_HEADING:
            inside = True
            continue
        if inside and stripped.startswith("## "):
            break
        if inside:
            section.append(line)

    bullets: list[str] = []
    plain: list[str] = []
    for line in section:
        match = _SUMMARY_BULLET_RE.match(line)
        if match:
            bullets.append(" ".join(match.group(1).split()))
        elif line.strip():
            if bullets and line[:1].isspace():
                bullets[-1] = f"{bullets[-1]} {' '.join(line.split())}"
            else:
                plain.append(" ".join(line.split()))
    items = bullets if bullets else plain
    return [item for item in items if not _is_placeholder(item)]


def merge_register(
    previous: Sequence[str],
    new: Sequence[str],
    limit: int = DEFAULT_REGISTER_LIMIT,
    max_chars: int = DEFAULT_REGISTER_CHARS,
) -> list[str]:
    """Combine the carried register with newly extracted rules, oldest first, bounded.

    * De-duplication uses `constraint_key`; the first wording and its position win, so the
      register reads the same from one compaction to the next.
    * A rule the user restates is as recent as its latest mention: when the register is over
      `limit` items or `max_chars` characters (sum of item lengths plus one separator each),
      the rules whose latest mention is oldest are evicted first. `new` is the user's latest
      word, so its rules outlive carried ones and are only evicted, oldest first, when `new`
      alone exceeds the bounds. An item longer than `max_chars` on its own is dropped.
    """
    entries: dict[str, tuple[str, int]] = {}  # key -> (first wording, latest mention)
    order: list[str] = []
    for mention, item in enumerate(_clean_items([*previous, *new])):
        key = constraint_key(item)
        if key in entries:
            entries[key] = (entries[key][0], mention)
        else:
            entries[key] = (item, mention)
            order.append(key)

    if limit <= 0 or max_chars <= 0:
        return []
    order = [key for key in order if len(entries[key][0]) + 1 <= max_chars]
    keep = set(order)
    by_age = sorted(order, key=lambda k: entries[k][1])
    total = sum(len(entries[k][0]) + 1 for k in order)
    for key in by_age:
        if len(keep) <= limit and total <= max_chars:
            break
        keep.discard(key)
        total -= len(entries[key][0]) + 1
    return [entries[key][0] for key in order if key in keep]


def _clean_items(items: Iterable[str]) -> list[str]:
    cleaned: list[str] = []
    for item in items:
        text = " ".join(item.split())
        if text and not _is_placeholder(text) and constraint_key(text):
            cleaned.append(text)
    return cleaned
