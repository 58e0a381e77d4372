"""The tiers' rules in ``tests/conftest.py``, on a scratch tree collected by a pytest subprocess.

Tests in ``engine/`` and ``ray/`` get their folder's mark; collection fails where a test takes the
``engine`` fixture without the ``engine`` mark, or where a test in ``unit/`` takes the engine or Ray or
carries their marks; a parameter merely named ``engine`` is not the fixture. Also: no test module
imports another (shared helpers live in ``tests/support/``).
"""

from __future__ import annotations

import importlib
import re
import shutil

import pytest

from tests.support import ROOT

INI = "[pytest]\nmarkers =\n    engine: e\n    ray: r\n    slow: s\n    images: i\n"


def _collect(pytester: pytest.Pytester, files: dict[str, str], *args: str) -> pytest.RunResult:
    """Collect (in-process, nothing runs) a scratch project: the real ``tests/conftest.py`` and ``files`` (path
    under tests/ -> source)."""
    pytester.makefile(".ini", pytest=INI)
    (pytester.path / "tests").mkdir(exist_ok=True)
    shutil.copy(ROOT / "tests" / "conftest.py", pytester.path / "tests" / "conftest.py")
    for rel, src in files.items():
        (pytester.path / "tests" / rel).parent.mkdir(parents=True, exist_ok=True)
        (pytester.path / "tests" / rel).write_text(src)
    with pytest.MonkeyPatch.context() as mp:  # the copied conftest looks for the data beside the scratch tree
        mp.setenv("DOCPILOT_BBC_DIR", str(importlib.import_module("tests.conftest").bbc_folder()))
        return pytester.runpytest("--collect-only", "-q", "-p", "no:cacheprovider", "tests", *args)


def test_folder_marks_and_a_parameter_named_engine(pytester):
    files = {
        "engine/test_e.py": "def test_e(engine):\n    pass\n",
        "ray/test_r.py": "def test_r():\n    pass\n",
        "unit/test_u.py": "import pytest\n\n@pytest.mark.parametrize('engine', ['cpu'])\ndef test_u(engine):\n    pass\n",
    }
    out = _collect(pytester, files, "-m", "engine")
    assert out.ret == 0, out.outlines
    out.stdout.fnmatch_lines(["tests/engine/test_e.py::test_e", "1/3 tests collected*"])
    _collect(pytester, files, "-m", "ray").stdout.fnmatch_lines(["tests/ray/test_r.py::test_r", "1/3 tests collected*"])


def test_the_engine_fixture_without_the_engine_mark_is_refused(pytester):
    out = _collect(pytester, {"ray/test_r.py": "def test_r(engine):\n    pass\n"})
    assert out.ret != 0
    assert "tests/ray/test_r.py::test_r: takes the `engine` fixture without the `engine` mark" in str(out.stderr) + str(out.stdout)


def test_a_unit_test_with_the_engine_or_a_heavy_mark_is_refused(pytester):
    out = _collect(pytester, {"unit/classify/test_u.py": "import pytest\n\n@pytest.mark.engine\ndef test_u(engine):\n"
                                                         "    pass\n\n@pytest.mark.ray\ndef test_v():\n    pass\n"})
    text = str(out.stderr) + str(out.stdout)
    assert out.ret != 0
    assert "test_u.py::test_u: a unit test with mark `engine`, fixture `engine` (move it to its tier)" in text
    assert "test_u.py::test_v: a unit test with mark `ray` (move it to its tier)" in text


def test_no_test_module_imports_another():
    found = []
    for path in (ROOT / "tests").rglob("*.py"):
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if re.match(r"\s*(from\s+(tests\.)?(\w+\.)*test_\w+\s+import|import\s+(tests\.)?(\w+\.)*test_\w+)", line):
                found.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    assert found == []


def test_every_test_under_slow_gets_the_slow_mark(pytester):
    """A test in ``slow/`` without its own ``slow`` mark (a parametrized case) is still left out of ``make test``."""
    files = {"slow/test_s.py": "import pytest\n\n@pytest.mark.parametrize('n', [1, pytest.param(2, marks=pytest.mark.slow)])\n"
                               "def test_s(n):\n    pass\n"}
    _collect(pytester, files, "-m", "not slow and not images").stdout.fnmatch_lines(["no tests collected (2 deselected)*"])
    _collect(pytester, files, "-m", "slow").stdout.fnmatch_lines(["2 tests collected*"])


def test_the_default_run_selects_nothing_under_tests_slow():
    """pyproject's default options (``make test``) on the real ``tests/slow/``: every test there is deselected."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "tests/slow"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert "no tests collected" in out.stdout and "deselected" in out.stdout, out.stdout[-2000:]


def test_make_test_keeps_the_heavy_tiers_on_one_worker_and_side_files_need_no_engine_or_ray():
    """`make test`'s xdist grouping (tests/conftest.py): unit tests each alone, the side files together, all else in one unit."""
    root = importlib.import_module("tests.conftest")
    assert root.xdist_scope("tests/unit/bench/test_baseline.py::test_x") == "tests/unit/bench/test_baseline.py::test_x"
    assert root.xdist_scope("tests/process/test_make_words.py::test_y[a]") == root.SIDE_GROUP
    for heavy in ("tests/engine/test_engine.py::t", "tests/ray/test_pilot.py::t", "tests/process/test_store_deadlines.py::t"):
        assert root.xdist_scope(heavy) == root.HEAVY_GROUP
    for name in root.SIDE_FILES:  # a renamed file would silently go back to the heavy worker; one that took the
        text = (ROOT / name).read_text()  # session engine or a local Ray would run beside the heavy worker's
        assert not re.search(r"def test_\w+\([^)]*\b(engine|local_ray)\b", text), name
