"""The ObjectStore protocol: the only storage interface the rest of compactd sees.

Five operations are enough for the commit protocol of DESIGN.md §5: ``get`` returns the bytes
*and* an etag, and ``put`` can be made conditional on that etag (``if_match``) or on the key
not existing yet (``create_only``). That is a compare-and-swap on whole objects, which S3
(``If-Match`` / ``If-None-Match: *``) and a local directory (flock + compare + rename) can both
provide. Everything above this layer (transcript commits, rotation, checkpoints, job artifacts)
is written against the protocol, so it runs unchanged on a laptop and on AWS/MinIO.

Etags are opaque: compare them only with etags from the same store. They are always returned
without the surrounding double quotes HTTP uses, and stores accept them quoted or not.
"""

from __future__ import annotations

import builtins
from typing import NamedTuple, Protocol, runtime_checkable
from urllib.parse import parse_qsl, unquote, urlsplit

__all__ = ["ObjectStore", "StoredObject", "open_store"]


class StoredObject(NamedTuple):
    """An object's bytes together with the etag they were read at.

    A NamedTuple so both ``obj.data`` and ``data, etag = store.get(key)`` work. Keeping the etag
    next to the data is the point: a later ``put(..., if_match=obj.etag)`` succeeds only if
    nobody changed the object since *these* bytes were read.
    """

    data: bytes
    etag: str


@runtime_checkable
class ObjectStore(Protocol):
    """A flat key → bytes store with compare-and-swap writes.

    Keys are ``/``-separated relative paths validated by :func:`storage.keys.validate_key`.
    All methods raise :class:`storage.errors.StoreError` subclasses only (plus
    :class:`storage.errors.InvalidKey` for malformed keys).
    """

    def get(self, key: str) -> StoredObject:
        """Return the object's bytes and etag; :class:`NotFound` if it does not exist."""
        ...

    def put(
        self, key: str, data: bytes, *, if_match: str | None = None, create_only: bool = False
    ) -> str:
        """Write the object and return its new etag.

        ``create_only``: fail with :class:`PreconditionFailed` if the key exists.
        ``if_match``: write only if the current etag equals it; :class:`NotFound` if the key is
        missing, :class:`PreconditionFailed` if the etag is stale. :class:`Conflict` means a
        concurrent write got in the way (retry after re-reading). Giving both is a ValueError.
        """
        ...

    def head(self, key: str) -> str | None:
        """Return the current etag, or ``None`` if the key does not exist."""
        ...

    def list(self, prefix: str) -> builtins.list[str]:
        """Return all keys starting with ``prefix`` (plain string prefix), sorted."""
        ...

    def delete(self, key: str, *, if_match: str | None = None) -> None:
        """Delete the object.

        Without ``if_match`` deleting a missing key is a no-op (as on S3), so a redelivered
        cleanup task succeeds. With ``if_match``: :class:`NotFound` if missing,
        :class:`PreconditionFailed` if the etag is stale.
        """
        ...


_S3_PARAMS = frozenset({"endpoint_url", "region", "addressing_style"})


def checked_put_data(data: object, *, if_match: str | None, create_only: bool) -> bytes:
    """The argument rules every store's `put` shares: one condition at most, bytes-like data."""
    if if_match is not None and create_only:
        raise ValueError("put: give either if_match or create_only, not both")
    if not isinstance(data, bytes | bytearray | memoryview):
        raise TypeError(f"put: data must be bytes, not {type(data).__name__}")
    return bytes(data)


def open_store(url: str) -> ObjectStore:
    """Build a store from a URL (settings, CLI flags).

    * ``file:///abs/dir`` → :class:`~storage.localfs.LocalFileStore` rooted at ``/abs/dir``.
    * ``s3://bucket[/prefix][?endpoint_url=...&region=...&addressing_style=path|virtual|auto]``
      → :class:`~storage.s3.S3Store`. Credentials come from the normal boto3 chain
      (environment, profile, instance role), never from the URL: URLs end up in logs, job
      records and process listings.

    Anything else raises ``ValueError`` with a message saying what was wrong and what is
    accepted, because this is usually a configuration typo seen by an operator.
    """
    if not isinstance(url, str) or not url:
        raise ValueError("store URL must be a non-empty string such as 'file:///var/lib/compactd'")
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme == "file":
        return _open_file_store(url, parts.netloc, parts.path, parts.query, parts.fragment)
    if scheme == "s3":
        return _open_s3_store(url, parts.netloc, parts.path, parts.query, parts.fragment)
    raise ValueError(
        f"unsupported store URL {url!r}: expected 'file:///absolute/dir' or "
        "'s3://bucket[/prefix][?endpoint_url=...&region=...]'"
    )


def _open_file_store(url: str, netloc: str, path: str, query: str, fragment: str) -> ObjectStore:
    from pathlib import Path

    from storage.localfs import LocalFileStore

    if netloc not in ("", "localhost"):
        raise ValueError(
            f"store URL {url!r}: file URLs must name a local absolute path "
            f"('file:///dir'), not the host {netloc!r}"
        )
    if query or fragment:
        raise ValueError(f"store URL {url!r}: file URLs take no query string or fragment")
    root = unquote(path)
    if not root.startswith("/"):
        raise ValueError(f"store URL {url!r}: file URLs need an absolute path ('file:///dir')")
    return LocalFileStore(Path(root))


def _open_s3_store(url: str, netloc: str, path: str, query: str, fragment: str) -> ObjectStore:
    from storage.s3 import S3Store

    if "@" in netloc:
        raise ValueError(
            "s3 store URL must not carry credentials; use the AWS environment variables, "
            "a profile or an instance role"
        )
    bucket = netloc
    if not bucket:
        raise ValueError(f"store URL {url!r}: missing bucket name ('s3://bucket[/prefix]')")
    if fragment:
        raise ValueError(f"store URL {url!r}: s3 URLs take no fragment")
    params: dict[str, str] = {}
    for name, value in parse_qsl(query, keep_blank_values=True, strict_parsing=False):
        if name in ("access_key", "secret_key", "aws_access_key_id", "aws_secret_access_key"):
            raise ValueError(
                "s3 store URL must not carry credentials; use the AWS environment variables, "
                "a profile or an instance role"
            )
        if name not in _S3_PARAMS:
            raise ValueError(
                f"store URL {url!r}: unknown parameter {name!r} "
                f"(accepted: {', '.join(sorted(_S3_PARAMS))})"
            )
        if name in params:
            raise ValueError(f"store URL {url!r}: parameter {name!r} given twice")
        if not value:
            raise ValueError(f"store URL {url!r}: parameter {name!r} is empty")
        params[name] = value
    endpoint_url = params.get("endpoint_url")
    if endpoint_url is not None:
        ep = urlsplit(endpoint_url)
        if ep.scheme not in ("http", "https") or not ep.netloc:
            raise ValueError(
                f"store URL {url!r}: endpoint_url must be an http(s) URL, got {endpoint_url!r}"
            )
    addressing_style = params.get("addressing_style")
    if addressing_style is not None and addressing_style not in ("auto", "path", "virtual"):
        raise ValueError(
            f"store URL {url!r}: addressing_style must be auto, path or virtual, "
            f"got {addressing_style!r}"
        )
    return S3Store(
        bucket,
        prefix=unquote(path).lstrip("/"),
        endpoint_url=endpoint_url,
        region=params.get("region"),
        addressing_style=addressing_style,
    )
