#!/usr/bin/env bash
# Make sure the pi reference oracle (tools/pi-oracle) has its node dependencies installed.
#
# Idempotent: does nothing when tools/pi-oracle/node_modules/@mariozechner/pi-coding-agent exists.
# Otherwise runs `npm ci` from the committed package-lock.json.
#
# Never fails the caller: when node/npm are missing or the install fails it prints a WARNING on
# stderr and exits 0, so the test suite simply skips the oracle tests (see tests/support/pioracle.py,
# oracle_available()).
set -u

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
ORACLE_DIR="$ROOT/tools/pi-oracle"
PKG_DIR="$ORACLE_DIR/node_modules/@mariozechner/pi-coding-agent"

warn() { echo "WARNING: ensure-pi-oracle: $*; pi oracle tests will be skipped" >&2; }

if [ -f "$PKG_DIR/package.json" ]; then
    exit 0
fi
if ! command -v node >/dev/null 2>&1; then
    warn "node is not installed"
    exit 0
fi
if ! command -v npm >/dev/null 2>&1; then
    warn "npm is not installed"
    exit 0
fi
node_major="$(node -p 'process.versions.node.split(".")[0]' 2>/dev/null || echo 0)"
if [ "${node_major:-0}" -lt 20 ]; then
    warn "node $(node --version 2>/dev/null) is too old (pi 0.73 needs >= 20.6)"
    exit 0
fi
if [ ! -f "$ORACLE_DIR/package-lock.json" ]; then
    warn "$ORACLE_DIR/package-lock.json is missing"
    exit 0
fi

# --ignore-scripts: the oracle only uses pi's pure JS modules; some transitive packages (e.g. koffi)
# have install scripts that would try to fetch prebuilt binaries.
log="$(mktemp)"
if (cd "$ORACLE_DIR" && npm ci --no-audit --no-fund --ignore-scripts --loglevel=error) >"$log" 2>&1 \
    && [ -f "$PKG_DIR/package.json" ]; then
    rm -f "$log"
    echo "ensure-pi-oracle: installed $(node -p "require('$PKG_DIR/package.json').version" 2>/dev/null) in tools/pi-oracle" >&2
    exit 0
fi
warn "npm ci failed in $ORACLE_DIR (last lines below)"
tail -n 15 "$log" >&2
rm -f "$log"
exit 0
