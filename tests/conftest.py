"""Shared pytest fixtures.

The real vLLM engine starts once per session (about 40 s on the 2-core CPU) with LoRA
slots reserved, and every engine test shares it. Tests run from the repository root;
state (model cache, registry, pilot records) goes to a session temp folder except the
model cache, which is shared with ``make model`` so the de-quantized weights are built once.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


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
    from classify.config import PilotConfig, load_config

    return load_config(PilotConfig, ROOT / "config" / "docpilot.json")


@pytest.fixture(scope="session")
def engine(pilot_config):
    """The real vLLM classifier (default base model, LoRA slots reserved), started once per session."""
    from classify.engine import build_engine

    clf = build_engine(pilot_config.model, pilot_config.engine, pilot_config.classify, enable_lora=True)
    yield clf
    clf.shutdown()


@pytest.fixture(scope="session")
def bbc_dir() -> Path:
    """The shared BBC News data folder (``DOCPILOT_BBC_DIR``, else ``../shared/data/bbc-news``); fails the test when absent."""
    folder = Path(os.environ["DOCPILOT_BBC_DIR"]).expanduser().resolve() if os.environ.get("DOCPILOT_BBC_DIR") else None
    if folder is None or not (folder / "test.csv").is_file():
        folder = Path.cwd().parent / "shared" / "data" / "bbc-news"
    if not (folder / "test.csv").is_file():
        folder = ROOT.parent / "shared" / "data" / "bbc-news"
    if not (folder / "test.csv").is_file():
        pytest.fail(f"BBC News data not found at {folder} (set DOCPILOT_BBC_DIR)")
    return folder


@pytest.fixture(scope="module")
def instant_ray():
    """A local Ray (2 CPUs, no dashboard) for one test module, with the bench-only instant engine picklable by value."""
    import ray
    from ray import cloudpickle

    import bench.instant_engine as instant

    cloudpickle.register_pickle_by_value(instant)
    ray.init(num_cpus=2, include_dashboard=False, object_store_memory=100 * 1024**2, log_to_driver=False)
    yield ray
    ray.shutdown()
