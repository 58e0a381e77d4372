"""The real ``make batch`` without a passed pilot (issue 42 item 7): the refusal names the make user's override,
``SKIP_PILOT_GATE=1``; the same command started as ``docpilot batch`` names ``--skip-pilot-gate``. Nothing starts:
the gate refuses before Ray or an engine (``make -o setup -o model``: the venv and model are taken as they are)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from tests.support import ROOT

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="no make on PATH")


def _env(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "DOCPILOT_VIA_MAKE"}
    env.update(
        DOCPILOT_HOME=str(tmp_path / "home"),
        DOCPILOT_RUNS=str(tmp_path / "runs"),
        DOCPILOT_EXPORTS=str(tmp_path / "exports"),
        DOCPILOT_REGISTRY=str(tmp_path / "registry"),
    )
    env.setdefault("DOCPILOT_MODEL_CACHE", str(ROOT / ".docpilot" / "models"))
    return env


def test_the_gate_refusal_uses_the_form_the_user_started_docpilot_with(tmp_path):
    venv = os.path.dirname(os.path.dirname(sys.executable))
    made = subprocess.run(
        ["make", "-s", "-o", "setup", "-o", "model", "batch", f"VENV={venv}"],
        cwd=ROOT,
        env=_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=300,
    )
    said = made.stdout + made.stderr
    assert made.returncode != 0 and "has not passed a pilot" in said, said[-3000:]
    assert "pass SKIP_PILOT_GATE=1 to override" in said and "--skip-pilot-gate" not in said, said[-3000:]
    direct = subprocess.run(
        [sys.executable, "-m", "docpilot", "batch"],
        cwd=ROOT,
        env=_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert "pass --skip-pilot-gate to override" in direct.stdout + direct.stderr, (
        direct.stdout + direct.stderr
    )[-3000:]
