"""Structured JSON logs with job, tenant, session and stage on every line.

The context travels in contextvars, so a log call deep in the engine or a provider gets the
job's ids without passing them around. Only ids, states, numbers and error *types* are logged
— never conversation text or secrets: `safe_error` keeps an exception's type and a scrubbed,
bounded message.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import os
import time
from collections.abc import Iterator
from typing import Any

import orjson

_CONTEXT: contextvars.ContextVar[dict[str, str]] = contextvars.ContextVar(
    "compactd_log_context")
FIELDS = ("job_id", "tenant", "session", "stage")


@contextlib.contextmanager
def log_context(**fields: str | None) -> Iterator[None]:
    """Add ids to every log line emitted inside the block (this thread/task only)."""
    current = dict(_CONTEXT.get({}))
    current.update({k: v for k, v in fields.items() if v is not None})
    token = _CONTEXT.set(current)
    try:
        yield
    finally:
        _CONTEXT.reset(token)


def set_stage(stage: str) -> None:
    current = dict(_CONTEXT.get({}))
    current["stage"] = stage
    _CONTEXT.set(current)


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, context ids, extra numbers."""

    def format(self, record: logging.LogRecord) -> str:
        payload: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        context = _CONTEXT.get({})
        for name in FIELDS:
            payload[name] = context.get(name)
        for key, value in record.__dict__.items():
            if key.startswith("ctx_"):
                payload[key[4:]] = value
        if record.exc_info and record.exc_info[0] is not None:
            payload["error_type"] = record.exc_info[0].__name__
        return orjson.dumps(payload, default=str).decode()


def configure_logging(level: str | None = None, fmt: str | None = None) -> None:
    """JSON by default (COMPACTD_LOG_FORMAT=text for humans); idempotent."""
    fmt = fmt or os.environ.get("COMPACTD_LOG_FORMAT", "json")
    level = level or os.environ.get("COMPACTD_LOG_LEVEL", "INFO")
    root = logging.getLogger()
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(
        "%(asctime)s %(levelname)s %(name)s %(message)s"))
    root.handlers = [handler]
    root.setLevel(level.upper())
    for noisy in ("httpx", "httpcore", "botocore", "boto3", "urllib3"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def safe_error(exc: BaseException, limit: int = 200) -> str:
    """`TypeName: first line` bounded — for records and logs that must not carry payloads."""
    first = str(exc).splitlines()[0] if str(exc) else ""
    return f"{type(exc).__name__}: {first[:limit]}"
