"""Object storage for compactd: the ObjectStore protocol, its two backends, and key layout.

``LocalFileStore`` (a directory; the embedded default) and ``S3Store`` (S3 and compatibles via
boto3) both offer compare-and-swap writes, which is what the transcript commit protocol builds
on instead of long-held locks (DESIGN.md §5). Use :func:`open_store` to build one from a URL.
"""

from storage.errors import (
    Conflict,
    InvalidId,
    InvalidKey,
    NotFound,
    PreconditionFailed,
    StoreError,
)
from storage.keys import (
    checkpoint_key,
    checkpoint_meta_key,
    checkpoints_prefix,
    head_key,
    job_artifact_key,
    job_prefix,
    segment_key,
    segments_prefix,
    session_prefix,
    tenant_prefix,
    validate_id,
    validate_key,
)
from storage.localfs import LocalFileStore
from storage.objectstore import ObjectStore, StoredObject, open_store
from storage.s3 import S3Store, map_client_error

__all__ = [
    "Conflict",
    "InvalidId",
    "InvalidKey",
    "LocalFileStore",
    "NotFound",
    "ObjectStore",
    "PreconditionFailed",
    "S3Store",
    "StoreError",
    "StoredObject",
    "checkpoint_key",
    "checkpoint_meta_key",
    "checkpoints_prefix",
    "head_key",
    "job_artifact_key",
    "job_prefix",
    "map_client_error",
    "open_store",
    "segment_key",
    "segments_prefix",
    "session_prefix",
    "tenant_prefix",
    "validate_id",
    "validate_key",
]
