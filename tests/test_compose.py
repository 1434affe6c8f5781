"""compose.yaml and the Dockerfile, checked without a Docker engine (none runs here).

The file is parsed and held to what operators rely on: every service present with a health
check, pinned images, restart policies, workers scalable, Flower private and authenticated,
Redis persistent, and — most likely to rot — every COMPACTD_* variable and every command line
matching the real settings model and CLI.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from compactd.settings import CompactdSettings

ROOT = Path(__file__).resolve().parents[1]
COMPOSE: dict[str, Any] = yaml.safe_load((ROOT / "compose.yaml").read_text())
SERVICES: dict[str, Any] = COMPOSE["services"]
APP_SERVICES = ("gateway", "worker", "flower")


def _expand(value: str) -> str:
    """Resolve `${VAR:-default}` the way compose does when VAR is unset."""
    return re.sub(r"\$\{[A-Z_]+:-([^}]*)\}", r"\1", value)


def test_all_services_present() -> None:
    assert set(SERVICES) >= {"redis", "minio", "minio-setup", "gateway", "worker", "flower"}


@pytest.mark.parametrize("name", ["redis", "minio", "gateway", "worker", "flower"])
def test_health_checks_and_restart(name: str) -> None:
    service = SERVICES[name]
    assert service["healthcheck"]["test"], name
    assert service.get("restart") in ("unless-stopped", "always"), name


def test_images_are_pinned() -> None:
    for name, service in SERVICES.items():
        image = service.get("image", "")
        if name in APP_SERVICES:
            assert service["build"] == "."
        else:
            assert ":" in image and not image.endswith(":latest"), name


def test_workers_scale_and_flower_is_private() -> None:
    worker = SERVICES["worker"]
    assert "ports" not in worker and "container_name" not in worker
    flower = SERVICES["flower"]
    assert all(str(p).startswith("127.0.0.1:") for p in flower["ports"])
    assert "--basic-auth" in flower["command"]
    assert "ops" in flower.get("profiles", [])
    assert all("ports" not in SERVICES[s] for s in ("redis", "minio"))


def test_redis_persists() -> None:
    command = " ".join(SERVICES["redis"]["command"])
    assert "--appendonly yes" in command and SERVICES["redis"]["volumes"]


def test_app_environment_matches_the_settings_model(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in APP_SERVICES:
        env = {k: _expand(str(v)) for k, v in SERVICES[name]["environment"].items()}
        for key in list(env):
            monkeypatch.delenv(key, raising=False)
        for key, value in env.items():
            monkeypatch.setenv(key, value)
        settings = CompactdSettings()  # extra="forbid": an unknown COMPACTD_* field fails here
        assert settings.redis_url == "redis://redis:6379/0"
        assert settings.store_url.startswith("s3://compactd?endpoint_url=http://minio:9000")
        known = set(CompactdSettings.model_fields)
        for key in env:
            if key.startswith("COMPACTD_"):
                field = key.removeprefix("COMPACTD_").split("__")[0].lower()
                assert field in known, f"{name}: {key} is not a setting"


def _help(command: str) -> str:
    proc = subprocess.run([sys.executable, "-m", "compactd", command, "--help"],
                          capture_output=True, text=True, cwd=ROOT, timeout=60,
                          env={"COLUMNS": "200", "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


@pytest.mark.parametrize("name", APP_SERVICES)
def test_commands_exist_with_their_options(name: str) -> None:
    command = SERVICES[name]["command"]
    assert command[0] == "compactd"
    text = _help(command[1])
    for option in (arg for arg in command[2:] if arg.startswith("--")):
        assert option in text, f"{name}: `compactd {command[1]}` has no {option}"


def test_dockerfile_multistage_non_root() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert len(re.findall(r"^FROM ", dockerfile, re.MULTILINE)) >= 2
    user = re.findall(r"^USER (\S+)", dockerfile, re.MULTILINE)
    assert user and not user[-1].startswith(("root", "0"))
    assert "HEALTHCHECK" in dockerfile


def test_readme_configuration_reference_is_generated_from_the_model() -> None:
    from compactd.settings_doc import README, update_readme

    text = README.read_text()
    assert update_readme(text) == text, "run: python -m compactd.settings_doc --write"
