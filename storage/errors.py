"""Typed storage errors shared by every ObjectStore implementation.

Callers (the commit protocol, rotation, the CLI, the API) must be able to react to *what*
went wrong without knowing *which* backend they talk to: a stale etag means "re-read and
retry the CAS", a missing key means "the session does not exist", a 409 means "someone raced
us, back off and retry". Each backend therefore translates its native failures (``OSError``,
botocore ``ClientError``) into this small hierarchy, and keeps the original exception as
``__cause__`` for debugging.
"""

from __future__ import annotations

__all__ = [
    "Conflict",
    "InvalidId",
    "InvalidKey",
    "NotFound",
    "PreconditionFailed",
    "StoreError",
]

# Ids and keys are echoed back in error messages; an attacker-controlled id of megabytes should
# not turn into a megabyte log line.
_MAX_SHOWN = 80


def _shown(value: object) -> str:
    """Return a bounded ``repr`` of *value* for use in error messages."""
    text = repr(value)
    if len(text) > _MAX_SHOWN:
        return f"{text[:_MAX_SHOWN]}... ({len(text)} chars)"
    return text


class StoreError(Exception):
    """Base class of every error raised by an ObjectStore.

    ``key`` is the object key involved (``None`` when the failure is not about one key, e.g. a
    listing or a misconfigured bucket), so callers can log it without parsing the message.
    """

    def __init__(self, message: str, *, key: str | None = None) -> None:
        super().__init__(message)
        self.key = key


class NotFound(StoreError):
    """The key does not exist (get/head of a missing object, or ``if_match`` on a missing key)."""


class PreconditionFailed(StoreError):
    """A conditional write lost: the etag is stale, or a create-only key already exists.

    This is the normal outcome of a lost compare-and-swap race; the caller re-reads and retries.
    """


class Conflict(StoreError):
    """The store refused the write because of a concurrent modification (S3 409).

    AWS returns ``409 ConditionalRequestConflict`` when two conditional writes to the same key
    overlap; unlike :class:`PreconditionFailed` the outcome of the other write is not yet known,
    so the caller should back off, re-read and retry.
    """


class InvalidKey(StoreError, ValueError):
    """An object key is malformed or could escape the store (``..``, absolute, empty segment).

    Also a ``ValueError`` because it is a programming or input error, not a storage failure:
    retrying can never help.
    """


class InvalidId(StoreError, ValueError):
    """A tenant, session, job, segment or checkpoint id breaks the id rule.

    Ids come from API callers and end up inside object keys and file paths, so they are checked
    before any key is built. The message names the kind of id, the offending value (bounded) and
    the rule it broke, because it is shown to API clients as a 4xx reason.
    """

    def __init__(self, kind: str, value: object, rule: str) -> None:
        super().__init__(f"invalid {kind} id {_shown(value)}: {rule}")
        self.kind = kind
        self.value = value
        self.rule = rule
