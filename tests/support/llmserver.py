"""A scripted local LLM server: real HTTP on 127.0.0.1, OpenAI and Anthropic wire formats.

Tests and benchmarks talk to it over sockets exactly as they would talk to vLLM or Anthropic,
so the provider code, the shared connection pool, deadlines and retries are exercised for real
(DESIGN §7: mocks only where a real part cannot run here).

* ``POST …/chat/completions`` answers in the OpenAI chat completion format, ``POST …/messages``
  in the Anthropic Messages format (any path prefix, e.g. ``/v1``).
* By default it answers with a structured summary *built from the prompt* (see
  ``build_summary``), so normal-path tests see realistic text: the five required headings in
  order, constraints, the latest user ask, identifiers, and everything of a previous summary.
* Faults are scripted per test: ``server.script(Behavior.rate_limited(1), Behavior.summary())``
  queues behaviours consumed one per request (optionally only by requests for one model);
  ``server.always(model, behavior)`` makes a model fail for good; ``server.latency`` delays
  every answer. Hangs and trickles end when the server stops.
* Every request is recorded (path, headers with credential values redacted, parsed body,
  model, arrival time on ``time.monotonic()``), and the peak number of requests in flight is
  tracked to prove parallelism.

Run standalone for benchmarks::

    python -m tests.support.llmserver --port 8099 --latency 0.5
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import signal
import socket
import threading
import time
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import FrameType, TracebackType
from typing import Any, Literal
from urllib.parse import urlsplit

import pytest

__all__ = [
    "REQUIRED_HEADINGS",
    "Behavior",
    "RecordedRequest",
    "ScriptedLLMServer",
    "build_summary",
    "llm_server",
]

REQUIRED_HEADINGS: tuple[str, ...] = (
    "## Decisions",
    "## Open TODOs",
    "## Constraints/Rules",
    "## Pending user asks",
    "## Exact identifiers",
)

Api = Literal["openai", "anthropic"]
Kind = Literal["reply", "error", "overflow", "hang", "trickle"]

_REDACTED = "<redacted>"
_CREDENTIAL_HEADERS = frozenset({"authorization", "x-api-key", "api-key", "proxy-authorization"})


# --------------------------------------------------------------------------------------------
# Behaviours
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Behavior:
    """What the server does with one request. Build them with the class methods.

    ``text=None`` means the default summary built from the prompt. ``delay`` is slept before
    answering (on top of the server's global latency).
    """

    kind: Kind = "reply"
    text: str | None = None
    finish: str | None = None  # "length" → finish_reason/stop_reason for a truncated answer
    status: int = 200
    body: Any = None  # error body: dict (sent as JSON) or str
    headers: tuple[tuple[str, str], ...] = ()
    delay: float = 0.0
    drop_headings: tuple[str, ...] = ()
    cached_tokens: int = 0
    cache_write_tokens: int = 0
    trickle_interval: float = 0.1
    trickle_bytes: int = 1
    trickle_headers: bool = False

    # -- successful answers ------------------------------------------------------------------
    @classmethod
    def summary(cls, *, cached_tokens: int = 0, cache_write_tokens: int = 0) -> Behavior:
        """The default structured summary built from the prompt."""
        return cls(cached_tokens=cached_tokens, cache_write_tokens=cache_write_tokens)

    @classmethod
    def reply(cls, text: str) -> Behavior:
        """Answer with exactly ``text``."""
        return cls(text=text)

    @classmethod
    def empty(cls) -> Behavior:
        """A 200 with no text at all (finish_reason ``stop``)."""
        return cls(text="")

    @classmethod
    def length_empty(cls) -> Behavior:
        """A 200 with no text that stopped on the output limit (``length``/``max_tokens``)."""
        return cls(text="", finish="length")

    @classmethod
    def missing_headings(cls, *headings: str) -> Behavior:
        """The default summary without ``headings`` (default: all five required headings)."""
        return cls(drop_headings=headings or REQUIRED_HEADINGS)

    # -- errors ------------------------------------------------------------------------------
    @classmethod
    def rate_limited(cls, retry_after: float | str | None = None) -> Behavior:
        """429, with ``Retry-After`` when given (seconds or an HTTP date string)."""
        headers = () if retry_after is None else (("Retry-After", _header_value(retry_after)),)
        return cls(kind="error", status=429, headers=headers, body="rate_limit")

    @classmethod
    def server_error(cls, status: int = 500) -> Behavior:
        return cls(kind="error", status=status, body="server_error")

    @classmethod
    def unavailable(cls, retry_after: float | str | None = None) -> Behavior:
        """503, with ``Retry-After`` when given."""
        headers = () if retry_after is None else (("Retry-After", _header_value(retry_after)),)
        return cls(kind="error", status=503, headers=headers, body="unavailable")

    @classmethod
    def overloaded(cls) -> Behavior:
        """Anthropic's 529 ``overloaded_error``."""
        return cls(kind="error", status=529, body="overloaded")

    @classmethod
    def overflow(cls) -> Behavior:
        """400 context overflow, in the wire format of the endpoint that was called."""
        return cls(kind="overflow", status=400)

    @classmethod
    def error(cls, status: int, body: Any, headers: Sequence[tuple[str, str]] = ()) -> Behavior:
        """Any status with a custom body (dict → JSON, str → text)."""
        return cls(kind="error", status=status, body=body, headers=tuple(headers))

    # -- timing ------------------------------------------------------------------------------
    @classmethod
    def slow(cls, seconds: float, then: Behavior | None = None) -> Behavior:
        """Wait ``seconds`` before doing ``then`` (default: the normal summary)."""
        return replace(then or cls(), delay=seconds)

    @classmethod
    def hang(cls) -> Behavior:
        """Accept the request and never answer (until the server stops)."""
        return cls(kind="hang")

    @classmethod
    def trickle(cls, interval: float = 0.1, nbytes: int = 1, *, headers: bool = False) -> Behavior:
        """Send the answer ``nbytes`` at a time every ``interval`` seconds.

        By default the status line and headers go out at once and only the body trickles;
        ``headers=True`` trickles the status line and headers too (no response object exists
        on the client side yet, so only a socket-level deadline can stop it).
        """
        return cls(
            kind="trickle", trickle_interval=interval, trickle_bytes=nbytes, trickle_headers=headers
        )


def _header_value(value: float | str) -> str:
    if isinstance(value, str):
        return value
    return str(int(value)) if float(value).is_integer() else str(value)


# --------------------------------------------------------------------------------------------
# Default summary built from the prompt
# --------------------------------------------------------------------------------------------

_SPEAKER = re.compile(
    r"^\[(User(?: sender=[^\]]*)?|Assistant|Assistant thinking|Assistant tool calls|"
    r"Tool result)\]:\s?(.*)$"
)
_CONSTRAINT = re.compile(r"\b(never|always|don't|do not|must)\b", re.IGNORECASE)
_TODO = re.compile(r"\b(todo|fixme|next step|still need to)\b|- \[ \]", re.IGNORECASE)
_IDENTIFIER = re.compile(
    r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"  # UUID
    r"|https?://[^\s<>\"'`]+"  # URL
    r"|(?<![\w.:/~-])/(?:[\w.@+~-]+/)+[\w.@+~-]+"  # absolute POSIX path, >= 2 segments
    r"|\b[A-Za-z]:\\[^\s\"'<>`]+"  # Windows path
    r"|\b[A-Za-z0-9][\w-]*(?:\.[\w-]+)*:\d{1,5}\b"  # host:port
    r"|\b[0-9a-fA-F]{8,}\b"  # hex hash >= 8
)
_STRIP_LEAD = "(\"'`[{<"
_STRIP_TRAIL = ")]\"'`,;:.!?<>"


def _block(prompt: str, tag: str) -> str | None:
    match = re.search(rf"<{tag}>\n?(.*?)\n?</{tag}>", prompt, re.DOTALL)
    return match.group(1) if match else None


def _entries(conversation: str) -> list[tuple[str, str]]:
    """(speaker, text) pairs; continuation lines belong to the entry above them."""
    entries: list[tuple[str, str]] = []
    for line in conversation.splitlines():
        match = _SPEAKER.match(line)
        if match:
            speaker = "User" if match.group(1).startswith("User") else match.group(1)
            entries.append((speaker, match.group(2)))
        elif entries and line.strip():
            speaker, text = entries[-1]
            entries[-1] = (speaker, f"{text}\n{line}")
    return entries


def _identifiers(text: str) -> list[str]:
    found: list[str] = []
    for match in _IDENTIFIER.finditer(text):
        value = match.group(0).lstrip(_STRIP_LEAD).rstrip(_STRIP_TRAIL)
        if len(value) >= 4 and value not in found:
            found.append(value)
    return found


def _sections(summary: str) -> tuple[dict[str, list[str]], list[str]]:
    """Split a previous summary into required-section bodies and everything else."""
    required: dict[str, list[str]] = {h: [] for h in REQUIRED_HEADINGS}
    other: list[str] = []
    current: str | None = None
    for line in summary.splitlines():
        stripped = line.strip()
        if stripped in required:
            current = stripped
            continue
        if stripped.startswith("## "):
            current = None
            other.append("#" + stripped)  # demote: the other headings become subsections
            continue
        if not stripped:
            continue
        if current is None:
            other.append(line)
        else:
            required[current].append(line)
    return required, other


def _one_line(text: str, limit: int = 300) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def _bullet(line: str) -> str:
    stripped = line.strip()
    return (
        stripped
        if stripped.startswith(("- ", "* ", "Latest user request context:"))
        else (f"- {stripped}")
    )


def build_summary(prompt: str) -> str:
    """A deterministic structured summary of the ``<conversation>`` in ``prompt``.

    * ``## Decisions``: the first line of each ``[Assistant]:`` entry;
    * ``## Open TODOs``: lines mentioning TODO/FIXME/next step/unchecked boxes;
    * ``## Constraints/Rules``: every line with never/always/don't/do not/must, verbatim;
    * ``## Pending user asks``: the last ``[User]:`` entry (led by ``Latest user request
      context: "<json>"`` when the instructions ask for that line);
    * ``## Exact identifiers``: every UUID, URL, path, host:port and hex hash (≥ 8) found.

    A ``<previous-summary>`` is kept whole: its required-section lines are merged into ours
    (theirs first) and any other section is carried under ``## Earlier context``.
    """
    conversation = _block(prompt, "conversation")
    previous = _block(prompt, "previous-summary")
    source = conversation if conversation is not None else prompt
    entries = _entries(source)

    carried: dict[str, list[str]] = {h: [] for h in REQUIRED_HEADINGS}
    earlier: list[str] = []
    if previous:
        carried, earlier = _sections(previous)

    decisions = [
        _one_line(text.splitlines()[0] if text else "", 200)
        for speaker, text in entries
        if speaker == "Assistant" and text.strip()
    ]
    constraints: list[str] = []
    todos: list[str] = []
    for line in source.splitlines():
        match = _SPEAKER.match(line)
        content = (match.group(2) if match else line).strip()
        if not content:
            continue
        if _CONSTRAINT.search(content):
            constraints.append(content)
        if _TODO.search(content):
            todos.append(content)
    user_texts = [text for speaker, text in entries if speaker == "User" and text.strip()]
    latest = _one_line(user_texts[-1]) if user_texts else ""
    identifiers = _identifiers(source + "\n" + (previous or ""))

    pending: list[str] = []
    if latest and "Latest user request context" in prompt:
        pending.append(f"Latest user request context: {json.dumps(latest, ensure_ascii=False)}")
    if latest:
        pending.append(f"- {latest}")
    for line in carried["## Pending user asks"]:
        text = line.strip()
        if text.startswith("Latest user request context:"):
            text = "earlier request: " + text.removeprefix("Latest user request context:").strip()
        pending.append(_bullet(text))

    def merge(heading: str, fresh: list[str]) -> list[str]:
        out: list[str] = []
        for item in [*(_bullet(x) for x in carried[heading]), *(_bullet(x) for x in fresh)]:
            if item not in out:
                out.append(item)
        return out or ["- (none)"]

    body: dict[str, list[str]] = {
        "## Decisions": merge("## Decisions", decisions),
        "## Open TODOs": merge("## Open TODOs", todos),
        "## Constraints/Rules": merge("## Constraints/Rules", constraints),
        "## Pending user asks": list(dict.fromkeys(pending)) or ["- (none)"],
        "## Exact identifiers": [f"- {value}" for value in identifiers] or ["- (none)"],
    }
    lines = ["## Goal", f"- {_one_line(user_texts[0], 200) if user_texts else '(unknown)'}", ""]
    for heading in REQUIRED_HEADINGS:
        lines.append(heading)
        lines.extend(body[heading])
        lines.append("")
    if earlier:
        lines.append("## Earlier context")
        lines.extend(earlier)
        lines.append("")
    return "\n".join(lines).strip() + "\n"


# --------------------------------------------------------------------------------------------
# Wire formats
# --------------------------------------------------------------------------------------------


def _prompt_of(api: Api, body: dict[str, Any]) -> str:
    """The user text of a request (the last user message), whatever the content shape."""
    messages = body.get("messages")
    if not isinstance(messages, list):
        return ""
    for message in reversed(messages):
        if isinstance(message, dict) and message.get("role") == "user":
            content = message.get("content")
            if isinstance(content, str):
                return content
            if isinstance(content, list):
                return "\n".join(
                    str(part.get("text", ""))
                    for part in content
                    if isinstance(part, dict) and part.get("type") == "text"
                )
    return ""


def _openai_reply(model: str, text: str, finish: str, prompt: str, b: Behavior) -> dict[str, Any]:
    prompt_tokens = max(1, len(prompt) // 4)
    return {
        "id": f"chatcmpl-{time.monotonic_ns()}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "finish_reason": finish,
            }
        ],
        "usage": {
            "prompt_tokens": prompt_tokens + b.cached_tokens,
            "completion_tokens": len(text) // 4,
            "total_tokens": prompt_tokens + b.cached_tokens + len(text) // 4,
            "prompt_tokens_details": {"cached_tokens": b.cached_tokens},
        },
    }


