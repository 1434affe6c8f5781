"""HTTP plumbing shared by the LLM providers: one pooled client per process, hard deadlines.

Why it looks like this:

* A Celery ``threads`` worker runs 32–64 LLM calls at once in one process. A client per call
  throws keep-alive away, and an unlocked lazily created global was measured to build several
  pools under load and overshoot the connection cap (celery-s3-notes §2). So there is exactly one
  ``httpx.Client`` per process, created once under a lock, with ``max_connections`` sized to the
  configured concurrency (``configure_shared_client`` or ``COMPACTD_LLM_CONCURRENCY``, default
  64) so a thread never queues locally for a connection it could have had.
* Celery prefork children must not reuse sockets inherited from the parent, so the client is
  dropped in the child after ``os.fork`` (``os.register_at_fork``) and rebuilt lazily there.
* The threads pool does not enforce Celery time limits, and httpx has no total timeout: its read
  timeout is per socket read, so a server that trickles a byte every few seconds, or accepts the
  request and never answers, can hold a worker thread for ever.

How the total deadline works. Every call made through ``post_json`` runs inside a per-thread
*call scope* holding an absolute ``time.monotonic()`` deadline (and optionally a cancellation
check). The shared client's transport uses our own httpcore network backend, which wraps every
socket operation of the calling thread: a connect, a TLS handshake, each write and each read gets
``min(its httpx timeout, deadline - now)`` as its socket timeout, and an operation that would
start after the deadline fails at once. So one blocked ``recv`` can never outlive the deadline
(a hung server), and many small successful reads cannot add up past it (a trickling server):
the call ends within a few milliseconds of the deadline, whatever the server does, without any
watchdog thread, and httpcore closes the interrupted connection instead of returning it to the
pool. When a cancellation check is given, a blocked read wakes every ``CANCEL_POLL_SECONDS`` to
look at it, so a cancelled call stops mid-request too. The body is streamed with a size cap, so
an endless response cannot exhaust memory either. Calls made outside a scope (nobody else should
use this client) behave like plain httpx.

The client ignores ``HTTP(S)_PROXY`` and friends (``trust_env=False``): a proxy transport
mounted from the environment would bypass the deadline backend. Redirects are not followed.

``post_json`` turns transport failures into the summarizer error types, and
``raise_for_provider_status`` maps HTTP status codes and error bodies (overflow detection via
``pipeline.overflow``). Error texts are trimmed and scrubbed: API keys and prompt text never
reach an exception, a log line or a job record.
"""

from __future__ import annotations

import email.utils
import json
import logging
import os
import ssl
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import httpcore
import httpx

from pipeline.overflow import is_overflow_error_text
from pipeline.summarizer import (
    ContextOverflowError,
    SummarizerCancelledError,
    SummarizerError,
    SummarizerTimeoutError,
    TransientSummarizerError,
)

__all__ = [
    "CANCEL_POLL_SECONDS",
    "DEFAULT_CONCURRENCY",
    "CallCancelled",
    "CallTimeouts",
    "HttpResult",
    "call_scope",
    "close_shared_client",
    "configure_shared_client",
    "decode_json_object",
    "parse_retry_after",
    "post_json",
    "raise_for_provider_status",
    "scrub",
    "shared_client",
]

logger = logging.getLogger("compactd.providers")

DEFAULT_CONCURRENCY = 64
CONCURRENCY_ENV = "COMPACTD_LLM_CONCURRENCY"
CANCEL_POLL_SECONDS = 0.1
# Idle keep-alive connections are kept this long; httpcore checks an idle socket is still
# readable before reusing it, so a server closing earlier costs a reconnect, not an error.
KEEPALIVE_EXPIRY_SECONDS = 20.0
DEFAULT_MAX_RESPONSE_BYTES = 16 * 1024 * 1024
_WRITE_SLICE_BYTES = 64 * 1024
_MAX_ERROR_DETAIL_CHARS = 300
# Statuses worth another attempt: throttling, timeouts at the edge, and server-side failures
# (529 is Anthropic's "overloaded").
_TRANSIENT_STATUSES = frozenset({408, 409, 425, 429})


