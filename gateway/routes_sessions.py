"""Transcript routes: upload/replace, append, read, the model view and checkpoints.

All storage work goes through `storage.sessions.SessionStore` so the gateway gets the same CAS,
seal and rotation guarantees as the workers. Handlers are sync functions (FastAPI runs them in
its thread pool) because the store and Redis clients are blocking; the upload handler is async
only to stream the body under a size cap, and hands the storage work to the pool.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Mapping, Sequence
from typing import Annotated, Any, Literal

import orjson
from fastapi import APIRouter, Header, Query, Request, Response
from fastapi.concurrency import run_in_threadpool

from gateway.auth import ApiError, Session, etag_matches, not_found, public_etag
from gateway.models import (
    AppendRequest,
    AppendResult,
    CheckpointList,
    ContextResponse,
    ErrorResponse,
    TranscriptWritten,
)
from pipeline.context import build_session_context, convert_to_llm
from pipeline.errors import TranscriptError
from pipeline.transcript import parse_transcript
from storage.checkpoints import create_checkpoint, list_checkpoints
from storage.errors import Conflict, PreconditionFailed
from storage.rotation import complete_sealed, seal_of, seal_segment
from storage.sessions import (
    MAX_ATTEMPTS,
    EntryRejected,
    SessionExists,
    SessionNotFound,
    StoreBusy,
    apply_entries,
    backoff_sleep,
    precheck_entries,
)

router = APIRouter(prefix="/v1/sessions/{session}", tags=["sessions"])

JSONL_TYPES = ("application/x-ndjson", "application/jsonl", "text/plain")
ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"model": ErrorResponse, "description": "Missing or invalid API key"},
    404: {"model": ErrorResponse, "description": "No such session (or not this tenant's)"},
    422: {"model": ErrorResponse, "description": "Invalid id or input"},
    429: {"model": ErrorResponse, "description": "Rate limited (see Retry-After)"},
}


def transcript_error(exc: TranscriptError) -> ApiError:
    """422 naming the line and the machine-readable code of a bad transcript."""
    return ApiError(422, "invalid_transcript", str(exc), line=exc.line, reason=exc.code,
                    detail=exc.detail)


async def read_limited(request: Request, limit: int) -> bytes:
    """The request body, refusing (413) as soon as it exceeds `limit` bytes."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise ApiError(413, "payload_too_large", f"body exceeds {limit} bytes", limit=limit)
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise ApiError(413, "payload_too_large", f"body exceeds {limit} bytes", limit=limit)
        chunks.append(chunk)
    return b"".join(chunks)


def _write_transcript(ref: Any, data: bytes, if_match: str | None, if_none_match: str | None
                      ) -> tuple[bool, TranscriptWritten]:
    """Create the session, or replace its live transcript (checkpoint, seal, HEAD swap)."""
    try:
        transcript = parse_transcript(data)
    except TranscriptError as exc:
        raise transcript_error(exc) from None
    if seal_of(transcript) is not None:
        raise ApiError(422, "invalid_transcript", "the last entry is a compactd seal "
                       "(customType 'compactd.sealed' is reserved)", line=None,
                       reason="reserved_type")
    ss = ref.store
    created = False
    if not ss.exists():
        if if_match is not None:
            raise ApiError(412, "precondition_failed", "If-Match given but the session does "
                           "not exist")
        try:
            ss.create(data)
            created = True
        except SessionExists:
            pass  # lost a create race: fall through to the replace path (and its checks)
    if not created:
        if if_none_match is not None and if_none_match.strip() == "*":
            raise ApiError(412, "precondition_failed", "the session already exists")
        _replace(ss, data, if_match)
    snap = ss.read()
    return created, TranscriptWritten(session=ref.session, created=created,
                                      etag=public_etag(snap.segment_key, snap.etag),
                                      entries=len(snap.transcript),
                                      leafId=snap.transcript.leaf_id)


def _replace(ss: Any, data: bytes, if_match: str | None) -> None:
    """Replace the live transcript the way a checkpoint restore does: the new segment is
    written create-only, the old one sealed (so a concurrent append lands in the new one, not
    in an archive) and HEAD swapped by CAS. The old transcript is checkpointed first."""
    new_key = ss.segment_key(f"u-{time.time_ns():020d}-{secrets.token_hex(4)}")
    written = False
    try:
        for attempt in range(MAX_ATTEMPTS):
            raw, snap = ss.read_raw()
            if if_match is not None and not etag_matches(
                    if_match, public_etag(snap.segment_key, snap.etag)):
                raise ApiError(412, "precondition_failed", "the transcript changed "
                               "(If-Match does not match the current ETag)")
            if not written:
                create_checkpoint(ss, "before replace via API", source=(raw, snap))
                ss.store.put(new_key, data, create_only=True)
                written = True
            sealed = seal_segment(ss, snap, new_key, "replace")
            if sealed is not None:
                complete_sealed(ss, snap.segment_key, sealed[0], sealed[1])
                return
            backoff_sleep(attempt)
        raise StoreBusy("replace: lost too many races")
    except BaseException:
        if written and ss.store.head(new_key) is not None:
            # Only an unreferenced segment is removed: if the seal went through, HEAD (or a
            # repairing reader) points at new_key and it must stay.
            try:
                ss.read()
                live = ss.read_head()[0].segment
            except Exception:
                live = new_key
            if live != new_key:
                ss.store.delete(new_key)
        raise


