"""LocalFileStore: the default ObjectStore, a directory tree on one host.

Each key is a file under ``root`` (``a/b/c`` → ``root/a/b/c``). Writes are compare-and-swap,
made safe across threads *and* processes (CLI, Celery prefork children, the agent itself) by
the sequence validated in celery-s3-notes.md §4 (experiment E13):

1. take ``fcntl.flock(LOCK_EX)`` on a sidecar ``<file>.lock`` — a separate file, because the
   data file itself is replaced on every write and a lock on a replaced inode protects nothing;
2. compare the current state with the condition (existence for ``create_only``, content hash
   for ``if_match``);
3. write a temp file in the *same* directory (so the rename cannot cross file systems), fsync it;
4. ``os.replace`` it over the target (atomic: readers see the old or the new bytes, never a
   torn file, so readers take no lock at all);
5. fsync the directory so the rename itself survives a power cut.

Etag = SHA-256 hex of the content. Content addressing needs no side database, is the same in
every process and after restarts, and cannot be fooled by coarse mtimes or reused inode
numbers. Its one quirk, ABA (content A → B → A makes an old etag match again), is harmless for
CAS: the condition we check is "the bytes are the ones I read", and they are.

Limits: single host only (flock over NFS is unreliable); the lock is advisory, so every writer
must go through this class; a key cannot be both an object and a "directory" of other keys
(``a`` and ``a/b``), which the key layout in :mod:`storage.keys` never does.
"""

from __future__ import annotations

import builtins
import errno
import fcntl
import hashlib
import os
import secrets
import stat
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

from storage.errors import InvalidKey, NotFound, PreconditionFailed, StoreError
from storage.keys import LOCK_SUFFIX, TEMP_PREFIX, validate_key
from storage.objectstore import StoredObject, checked_put_data

__all__ = ["LocalFileStore"]

# Errors meaning "there is no object at this path": the file is missing, a parent "directory"
# is really a file, or the path is a directory (a key prefix, not an object, as on S3).
_MISSING = (FileNotFoundError, NotADirectoryError, IsADirectoryError)


