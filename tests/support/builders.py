"""Building pi v3 transcripts for tests and benchmarks, deterministically.

`SessionBuilder` writes entries one call at a time (each a child of the previous one unless a
parent is given); `generate_session` makes long realistic coding sessions (user turns, tool
calls with results, usage) from a seed, so benchmarks and property tests get the same bytes
on every run.
"""

from __future__ import annotations

import random
from typing import Any

import orjson

BASE_MS = 1_772_359_200_000


class SessionBuilder:
    """Append-only builder of a v3 session file."""

    def __init__(self, session_id: str = "0b8e6a52-4d1c-4f0e-9a51-3c2f6f1d2e77",
                 cwd: str = "/home/u/proj") -> None:
        self.header: dict[str, Any] = {
            "type": "session", "version": 3, "id": session_id,
            "timestamp": "2026-03-01T10:00:00.000Z", "cwd": cwd,
        }
        self.entries: list[dict[str, Any]] = []
        self.leaf: str | None = None
        self._n = 0
        self._call = 0

    def _next_id(self) -> str:
        self._n += 1
        return f"{self._n:08x}"

    def _ts(self) -> str:
        seconds = self._n
        return f"2026-03-01T{10 + seconds // 3600 % 14:02d}:{seconds // 60 % 60:02d}:" \
               f"{seconds % 60:02d}.000Z"

    def add(self, kind: str, parent: str | bool | None = True, **fields: Any) -> str:
        entry_id = self._next_id()
        parent_id = self.leaf if parent is True else (None if parent is False else parent)
        entry = {"type": kind, "id": entry_id, "parentId": parent_id, "timestamp": self._ts()}
        entry.update(fields)
        self.entries.append(entry)
        self.leaf = entry_id
        return entry_id

    def message(self, message: dict[str, Any], parent: str | bool | None = True) -> str:
        message.setdefault("timestamp", BASE_MS + self._n * 1000)
        return self.add("message", parent, message=message)

    def user(self, text: str, **kw: Any) -> str:
        return self.message({"role": "user", "content": text}, **kw)

    def assistant(self, text: str = "", calls: list[tuple[str, dict[str, Any]]] | None = None,
                  usage: int | None = None, stop: str | None = None,
                  thinking: str | None = None, **kw: Any) -> str:
        content: list[dict[str, Any]] = []
        if thinking:
            content.append({"type": "thinking", "thinking": thinking})
        if text:
            content.append({"type": "text", "text": text})
        self.last_call_ids: list[str] = []
        for name, args in calls or []:
            self._call += 1
            call_id = f"call_{self._call}"
            self.last_call_ids.append(call_id)
            content.append({"type": "toolCall", "id": call_id, "name": name, "arguments": args})
        msg: dict[str, Any] = {
            "role": "assistant", "content": content, "api": "anthropic-messages",
            "provider": "anthropic", "model": "claude-sonnet-4-5",
            "stopReason": stop or ("toolUse" if calls else "stop"),
        }
        if usage is not None:
            msg["usage"] = {"input": usage, "output": 0, "cacheRead": 0, "cacheWrite": 0,
                            "totalTokens": usage}
        return self.message(msg, **kw)

    def tool_result(self, call_id: str, text: str, name: str = "bash",
                    is_error: bool = False, **kw: Any) -> str:
        return self.message({"role": "toolResult", "toolCallId": call_id, "toolName": name,
                             "content": [{"type": "text", "text": text}],
                             "details": {"exitCode": 1 if is_error else 0},
                             "isError": is_error}, **kw)

    def to_bytes(self) -> bytes:
        lines = [orjson.dumps(self.header)] + [orjson.dumps(e) for e in self.entries]
        return b"\n".join(lines) + b"\n"


_WORD_TEXT = (
    "refactor parser module handler cache queue worker session token budget summary commit "
    "branch release config schema migration request response latency retry index shard lease "
    "fence chunk merge audit fallback rotate archive"
)
_WORDS = tuple(_WORD_TEXT.split())


def _prose(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(words)).capitalize() + "."


def generate_session(entries: int, seed: int = 0, result_chars: int = 3000) -> bytes:
    """A coding session of about `entries` entries: turns of user ask -> tool loop -> answer."""
    rng = random.Random(seed)
    builder = SessionBuilder(session_id=f"bench-{seed:04d}-{entries}")
    turn = 0
    while len(builder.entries) < entries:
        turn += 1
        builder.user(f"Task {turn}: {_prose(rng, rng.randint(8, 40))} "
                     f"Check src/module_{turn % 17}.py please.")
        for _ in range(rng.randint(1, 6)):
            if len(builder.entries) >= entries - 2:
                break
            tool = rng.choice(["read", "edit", "bash", "write"])
            path = f"/repo/src/module_{rng.randint(0, 40)}.py"
            args: dict[str, Any] = {"path": path} if tool != "bash" else {
                "command": f"pytest -q tests/test_{rng.randint(0, 9)}.py"}
            if tool == "edit":
                args.update(oldText=_prose(rng, 6), newText=_prose(rng, 8))
            builder.assistant(_prose(rng, rng.randint(5, 30)), calls=[(tool, args)])
            body = "\n".join(_prose(rng, 12) for _ in range(max(1, result_chars // 90)))
            builder.tool_result(builder.last_call_ids[0], body, name=tool,
                                is_error=rng.random() < 0.05)
        builder.assistant(_prose(rng, rng.randint(10, 60)),
                          usage=1000 + len(builder.entries) * 400)
    return builder.to_bytes()
