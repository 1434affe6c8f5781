"""Object key layout and validation.

Layout (one prefix per session, so a session can be listed, copied or deleted as a unit)::

    tenants/{tenant}/sessions/{session}/HEAD                      pointer to the live segment
    tenants/{tenant}/sessions/{session}/segments/{segment}.jsonl  transcript segments
    tenants/{tenant}/sessions/{session}/checkpoints/{id}.jsonl    pre-compaction snapshots
    tenants/{tenant}/sessions/{session}/checkpoints/{id}.meta.json
    tenants/{tenant}/sessions/{session}/jobs/{job}/{name}         job artifacts (chunk inputs,
                                                                  partial summaries, ...)

Every id is validated before it is spliced into a key. Ids arrive from API clients; an id such
as ``../other-tenant`` or ``a/b`` would otherwise let one tenant read or overwrite another
tenant's objects (on the local filesystem store it would even address files outside the root).
The helpers below therefore never accept a raw string without checking it, and
:func:`validate_key` is applied again by every store, as defence in depth for keys built by
hand.
"""

from __future__ import annotations

import re

from storage.errors import InvalidId, InvalidKey

__all__ = [
    "ID_PATTERN",
    "checkpoint_key",
    "checkpoint_meta_key",
    "checkpoints_prefix",
    "head_key",
    "job_artifact_key",
    "job_prefix",
    "segment_key",
    "segments_prefix",
    "session_prefix",
    "tenant_prefix",
    "validate_id",
    "validate_key",
]

#: The id rule of DESIGN.md §5: portable file-name characters only, 1..128 of them.
ID_PATTERN = re.compile(r"[A-Za-z0-9._-]{1,128}")

#: Suffix of the sidecar lock file LocalFileStore keeps next to each object. Reserved in keys
#: (for every store, so a key valid on one backend is valid on all of them).
LOCK_SUFFIX = ".lock"
#: Prefix of LocalFileStore's temporary files. Reserved in key segments for the same reason.
TEMP_PREFIX = ".tmp-"

#: S3's limit on the UTF-8 length of a key.
MAX_KEY_BYTES = 1024
#: Typical file-name limit (255 bytes) minus room for the ``.lock`` sidecar suffix.
MAX_SEGMENT_BYTES = 250


def validate_id(kind: str, value: object) -> str:
    """Check one id against the id rule and return it unchanged.

    ``kind`` ("tenant", "session", "job", ...) only feeds the error message, so the API can say
    *which* id was wrong. Raises :class:`InvalidId` naming the value and the broken rule.
    """
    if not isinstance(value, str):
        raise InvalidId(kind, value, f"must be a string, not {type(value).__name__}")
    if not value:
        raise InvalidId(kind, value, "must not be empty")
    if len(value) > 128:
        raise InvalidId(kind, value, f"must be at most 128 characters (got {len(value)})")
    if ID_PATTERN.fullmatch(value) is None:
        raise InvalidId(
            kind, value, "may only contain ASCII letters, digits, '.', '_' and '-' ([A-Za-z0-9._-])"
        )
    if value in (".", ".."):
        raise InvalidId(kind, value, "must not be '.' or '..'")
    if ".." in value:
        raise InvalidId(kind, value, "must not contain '..'")
    return value


