"""`CompactdClient`: a small synchronous httpx client for the gateway's HTTP API.

One method per endpoint, returning decoded JSON; any 4xx/5xx raises `CompactdAPIError` carrying
the status and the gateway's machine-readable error code, so callers branch on `code`, not on
message text.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, cast

import httpx

FINAL_STATES = frozenset({"succeeded", "failed", "skipped", "cancelled", "superseded"})


def _object(response: httpx.Response) -> dict[str, Any]:
    """The response body, a JSON object in every gateway answer."""
    return cast(dict[str, Any], response.json())


def _objects(response: httpx.Response, field: str) -> list[dict[str, Any]]:
    """The list of JSON objects under `field` of the response body."""
    return cast(list[dict[str, Any]], _object(response)[field])


class CompactdAPIError(Exception):
    """A non-2xx answer: `status`, `code` (e.g. "not_found"), `body` (the decoded JSON)."""

    def __init__(self, status: int, code: str, message: str, body: Any,
                 headers: httpx.Headers) -> None:
        super().__init__(f"HTTP {status} {code}: {message}")
        self.status = status
        self.code = code
        self.message = message
        self.body = body
        self.headers = headers

    @property
    def retry_after(self) -> float | None:
        raw = self.headers.get("retry-after")
        return float(raw) if raw and raw.isdigit() else None


class CompactdClient:
    """`CompactdClient("http://127.0.0.1:8080", "cpd_...")`; usable as a context manager."""

    def __init__(self, base_url: str, api_key: str | None = None, *, timeout: float = 30.0,
                 transport: httpx.BaseTransport | None = None) -> None:
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.http = httpx.Client(base_url=base_url.rstrip("/"), headers=headers,
                                 timeout=timeout, transport=transport)

    def __enter__(self) -> CompactdClient:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        self.http.close()

    def _call(self, method: str, url: str, **kwargs: Any) -> httpx.Response:
        response = self.http.request(method, url, **kwargs)
        if response.status_code >= 400:
            try:
                body = response.json()
                error = body.get("error", {}) if isinstance(body, dict) else {}
            except ValueError:
                body, error = response.text, {}
            raise CompactdAPIError(response.status_code, str(error.get("code", "error")),
                                   str(error.get("message", response.reason_phrase)), body,
                                   response.headers)
        return response

    # -- ops -------------------------------------------------------------------------------
    def health(self) -> dict[str, Any]:
        return _object(self._call("GET", "/healthz"))

    def ready(self) -> dict[str, Any]:
        return _object(self._call("GET", "/readyz"))

    def metrics(self) -> str:
        return self._call("GET", "/metrics").text

    # -- sessions --------------------------------------------------------------------------
    def put_transcript(self, session: str, data: bytes, *, if_match: str | None = None,
                       create_only: bool = False) -> dict[str, Any]:
        headers = {"Content-Type": "application/x-ndjson"}
        if if_match:
            headers["If-Match"] = if_match
        if create_only:
            headers["If-None-Match"] = "*"
        return _object(self._call("PUT", f"/v1/sessions/{session}/transcript", content=data,
                                  headers=headers))

    def append_entries(self, session: str, entries: Sequence[dict[str, Any]], *,
                       if_match: str | None = None) -> dict[str, Any]:
        headers = {"If-Match": if_match} if if_match else {}
        return _object(self._call("POST", f"/v1/sessions/{session}/entries",
                                  json={"entries": list(entries)}, headers=headers))

    def get_transcript(self, session: str) -> tuple[bytes, str]:
        """The raw JSONL and its ETag."""
        response = self._call("GET", f"/v1/sessions/{session}/transcript")
        return response.content, response.headers.get("etag", "")

    def get_context(self, session: str, format: str = "pi") -> dict[str, Any]:
        return _object(self._call("GET", f"/v1/sessions/{session}/context",
                                  params={"format": format}))

    def list_checkpoints(self, session: str) -> list[dict[str, Any]]:
        return _objects(self._call("GET", f"/v1/sessions/{session}/checkpoints"), "checkpoints")

    # -- jobs ------------------------------------------------------------------------------
    def submit_compaction(self, session: str, *, trigger: str = "manual",
                          keep_recent_tokens: int | None = None,
                          reserve_tokens: int | None = None, context_window: int | None = None,
                          instructions: str | None = None, callback_url: str | None = None,
                          idempotency_key: str | None = None) -> dict[str, Any]:
        body: dict[str, Any] = {"trigger": trigger}
        for name, value in (("keepRecentTokens", keep_recent_tokens),
                            ("reserveTokens", reserve_tokens),
                            ("contextWindow", context_window), ("instructions", instructions),
                            ("callbackUrl", callback_url)):
            if value is not None:
                body[name] = value
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else {}
        return _object(self._call("POST", f"/v1/sessions/{session}/compactions", json=body,
                                  headers=headers))

    def get_job(self, job_id: str) -> dict[str, Any]:
        return _object(self._call("GET", f"/v1/jobs/{job_id}"))

    def cancel_job(self, job_id: str) -> dict[str, Any]:
        return _object(self._call("DELETE", f"/v1/jobs/{job_id}"))

    def list_jobs(self, session: str) -> list[dict[str, Any]]:
        return _objects(self._call("GET", f"/v1/sessions/{session}/jobs"), "jobs")

    def wait_job(self, job_id: str, timeout: float = 600.0, poll: float = 0.25
                 ) -> dict[str, Any]:
        """Poll until the job is final; TimeoutError after `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            job = self.get_job(job_id)
            if job.get("state") in FINAL_STATES:
                return job
            if time.monotonic() > deadline:
                raise TimeoutError(f"job {job_id} still {job.get('state')} after {timeout} s")
            time.sleep(poll)
