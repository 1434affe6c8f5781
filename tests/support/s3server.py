"""pytest plugin: a real S3 endpoint for tests, served by moto over HTTP on 127.0.0.1.

Why a server and not ``moto.mock_aws``: the in-process mock patches botocore, so requests never
reach HTTP and header handling (``If-Match`` quoting, path-style addressing, status codes) is
not exercised. The server speaks the wire protocol, so S3Store is tested exactly as it talks to
AWS or MinIO. One server per test session (startup costs ~0.3 s); one fresh bucket per test, so
tests are isolated and can run in any order or under xdist (each worker gets its own server).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import boto3
import pytest
from moto.server import ThreadedMotoServer

from storage.s3 import S3Store

# moto accepts any credentials; explicit dummy ones keep tests from picking up (and using) a
# developer's real AWS profile, and region must be set for SigV4 signing.
TEST_ACCESS_KEY = "testing-access-key"
TEST_SECRET_KEY = "testing-secret-key"  # dummy, for the local moto server only
TEST_REGION = "us-east-1"


@pytest.fixture(scope="session")
def moto_server() -> Iterator[str]:
    """Start moto's S3 server on a free port of 127.0.0.1 and yield its endpoint URL."""
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        yield f"http://{host}:{port}"
    finally:
        server.stop()


@pytest.fixture
def s3_store(moto_server: str) -> Iterator[S3Store]:
    """An S3Store on a brand-new bucket of the session's moto server (over real HTTP)."""
    bucket = f"compactd-test-{uuid.uuid4().hex[:16]}"
    admin = boto3.client(
        "s3",
        endpoint_url=moto_server,
        region_name=TEST_REGION,
        aws_access_key_id=TEST_ACCESS_KEY,
        aws_secret_access_key=TEST_SECRET_KEY,
    )
    admin.create_bucket(Bucket=bucket)
    yield S3Store(
        bucket,
        endpoint_url=moto_server,
        region=TEST_REGION,
        access_key=TEST_ACCESS_KEY,
        secret_key=TEST_SECRET_KEY,
    )
