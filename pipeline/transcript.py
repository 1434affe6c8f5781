"""Reading and writing pi session transcripts (JSONL, versions 1–3).

A transcript is a header line plus entries forming a tree through `parentId`. We parse with
orjson, validate every entry against `pipeline.models`, and keep each source line's exact bytes
so that a rewrite leaves entries we did not touch byte-for-byte identical (unknown entry types
and unknown fields included). Old files (v1/v2) are migrated in memory with ids derived from the
header id and the line position, so the same file always gets the same ids.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import orjson
from pydantic import ValidationError

from pipeline.errors import TranscriptError
from pipeline.models import validate_entry, validate_header

CURRENT_VERSION = 3
MAX_LINE_BYTES = 64 * 1024 * 1024


@dataclass(slots=True)
class Entry:
    """One tree entry. `data` is the JSON object; `raw` the exact source line while unchanged."""

    data: dict[str, Any]
    line: int = 0
    raw: bytes | None = None

    @property
    def id(self) -> str:
        return str(self.data["id"])

    @property
    def parent_id(self) -> str | None:
        parent = self.data.get("parentId")
        return None if parent is None else str(parent)

    @property
    def type(self) -> str:
        return str(self.data.get("type", ""))

    @property
    def message(self) -> dict[str, Any] | None:
        """The message payload for `message` entries, else None."""
        if self.data.get("type") == "message":
            msg = self.data.get("message")
            return msg if isinstance(msg, dict) else None
        return None

    @property
    def role(self) -> str | None:
        msg = self.message
        return None if msg is None else msg.get("role")

    def to_bytes(self) -> bytes:
        return self.raw if self.raw is not None else orjson.dumps(self.data)


@dataclass(frozen=True, slots=True)
class SkippedLine:
    """A line left out in lenient mode, and why."""

    line: int
    code: str
    detail: str


@dataclass(slots=True)
class Transcript:
    """A parsed session: header, entries in file order, and the tree index."""

    header: dict[str, Any]
    entries: list[Entry]
    header_raw: bytes | None = None
    source_version: int = CURRENT_VERSION
    skipped: list[SkippedLine] = field(default_factory=list)
    _by_id: dict[str, Entry] = field(default_factory=dict, repr=False)
    _index: dict[str, int] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        self.reindex()

    def reindex(self) -> None:
        self._by_id = {e.id: e for e in self.entries}
        self._index = {e.id: i for i, e in enumerate(self.entries)}

    # --- lookups ----------------------------------------------------------------------------

    @property
    def session_id(self) -> str:
        return str(self.header.get("id", ""))

    def get(self, entry_id: str) -> Entry | None:
        return self._by_id.get(entry_id)

    def __contains__(self, entry_id: object) -> bool:
        return entry_id in self._by_id

    def __len__(self) -> int:
        return len(self.entries)

    @property
    def leaf_id(self) -> str | None:
        """pi's leaf after loading: the last entry in file order."""
        return self.entries[-1].id if self.entries else None

    def path(self, leaf_id: str | None = None) -> list[Entry]:
        """Root-to-leaf list of entries on the branch ending at `leaf_id` (default: the leaf)."""
        leaf = leaf_id if leaf_id is not None else self.leaf_id
        if leaf is None:
            return []
        if leaf not in self._by_id:
            raise TranscriptError("unknown_leaf", f"leaf {leaf!r} is not an entry of this session")
        out: list[Entry] = []
        current: Entry | None = self._by_id[leaf]
        while current is not None:
            out.append(current)
            parent = current.parent_id
            current = self._by_id.get(parent) if parent is not None else None
        out.reverse()
        return out

    def children(self, entry_id: str | None) -> list[Entry]:
        return [e for e in self.entries if e.parent_id == entry_id]

    def new_id(self, seed: str = "") -> str:
        """A fresh 8-hex id, unique in this transcript (pi's id shape)."""
        counter = 0
        while True:
            digest = hashlib.sha256(f"{self.session_id}:{seed}:{len(self)}:{counter}".encode())
            candidate = digest.hexdigest()[:8]
            if candidate not in self._by_id:
                return candidate
            counter += 1

    # --- mutation (in memory; persistence is the storage layer's job) -----------------------

    def append(self, data: dict[str, Any]) -> Entry:
        """Append an already-validated entry dict whose id is new."""
        entry = Entry(data=data)
        if entry.id in self._by_id:
            raise TranscriptError("duplicate_id", f"entry id {entry.id!r} already exists")
        self.entries.append(entry)
        self._by_id[entry.id] = entry
        self._index[entry.id] = len(self.entries) - 1
        return entry

    # --- serialization ------------------------------------------------------------------------

    def header_bytes(self) -> bytes:
        if self.header_raw is not None and self.source_version == CURRENT_VERSION:
            return self.header_raw
        return orjson.dumps(self.header)

    def iter_lines(self) -> Iterator[bytes]:
        yield self.header_bytes()
        for entry in self.entries:
            yield entry.to_bytes()

    def to_bytes(self) -> bytes:
        """Serialize as a v3 file: one JSON object per line, trailing newline."""
        return b"\n".join(self.iter_lines()) + b"\n"


