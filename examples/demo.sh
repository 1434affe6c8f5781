#!/usr/bin/env bash
# `make demo`: plan and compact the bundled example session with the offline extractive
# summarizer, then show what the agent's model would see afterwards.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=.venv/bin
OUT="$(mktemp -d)/session.compacted.jsonl"
ARGS=(--keep-recent 4000 --window 128000)

echo "== 1. The plan: what is kept, what is summarized, how it fans out"
$BIN/compactd plan examples/session.jsonl "${ARGS[@]}"
echo
echo "== 2. Compact (extractive summarizer, no LLM needed)"
$BIN/compactd compact examples/session.jsonl --summarizer extractive "${ARGS[@]}" --out "$OUT"
echo
echo "== 3. The summary the next turn starts from"
$BIN/python - "$OUT" <<'PY'
import sys
from pipeline.context import build_session_context
from pipeline.transcript import parse_transcript
t = parse_transcript(open(sys.argv[1], "rb").read())
ctx = build_session_context(t.path())
print(ctx.messages[0].message["summary"])
print(f"\n[{len(ctx.messages) - 1} recent messages kept verbatim after the summary]")
PY
echo
echo "Input untouched: examples/session.jsonl; result: $OUT"
