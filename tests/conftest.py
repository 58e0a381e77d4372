"""Shared pytest fixtures and the tiers' rules.

The tests live in tiers that mirror the code: ``unit/<package>/`` (no vLLM engine, no Ray, no
heavy subprocess: ``make test-unit``), ``engine/`` (the real session vLLM engine), ``ray/`` (a real
local Ray; its one fixture ``local_ray`` is in ``ray/conftest.py``), ``process/`` (``docpilot`` or a
vLLM import in a subprocess), ``slow/`` (``make test-slow``) and ``images/`` (``make test-images``);
shared helpers are in ``support/`` (no test module imports another). Tests in ``engine/`` get the ``engine`` mark, tests in ``ray/`` the ``ray`` mark
and tests in ``slow/`` the ``slow`` mark from their folder (so none of ``slow/`` runs in the default ``make test``;
a long test that shares its file's helpers elsewhere carries ``@pytest.mark.slow`` itself); collection fails where a test takes the ``engine`` fixture without the ``engine`` mark,
or where a test in ``unit/`` takes the engine or Ray, or carries their marks. Every test has a
timeout (``timeout`` in pyproject's pytest options; longer ones are marked where a test needs them).

The real vLLM engine starts once per session (about 40 s on the 2-core CPU) with LoRA
slots reserved, and every engine test shares it. Tests run from the repository root;
state (model cache, registry, pilot records) goes to a session temp folder except the
model cache, which is shared with ``make model`` so the de-quantized weights are built once.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

pytest_plugins = ["pytester"]  # tests/unit/project/test_tiers.py collects scratch trees under this conftest

ROOT = Path(__file__).resolve().parent.parent
TESTS = ROOT / "tests"
FOLDER_MARKS = {"engine": "engine", "ray": "ray", "slow": "slow"}  # tier folder -> the mark its tests get
HEAVY_MARKS = ("engine", "ray", "slow", "images")  # none of these in unit/
HEAVY_FIXTURES = ("engine", "local_ray")  # nor these
HEAVY_GROUP = "heavy"
"""The xdist work unit of every test outside ``unit/`` but ``SIDE_FILES``: with ``-n N --dist loadgroup`` (``make test``)
one worker runs them all, in collection order and one at a time as without xdist (one vLLM engine, one local Ray, the
timings they assert), while the other workers run ``SIDE_GROUP`` and the unit tier beside them (:func:`xdist_scope`)."""
SIDE_GROUP = "side"
SIDE_FILES = frozenset(f"tests/process/{name}.py" for name in (
    "test_train_resume_inputs", "test_train_disk_cli", "test_quiet_logs", "test_corpus_store", "test_transfer_interrupted",
    "test_model_integrity_cli", "test_make_words", "test_detach_identity"))
"""Process-tier files that assert no timing tighter than tens of seconds and start no engine of the session: one work
unit, ``SIDE_GROUP``, run beside ``HEAVY_GROUP`` by another worker (a ``docpilot`` subprocess each, on a free port or
its own tmpfs where they need one). The deadline tests (stalled stores, slow clients) stay in ``HEAVY_GROUP``."""


def _tier(item: pytest.Item) -> str:
    """The tier folder of ``item`` (``unit``, ``engine``, ``ray``, ``slow``, ``images``), or ``""`` outside one."""
    try:
        parts = Path(item.path).resolve().relative_to(TESTS).parts
    except ValueError:
        return ""
    return parts[0] if len(parts) > 1 else ""


def _takes_fixture(item: pytest.Item, name: str) -> bool:
    """Whether ``item`` uses the fixture ``name`` defined in a conftest of ``tests/`` (not a parameter of that name)."""
    defs = getattr(item, "_fixtureinfo", None)
    defs = defs.name2fixturedefs.get(name, ()) if defs else ()
    return any(Path(d.func.__code__.co_filename).resolve().is_relative_to(TESTS) for d in defs)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """With ``--dist loadgroup`` (``make test``): the tests outside ``tests/unit/`` are two work units, ``SIDE_GROUP``
    (``SIDE_FILES``) and ``HEAVY_GROUP`` (all the others); each unit test is a unit of its own.

    xdist's own ``loadgroup`` reads ``xdist_group`` marks by rewriting ``item._nodeid``, which pytest 9.2's nodes no
    longer read, so the grouping is done here, on the node ids, with xdist's public scheduler hook.
    """
    if config.getoption("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class HeavyOnOneWorker(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return xdist_scope(nodeid)

    return HeavyOnOneWorker(config, log)


def xdist_scope(nodeid: str) -> str:
    """The xdist work unit of the test ``nodeid`` under ``make test``: itself in ``tests/unit/``, else ``SIDE_GROUP``
    or ``HEAVY_GROUP``."""
    if nodeid.startswith("tests/unit/"):
        return nodeid
    return SIDE_GROUP if nodeid.split("::", 1)[0] in SIDE_FILES else HEAVY_GROUP


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark each test by its tier folder, then refuse (a usage error, before any test runs) a test that takes
    the real engine without the ``engine`` mark, or a test in ``unit/`` that takes the engine or Ray or carries
    a mark of the heavy tiers."""
    for item in items:
        mark = FOLDER_MARKS.get(_tier(item))
        if mark:
            item.add_marker(mark)
    problems = []
    for item in items:
        if _takes_fixture(item, "engine") and item.get_closest_marker("engine") is None:
            problems.append(f"{item.nodeid}: takes the `engine` fixture without the `engine` mark")
        if _tier(item) == "unit":
            heavy = [f"mark `{m}`" for m in HEAVY_MARKS if item.get_closest_marker(m) is not None]
            heavy += [f"fixture `{f}`" for f in HEAVY_FIXTURES if _takes_fixture(item, f)]
            if heavy:
                problems.append(f"{item.nodeid}: a unit test with {', '.join(heavy)} (move it to its tier)")
    if problems:
        raise pytest.UsageError("tests in the wrong tier:\n  " + "\n  ".join(problems))


