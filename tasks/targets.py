"""Where a job's transcript lives: parse a target string and open (store, key).

Targets are strings so they fit in job records and CLI arguments:

* ``store://{tenant}/{session}`` — the session in the configured object store
  (``COMPACTD_STORE_URL``): its HEAD pointer names the active segment, and commits go through
  `storage.sessions.SessionStore` (checkpoint, CAS, optional rotation).
* ``file:///abs/path.jsonl`` — a plain local file, committed in place by the same CAS path
  (`LocalFileStore.for_file`). The worker must see the same filesystem as the producer.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

from storage import sessions
from storage.keys import validate_id


@dataclass(frozen=True, slots=True)
class Target:
    """A parsed target: `kind` is "store" or "file"; tenant/session always set."""

    kind: str
    tenant: str
    session: str
    path: str | None = None

    @property
    def uri(self) -> str:
        if self.kind == "file":
            return f"file://{self.path}"
        return f"store://{self.tenant}/{self.session}"


def parse_target(target: str, *, tenant: str | None = None,
                 session: str | None = None) -> Target:
    """Parse a target, filling tenant/session for file targets (default tenant "local",
    session derived from the file path so the same file always maps to the same lease)."""
    parts = urlsplit(target)
    if parts.scheme == "store":
        t, _, s = (parts.netloc + parts.path).partition("/")
        t, s = t or (tenant or ""), s.strip("/") or (session or "")
        if (tenant and tenant != t) or (session and session != s):
            raise ValueError(f"target {target!r} disagrees with --tenant/--session")
        return Target("store", validate_id("tenant", t), validate_id("session", s))
    if parts.scheme == "file":
        if parts.netloc not in ("", "localhost"):
            raise ValueError(f"file target {target!r} must be a local absolute path")
        path = unquote(parts.path)
        if not path.startswith("/"):
            raise ValueError(f"file target {target!r} needs an absolute path (file:///abs)")
        real = os.path.realpath(path)
        derived = "file-" + hashlib.sha256(real.encode()).hexdigest()[:20]
        return Target("file", validate_id("tenant", tenant or "local"),
                      validate_id("session", session or derived), real)
    if not parts.scheme and tenant is None and session is None and target.startswith("/"):
        return parse_target(f"file://{target}")
    raise ValueError(f"unsupported target {target!r}: use store://TENANT/SESSION or "
                     "file:///abs/path.jsonl")


def open_target(target: Target, store_url: str) -> sessions.Target:
    """The storage target of a job: read its bytes, commit through it."""
    if target.kind == "file":
        assert target.path is not None
        return sessions.parse_target(target.path)
    return sessions.parse_target(f"store://{target.tenant}/{target.session}",
                                 store_url=store_url)