def _etag_of(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _normalize_etag(etag: str) -> str:
    """Accept etags quoted HTTP-style (``"abc"``) as well as bare, for parity with S3Store."""
    return etag.strip().strip('"')


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _is_reserved(name: str) -> bool:
    return name.endswith(LOCK_SUFFIX) or name.startswith(TEMP_PREFIX)


class LocalFileStore:
    """ObjectStore on a local directory; see the module docstring for the write protocol.

    ``root`` is resolved (symlinks included) once; it is created lazily on the first write, so
    constructing a store never touches the disk and a read-only use of a missing root simply
    finds nothing.
    """

    def __init__(self, root: Path | str) -> None:
        self.root = Path(os.path.realpath(os.fspath(root)))
        self._root = str(self.root)

    @classmethod
    def for_file(cls, path: Path | str) -> tuple[LocalFileStore, str]:
        """Return ``(store, key)`` addressing one plain file, e.g. for ``compact --in-place``.

        The store is rooted at the file's directory and the key is its name, so the same CAS
        write path (lock, compare, atomic replace) protects a user's own transcript file
        against an agent appending to it concurrently. Symlinks are resolved first, so an
        in-place write updates the real file instead of replacing the link.
        """
        real = Path(os.path.realpath(os.fspath(path)))
        if real.name == "":
            raise InvalidKey(f"{os.fspath(path)!r} does not name a file")
        key = validate_key(real.name)
        return cls(real.parent), key

    def __repr__(self) -> str:
        return f"LocalFileStore({self._root!r})"

    # ------------------------------------------------------------------ paths

    def path_for(self, key: str) -> Path:
        """The file that holds ``key`` (validated; guaranteed to lie under ``root``)."""
        return Path(self._path(key))

    def _path(self, key: str) -> str:
        validate_key(key)
        path = os.path.join(self._root, *key.split("/"))
        # validate_key already rules out '..' and absolute keys; this also catches a symlink
        # inside the root that points outside it.
        real = os.path.realpath(path)
        if real != self._root and not real.startswith(self._root + os.sep):
            raise InvalidKey(f"object key {key!r} resolves outside the store root", key=key)
        return path

    # ------------------------------------------------------------------ reads

    def get(self, key: str) -> StoredObject:
        """Read the whole object; no lock needed because writers replace files atomically."""
        path = self._path(key)
        try:
            with open(path, "rb") as f:
                data = f.read()
        except _MISSING:
            raise NotFound(f"no object at key {key!r}", key=key) from None
        except OSError as exc:
            raise StoreError(f"cannot read {key!r}: {exc.strerror or exc}", key=key) from exc
        return StoredObject(data, _etag_of(data))

    def head(self, key: str) -> str | None:
        """Current etag (hash streamed from disk, so large objects are not held in memory)."""
        path = self._path(key)
        try:
            return self._current_etag(path)
        except OSError as exc:
            raise StoreError(f"cannot read {key!r}: {exc.strerror or exc}", key=key) from exc

    def list(self, prefix: str) -> builtins.list[str]:
        """Sorted keys starting with ``prefix``; sidecar locks and temp files are not keys."""
        if not isinstance(prefix, str):
            raise TypeError(f"prefix must be a string, not {type(prefix).__name__}")
        # Only walk the deepest directory the prefix pins down, not the whole store.
        dir_part = prefix.rpartition("/")[0]
        if dir_part:
            try:
                validate_key(dir_part)
            except InvalidKey:
                return []  # no valid key can live under such a prefix
            start = os.path.join(self._root, *dir_part.split("/"))
        else:
            start = self._root
        keys: builtins.list[str] = []
        for dirpath, dirnames, filenames in os.walk(start, onerror=self._walk_error):
            rel = os.path.relpath(dirpath, self._root)
            base = "" if rel == "." else rel.replace(os.sep, "/") + "/"
            dirnames[:] = [
                d
                for d in dirnames
                if not _is_reserved(d)
                and ((base + d + "/").startswith(prefix) or prefix.startswith(base + d + "/"))
            ]
            for name in filenames:
                key = base + name
                if not _is_reserved(name) and key.startswith(prefix):
                    keys.append(key)
        keys.sort()
        return keys

    @staticmethod
    def _walk_error(exc: OSError) -> None:
        if isinstance(exc, _MISSING):
            return  # missing prefix directory: simply no keys
        raise StoreError(f"cannot list {exc.filename!r}: {exc.strerror or exc}") from exc

    def _current_etag(self, path: str) -> str | None:
        try:
            with open(path, "rb") as f:
                return hashlib.file_digest(f, "sha256").hexdigest()
        except _MISSING:
            return None

    # ------------------------------------------------------------------ writes

    def put(
        self, key: str, data: bytes, *, if_match: str | None = None, create_only: bool = False
    ) -> str:
        """Write ``data`` under ``key`` (optionally conditional) and return its etag."""
        data = checked_put_data(data, if_match=if_match, create_only=create_only)
        path = self._path(key)
        try:
            self._makedirs(os.path.dirname(path))
            with self._locked(path):
                if create_only:
                    if os.path.lexists(path):
                        raise PreconditionFailed(f"key {key!r} already exists", key=key)
                elif if_match is not None:
                    current = self._current_etag(path)
                    if current is None:
                        raise NotFound(f"if_match on missing key {key!r}", key=key)
                    if current != _normalize_etag(if_match):
                        raise PreconditionFailed(
                            f"stale etag for {key!r}: expected {if_match}, found {current}",
                            key=key,
                        )
                self._write_atomic(path, data)
        except StoreError:
            raise
        except OSError as exc:
            raise StoreError(f"cannot write {key!r}: {exc.strerror or exc}", key=key) from exc
        return _etag_of(data)

    def delete(self, key: str, *, if_match: str | None = None) -> None:
        """Delete under the lock, then drop the lock file too (see :meth:`_locked`)."""
        path = self._path(key)
        try:
            with self._locked(path) as lock_path:
                if if_match is not None:
                    current = self._current_etag(path)
                    if current is None:
                        raise NotFound(f"if_match on missing key {key!r}", key=key)
                    if current != _normalize_etag(if_match):
                        raise PreconditionFailed(
                            f"stale etag for {key!r}: expected {if_match}, found {current}",
                            key=key,
                        )
                with suppress(*_MISSING):  # idempotent, like S3 DeleteObject
                    os.unlink(path)
                # Safe while we hold the lock: waiters on the old lock inode notice it is no
                # longer linked and retry on a fresh one.
                os.unlink(lock_path)
                _fsync_dir(os.path.dirname(path))
        except _MISSING:
            # The lock file could not even be created: the parent directory does not exist.
            if if_match is not None:
                raise NotFound(f"if_match on missing key {key!r}", key=key) from None
        except StoreError:
            raise
        except OSError as exc:
            raise StoreError(f"cannot delete {key!r}: {exc.strerror or exc}", key=key) from exc

    @contextmanager
    def _locked(self, path: str) -> Iterator[str]:
        """Hold an exclusive flock on ``<path>.lock``; yields the lock file's path.

        flock belongs to the open file description, so two threads of one process that each
        open the lock file exclude each other just like two processes do. Because
        :meth:`delete` unlinks the lock file, a waiter may wake up holding a lock on an inode
        that is no longer linked; it then retries on the current file, otherwise two writers
        could each "hold" a different inode of the same lock.
        """
        lock_path = path + LOCK_SUFFIX
        while True:
            fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                held = os.fstat(fd)
                try:
                    linked = os.stat(lock_path)
                except FileNotFoundError:
                    linked = None
            except BaseException:
                os.close(fd)
                raise
            if linked is not None and (linked.st_dev, linked.st_ino) == (
                held.st_dev,
                held.st_ino,
            ):
                break
            os.close(fd)
        try:
            yield lock_path
        finally:
            os.close(fd)  # releases the flock

    def _write_atomic(self, path: str, data: bytes) -> None:
        """Temp file in the same directory + fsync + ``os.replace`` + directory fsync."""
        directory = os.path.dirname(path)
        tmp = os.path.join(directory, f"{TEMP_PREFIX}{secrets.token_hex(8)}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
        try:
            # Keep the permissions of a file we replace (matters for --in-place on a user's
            # own transcript, which may well be 0600).
            with suppress(*_MISSING):
                os.fchmod(fd, stat.S_IMODE(os.stat(path).st_mode))
            view = memoryview(data)
            while view:
                written = os.write(fd, view)
                view = view[written:]
            os.fsync(fd)
        except BaseException:
            os.close(fd)
            _unlink_quietly(tmp)
            raise
        os.close(fd)
        try:
            os.replace(tmp, path)
        except BaseException:
            _unlink_quietly(tmp)
            raise
        _fsync_dir(directory)

    def _makedirs(self, directory: str) -> None:
        """Create ``directory`` and missing parents, fsyncing each new entry's parent.

        ``os.makedirs`` alone would leave the new directory entries only in the page cache; a
        crash could then lose a freshly created session directory together with its files.
        """
        missing: builtins.list[str] = []
        current = directory
        while not os.path.isdir(current):
            missing.append(current)
            parent = os.path.dirname(current)
            if parent == current:
                break
            current = parent
        for new_dir in reversed(missing):
            try:
                os.mkdir(new_dir, 0o777)
            except FileExistsError:
                if not os.path.isdir(new_dir):
                    raise NotADirectoryError(
                        errno.ENOTDIR, "a file is in the way of a key prefix", new_dir
                    ) from None
                continue  # a concurrent writer created it
            _fsync_dir(os.path.dirname(new_dir))


def _unlink_quietly(path: str) -> None:
    with suppress(OSError):
        os.unlink(path)