# --- parsing ----------------------------------------------------------------------------------


def _split_lines(data: bytes) -> Iterable[tuple[int, bytes]]:
    for number, line in enumerate(data.split(b"\n"), start=1):
        if line.endswith(b"\r"):
            line = line[:-1]
        if line.strip():
            yield number, line


def _load_line(number: int, line: bytes) -> dict[str, Any]:
    if len(line) > MAX_LINE_BYTES:
        raise TranscriptError(
            "line_too_long", f"{len(line)} bytes exceeds the {MAX_LINE_BYTES}-byte limit", number
        )
    if not line.isascii():
        try:
            line.decode("utf-8")
        except UnicodeDecodeError as exc:
            detail = f"byte {exc.start}: {exc.reason}"
            raise TranscriptError("invalid_utf8", detail, number) from exc
    try:
        obj = orjson.loads(line)
    except orjson.JSONDecodeError as exc:
        raise TranscriptError("not_json", str(exc), number) from exc
    if not isinstance(obj, dict):
        raise TranscriptError(
            "not_an_object", f"expected a JSON object, got {type(obj).__name__}", number
        )
    return obj


def _describe(exc: ValidationError) -> str:
    first = exc.errors()[0]
    loc = ".".join(str(p) for p in first["loc"]) or "entry"
    more = f" (+{exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
    return f"{loc}: {first['msg']}{more}"


def _migration_id(session_id: str, line: int, taken: set[str]) -> str:
    counter = 0
    while True:
        digest = hashlib.sha256(f"{session_id}:{line}:{counter}".encode()).hexdigest()[:8]
        if digest not in taken:
            taken.add(digest)
            return digest
        counter += 1


def _migrate(header: dict[str, Any], items: list[tuple[int, dict[str, Any]]], version: int) -> None:
    """Migrate v1/v2 entries to v3 in place, as pi does, but with deterministic ids.

    v1 -> v2: entries become a linear chain; a compaction's `firstKeptEntryIndex` (an index
    into the file's entries, header included) becomes `firstKeptEntryId`.
    v2 -> v3: the message role `hookMessage` is renamed `custom`.
    """
    session_id = str(header.get("id", ""))
    if version < 2:
        taken: set[str] = set()
        prev: str | None = None
        file_entries: list[dict[str, Any]] = [header] + [obj for _, obj in items]
        for line, obj in items:
            obj["id"] = _migration_id(session_id, line, taken)
            obj["parentId"] = prev
            prev = obj["id"]
            if obj.get("type") == "compaction" and isinstance(
                obj.get("firstKeptEntryIndex"), int
            ):
                index = obj.pop("firstKeptEntryIndex")
                if 0 <= index < len(file_entries):
                    target = file_entries[index]
                    if target.get("type") != "session" and "id" in target:
                        obj["firstKeptEntryId"] = target["id"]
    if version < 3:
        for _, obj in items:
            msg = obj.get("message")
            if (obj.get("type") == "message" and isinstance(msg, dict)
                    and msg.get("role") == "hookMessage"):
                msg["role"] = "custom"
    header["version"] = CURRENT_VERSION