@router.put(
    "/transcript", status_code=200, response_model=TranscriptWritten,
    summary="Upload or replace a session transcript (pi JSONL)",
    responses={201: {"model": TranscriptWritten, "description": "Session created"},
               412: {"model": ErrorResponse}, 413: {"model": ErrorResponse}, **ERRORS},
    openapi_extra={"requestBody": {"required": True, "content": {
        t: {"schema": {"type": "string"}} for t in JSONL_TYPES}}},
)
async def put_transcript(
    request: Request, response: Response, ref: Session,
    if_match: Annotated[str | None, Header(max_length=256)] = None,
    if_none_match: Annotated[str | None, Header(max_length=256)] = None,
) -> TranscriptWritten:
    """Create the session from the body, or replace its live transcript (the previous one is
    checkpointed). `If-Match: <etag>` makes the replace conditional (412 when stale);
    `If-None-Match: *` makes it create-only."""
    limit = request.app.state.services.gateway.max_transcript_bytes
    data = await read_limited(request, limit)
    created, result = await run_in_threadpool(_write_transcript, ref, data, if_match,
                                              if_none_match)
    response.status_code = 201 if created else 200
    response.headers["ETag"] = result.etag
    return result


@router.post(
    "/entries", response_model=AppendResult, summary="Append entries (CAS, all or nothing)",
    responses={412: {"model": ErrorResponse}, 413: {"model": ErrorResponse}, **ERRORS},
)
def append_entries(
    body: AppendRequest, response: Response, ref: Session,
    if_match: Annotated[str | None, Header(max_length=256)] = None,
) -> AppendResult:
    """Append to the live transcript. Entries without `id`/`parentId` get a fresh id and
    chain to the current leaf. With `If-Match`, the append happens only if the transcript is
    still at that ETag (412 otherwise). A bad entry is a 422 naming its index."""
    try:
        prepared = precheck_entries(body.entries)
    except EntryRejected as exc:
        raise ApiError(422, "invalid_entry", str(exc), index=exc.index, reason=exc.code,
                       detail=exc.detail) from None
    ss = ref.store
    try:
        for attempt in range(MAX_ATTEMPTS):
            snap = ss.read()
            if if_match is not None and not etag_matches(
                    if_match, public_etag(snap.segment_key, snap.etag)):
                raise ApiError(412, "precondition_failed", "the transcript changed "
                               "(If-Match does not match the current ETag)")
            ids = apply_entries(snap.transcript, prepared)
            try:
                stored = ss.store.put(snap.segment_key, snap.transcript.to_bytes(),
                                      if_match=snap.etag)
            except (PreconditionFailed, Conflict):
                backoff_sleep(attempt)
                continue
            etag = public_etag(snap.segment_key, _etag_of(stored, ss, snap.segment_key))
            response.headers["ETag"] = etag
            return AppendResult(ids=ids, etag=etag)
    except SessionNotFound:
        raise not_found("session") from None
    except EntryRejected as exc:
        raise ApiError(422, "invalid_entry", str(exc), index=exc.index, reason=exc.code,
                       detail=exc.detail) from None
    raise StoreBusy("append: lost too many races")


def _etag_of(put_result: Any, ss: Any, key: str) -> str:
    """The etag `put` returned (stores return it), else one more HEAD."""
    if isinstance(put_result, str):
        return put_result
    etag = getattr(put_result, "etag", None)
    if isinstance(etag, str):
        return etag
    head = ss.store.head(key)
    return str(head)


@router.get(
    "/transcript", summary="The live transcript (raw JSONL) with its ETag",
    responses={200: {"content": {"application/x-ndjson": {"schema": {"type": "string"}}}},
               304: {"description": "Not modified (If-None-Match)"}, **ERRORS},
    response_class=Response,
)
def get_transcript(
    ref: Session, if_none_match: Annotated[str | None, Header(max_length=256)] = None,
) -> Response:
    try:
        data, snap = ref.store.read_raw()
    except SessionNotFound:
        raise not_found("session") from None
    etag = public_etag(snap.segment_key, snap.etag)
    if if_none_match is not None and etag_matches(if_none_match, etag):
        return Response(status_code=304, headers={"ETag": etag})
    return Response(data, media_type="application/x-ndjson", headers={"ETag": etag})


