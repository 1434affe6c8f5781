"""ObjectStore contract tests, run against LocalFileStore and S3Store (moto over HTTP).

The contract is what the transcript commit protocol relies on: reads return the etag of the
bytes they return, conditional writes are compare-and-swap (no lost update, ever), and failures
arrive as the typed errors of storage.errors, identically on both backends.
"""

from __future__ import annotations

import hashlib
import multiprocessing
import os
import queue
import stat
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError
from hypothesis import given
from hypothesis import strategies as st

from storage import (
    Conflict,
    InvalidId,
    InvalidKey,
    LocalFileStore,
    NotFound,
    ObjectStore,
    PreconditionFailed,
    S3Store,
    StoredObject,
    StoreError,
    checkpoint_key,
    checkpoint_meta_key,
    head_key,
    job_artifact_key,
    map_client_error,
    open_store,
    segment_key,
    session_prefix,
    validate_id,
    validate_key,
)
from tests.support.s3server import TEST_ACCESS_KEY, TEST_REGION, TEST_SECRET_KEY

# --------------------------------------------------------------------------- fixtures


@pytest.fixture(params=["local", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> ObjectStore:
    """The same contract test against both backends."""
    if request.param == "local":
        return LocalFileStore(tmp_path / "store")
    s3: S3Store = request.getfixturevalue("s3_store")
    return s3


def _is_local(store: ObjectStore) -> bool:
    return isinstance(store, LocalFileStore)


# --------------------------------------------------------------------------- basics


def test_both_backends_satisfy_the_protocol(store: ObjectStore) -> None:
    assert isinstance(store, ObjectStore)


def test_put_get_head_roundtrip(store: ObjectStore) -> None:
    data = b'{"type":"session","version":3}\n\x00\xff binary-safe\n'
    etag = store.put("a/b/c.jsonl", data)
    assert etag and '"' not in etag
    got = store.get("a/b/c.jsonl")
    assert isinstance(got, StoredObject)
    assert got == StoredObject(data, etag)
    body, tag = got  # unpacks like the (bytes, etag) pair of the design
    assert (body, tag) == (data, etag)
    assert store.head("a/b/c.jsonl") == etag


def test_empty_object(store: ObjectStore) -> None:
    etag = store.put("empty", b"")
    assert store.get("empty") == StoredObject(b"", etag)


def test_overwrite_changes_etag_and_same_content_same_etag(store: ObjectStore) -> None:
    e1 = store.put("k", b"one")
    e2 = store.put("k", b"two")
    assert e1 != e2
    assert store.get("k") == StoredObject(b"two", e2)
    # Both backends derive the etag from the content (sha256 / MD5 of a single-part upload).
    assert store.put("k", b"one") == e1


def test_local_etag_is_sha256_of_content(tmp_path: Path) -> None:
    store = LocalFileStore(tmp_path)
    assert store.put("x", b"hello") == hashlib.sha256(b"hello").hexdigest()


def test_get_missing_is_not_found_and_head_is_none(store: ObjectStore) -> None:
    with pytest.raises(NotFound) as info:
        store.get("no/such/key")
    assert info.value.key == "no/such/key"
    assert store.head("no/such/key") is None


def test_a_prefix_is_not_an_object(store: ObjectStore) -> None:
    store.put("dir/file", b"x")
    with pytest.raises(NotFound):
        store.get("dir")
    assert store.head("dir") is None


def test_list_is_sorted_and_uses_string_prefixes(store: ObjectStore) -> None:
    keys = [
        "tenants/t1/sessions/s2/HEAD",
        "tenants/t1/sessions/s1/segments/b.jsonl",
        "tenants/t1/sessions/s1/segments/a.jsonl",
        "tenants/t1/sessions/s10/HEAD",
        "tenants/t2/sessions/s1/HEAD",
        "top",
    ]
    for key in keys:
        store.put(key, key.encode())
    assert store.list("") == sorted(keys)
    assert store.list("tenants/t1/") == sorted(k for k in keys if k.startswith("tenants/t1/"))
    # A plain string prefix, as on S3: "s1" matches "s1/..." and "s10/...".
    assert store.list("tenants/t1/sessions/s1") == [
        "tenants/t1/sessions/s1/segments/a.jsonl",
        "tenants/t1/sessions/s1/segments/b.jsonl",
        "tenants/t1/sessions/s10/HEAD",
    ]
    assert store.list("tenants/t1/sessions/s1/") == [
        "tenants/t1/sessions/s1/segments/a.jsonl",
        "tenants/t1/sessions/s1/segments/b.jsonl",
    ]
    assert store.list("tenants/t1/sessions/s1/segments/a") == [
        "tenants/t1/sessions/s1/segments/a.jsonl"
    ]
    assert store.list("to") == ["top"]
    assert store.list("nothing/here/") == []
    assert store.list("../") == []


def test_list_paginates(store: ObjectStore) -> None:
    keys = [f"p/k{i:02d}" for i in range(7)]
    for key in reversed(keys):
        store.put(key, b".")
    if isinstance(store, S3Store):
        # Same bucket, 2 keys per page: ListObjectsV2 must be followed across 4 pages.
        store = S3Store(store.bucket, client=store.client, list_page_size=2)
    assert store.list("p/") == keys


def test_local_list_hides_lock_and_temp_files(tmp_path: Path) -> None:
    store = LocalFileStore(tmp_path)
    store.put("a/x", b"1")
    store.put("a/x", b"2", if_match=store.head("a/x"))
    assert (tmp_path / "a" / "x.lock").exists()  # the sidecar exists...
    (tmp_path / "a" / ".tmp-deadbeef").write_bytes(b"crash leftover")
    assert store.list("") == ["a/x"]  # ...but is not a key
    assert sorted(os.listdir(tmp_path / "a")) == [".tmp-deadbeef", "x", "x.lock"]


def test_delete(store: ObjectStore) -> None:
    etag = store.put("d/k", b"v")
    store.delete("d/k")
    assert store.head("d/k") is None
    with pytest.raises(NotFound):
        store.get("d/k")
    store.delete("d/k")  # idempotent without a condition (redelivered cleanup tasks)
    assert store.list("d/") == []

    etag = store.put("d/k", b"v2")
    with pytest.raises(PreconditionFailed):
        store.delete("d/k", if_match=hashlib.md5(b"other").hexdigest())
    assert store.get("d/k").data == b"v2"
    store.delete("d/k", if_match=etag)
    assert store.head("d/k") is None
    with pytest.raises(NotFound):
        store.delete("d/k", if_match=etag)
    with pytest.raises(NotFound):
        store.delete("never/existed/dir/k", if_match=etag)


def test_local_delete_removes_lock_file(tmp_path: Path) -> None:
    store = LocalFileStore(tmp_path)
    store.put("k", b"v")
    store.delete("k")
    assert os.listdir(tmp_path) == []


# --------------------------------------------------------------------------- compare-and-swap


def test_create_only(store: ObjectStore) -> None:
    etag = store.put("c/k", b"first", create_only=True)
    assert store.get("c/k") == StoredObject(b"first", etag)
    with pytest.raises(PreconditionFailed) as info:
        store.put("c/k", b"second", create_only=True)
    assert info.value.key == "c/k"
    assert store.get("c/k") == StoredObject(b"first", etag)  # loser wrote nothing


def test_if_match_current_etag_succeeds(store: ObjectStore) -> None:
    etag = store.put("m/k", b"v1")
    new = store.put("m/k", b"v2", if_match=etag)
    assert new != etag
    assert store.get("m/k") == StoredObject(b"v2", new)


def test_if_match_accepts_quoted_etags(store: ObjectStore) -> None:
    etag = store.put("q/k", b"v1")
    new = store.put("q/k", b"v2", if_match=f'"{etag}"')
    assert store.get("q/k").etag == new


def test_if_match_stale_etag_fails(store: ObjectStore) -> None:
    stale = store.put("s/k", b"v1")
    current = store.put("s/k", b"v2", if_match=stale)
    with pytest.raises(PreconditionFailed) as info:
        store.put("s/k", b"v3", if_match=stale)
    assert info.value.key == "s/k"
    assert store.get("s/k") == StoredObject(b"v2", current)


def test_if_match_on_missing_key_is_not_found(store: ObjectStore) -> None:
    etag = store.put("other", b"x")
    with pytest.raises(NotFound):
        store.put("missing/k", b"v", if_match=etag)
    assert store.head("missing/k") is None


def test_if_match_and_create_only_together_is_an_error(store: ObjectStore) -> None:
    with pytest.raises(ValueError, match="not both"):
        store.put("k", b"v", if_match="abc", create_only=True)


def test_create_only_race_has_exactly_one_winner(store: ObjectStore) -> None:
    n = 8
    barrier = threading.Barrier(n)
    winners: list[int] = []
    losers: list[int] = []

    def contender(i: int) -> None:
        barrier.wait()
        try:
            store.put("race/k", f"writer-{i}".encode(), create_only=True)
            winners.append(i)
        except PreconditionFailed:
            losers.append(i)

    _run_threads([lambda i=i: contender(i) for i in range(n)])
    assert len(winners) == 1 and len(losers) == n - 1
    assert store.get("race/k").data == f"writer-{winners[0]}".encode()


def _cas_append(store: ObjectStore, key: str, line: bytes) -> int:
    """Read-modify-write ``line`` onto ``key`` with a CAS loop; return the number of retries."""
    retries = 0
    while True:
        try:
            current = store.get(key)
        except NotFound:
            try:
                store.put(key, line, create_only=True)
                return retries
            except PreconditionFailed:
                retries += 1
                continue
        try:
            store.put(key, current.data + line, if_match=current.etag)
            return retries
        except (PreconditionFailed, Conflict):
            retries += 1


def _run_threads(targets: list[Callable[[], None]]) -> None:
    errors: queue.Queue[BaseException] = queue.Queue()

    def wrap(fn: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            try:
                fn()
            except BaseException as exc:  # surfaced below: a thread must not fail silently
                errors.put(exc)

        return run

    threads = [threading.Thread(target=wrap(t)) for t in targets]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads), "writer thread hung"
    if not errors.empty():
        raise errors.get()


def _check_counter(store: ObjectStore, key: str, expected_lines: set[bytes]) -> None:
    lines = store.get(key).data.splitlines(keepends=True)
    assert len(lines) == len(expected_lines), "lost or duplicated update"
    assert set(lines) == expected_lines


def test_concurrent_threads_lose_no_update(store: ObjectStore) -> None:
    writers, per_writer = 6, 8
    barrier = threading.Barrier(writers)
    retries: list[int] = []
    successes: list[bytes] = []

    def writer(w: int) -> None:
        barrier.wait()
        for i in range(per_writer):
            line = f"w{w}-{i}\n".encode()
            retries.append(_cas_append(store, "counter", line))
            successes.append(line)

    _run_threads([lambda w=w: writer(w) for w in range(writers)])
    assert len(successes) == writers * per_writer
    _check_counter(store, "counter", set(successes))
    assert sum(retries) > 0, "no contention happened: the test proved nothing"


def _process_writer(root: str, worker: int, count: int, start: Any, results: Any) -> None:
    """Runs in a spawned child: CAS-append ``count`` lines, report (worker, retries)."""
    store = LocalFileStore(Path(root))
    start.wait(30)
    retries = 0
    for i in range(count):
        retries += _cas_append(store, "counter", f"p{worker}-{i}\n".encode())
    results.put((worker, retries))


def test_local_concurrent_processes_lose_no_update(tmp_path: Path) -> None:
    # spawn, not fork: the parent runs a moto server thread and boto3 connection pools.
    ctx = multiprocessing.get_context("spawn")
    start = ctx.Event()
    results = ctx.Queue()
    workers, per_worker = 4, 25
    procs = [
        ctx.Process(target=_process_writer, args=(str(tmp_path), w, per_worker, start, results))
        for w in range(workers)
    ]
    for p in procs:
        p.start()
    start.set()
    reports = [results.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(timeout=30)
        assert p.exitcode == 0
    assert sorted(w for w, _ in reports) == list(range(workers))
    expected = {f"p{w}-{i}\n".encode() for w in range(workers) for i in range(per_worker)}
    _check_counter(LocalFileStore(tmp_path), "counter", expected)


def test_local_readers_never_see_torn_writes(tmp_path: Path) -> None:
    store = LocalFileStore(tmp_path)
    versions = [bytes([65 + i]) * (256 * 1024 + i) for i in range(4)]
    valid = {hashlib.sha256(v).hexdigest(): v for v in versions}
    store.put("big", versions[0])
    stop = threading.Event()
    seen: list[str] = []

    def reader() -> None:
        while not stop.is_set():
            data, etag = store.get("big")
            assert valid.get(etag) == data
            seen.append(etag)

    def writer() -> None:
        try:
            for i in range(40):
                store.put("big", versions[i % len(versions)])
        finally:
            stop.set()

    _run_threads([reader, reader, writer])
    assert len(set(seen)) > 1


# --------------------------------------------------------------------------- error mapping


def _client_error(code: str, status: int, op: str = "PutObject") -> ClientError:
    return ClientError(
        {
            "Error": {"Code": code, "Message": f"{code} happened"},
            "ResponseMetadata": {"HTTPStatusCode": status},
        },
        op,
    )


@pytest.mark.parametrize(
    ("code", "status", "expected"),
    [
        ("ConditionalRequestConflict", 409, Conflict),
        ("OperationAborted", 409, Conflict),
        ("SomethingNew", 409, Conflict),
        ("PreconditionFailed", 412, PreconditionFailed),
        ("412", 412, PreconditionFailed),  # HEAD: no body, the status is the code
        ("NoSuchKey", 404, NotFound),
        ("404", 404, NotFound),
        ("NotFound", 404, NotFound),
        ("NoSuchBucket", 404, StoreError),  # misconfiguration, not a missing object
        ("AccessDenied", 403, StoreError),
        ("InternalError", 500, StoreError),
    ],
)
def test_map_client_error(code: str, status: int, expected: type[StoreError]) -> None:
    err = map_client_error(_client_error(code, status), "k/1")
    assert type(err) is expected
    assert err.key == "k/1"
    assert code in str(err)


def test_s3_conflict_surfaces_from_the_store() -> None:
    """A 409 raised by the client during put reaches the caller as Conflict."""

    class ConflictingClient:
        def put_object(self, **kwargs: Any) -> dict[str, Any]:
            assert kwargs["IfMatch"] == '"abc"'
            raise _client_error("ConditionalRequestConflict", 409)

    store = S3Store("bucket", client=ConflictingClient())
    with pytest.raises(Conflict) as info:
        store.put("k", b"v", if_match="abc")
    assert isinstance(info.value.__cause__, ClientError)


def test_s3_missing_bucket_is_a_store_error_not_not_found(s3_store: S3Store) -> None:
    store = S3Store(
        "compactd-no-such-bucket",
        endpoint_url=s3_store.endpoint_url,
        region=TEST_REGION,
        access_key=TEST_ACCESS_KEY,
        secret_key=TEST_SECRET_KEY,
    )
    with pytest.raises(StoreError) as info:
        store.get("k")
    assert type(info.value) is StoreError


def test_s3_store_repr_hides_credentials(s3_store: S3Store) -> None:
    assert TEST_SECRET_KEY not in repr(s3_store)
    assert TEST_ACCESS_KEY not in repr(s3_store)
    assert TEST_SECRET_KEY not in str(vars(s3_store))


def test_s3_prefix_isolates_keys(s3_store: S3Store) -> None:
    scoped = S3Store(s3_store.bucket, prefix="/deploy-a/", client=s3_store.client)
    scoped.put("x/y", b"1")
    s3_store.put("x/y", b"2")
    assert scoped.list("") == ["x/y"]
    assert s3_store.list("") == ["deploy-a/x/y", "x/y"]
    assert scoped.get("x/y").data == b"1"


# --------------------------------------------------------------------------- key safety

BAD_KEYS = [
    "",
    "/etc/passwd",
    "../outside",
    "a/../../outside",
    "a/..",
    "..",
    ".",
    "a/./b",
    "a//b",
    "a/",
    "a\\..\\b",
    "a\x00b",
    "line\nbreak",
    "x.lock",
    "dir/.tmp-123",
    "a/" + "x" * 251,
    "k/" * 600,
]


@pytest.mark.parametrize("key", BAD_KEYS)
def test_local_store_rejects_unsafe_keys(tmp_path: Path, key: str) -> None:
    root = tmp_path / "root"
    store = LocalFileStore(root)
    with pytest.raises(InvalidKey):
        store.put(key, b"pwned")
    with pytest.raises(InvalidKey):
        store.get(key)
    with pytest.raises(InvalidKey):
        store.delete(key)
    assert not (tmp_path / "outside").exists()


def test_invalid_key_is_a_value_error_and_a_store_error() -> None:
    with pytest.raises(ValueError, match="'\\.\\.' path segment"):
        validate_key("a/../b")
    assert issubclass(InvalidKey, StoreError)


def test_local_store_rejects_symlink_escape(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    root = tmp_path / "root"
    root.mkdir()
    (root / "link").symlink_to(outside)
    store = LocalFileStore(root)
    with pytest.raises(InvalidKey, match="outside the store root"):
        store.put("link/file", b"pwned")
    assert list(outside.iterdir()) == []


def test_s3_store_rejects_unsafe_keys_too(s3_store: S3Store) -> None:
    """Same key rules on every backend, so a key valid in tests is valid in production."""
    for key in ["../x", "/abs", "a//b", "x.lock"]:
        with pytest.raises(InvalidKey):
            s3_store.put(key, b"v")


def test_local_store_key_under_existing_file_is_a_store_error(tmp_path: Path) -> None:
    store = LocalFileStore(tmp_path)
    store.put("a", b"file")
    with pytest.raises(StoreError):
        store.put("a/b", b"v")
    with pytest.raises(NotFound):
        store.get("a/b")


# --------------------------------------------------------------------------- for_file


def test_for_file_round_trip_and_cas(tmp_path: Path) -> None:
    path = tmp_path / "session.jsonl"
    path.write_bytes(b'{"type":"session"}\n')
    path.chmod(0o600)
    store, key = LocalFileStore.for_file(path)
    assert key == "session.jsonl"
    assert store.root == tmp_path.resolve()
    data, etag = store.get(key)
    assert data == b'{"type":"session"}\n'
    new = store.put(key, data + b'{"type":"message"}\n', if_match=etag)
    assert path.read_bytes() == b'{"type":"session"}\n{"type":"message"}\n'
    assert stat.S_IMODE(path.stat().st_mode) == 0o600  # in-place write keeps permissions
    with pytest.raises(PreconditionFailed):
        store.put(key, b"stale", if_match=etag)
    assert store.head(key) == new


def test_for_file_follows_symlinks(tmp_path: Path) -> None:
    real = tmp_path / "data" / "real.jsonl"
    real.parent.mkdir()
    real.write_bytes(b"v1\n")
    link = tmp_path / "link.jsonl"
    link.symlink_to(real)
    store, key = LocalFileStore.for_file(link)
    assert store.get(key).data == b"v1\n"
    store.put(key, b"v2\n", if_match=store.get(key).etag)
    assert link.is_symlink()
    assert real.read_bytes() == b"v2\n"


# --------------------------------------------------------------------------- keys.py


@pytest.mark.parametrize("value", ["t1", "a", "A.b_c-9", "x" * 128, "v1.2.3", ".hidden", "-"])
def test_validate_id_accepts_good_ids(value: str) -> None:
    assert validate_id("tenant", value) == value


@pytest.mark.parametrize(
    ("value", "rule"),
    [
        ("", "must not be empty"),
        (".", "must not be '.' or '..'"),
        ("..", "must not be '.' or '..'"),
        ("a..b", "must not contain '..'"),
        ("a/b", "may only contain"),
        ("../etc", "may only contain"),
        ("a b", "may only contain"),
        ("tenant\n", "may only contain"),
        ("x" * 129, "at most 128 characters"),
        ("café", "may only contain"),
        ("会话", "may only contain"),
        (42, "must be a string"),
    ],
)
def test_validate_id_rejects_bad_ids(value: object, rule: str) -> None:
    with pytest.raises(InvalidId) as info:
        validate_id("session", value)
    message = str(info.value)
    assert message.startswith("invalid session id ")
    assert rule in message
    assert info.value.kind == "session" and info.value.value == value
    assert isinstance(info.value, ValueError)


def test_invalid_id_message_is_bounded() -> None:
    with pytest.raises(InvalidId) as info:
        validate_id("tenant", "/" * 100_000)
    assert len(str(info.value)) < 300


def test_key_layout() -> None:
    assert session_prefix("t1", "s1") == "tenants/t1/sessions/s1/"
    assert head_key("t1", "s1") == "tenants/t1/sessions/s1/HEAD"
    assert segment_key("t1", "s1", "seg-0") == "tenants/t1/sessions/s1/segments/seg-0.jsonl"
    assert checkpoint_key("t1", "s1", "c1") == "tenants/t1/sessions/s1/checkpoints/c1.jsonl"
    assert (
        checkpoint_meta_key("t1", "s1", "c1") == "tenants/t1/sessions/s1/checkpoints/c1.meta.json"
    )
    assert job_artifact_key("t1", "s1", "j1", "part-0.json") == (
        "tenants/t1/sessions/s1/jobs/j1/part-0.json"
    )


@pytest.mark.parametrize(
    ("helper", "kind"),
    [
        (lambda bad: session_prefix(bad, "s"), "tenant"),
        (lambda bad: head_key("t", bad), "session"),
        (lambda bad: segment_key("t", "s", bad), "segment"),
        (lambda bad: checkpoint_key("t", "s", bad), "checkpoint"),
        (lambda bad: checkpoint_meta_key("t", "s", bad), "checkpoint"),
        (lambda bad: job_artifact_key("t", "s", bad, "x"), "job"),
        (lambda bad: job_artifact_key("t", "s", "j", bad), "artifact name"),
    ],
)
def test_every_key_helper_validates_its_ids(helper: Callable[[str], str], kind: str) -> None:
    with pytest.raises(InvalidId, match=f"invalid {kind} id '\\.\\./x'"):
        helper("../x")


@given(st.text(max_size=140))
def test_ids_accepted_are_always_safe_key_segments(value: str) -> None:
    try:
        validate_id("tenant", value)
    except InvalidId:
        return
    key = head_key(value, "s")
    assert key.split("/") == ["tenants", value, "sessions", "s", "HEAD"]
    assert validate_key(key) == key


# --------------------------------------------------------------------------- open_store


def test_open_store_file_urls(tmp_path: Path) -> None:
    store = open_store(f"file://{tmp_path}/my%20store")
    assert isinstance(store, LocalFileStore)
    assert store.root == tmp_path.resolve() / "my store"
    store.put("k", b"v")
    assert (tmp_path / "my store" / "k").read_bytes() == b"v"
    local = open_store(f"file://localhost{tmp_path}")
    assert isinstance(local, LocalFileStore) and local.root == tmp_path.resolve()


def test_open_store_s3_url_builds_a_working_store(
    s3_store: S3Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", TEST_ACCESS_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", TEST_SECRET_KEY)
    endpoint = s3_store.endpoint_url
    store = open_store(f"s3://{s3_store.bucket}/env/prod?endpoint_url={endpoint}&region=eu-west-1")
    assert isinstance(store, S3Store)
    assert (store.bucket, store.prefix, store.endpoint_url, store.region) == (
        s3_store.bucket,
        "env/prod/",
        endpoint,
        "eu-west-1",
    )
    store.put("k", b"v")
    assert s3_store.list("") == ["env/prod/k"]


def test_open_store_s3_without_prefix() -> None:
    store = open_store("s3://my-bucket?region=us-east-1")
    assert isinstance(store, S3Store)
    assert (store.bucket, store.prefix, store.region) == ("my-bucket", "", "us-east-1")


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("", "non-empty"),
        ("/var/lib/compactd", "unsupported store URL"),
        ("http://example.com/x", "unsupported store URL"),
        ("gs://bucket", "unsupported store URL"),
        ("file:relative/dir", "absolute path"),
        ("file://otherhost/dir", "host 'otherhost'"),
        ("file:///dir?x=1", "no query string"),
        ("s3://", "missing bucket"),
        ("s3:///prefix", "missing bucket"),
        ("s3://b?endpoint=http://x", "unknown parameter 'endpoint'"),
        ("s3://b?region=a&region=b", "given twice"),
        ("s3://b?region=", "is empty"),
        ("s3://b?endpoint_url=localhost:9000", "http(s) URL"),
        ("s3://b?addressing_style=weird", "addressing_style"),
        ("s3://AKIA:secret@b", "must not carry credentials"),
        ("s3://b?secret_key=x&access_key=y", "must not carry credentials"),
        ("s3://b/../x", "'..' path segment"),
    ],
)
def test_open_store_rejects_bad_urls(url: str, message: str) -> None:
    with pytest.raises(ValueError) as info:
        open_store(url)
    assert message in str(info.value)


@pytest.fixture(autouse=True)
def _no_leftover_temp_files(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[None]:
    """After every test, no LocalFileStore temp file may be left behind (atomic writes)."""
    yield
    leftovers = [
        p
        for p in tmp_path.rglob(".tmp-*")
        if request.node.name != "test_local_list_hides_lock_and_temp_files"
    ]
    assert leftovers == []


def test_boto3_is_the_real_client(s3_store: S3Store) -> None:
    """Guard: the fixture's store talks HTTP to moto, not to an in-process mock."""
    assert s3_store.endpoint_url is not None
    assert s3_store.endpoint_url.startswith("http://127.0.0.1:")
    raw = boto3.client(
        "s3",
        endpoint_url=s3_store.endpoint_url,
        region_name=TEST_REGION,
        aws_access_key_id=TEST_ACCESS_KEY,
        aws_secret_access_key=TEST_SECRET_KEY,
    )
    s3_store.put("wire", b"over http")
    assert raw.get_object(Bucket=s3_store.bucket, Key="wire")["Body"].read() == b"over http"