@dataclass(frozen=True)
class CallTimeouts:
    """Timeouts for one HTTP attempt, in seconds.

    ``connect``/``read``/``write``/``pool`` are httpx's per-operation timeouts (read is per socket
    read, not per response); ``total`` is the wall-clock deadline of the whole attempt, enforced
    by the deadline backend described in the module docstring.
    """

    connect: float = 5.0
    read: float = 120.0
    write: float = 30.0
    pool: float = 10.0
    total: float = 180.0

    def __post_init__(self) -> None:
        for name in ("connect", "read", "write", "pool", "total"):
            if not getattr(self, name) > 0:
                raise ValueError(f"CallTimeouts.{name} must be > 0")


class CallCancelled(Exception):
    """Raised from inside a socket operation when the call scope's cancellation check fires."""


# --------------------------------------------------------------------------------------------
# Per-thread call scope and the deadline-enforcing network backend
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Scope:
    deadline: float
    cancelled: Callable[[], bool] | None

    def check_cancelled(self) -> None:
        if self.cancelled is not None and self.cancelled():
            raise CallCancelled("call cancelled")

    def limit(self, timeout: float | None) -> float:
        """Absolute end time of one socket operation: its own timeout or the deadline."""
        if timeout is None:
            return self.deadline
        return min(time.monotonic() + timeout, self.deadline)


_local = threading.local()


def _scope() -> _Scope | None:
    scope: _Scope | None = getattr(_local, "scope", None)
    return scope


@contextmanager
def call_scope(deadline: float, cancelled: Callable[[], bool] | None = None) -> Iterator[None]:
    """Bound every socket operation this thread makes through the shared client.

    ``deadline`` is an absolute ``time.monotonic()`` value. Scopes nest; the inner one wins
    while it is active.
    """
    previous = _scope()
    _local.scope = _Scope(deadline, cancelled)
    try:
        yield
    finally:
        _local.scope = previous


class _DeadlineStream(httpcore.NetworkStream):
    """A socket stream whose reads and writes cannot outlive the calling thread's deadline."""

    def __init__(self, inner: httpcore.NetworkStream) -> None:
        self._inner = inner

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        scope = _scope()
        if scope is None:
            return self._inner.read(max_bytes, timeout)
        end = scope.limit(timeout)
        while True:
            scope.check_cancelled()
            remaining = end - time.monotonic()
            if remaining <= 0:
                what = "total deadline" if end >= scope.deadline else "read timeout"
                raise httpcore.ReadTimeout(f"{what} exceeded while reading")
            if scope.cancelled is not None:
                remaining = min(remaining, CANCEL_POLL_SECONDS)
            try:
                # A timed-out recv consumes nothing (plain or TLS), so it is safe to retry.
                return self._inner.read(max_bytes, remaining)
            except httpcore.ReadTimeout:
                continue

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        scope = _scope()
        if scope is None:
            self._inner.write(buffer, timeout)
            return
        end = scope.limit(timeout)
        view = memoryview(buffer)
        # Slices, so that a large body sent to a slow reader re-checks the deadline as it goes.
        for start in range(0, len(view), _WRITE_SLICE_BYTES):
            scope.check_cancelled()
            remaining = end - time.monotonic()
            if remaining <= 0:
                raise httpcore.WriteTimeout("deadline exceeded while writing")
            self._inner.write(bytes(view[start : start + _WRITE_SLICE_BYTES]), remaining)

    def close(self) -> None:
        self._inner.close()

    def start_tls(
        self,
        ssl_context: ssl.SSLContext,
        server_hostname: str | None = None,
        timeout: float | None = None,
    ) -> httpcore.NetworkStream:
        return _DeadlineStream(
            self._inner.start_tls(ssl_context, server_hostname, _connect_budget(timeout))
        )

    def get_extra_info(self, info: str) -> Any:
        return self._inner.get_extra_info(info)


def _connect_budget(timeout: float | None) -> float | None:
    scope = _scope()
    if scope is None:
        return timeout
    scope.check_cancelled()
    remaining = scope.limit(timeout) - time.monotonic()
    if remaining <= 0:
        raise httpcore.ConnectTimeout("deadline exceeded before connecting")
    return remaining


class _DeadlineBackend(httpcore.NetworkBackend):
    """httpcore's blocking socket backend with every stream wrapped in ``_DeadlineStream``."""

    def __init__(self) -> None:
        self._inner = httpcore.SyncBackend()

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.NetworkStream:
        stream = self._inner.connect_tcp(
            host, port, _connect_budget(timeout), local_address, socket_options
        )
        return _DeadlineStream(stream)

    def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.NetworkStream:
        stream = self._inner.connect_unix_socket(path, _connect_budget(timeout), socket_options)
        return _DeadlineStream(stream)

    def sleep(self, seconds: float) -> None:
        self._inner.sleep(seconds)


