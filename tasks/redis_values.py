"""Typed views of Redis replies.

redis-py annotates replies as ``bytes | str`` because a client may be built with
``decode_responses=True``. compactd's clients never are, so replies are ``bytes`` at run time;
these helpers narrow the union for the type checker without changing what bytes turn into.
"""

from __future__ import annotations

__all__ = ["as_bytes", "as_text"]


def as_text(value: bytes | str) -> str:
    """A reply as text (UTF-8, as ``bytes.decode`` does)."""
    return value.decode() if isinstance(value, bytes) else value


def as_bytes(value: bytes | str) -> bytes:
    """A reply as raw bytes."""
    return value if isinstance(value, bytes) else value.encode()
