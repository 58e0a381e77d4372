"""The Makefile passes each command's config file on, also to the model it provisions first (``make -n``)."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from tests.support.corpora import ROOT

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="no make on PATH")


def _dry_run(*args: str) -> list[str]:
    """The docpilot command lines ``make -n`` would run (the venv's own set-up lines, if any, left out)."""
    out = subprocess.run(["make", "-n", "-s", *args], cwd=ROOT, capture_output=True, text=True, timeout=60, check=True)
    return [line.split("/bin/", 1)[-1].strip() for line in out.stdout.splitlines() if "/bin/docpilot " in line]


@pytest.mark.parametrize(("target", "variable"), [("train", "TRAIN_CONFIG"), ("batch", "BATCH_CONFIG")])
def test_a_command_config_also_names_the_model_provisioned_for_it(target, variable):
    lines = _dry_run(target, f"{variable}=other.json")
    assert lines[0] == "docpilot model --config other.json", lines
    assert lines[1].startswith(f"docpilot {target} --config other.json"), lines


def test_config_alone_sets_every_command():
    assert _dry_run("pilot", "CONFIG=mine.json")[:2] == ["docpilot model --config mine.json",
                                                         "docpilot pilot --config mine.json"]


def test_make_plan_sizes_the_job_of_config_on_the_lot_of_lots_config():
    assert _dry_run("plan", "CONFIG=job.json", "LOTS_CONFIG=lot.json") == [
        "docpilot plan --config job.json --lots-config lot.json"]
    assert _dry_run("plan") == ["docpilot plan --config config/docpilot.json --lots-config config/lots.json"]


def test_make_help_lists_every_target():
    """``make help`` names each ``.PHONY`` target (``clean`` and ``requirements-rebuild`` were missing once)."""
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    [phony] = [line for line in makefile.splitlines() if line.startswith(".PHONY:")]
    out = subprocess.run(["make", "-s", "help"], cwd=ROOT, capture_output=True, text=True, timeout=60, check=True).stdout
    listed = {line.split()[0] for line in out.splitlines() if line.strip()}
    assert set(phony.split(":", 1)[1].split()) - {"help"} <= listed, out