class _DeadlineTransport(httpx.HTTPTransport):
    """``httpx.HTTPTransport`` whose connection pool uses the deadline backend.

    httpx does not let a caller choose the network backend, so the pool built by the parent
    constructor is replaced by an identical one that does (httpx is pinned below 0.29; the
    hang/trickle tests fail loudly if this ever stops taking effect).
    """

    def __init__(self, limits: httpx.Limits) -> None:
        ssl_context = httpx.create_ssl_context()
        super().__init__(verify=ssl_context, limits=limits, trust_env=False)
        self._pool = httpcore.ConnectionPool(
            ssl_context=ssl_context,
            max_connections=limits.max_connections,
            max_keepalive_connections=limits.max_keepalive_connections,
            keepalive_expiry=limits.keepalive_expiry,
            network_backend=_DeadlineBackend(),
        )


# --------------------------------------------------------------------------------------------
# The shared client
# --------------------------------------------------------------------------------------------

_lock = threading.Lock()
_client: httpx.Client | None = None
_client_pid: int | None = None
_configured_concurrency: int | None = None


def _concurrency() -> int:
    if _configured_concurrency is not None:
        return _configured_concurrency
    return _env_concurrency()


def _env_concurrency() -> int:
    raw = os.environ.get(CONCURRENCY_ENV, "").strip()
    if raw:
        try:
            value = int(raw)
        except ValueError:
            raise ValueError(f"{CONCURRENCY_ENV} must be an integer, got {raw!r}") from None
        if value < 1:
            raise ValueError(f"{CONCURRENCY_ENV} must be >= 1")
        return value
    return DEFAULT_CONCURRENCY


def configure_shared_client(*, concurrency: int | None) -> None:
    """Size the process's connection pool (call from ``worker_process_init``/``worker_init``).

    ``concurrency`` is the number of threads that may call a provider at once; the pool gets
    that many connections. ``None`` goes back to ``COMPACTD_LLM_CONCURRENCY`` or 64. Raises
    ``RuntimeError`` if the client already exists with another size: swapping a pool under
    threads that are using it would break their calls.
    """
    global _configured_concurrency
    if concurrency is not None and concurrency < 1:
        raise ValueError("concurrency must be >= 1")
    with _lock:
        if _client is not None and _client_pid == os.getpid():
            current = _concurrency()
            wanted = concurrency if concurrency is not None else _env_concurrency()
            if current != wanted:
                raise RuntimeError(
                    "the shared HTTP client already exists; configure it before the first call"
                )
        _configured_concurrency = concurrency


def shared_client() -> httpx.Client:
    """The process-wide pooled client, created on first use (thread-safe, fork-aware)."""
    global _client, _client_pid
    client = _client
    if client is not None and _client_pid == os.getpid():
        return client
    with _lock:
        if _client is None or _client_pid != os.getpid():
            size = _concurrency()
            defaults = CallTimeouts()
            _client = httpx.Client(
                transport=_DeadlineTransport(
                    httpx.Limits(
                        max_connections=size,
                        max_keepalive_connections=size,
                        keepalive_expiry=KEEPALIVE_EXPIRY_SECONDS,
                    )
                ),
                timeout=httpx.Timeout(
                    connect=defaults.connect,
                    read=defaults.read,
                    write=defaults.write,
                    pool=defaults.pool,
                ),
                trust_env=False,
                follow_redirects=False,
            )
            _client_pid = os.getpid()
        return _client


def close_shared_client() -> None:
    """Close and forget the shared client (tests, worker shutdown). The next call rebuilds it."""
    global _client, _client_pid
    with _lock:
        client, _client, _client_pid = _client, None, None
    if client is not None:
        client.close()


def _reset_after_fork() -> None:
    # The child must not touch the parent's sockets, and a lock held by another parent thread
    # at fork time would never be released here: start over with fresh state. The inherited
    # client is deliberately not closed (closing could disturb the parent's connections).
    global _lock, _client, _client_pid
    _lock = threading.Lock()
    _client = None
    _client_pid = None


os.register_at_fork(after_in_child=_reset_after_fork)