def validate_key(key: object) -> str:
    """Check the structure of an object key and return it unchanged.

    Keys are ``/``-separated relative paths. Rejected: non-strings, empty keys, a leading ``/``
    (absolute), empty segments (``a//b``, trailing ``/``), ``.`` or ``..`` segments, control
    characters and backslashes (path tricks on some systems, unprintable in logs and S3's XML),
    segments reserved by LocalFileStore (``*.lock`` sidecars, ``.tmp-*`` temp files), and
    over-long keys. Raises :class:`InvalidKey`.
    """
    if not isinstance(key, str):
        raise InvalidKey(f"object key must be a string, not {type(key).__name__}")
    if not key:
        raise InvalidKey("object key must not be empty")
    shown = key if len(key) <= 80 else key[:80] + "..."
    if key.startswith("/"):
        raise InvalidKey(f"object key {shown!r} must be relative (no leading '/')", key=key)
    if any(ord(ch) < 0x20 or ord(ch) == 0x7F for ch in key) or "\\" in key:
        raise InvalidKey(
            f"object key {shown!r} must not contain control characters or backslashes", key=key
        )
    try:
        encoded = key.encode("utf-8")
    except UnicodeEncodeError:  # lone surrogates: not representable in a file name or S3 key
        raise InvalidKey(f"object key {shown!r} is not valid Unicode", key=key) from None
    if len(encoded) > MAX_KEY_BYTES:
        raise InvalidKey(f"object key {shown!r} is longer than {MAX_KEY_BYTES} bytes", key=key)
    for segment in key.split("/"):
        if not segment:
            raise InvalidKey(f"object key {shown!r} has an empty path segment", key=key)
        if segment in (".", ".."):
            raise InvalidKey(f"object key {shown!r} has a {segment!r} path segment", key=key)
        if segment.endswith(LOCK_SUFFIX) or segment.startswith(TEMP_PREFIX):
            raise InvalidKey(
                f"object key {shown!r}: segment {segment!r} uses a reserved name "
                f"('*{LOCK_SUFFIX}' and '{TEMP_PREFIX}*' are used by the local store)",
                key=key,
            )
        if len(segment.encode("utf-8")) > MAX_SEGMENT_BYTES:
            raise InvalidKey(
                f"object key {shown!r} has a segment longer than {MAX_SEGMENT_BYTES} bytes",
                key=key,
            )
    return key


def tenant_prefix(tenant: str) -> str:
    """``tenants/{tenant}/``: everything a tenant owns."""
    return f"tenants/{validate_id('tenant', tenant)}/"


def session_prefix(tenant: str, session: str) -> str:
    """``tenants/{tenant}/sessions/{session}/``: everything one session owns."""
    return f"{tenant_prefix(tenant)}sessions/{validate_id('session', session)}/"


def head_key(tenant: str, session: str) -> str:
    """``.../HEAD``: the small object naming the live segment; swapped by CAS on rotation."""
    return f"{session_prefix(tenant, session)}HEAD"


def segments_prefix(tenant: str, session: str) -> str:
    """``.../segments/``: prefix for listing a session's segments (live and archived)."""
    return f"{session_prefix(tenant, session)}segments/"


def segment_key(tenant: str, session: str, segment_id: str) -> str:
    """``.../segments/{segment_id}.jsonl``: one transcript segment (pi session JSONL)."""
    return f"{segments_prefix(tenant, session)}{validate_id('segment', segment_id)}.jsonl"


def checkpoints_prefix(tenant: str, session: str) -> str:
    """``.../checkpoints/``: prefix for listing (and bounding) a session's checkpoints."""
    return f"{session_prefix(tenant, session)}checkpoints/"


def checkpoint_key(tenant: str, session: str, checkpoint_id: str) -> str:
    """``.../checkpoints/{id}.jsonl``: a pre-compaction snapshot of the transcript."""
    return f"{checkpoints_prefix(tenant, session)}{validate_id('checkpoint', checkpoint_id)}.jsonl"


def checkpoint_meta_key(tenant: str, session: str, checkpoint_id: str) -> str:
    """``.../checkpoints/{id}.meta.json``: metadata (source segment, sizes, time) of a checkpoint.

    Kept as a separate small object so listing and pruning checkpoints never has to download
    the (possibly large) snapshot itself.
    """
    cid = validate_id("checkpoint", checkpoint_id)
    return f"{checkpoints_prefix(tenant, session)}{cid}.meta.json"


def job_prefix(tenant: str, session: str, job_id: str) -> str:
    """``.../jobs/{job_id}/``: all artifacts of one compaction job (for listing and cleanup)."""
    return f"{session_prefix(tenant, session)}jobs/{validate_id('job', job_id)}/"


def job_artifact_key(tenant: str, session: str, job_id: str, name: str) -> str:
    """``.../jobs/{job_id}/{name}``: one job artifact (chunk input, partial summary, ...).

    ``name`` follows the id rule too: artifact names are built by our code from indexes and
    hashes, and a slash in one would silently create a nested "directory".
    """
    return f"{job_prefix(tenant, session, job_id)}{validate_id('artifact name', name)}"
