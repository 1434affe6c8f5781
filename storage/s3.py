"""S3Store: ObjectStore on S3 or anything S3-compatible (MinIO, Ceph, moto), via boto3.

Compare-and-swap uses S3 conditional writes (celery-s3-notes.md §4.1): ``PutObject`` with
``If-None-Match: *`` for create-only and ``If-Match: "<etag>"`` for updates, both supported by
AWS since 2024 and by moto's server mode with AWS status codes. Failures are mapped onto the
typed errors of :mod:`storage.errors` by :func:`map_client_error`.

Known trap, handled one level up: botocore retries a PUT whose response got lost; the retry
then fails its own condition against *our* earlier write and surfaces as
:class:`PreconditionFailed`. The commit protocol therefore stamps every write with a unique
compaction id and re-reads on a 412 to see whether the winner was itself.
"""

from __future__ import annotations

import builtins
from typing import Any, cast

import boto3  # type: ignore[import-untyped]
from botocore.config import Config  # type: ignore[import-untyped]
from botocore.exceptions import (  # type: ignore[import-untyped]
    BotoCoreError,
    ClientError,
)

from storage.errors import Conflict, NotFound, PreconditionFailed, StoreError
from storage.keys import validate_key
from storage.objectstore import StoredObject, checked_put_data

__all__ = ["S3Store", "map_client_error"]

_PRECONDITION_CODES = frozenset({"PreconditionFailed", "412"})
_NOT_FOUND_CODES = frozenset({"NoSuchKey", "NotFound", "404"})
_CONFLICT_CODES = frozenset({"ConditionalRequestConflict", "OperationAborted", "409"})


def map_client_error(exc: ClientError, key: str | None = None) -> StoreError:
    """Translate a botocore ``ClientError`` into the store's typed errors.

    The error code is checked before the HTTP status, because S3 uses 404 for a missing
    *bucket* too: ``NoSuchBucket`` is a configuration error, not a missing object, and must not
    look like "this session does not exist". HEAD responses have no body, so for them only the
    status (as code ``"404"``/``"412"``) is available. Returns the error; the caller raises it
    ``from exc`` so the original response stays attached.
    """
    response: dict[str, Any] = getattr(exc, "response", None) or {}
    error = response.get("Error") or {}
    code = str(error.get("Code") or "")
    status = (response.get("ResponseMetadata") or {}).get("HTTPStatusCode")
    message = str(error.get("Message") or code or exc)
    where = f" for key {key!r}" if key is not None else ""
    text = f"S3 {code or status}{where}: {message}"
    if code == "NoSuchBucket":
        return StoreError(text, key=key)
    if code in _PRECONDITION_CODES or (not code and status == 412):
        return PreconditionFailed(text, key=key)
    if code in _NOT_FOUND_CODES:
        return NotFound(text, key=key)
    if code in _CONFLICT_CODES:
        return Conflict(text, key=key)
    if status == 412:
        return PreconditionFailed(text, key=key)
    if status == 404:
        return NotFound(text, key=key)
    if status == 409:
        return Conflict(text, key=key)
    return StoreError(text, key=key)


def _strip_etag(etag: str) -> str:
    return etag.strip().strip('"')


def _quote_etag(etag: str) -> str:
    """``If-Match`` takes an HTTP entity tag, which is quoted (RFC 9110); MinIO is strict."""
    return f'"{_strip_etag(etag)}"'


def _default_config(addressing_style: str | None, endpoint_url: str | None) -> Config:
    """Client settings chosen for a service doing many small conditional writes.

    * ``standard`` retries with 4 attempts: transient 5xx/throttling are retried with backoff,
      but not so often that a lost-ack 412 (see module docstring) becomes likely or that a
      Celery task stalls for minutes.
    * Short connect timeout, moderate read timeout: a dead endpoint must fail fast so the task
      can retry elsewhere; transcripts are small enough to transfer well within 30 s.
    * A pool of 64 connections: one client is shared by a 32–64 thread worker pool.
    * Path-style addressing when a custom endpoint is given: MinIO, moto and most on-prem S3
      do not have wildcard DNS for virtual-hosted buckets.
    * Checksums only when required: botocore ≥ 1.36 adds CRC checksums to every request by
      default, which several S3-compatible servers reject.
    """
    style = addressing_style or ("path" if endpoint_url else "auto")
    return Config(
        retries={"mode": "standard", "max_attempts": 4},
        connect_timeout=5,
        read_timeout=30,
        max_pool_connections=64,
        s3={"addressing_style": style},
        request_checksum_calculation="when_required",
        response_checksum_validation="when_required",
    )