# --------------------------------------------------------------------------------------------
# One POST, with transport errors mapped to summarizer errors
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class HttpResult:
    """A complete HTTP response (any status)."""

    status: int
    headers: httpx.Headers
    body: bytes
    elapsed: float

    def text(self) -> str:
        return self.body.decode("utf-8", errors="replace")


def post_json(
    url: str,
    payload: Mapping[str, Any],
    *,
    headers: Mapping[str, str],
    timeouts: CallTimeouts,
    provider: str,
    deadline: float | None = None,
    cancelled: Callable[[], bool] | None = None,
    max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES,
) -> HttpResult:
    """POST ``payload`` as JSON through the shared client and read the whole response.

    The attempt ends at ``now + timeouts.total`` or ``deadline`` (absolute monotonic), whichever
    is first. Any status is returned; transport failures raise: ``SummarizerCancelledError``,
    ``SummarizerTimeoutError`` (deadline, read/write timeout, no pooled connection in time),
    ``TransientSummarizerError`` (refused/reset connection, connect timeout before the deadline,
    server hung up), ``SummarizerError`` (anything else, e.g. an oversized response).
    """
    start = time.monotonic()
    end = start + timeouts.total if deadline is None else min(start + timeouts.total, deadline)
    host = httpx.URL(url).host
    if end <= start:
        raise SummarizerTimeoutError(f"{provider}: no time left for the call to {host}")
    if cancelled is not None and cancelled():
        raise SummarizerCancelledError(f"{provider}: cancelled before the call")

    def bound(value: float) -> float:
        return max(0.001, min(value, end - time.monotonic()))

    content = json.dumps(payload, ensure_ascii=False).encode("utf-8")
    request_headers = {"content-type": "application/json", **headers}
    client = shared_client()
    try:
        with (
            call_scope(end, cancelled),
            client.stream(
                "POST",
                url,
                content=content,
                headers=request_headers,
                timeout=httpx.Timeout(
                    connect=bound(timeouts.connect),
                    read=bound(timeouts.read),
                    write=bound(timeouts.write),
                    pool=bound(timeouts.pool),
                ),
            ) as response,
        ):
            chunks: list[bytes] = []
            size = 0
            for chunk in response.iter_bytes():
                size += len(chunk)
                if size > max_response_bytes:
                    raise SummarizerError(
                        f"{provider}: response from {host} larger than {max_response_bytes} bytes"
                    )
                chunks.append(chunk)
                if time.monotonic() > end:  # belt and braces; the backend already bounds
                    raise httpcore.ReadTimeout("total deadline exceeded")
            return HttpResult(
                status=response.status_code,
                headers=response.headers,
                body=b"".join(chunks),
                elapsed=time.monotonic() - start,
            )
    except CallCancelled:
        raise SummarizerCancelledError(f"{provider}: cancelled during the call") from None
    except (httpx.TimeoutException, httpcore.TimeoutException) as exc:
        now = time.monotonic()
        waited = now - start
        if now >= end - 0.005:
            raise SummarizerTimeoutError(
                f"{provider}: call to {host} exceeded its deadline after {waited:.1f}s"
            ) from None
        if isinstance(exc, httpx.ConnectTimeout):
            raise TransientSummarizerError(
                f"{provider}: connect timeout to {host} after {waited:.1f}s"
            ) from None
        if isinstance(exc, httpx.PoolTimeout):
            raise SummarizerTimeoutError(
                f"{provider}: no free connection to {host} within {timeouts.pool:.1f}s"
            ) from None
        raise SummarizerTimeoutError(
            f"{provider}: {type(exc).__name__} from {host} after {waited:.1f}s"
        ) from None
    except (httpx.NetworkError, httpx.RemoteProtocolError, httpx.DecodingError) as exc:
        raise TransientSummarizerError(
            f"{provider}: {type(exc).__name__} talking to {host}: {_trim(str(exc))}"
        ) from None
    except httpx.HTTPError as exc:
        raise SummarizerError(
            f"{provider}: {type(exc).__name__} talking to {host}: {_trim(str(exc))}"
        ) from None


# --------------------------------------------------------------------------------------------
# Status and body handling
# --------------------------------------------------------------------------------------------


