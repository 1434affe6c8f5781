"""Write the gateway's OpenAPI schema to docs/openapi.json (or `--check` that it is current).

The committed file lets clients be generated and reviewed without running the server; the test
suite runs `--check` so the file cannot drift from the code.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
TARGET = ROOT / "docs" / "openapi.json"


def render() -> str:
    from compactd.settings import CompactdSettings
    from gateway.app import create_app
    from gateway.models import GatewaySettings

    # Fixed settings: the schema must not depend on the environment it is exported in.
    app = create_app(CompactdSettings(redis_url="redis://127.0.0.1:6379/0",
                                      store_url="file:///tmp/compactd-openapi"),
                     GatewaySettings())
    return json.dumps(app.openapi(), indent=2, sort_keys=False) + "\n"


def main(argv: list[str]) -> int:
    text = render()
    if "--check" in argv:
        if not TARGET.exists() or TARGET.read_text() != text:
            print(f"{TARGET} is out of date: run python scripts/export_openapi.py")
            return 1
        return 0
    TARGET.parent.mkdir(parents=True, exist_ok=True)
    TARGET.write_text(text)
    print(f"wrote {TARGET}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