class S3Store:
    """ObjectStore on one bucket, optionally under a key prefix (several deployments can share
    a bucket).

    Credentials: pass ``access_key``/``secret_key`` explicitly (tests, MinIO) or leave them
    ``None`` for the normal boto3 chain (environment, profile, instance role). They are handed
    to boto3 only and never stored on the instance, logged or shown in ``repr``. A ready
    ``client`` can be injected instead (then the connection arguments are ignored).

    boto3 clients are thread-safe, but sessions are not and neither survives ``fork()``; build
    the store in each worker process (after fork), then share it between that process's
    threads.
    """

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        endpoint_url: str | None = None,
        region: str | None = None,
        access_key: str | None = None,
        secret_key: str | None = None,
        client: Any = None,
        *,
        addressing_style: str | None = None,
        list_page_size: int = 1000,
    ) -> None:
        if not bucket or "/" in bucket:
            raise ValueError(f"invalid S3 bucket name {bucket!r}")
        if (access_key is None) != (secret_key is None):
            raise ValueError("give both access_key and secret_key, or neither")
        if not 1 <= list_page_size <= 1000:
            raise ValueError("list_page_size must be between 1 and 1000")
        prefix = prefix.strip("/")
        if prefix:
            validate_key(prefix)
        self.bucket = bucket
        self.prefix = f"{prefix}/" if prefix else ""
        self.endpoint_url = endpoint_url
        self.region = region
        self.list_page_size = list_page_size
        if client is None:
            session = boto3.session.Session(
                aws_access_key_id=access_key,
                aws_secret_access_key=secret_key,
                region_name=region,
            )
            client = session.client(
                "s3",
                endpoint_url=endpoint_url,
                config=_default_config(addressing_style, endpoint_url),
            )
        self.client: Any = client

    def __repr__(self) -> str:
        return (
            f"S3Store(bucket={self.bucket!r}, prefix={self.prefix!r}, "
            f"endpoint_url={self.endpoint_url!r}, region={self.region!r})"
        )

    def _full(self, key: str) -> str:
        return self.prefix + validate_key(key)

    def _fail(self, exc: Exception, key: str | None, action: str) -> StoreError:
        """Map any boto failure; transport errors become plain StoreError (retryable)."""
        if isinstance(exc, ClientError):
            return map_client_error(exc, key)
        where = f" {key!r}" if key is not None else ""
        return StoreError(f"S3 {action}{where} failed: {exc}", key=key)

    # ------------------------------------------------------------------ reads

    def get(self, key: str) -> StoredObject:
        """``GetObject``; the etag comes from the same response as the bytes."""
        full = self._full(key)
        try:
            response = self.client.get_object(Bucket=self.bucket, Key=full)
            body = response["Body"]
            try:
                data = cast(bytes, body.read())
            finally:
                body.close()
        except (ClientError, BotoCoreError) as exc:
            raise self._fail(exc, key, "get") from exc
        return StoredObject(data, _strip_etag(str(response["ETag"])))

    def head(self, key: str) -> str | None:
        """``HeadObject``; a 404 means absent. HEAD has no error body, so only codes remain."""
        full = self._full(key)
        try:
            response = self.client.head_object(Bucket=self.bucket, Key=full)
        except ClientError as exc:
            err = map_client_error(exc, key)
            if type(err) is NotFound:
                return None
            raise err from exc
        except BotoCoreError as exc:
            raise self._fail(exc, key, "head") from exc
        return _strip_etag(str(response["ETag"]))

    def list(self, prefix: str) -> builtins.list[str]:
        """``ListObjectsV2`` over all pages (1000 keys per page at most on S3)."""
        if not isinstance(prefix, str):
            raise TypeError(f"prefix must be a string, not {type(prefix).__name__}")
        keys: builtins.list[str] = []
        try:
            paginator = self.client.get_paginator("list_objects_v2")
            pages = paginator.paginate(
                Bucket=self.bucket,
                Prefix=self.prefix + prefix,
                PaginationConfig={"PageSize": self.list_page_size},
            )
            for page in pages:
                for item in page.get("Contents", ()):
                    keys.append(str(item["Key"])[len(self.prefix) :])
        except (ClientError, BotoCoreError) as exc:
            raise self._fail(exc, None, "list") from exc
        keys.sort()
        return keys

    # ------------------------------------------------------------------ writes

    def put(
        self, key: str, data: bytes, *, if_match: str | None = None, create_only: bool = False
    ) -> str:
        """``PutObject`` with ``If-Match`` / ``If-None-Match: *``; returns the new etag."""
        data = checked_put_data(data, if_match=if_match, create_only=create_only)
        kwargs: dict[str, Any] = {
            "Bucket": self.bucket,
            "Key": self._full(key),
            "Body": data,
        }
        if create_only:
            kwargs["IfNoneMatch"] = "*"
        elif if_match is not None:
            kwargs["IfMatch"] = _quote_etag(if_match)
        try:
            response = self.client.put_object(**kwargs)
        except (ClientError, BotoCoreError) as exc:
            raise self._fail(exc, key, "put") from exc
        return _strip_etag(str(response["ETag"]))

    def delete(self, key: str, *, if_match: str | None = None) -> None:
        """``DeleteObject``; unconditional deletes of missing keys succeed, as on S3."""
        kwargs: dict[str, Any] = {"Bucket": self.bucket, "Key": self._full(key)}
        if if_match is not None:
            kwargs["IfMatch"] = _quote_etag(if_match)
        try:
            self.client.delete_object(**kwargs)
        except (ClientError, BotoCoreError) as exc:
            raise self._fail(exc, key, "delete") from exc
