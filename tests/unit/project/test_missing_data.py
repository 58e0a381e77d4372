"""Without the BBC News data, the suite stops at its start with one line (``tests/conftest.py``), not 69 errors."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def test_a_clone_without_the_data_stops_at_the_start_with_one_line(tmp_path):
    # a clone elsewhere: the real conftest, no ../shared beside it, DOCPILOT_BBC_DIR pointing at nothing
    clone = tmp_path / "elsewhere" / "docpilot"
    (clone / "tests").mkdir(parents=True)
    shutil.copy(ROOT / "tests" / "conftest.py", clone / "tests" / "conftest.py")
    (clone / "tests" / "test_any.py").write_text("def test_any():\n    assert True\n")
    env = {**os.environ, "DOCPILOT_BBC_DIR": str(tmp_path / "no-such-folder"), "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "tests"], cwd=clone,
                         capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 4, out.stdout + out.stderr
    said = [ln for ln in (out.stdout + out.stderr).splitlines() if "BBC News data not found" in ln]
    assert len(said) == 1 and "DOCPILOT_BBC_DIR" in said[0] and "train.csv and test.csv" in said[0]
    assert "passed" not in out.stdout and "error" not in out.stdout.lower().replace("bbc news data not found", "")
    env["DOCPILOT_BBC_DIR"] = str(ROOT.parent / "shared" / "data" / "bbc-news")  # with the data: it runs
    ok = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "tests"], cwd=clone,
                        capture_output=True, text=True, timeout=120, env=env)
    assert ok.returncode == 0 and "1 passed" in ok.stdout, ok.stdout + ok.stderr