@pytest.fixture(scope="session", autouse=True)
def _isolated_state(tmp_path_factory: pytest.TempPathFactory):
    """Point docpilot's state at a temp folder, keeping the real model cache (built once by `make model`)."""
    state = tmp_path_factory.mktemp("docpilot-state")
    saved = {k: os.environ.get(k) for k in ("DOCPILOT_HOME", "DOCPILOT_MODEL_CACHE", "DOCPILOT_RUNS", "DOCPILOT_EXPORTS", "DOCPILOT_REGISTRY")}
    os.environ.setdefault("DOCPILOT_MODEL_CACHE", str(ROOT / ".docpilot" / "models"))
    os.environ["DOCPILOT_HOME"] = str(state)
    os.environ["DOCPILOT_RUNS"] = str(state / "runs")
    os.environ["DOCPILOT_EXPORTS"] = str(state / "exports")
    os.environ["DOCPILOT_REGISTRY"] = str(state / "registry")
    yield state
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


@pytest.fixture(scope="session")
def pilot_config():
    """The shipped ``config/docpilot.json``."""
    from classify.config.sections import PilotConfig, load_config

    return load_config(PilotConfig, ROOT / "config" / "docpilot.json")


@pytest.fixture(scope="session")
def engine(pilot_config):
    """The real vLLM classifier (default base model, LoRA slots reserved), started once per session."""
    from classify.engine.build import build_engine

    clf = build_engine(pilot_config.model, pilot_config.engine, pilot_config.classify, enable_lora=True)
    yield clf
    clf.shutdown()


BBC_MISSING = ("BBC News data not found: the tests read train.csv and test.csv from $DOCPILOT_BBC_DIR, else "
               "../shared/data/bbc-news beside the clone; set DOCPILOT_BBC_DIR to a folder holding them (the public "
               "BBC News set, Greene & Cunningham 2006, mlg.ucd.ie/datasets/bbc.html, as CSV: text,category)")
"""The one line ``make test`` stops with when the data is missing (``pytest_configure``)."""


def bbc_folder() -> Path | None:
    """The BBC News data folder: ``DOCPILOT_BBC_DIR``, else ``../shared/data/bbc-news`` beside the working directory
    or the clone; ``None`` when none of them holds ``test.csv``."""
    candidates = [Path(os.environ["DOCPILOT_BBC_DIR"]).expanduser().resolve()] if os.environ.get("DOCPILOT_BBC_DIR") else []
    candidates += [Path.cwd().parent / "shared" / "data" / "bbc-news", ROOT.parent / "shared" / "data" / "bbc-news"]
    return next((folder for folder in candidates if (folder / "test.csv").is_file()), None)


def pytest_configure(config: pytest.Config) -> None:
    """Stop the whole run at its start, with one line, when the BBC News data is missing (on the controller only:
    xdist workers inherit the answer)."""
    if not hasattr(config, "workerinput") and bbc_folder() is None:
        pytest.exit(BBC_MISSING, returncode=4)


@pytest.fixture(scope="session")
def bbc_dir() -> Path:
    """The shared BBC News data folder (:func:`bbc_folder`); a run without it stops at its start."""
    folder = bbc_folder()
    if folder is None:
        pytest.fail(BBC_MISSING)
    return folder