def parse_transcript(data: bytes, *, lenient: bool = False) -> Transcript:
    """Parse a session file. Strict mode raises `TranscriptError` on the first problem.

    Lenient mode does what pi does with damaged files (skip what cannot be used) but reports
    every skipped line in `Transcript.skipped`. A missing or invalid header is an error in both
    modes: without it we cannot know the session id or format version.
    """
    if not data.strip():
        raise TranscriptError("empty_file", "the transcript has no lines")
    skipped: list[SkippedLine] = []
    lines = _split_lines(data)

    first_no, first_raw = next(iter(lines))
    header = _load_line(first_no, first_raw)
    if header.get("type") != "session":
        raise TranscriptError("no_header", "the first line must be a 'session' header", first_no)
    try:
        validate_header(header)
    except ValidationError as exc:
        raise TranscriptError("invalid_header", _describe(exc), first_no) from exc
    version = header.get("version", 1)
    # bool is an int subclass in Python: `"version": true` must not pass as version 1.
    if (not isinstance(version, int) or isinstance(version, bool)
            or not 1 <= version <= CURRENT_VERSION):
        raise TranscriptError("unsupported_version", f"version {version!r} is not 1, 2 or 3",
                              first_no)

    items: list[tuple[int, dict[str, Any]]] = []
    raws: dict[int, bytes] = {}
    for number, raw in lines:
        try:
            obj = _load_line(number, raw)
            if not isinstance(obj.get("type"), str):
                raise TranscriptError("invalid_entry", "entry has no string 'type'", number)
        except TranscriptError as exc:
            if not lenient:
                raise
            skipped.append(SkippedLine(number, exc.code, exc.detail))
            continue
        items.append((number, obj))
        raws[number] = raw

    if version < CURRENT_VERSION:
        _migrate(header, items, version)

    entries: list[Entry] = []
    seen: dict[str, int] = {}
    for number, obj in items:
        try:
            validate_entry(obj)
        except (ValidationError, ValueError) as exc:
            detail = _describe(exc) if isinstance(exc, ValidationError) else str(exc)
            if not lenient:
                raise TranscriptError("invalid_entry", detail, number) from exc
            skipped.append(SkippedLine(number, "invalid_entry", detail))
            continue
        entry_id = obj["id"]
        if entry_id in seen:
            detail = f"id {entry_id!r} was already used on line {seen[entry_id]}"
            if not lenient:
                raise TranscriptError("duplicate_id", detail, number)
            skipped.append(SkippedLine(number, "duplicate_id", detail))
            continue
        seen[entry_id] = number
        source = raws[number] if version == CURRENT_VERSION else None
        entries.append(Entry(data=obj, line=number, raw=source))

    entries = _check_tree(entries, lenient, skipped)
    return Transcript(
        header=header,
        entries=entries,
        header_raw=first_raw,
        source_version=version,
        skipped=skipped,
    )


def _check_tree(entries: list[Entry], lenient: bool, skipped: list[SkippedLine]) -> list[Entry]:
    """Reject dangling parents and cycles (lenient: drop the offending entries and report)."""
    by_id = {e.id: e for e in entries}
    bad: set[str] = set()
    for entry in entries:
        parent = entry.parent_id
        if parent is not None and parent not in by_id:
            detail = f"parentId {parent!r} of entry {entry.id!r} does not exist"
            if not lenient:
                raise TranscriptError("dangling_parent", detail, entry.line)
            skipped.append(SkippedLine(entry.line, "dangling_parent", detail))
            bad.add(entry.id)

    state: dict[str, int] = {}  # 1 = on the current walk, 2 = known to reach a root
    for entry in entries:
        walk: list[str] = []
        current: str | None = entry.id
        while current is not None and state.get(current) != 2 and current not in bad:
            if state.get(current) == 1:
                cycle_entry = by_id[current]
                detail = f"entry {current!r} is its own ancestor"
                if not lenient:
                    raise TranscriptError("parent_cycle", detail, cycle_entry.line)
                cycle_start = walk.index(current)
                for member in walk[cycle_start:]:
                    bad.add(member)
                    skipped.append(SkippedLine(by_id[member].line, "parent_cycle", detail))
                break
            state[current] = 1
            walk.append(current)
            current = by_id[current].parent_id
        for member in walk:
            state[member] = 2
    if not bad:
        return entries
    # Lenient: drop bad entries and everything that descends from them.
    kept: list[Entry] = []
    dropped = set(bad)
    for entry in _topological(entries, by_id):
        if entry.id in dropped or (entry.parent_id is not None and entry.parent_id in dropped):
            if entry.id not in bad:
                skipped.append(SkippedLine(entry.line, "dangling_parent",
                                           f"ancestor of entry {entry.id!r} was skipped"))
            dropped.add(entry.id)
            continue
        kept.append(entry)
    order = {id(e): i for i, e in enumerate(entries)}
    kept.sort(key=lambda e: order[id(e)])
    return kept


def _topological(entries: list[Entry], by_id: dict[str, Entry]) -> list[Entry]:
    """Entries ordered so parents come before children (cycle members in file order)."""
    depth: dict[str, int] = {}

    def depth_of(entry_id: str) -> int:
        chain: list[str] = []
        current: str | None = entry_id
        while current is not None and current not in depth and current in by_id:
            if current in chain:
                break
            chain.append(current)
            current = by_id[current].parent_id
        base = depth.get(current, -1) if current is not None else -1
        for member in reversed(chain):
            base += 1
            depth[member] = base
        return depth[entry_id]

    return sorted(entries, key=lambda e: depth_of(e.id))