def _anthropic_reply(model: str, text: str, stop: str, prompt: str, b: Behavior) -> dict[str, Any]:
    return {
        "id": f"msg_{time.monotonic_ns()}",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [{"type": "text", "text": text}] if text else [],
        "stop_reason": stop,
        "stop_sequence": None,
        "usage": {
            "input_tokens": max(1, len(prompt) // 4),
            "output_tokens": len(text) // 4,
            "cache_read_input_tokens": b.cached_tokens,
            "cache_creation_input_tokens": b.cache_write_tokens,
        },
    }


_ERROR_TEXT = {
    "rate_limit": ("rate_limit_error", "Rate limit reached for requests. Please try again."),
    "server_error": ("api_error", "The server had an error while processing your request."),
    "unavailable": ("api_error", "Service temporarily unavailable."),
    "overloaded": ("overloaded_error", "Overloaded"),
}


def _error_body(api: Api, behavior: Behavior) -> Any:
    if behavior.kind == "overflow":
        if api == "openai":
            return {
                "error": {
                    "message": "This model's maximum context length is 8192 tokens. However, "
                    "your messages resulted in 12000 tokens. Please reduce the length of the "
                    "messages.",
                    "type": "invalid_request_error",
                    "param": "messages",
                    "code": "context_length_exceeded",
                }
            }
        return {
            "type": "error",
            "error": {
                "type": "invalid_request_error",
                "message": "prompt is too long: 210000 tokens > 200000 maximum",
            },
        }
    if isinstance(behavior.body, str) and behavior.body in _ERROR_TEXT:
        kind, message = _ERROR_TEXT[behavior.body]
        if api == "openai":
            return {"error": {"message": message, "type": kind, "code": None}}
        return {"type": "error", "error": {"type": kind, "message": message}}
    return behavior.body


# --------------------------------------------------------------------------------------------
# The server
# --------------------------------------------------------------------------------------------


@dataclass
class RecordedRequest:
    """One request as the server saw it. Times are ``time.monotonic()`` of this process."""

    path: str
    api: Api | None
    headers: dict[str, str]
    body: Any
    model: str | None
    arrived: float
    behavior: str = ""
    finished: float | None = None

    @property
    def prompt(self) -> str:
        if self.api is None or not isinstance(self.body, dict):
            return ""
        return _prompt_of(self.api, self.body)


@dataclass
class _Scripted:
    behavior: Behavior
    model: str | None


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 256  # benchmarks open many connections at once
    owner: ScriptedLLMServer


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, so the client's pool is really used
    server: _HTTPServer

    def setup(self) -> None:
        super().setup()
        self.server.owner._track(self.connection, add=True)

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            self.server.owner._track(self.connection, add=False)

    def do_POST(self) -> None:
        self.server.owner._handle(self)

    def do_GET(self) -> None:
        self.server.owner._send_json(self, 200, {"object": "list", "data": []})

    def log_message(self, format: str, *args: Any) -> None:
        return


@dataclass
class _State:
    queue: deque[_Scripted] = field(default_factory=deque)
    always: dict[str, Behavior] = field(default_factory=dict)
    requests: list[RecordedRequest] = field(default_factory=list)
    in_flight: int = 0
    max_in_flight: int = 0


class ScriptedLLMServer:
    """The server. ``with ScriptedLLMServer() as server: ... server.url ...``.

    ``url`` is the base URL to give a provider (``http://127.0.0.1:PORT/v1``). Set
    ``expected_api_key`` to make it answer 401 to requests without that key (checked in
    ``Authorization: Bearer`` and ``x-api-key``).
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        latency: float = 0.0,
        expected_api_key: str | None = None,
    ) -> None:
        self.host = host
        self.port = port
        self.latency = latency
        self.expected_api_key = expected_api_key
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._state = _State()
        self._connections: set[socket.socket] = set()
        self._httpd: _HTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> ScriptedLLMServer:
        if self._httpd is not None:
            return self
        self._stop.clear()
        httpd = _HTTPServer((self.host, self.port), _Handler)
        httpd.owner = self
        self.port = int(httpd.server_address[1])
        self._httpd = httpd
        self._thread = threading.Thread(
            target=httpd.serve_forever,
            kwargs={"poll_interval": 0.05},
            daemon=True,
            name=f"llmserver:{self.port}",
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving; hangs and trickles end, open connections are shut down."""
        httpd, self._httpd = self._httpd, None
        if httpd is None:
            return
        self._stop.set()
        httpd.shutdown()
        httpd.server_close()
        with self._lock:
            connections = list(self._connections)
        for conn in connections:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def __enter__(self) -> ScriptedLLMServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    @property
    def root_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def url(self) -> str:
        return f"{self.root_url}/v1"

    # -- scripting ---------------------------------------------------------------------------
    def script(self, *behaviors: Behavior, model: str | None = None) -> None:
        """Queue behaviours, consumed one per request (only by ``model``'s requests if given)."""
        with self._lock:
            self._state.queue.extend(_Scripted(b, model) for b in behaviors)

    def always(self, model: str, behavior: Behavior) -> None:
        """Every request for ``model`` gets ``behavior`` (after the queue is consumed)."""
        with self._lock:
            self._state.always[model] = behavior

    def reset(self) -> None:
        """Forget the script, the rules and the recorded requests."""
        with self._lock:
            self._state = _State()

    # -- observations ------------------------------------------------------------------------
    @property
    def requests(self) -> list[RecordedRequest]:
        with self._lock:
            return list(self._state.requests)

    @property
    def max_in_flight(self) -> int:
        with self._lock:
            return self._state.max_in_flight

    @property
    def in_flight(self) -> int:
        with self._lock:
            return self._state.in_flight

    @property
    def pending_script(self) -> int:
        with self._lock:
            return len(self._state.queue)

    # -- internals ---------------------------------------------------------------------------
    def _track(self, conn: socket.socket, *, add: bool) -> None:
        with self._lock:
            if add:
                self._connections.add(conn)
            else:
                self._connections.discard(conn)

    def _next_behavior(self, model: str | None) -> Behavior:
        with self._lock:
            for index, item in enumerate(self._state.queue):
                if item.model is None or item.model == model:
                    del self._state.queue[index]
                    return item.behavior
            if model is not None and model in self._state.always:
                return self._state.always[model]
        return Behavior.summary()

    def _authorized(self, headers: dict[str, str]) -> bool:
        if not self.expected_api_key:
            return True
        key = self.expected_api_key
        return headers.get("authorization") == f"Bearer {key}" or headers.get("x-api-key") == key

    def _handle(self, h: _Handler) -> None:
        arrived = time.monotonic()
        length = int(h.headers.get("Content-Length") or 0)
        raw = h.rfile.read(length) if length else b""
        path = urlsplit(h.path).path
        api: Api | None = (
            "openai"
            if path.endswith("/chat/completions")
            else "anthropic"
            if path.endswith("/messages")
            else None
        )
        headers = {k.lower(): v for k, v in h.headers.items()}
        try:
            body: Any = json.loads(raw) if raw else None
        except ValueError:
            body = None
        model = body.get("model") if isinstance(body, dict) else None
        recorded = RecordedRequest(
            path=path,
            api=api,
            headers=_redact(headers),
            body=body,
            model=model if isinstance(model, str) else None,
            arrived=arrived,
        )
        with self._lock:
            self._state.requests.append(recorded)
            self._state.in_flight += 1
            self._state.max_in_flight = max(self._state.max_in_flight, self._state.in_flight)
        try:
            if api is None:
                recorded.behavior = "not_found"
                self._send_json(h, 404, {"error": {"message": f"no route for {path}"}})
                return
            if not isinstance(body, dict):
                recorded.behavior = "bad_request"
                self._send_json(h, 400, {"error": {"message": "body is not a JSON object"}})
                return
            if not self._authorized(headers):
                recorded.behavior = "unauthorized"
                self._send_json(h, 401, {"error": {"message": "invalid x-api-key / bearer token"}})
                return
            behavior = self._next_behavior(recorded.model)
            recorded.behavior = behavior.kind
            if self.latency > 0 and self._stop.wait(self.latency):
                h.close_connection = True
                return
            if behavior.delay > 0 and self._stop.wait(behavior.delay):
                h.close_connection = True
                return
            self._perform(h, api, body, behavior, recorded)
        except (BrokenPipeError, ConnectionResetError):
            h.close_connection = True
        finally:
            recorded.finished = time.monotonic()
            with self._lock:
                self._state.in_flight -= 1

    def _perform(
        self, h: _Handler, api: Api, body: dict[str, Any], b: Behavior, rec: RecordedRequest
    ) -> None:
        if b.kind == "hang":
            self._stop.wait()
            h.close_connection = True
            return
        if b.kind in ("error", "overflow"):
            self._send(h, b.status, _error_body(api, b), b.headers)
            return
        prompt = rec.prompt
        model = rec.model or "unknown"
        if b.text is not None:
            text = b.text
        else:
            text = build_summary(prompt)
            for heading in b.drop_headings:
                text = "\n".join(line for line in text.splitlines() if line.strip() != heading)
        if api == "openai":
            payload = _openai_reply(model, text, b.finish or "stop", prompt, b)
        else:
            stop = "max_tokens" if b.finish == "length" else (b.finish or "end_turn")
            payload = _anthropic_reply(model, text, stop, prompt, b)
        if b.kind == "trickle":
            self._trickle(h, json.dumps(payload).encode(), b)
            return
        self._send(h, 200, payload, b.headers)

    def _trickle(self, h: _Handler, data: bytes, b: Behavior) -> None:
        head = (
            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(data)}\r\n\r\n"
        ).encode("ascii")
        if b.trickle_headers:
            data = head + data
        else:
            h.wfile.write(head)
            h.wfile.flush()
        h.close_connection = True
        step = max(1, b.trickle_bytes)
        for start in range(0, len(data), step):
            if self._stop.wait(b.trickle_interval):
                h.close_connection = True
                return
            h.wfile.write(data[start : start + step])
            h.wfile.flush()

    def _send(
        self, h: _Handler, status: int, payload: Any, headers: Sequence[tuple[str, str]] = ()
    ) -> None:
        if isinstance(payload, bytes):
            data, ctype = payload, "application/octet-stream"
        elif isinstance(payload, str):
            data, ctype = payload.encode(), "text/plain; charset=utf-8"
        elif payload is None:
            data, ctype = b"", "text/plain"
        else:
            data, ctype = json.dumps(payload).encode(), "application/json"
        h.send_response(status)
        h.send_header("Content-Type", ctype)
        h.send_header("Content-Length", str(len(data)))
        for name, value in headers:
            h.send_header(name, value)
        h.end_headers()
        h.wfile.write(data)
        h.wfile.flush()

    def _send_json(self, h: _Handler, status: int, payload: Any) -> None:
        self._send(h, status, payload)


