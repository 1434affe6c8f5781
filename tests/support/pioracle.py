"""Run pi's own (v0.73.x) session/compaction code as a reference oracle.

Thin wrapper around ``tools/pi-oracle/oracle.mjs`` (run under node). Install its dependencies with
``scripts/ensure-pi-oracle.sh``; tests should skip when :func:`oracle_available` is false, e.g.::

    if not oracle_available():
        pytest.skip("pi oracle not installed (node/npm missing?)")

Entries are identified by their 0-based index in the active path (root -> leaf) and by the 1-based
line number in the original file (``pathLineNumbers``, ``line``). Entry ids of v1 files are random
(pi's migration uses random ids), so compare indices/lines, not ids, for such files.
"""

from __future__ import annotations

import functools
import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
ORACLE_DIR = REPO_ROOT / "tools" / "pi-oracle"
ORACLE_SCRIPT = ORACLE_DIR / "oracle.mjs"
PI_PACKAGE_DIR = ORACLE_DIR / "node_modules" / "@mariozechner" / "pi-coding-agent"

#: seconds for one oracle call (one call takes about 0.5 s on the 1 k-line fixtures)
DEFAULT_TIMEOUT = 60.0


@functools.lru_cache(maxsize=1)
def _node() -> str | None:
    return shutil.which("node")


def oracle_available() -> bool:
    """True when node is on PATH and pi is installed under tools/pi-oracle/node_modules."""
    return (
        _node() is not None
        and ORACLE_SCRIPT.is_file()
        and (PI_PACKAGE_DIR / "package.json").is_file()
    )


def _run(args: list[str], timeout: float) -> dict[str, Any]:
    node = _node()
    if node is None or not oracle_available():
        raise RuntimeError(
            "pi oracle unavailable: need node on PATH and tools/pi-oracle/node_modules "
            "(run scripts/ensure-pi-oracle.sh)"
        )
    cmd = [node, str(ORACLE_SCRIPT), *args]
    try:
        proc = subprocess.run(
            cmd,
            cwd=ORACLE_DIR,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise RuntimeError(f"pi oracle timed out after {timeout}s: {' '.join(cmd)}") from exc
    out = proc.stdout.strip()
    try:
        result = json.loads(out.splitlines()[-1]) if out else None
    except json.JSONDecodeError:
        result = None
    if not isinstance(result, dict):
        raise RuntimeError(
            f"pi oracle gave no JSON (exit {proc.returncode}): {' '.join(cmd)}\n"
            f"stdout: {out[-2000:]}\nstderr: {proc.stderr.strip()[-2000:]}"
        )
    if proc.returncode != 0 or not result.get("ok"):
        raise RuntimeError(
            f"pi oracle failed (exit {proc.returncode}): {result.get('error', result)}"
            + (f"\nstderr: {proc.stderr.strip()[-2000:]}" if proc.stderr.strip() else "")
        )
    return result


def pi_prepare(
    path: Path,
    keep_recent: int = 20000,
    *,
    reserve: int | None = None,
    leaf: str | None = None,
    leaf_line: int | None = None,
    timeout: float = DEFAULT_TIMEOUT,
) -> dict[str, Any]:
    """pi's ``prepareCompaction`` on the active branch of ``path`` (the file is never modified).

    Returns the oracle JSON: ``firstKeptIndex``, ``firstKeptEntryId``, ``isSplitTurn``,
    ``turnStartIndex``, ``boundaryStart``, ``tokensBefore``, ``messagesToSummarize`` /
    ``turnPrefixMessages`` (lists of ``{index, id, line, role}``), ``fileOps``
    (``{readFiles, modifiedFiles}``), ``pathLength``, ``pathLineNumbers``, ``pathEntryTokens`` ...
    When pi returns undefined the dict has ``result: None``.
    """
    args = ["prepare", str(Path(path).resolve()), "--keep-recent", str(int(keep_recent))]
    if reserve is not None:
        args += ["--reserve", str(int(reserve))]
    if leaf is not None:
        args += ["--leaf", leaf]
    if leaf_line is not None:
        args += ["--leaf-line", str(int(leaf_line))]
    return _run(args, timeout)


def pi_context(
    path: Path,
    leaf: str | None = None,
    *,
    leaf_line: int | None = None,
    timeout: float = DEFAULT_TIMEOUT,
) -> dict[str, Any]:
    """pi's ``buildSessionContext`` for ``path`` (the file is never modified).

    Returns ``sessionVersion``, ``entryCount``, ``skippedLines``, ``leafId``, ``hasCompaction``,
    ``orphanToolResults`` and ``messages`` (minimal per-role fields plus ``index``/``line`` of the
    source entry).
    """
    args = ["context", str(Path(path).resolve())]
    if leaf is not None:
        args += ["--leaf", leaf]
    if leaf_line is not None:
        args += ["--leaf-line", str(int(leaf_line))]
    return _run(args, timeout)
