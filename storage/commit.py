"""Committing a compaction to a stored transcript by compare-and-swap, never a long lock.

Read the object (bytes + etag), rebase the compaction entry onto what is there now
(`pipeline.commit.rebase_compaction`), write with `if_match`. When another writer got in
between (PreconditionFailed / Conflict), back off and redo the read-rebase-write with the
same summary: no new LLM call. A 412 on a write that may in fact have landed is resolved by
the idempotency check on the next read (the compaction id is found, nothing is written twice).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from tenacity import Retrying, retry_if_exception_type, stop_after_attempt, wait_random_exponential

from pipeline.commit import SnapshotFacts, Superseded, rebase_compaction
from pipeline.transcript import Transcript, parse_transcript
from storage.errors import Conflict, PreconditionFailed
from storage.objectstore import ObjectStore

CommitStatus = Literal["committed", "already_committed"]


class _Retry(Exception):
    pass


@dataclass(frozen=True, slots=True)
class CommitResult:
    status: CommitStatus
    entry_id: str
    etag: str
    attempts: int
    transcript: Transcript


def commit_compaction(store: ObjectStore, key: str, entry: dict[str, Any],
                      facts: SnapshotFacts, *, max_attempts: int = 8) -> CommitResult:
    """CAS-append `entry` to the transcript at `key`. Raises `Superseded` when it must not."""
    attempts = 0
    for attempt in Retrying(stop=stop_after_attempt(max_attempts),
                            wait=wait_random_exponential(multiplier=0.02, max=0.5),
                            retry=retry_if_exception_type(_Retry), reraise=True):
        with attempt:
            attempts += 1
            stored = store.get(key)
            current = parse_transcript(stored.data)
            status, entry_id = rebase_compaction(current, entry, facts)
            if status == "already_committed":
                return CommitResult("already_committed", entry_id, stored.etag, attempts,
                                    current)
            try:
                etag = store.put(key, current.to_bytes(), if_match=stored.etag)
            except (PreconditionFailed, Conflict) as exc:
                raise _Retry(str(exc)) from exc
            return CommitResult("committed", entry_id, etag, attempts, current)
    raise AssertionError("unreachable")  # pragma: no cover


__all__ = ["CommitResult", "Superseded", "commit_compaction"]