# --- the model view ----------------------------------------------------------------------------


def _blocks(content: Any) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return [b for b in content if isinstance(b, dict)] if isinstance(content, list) else []


def _text(content: Any) -> str:
    return "\n".join(b.get("text", "") for b in _blocks(content) if b.get("type") == "text")


def to_openai(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """pi LLM messages -> OpenAI chat completions messages (thinking blocks dropped)."""
    out: list[dict[str, Any]] = []
    for m in messages:
        role = m.get("role")
        if role == "user":
            parts: list[dict[str, Any]] = []
            for b in _blocks(m.get("content")):
                if b.get("type") == "text":
                    parts.append({"type": "text", "text": b.get("text", "")})
                elif b.get("type") == "image":
                    url = f"data:{b.get('mimeType', 'image/png')};base64,{b.get('data', '')}"
                    parts.append({"type": "image_url", "image_url": {"url": url}})
            out.append({"role": "user", "content": parts})
        elif role == "assistant":
            msg: dict[str, Any] = {"role": "assistant", "content": _text(m.get("content")) or None}
            calls = [{"id": b.get("id"), "type": "function",
                      "function": {"name": b.get("name"),
                                   "arguments": orjson.dumps(b.get("arguments") or {}).decode()}}
                     for b in _blocks(m.get("content")) if b.get("type") == "toolCall"]
            if calls:
                msg["tool_calls"] = calls
            out.append(msg)
        elif role == "toolResult":
            out.append({"role": "tool", "tool_call_id": m.get("toolCallId"),
                        "content": _text(m.get("content"))})
    return out


def to_anthropic(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """pi LLM messages -> Anthropic Messages (tool results as user turns; same-role turns
    merged because the API requires alternation)."""
    out: list[dict[str, Any]] = []

    def push(role: str, blocks: list[dict[str, Any]]) -> None:
        if out and out[-1]["role"] == role:
            out[-1]["content"].extend(blocks)
        else:
            out.append({"role": role, "content": blocks})

    for m in messages:
        role = m.get("role")
        blocks: list[dict[str, Any]] = []
        if role == "user":
            for b in _blocks(m.get("content")):
                if b.get("type") == "text":
                    blocks.append({"type": "text", "text": b.get("text", "")})
                elif b.get("type") == "image":
                    blocks.append({"type": "image", "source": {
                        "type": "base64", "media_type": b.get("mimeType", "image/png"),
                        "data": b.get("data", "")}})
            push("user", blocks)
        elif role == "assistant":
            for b in _blocks(m.get("content")):
                if b.get("type") == "text" and b.get("text"):
                    blocks.append({"type": "text", "text": b["text"]})
                elif b.get("type") == "toolCall":
                    blocks.append({"type": "tool_use", "id": b.get("id"), "name": b.get("name"),
                                   "input": b.get("arguments") or {}})
            push("assistant", blocks)
        elif role == "toolResult":
            push("user", [{"type": "tool_result", "tool_use_id": m.get("toolCallId"),
                           "content": [{"type": "text", "text": _text(m.get("content"))}],
                           "is_error": bool(m.get("isError"))}])
    return out


@router.get("/context", response_model=ContextResponse, responses=ERRORS,
            summary="The model view after compaction (pi's buildSessionContext)")
def get_context(
    ref: Session,
    format: Annotated[Literal["pi", "agent", "openai", "anthropic"], Query(
        description="pi: pi LLM messages (convertToLlm); agent: pi agent messages "
                    "(compactionSummary etc.); openai / anthropic: provider message form")
    ] = "pi",
) -> ContextResponse:
    """What the agent should send to its model now: the last compaction's summary first,
    then the kept tail and everything after it."""
    try:
        snap = ref.store.read()
    except SessionNotFound:
        raise not_found("session") from None
    ctx = build_session_context(snap.transcript.path())
    agent = ctx.payloads
    messages: list[dict[str, Any]]
    if format == "agent":
        messages = [dict(m) for m in agent]
    else:
        llm = convert_to_llm(agent)
        messages = (llm if format == "pi" else to_openai(llm) if format == "openai"
                    else to_anthropic(llm))
    return ContextResponse(session=ref.session, format=format, compactionId=ctx.compaction_id,
                           thinkingLevel=ctx.thinking_level, model=ctx.model, messages=messages)


@router.get("/checkpoints", response_model=CheckpointList, responses=ERRORS,
            summary="Pre-compaction snapshots of the session, newest first")
def get_checkpoints(ref: Session) -> CheckpointList:
    if not ref.store.exists():
        raise not_found("session")
    return CheckpointList.model_validate(
        {"checkpoints": [m.to_json() for m in list_checkpoints(ref.store)]})
