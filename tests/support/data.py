"""Where the shared real pi transcripts live: beside the checkout (CI) or under /work."""

from __future__ import annotations

from pathlib import Path

_BESIDE = Path(__file__).resolve().parents[3] / "shared" / "data" / "pi-sessions"
PI_SESSIONS = _BESIDE if _BESIDE.exists() else Path("/work/shared/data/pi-sessions")