def _redact(headers: dict[str, str]) -> dict[str, str]:
    """Credential values never land in the record; the scheme of Authorization is kept."""
    out: dict[str, str] = {}
    for name, value in headers.items():
        if name in _CREDENTIAL_HEADERS:
            scheme = value.split(" ", 1)[0] if " " in value else ""
            out[name] = f"{scheme} {_REDACTED}".strip()
        else:
            out[name] = value
    return out


# --------------------------------------------------------------------------------------------
# pytest fixture and CLI
# --------------------------------------------------------------------------------------------


@pytest.fixture
def llm_server() -> Iterator[ScriptedLLMServer]:
    """A started server with an empty script, stopped after the test."""
    with ScriptedLLMServer() as server:
        yield server


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Scripted local LLM server (OpenAI + Anthropic).")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8099)
    parser.add_argument("--latency", type=float, default=0.0, help="seconds before each answer")
    parser.add_argument("--api-key", default=None, help="require this key (401 otherwise)")
    args = parser.parse_args(argv)

    server = ScriptedLLMServer(
        args.host, args.port, latency=args.latency, expected_api_key=args.api_key
    )
    done = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        done.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    with server:
        print(f"llmserver listening on {server.url} (latency {args.latency}s)", flush=True)
        while not done.wait(0.1):
            pass
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
