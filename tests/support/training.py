"""The shipped training config, made quick for tests (``train_config`` is a fixture: import it by name)."""

from __future__ import annotations

import pytest

from classify.config.sections import load_config
from classify.config.training import TrainConfig
from tests.support import ROOT


@pytest.fixture(scope="module")
def train_config() -> TrainConfig:
    """``config/docpilot.json`` read as a :class:`TrainConfig`."""
    return load_config(TrainConfig, ROOT / "config" / "docpilot.json")


def quick_config(cfg: TrainConfig, **smoke) -> TrainConfig:
    """The shipped config made for tests: one thread, no own engine, smoke fields overridden."""
    return cfg.model_copy(update={
        "training": cfg.training.model_copy(update={"threads": 1}),
        "checks": cfg.checks.model_copy(update={"validation_engine": "none"}),
        "smoke": cfg.smoke.model_copy(update=smoke),
    })