def parse_retry_after(headers: Mapping[str, str], *, now: datetime | None = None) -> float | None:
    """Seconds the server asked us to wait, from ``retry-after-ms`` or ``retry-after``.

    ``retry-after`` may be delta-seconds or an HTTP date (RFC 9110 §10.2.3). Junk is ignored.
    """
    lowered = {k.lower(): v for k, v in headers.items()}
    raw_ms = lowered.get("retry-after-ms")
    if raw_ms:
        try:
            value = float(raw_ms) / 1000.0
            if value >= 0 and value == value:
                return value
        except ValueError:
            pass
    raw = lowered.get("retry-after")
    if not raw:
        return None
    raw = raw.strip()
    try:
        seconds = float(raw)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(raw)
        except (TypeError, ValueError, IndexError):
            return None
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
        reference = now or datetime.now(UTC)
        return max(0.0, (when - reference).total_seconds())
    if seconds != seconds or seconds < 0 or seconds == float("inf"):
        return None
    return seconds


def scrub(text: str, *, secrets: Sequence[str] = (), prompt: str = "") -> str:
    """Remove secrets and any verbatim run of prompt text from an error text.

    Some servers echo the request in validation errors; transcript text must not end up in an
    exception (it travels to job records, Flower and logs). A 32-char window of ``text`` that
    occurs in ``prompt`` is treated as prompt text and replaced with ``[…]``.
    """
    for secret in secrets:
        if secret and len(secret) >= 4:
            text = text.replace(secret, "[redacted]")
    window = 32
    if prompt and len(text) >= window:
        covered = [False] * len(text)
        for i in range(0, len(text) - window + 1, 4):
            if text[i : i + window] in prompt:
                for j in range(i, i + window):
                    covered[j] = True
        if any(covered):
            out: list[str] = []
            in_run = False
            for ch, hit in zip(text, covered, strict=True):
                if hit:
                    if not in_run:
                        out.append("[…]")
                    in_run = True
                else:
                    out.append(ch)
                    in_run = False
            text = "".join(out)
    return text


def _trim(text: str, limit: int = _MAX_ERROR_DETAIL_CHARS) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _error_message(body: str) -> str:
    """The provider's own message when the body is the usual JSON error, else the body."""
    try:
        data = json.loads(body)
    except ValueError:
        return body
    if isinstance(data, dict):
        error = data.get("error")
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return str(error["message"])
        if isinstance(error, str):
            return error
        if isinstance(data.get("message"), str):
            return str(data["message"])
        if isinstance(data.get("detail"), str):
            return str(data["detail"])
    return body


def raise_for_provider_status(
    result: HttpResult,
    *,
    provider: str,
    secrets: Sequence[str] = (),
    prompt: str = "",
) -> None:
    """Map a non-2xx response to the summarizer error that tells the caller what to do.

    * overflow text in the body (any status but 429), or 413 → ``ContextOverflowError``:
      re-plan smaller, never retry as is;
    * 408/409/425/429, 5xx, 529 → ``TransientSummarizerError`` with the server's Retry-After;
    * any other status → ``SummarizerError`` with the status and a trimmed, scrubbed body.
    """
    status = result.status
    if 200 <= status < 300:
        return
    body = result.text()
    message = _error_message(body)
    detail = _trim(scrub(message, secrets=secrets, prompt=prompt)) or "(no body)"
    if status == 413 or (
        status != 429 and (is_overflow_error_text(message) or is_overflow_error_text(body))
    ):
        raise ContextOverflowError(f"{provider}: HTTP {status}: {detail}")
    if status in _TRANSIENT_STATUSES or status >= 500:
        raise TransientSummarizerError(
            f"{provider}: HTTP {status}: {detail}",
            retry_after=parse_retry_after(result.headers),
        )
    raise SummarizerError(f"{provider}: HTTP {status}: {detail}")


def decode_json_object(
    result: HttpResult, *, provider: str, secrets: Sequence[str] = (), prompt: str = ""
) -> dict[str, Any]:
    """Parse a 2xx body as a JSON object, or raise a non-retryable ``SummarizerError``.

    A 200 that is not JSON is usually a proxy or captive portal page; retrying the same URL
    does not help, the fallback chain does.
    """
    try:
        data = json.loads(result.body)
    except ValueError:
        snippet = _trim(scrub(result.text(), secrets=secrets, prompt=prompt), 120)
        raise SummarizerError(
            f"{provider}: HTTP {result.status} with a non-JSON body: {snippet}"
        ) from None
    if not isinstance(data, dict):
        raise SummarizerError(f"{provider}: HTTP {result.status} with a non-object JSON body")
    return data
