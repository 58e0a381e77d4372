"""Config schema: round trips and the exact error messages (peft's table-driven habit)."""

from __future__ import annotations

import json

import pytest

from classify.config.file import CommandConfig, file_data
from classify.config.sections import (
    ClassifyConfig,
    EngineConfig,
    ModelConfig,
    PilotConfig,
    classification_sha256,
    config_sha256,
    load_config,
    parse_config,
)
from classify.errors import ConfigError


@pytest.mark.parametrize("cls", [ModelConfig, EngineConfig, ClassifyConfig, PilotConfig])
def test_round_trip(cls, tmp_path):
    cfg = cls()
    path = tmp_path / "c.json"
    data = file_data(cfg) if isinstance(cfg, CommandConfig) else cfg.model_dump(mode="json")  # PilotConfig: one-file layout
    path.write_text(json.dumps(data))
    again = load_config(cls, path)
    assert again == cfg and config_sha256(again) == config_sha256(cfg)


@pytest.mark.parametrize(
    ("data", "match"),
    [
        ({"model": {"dtype": "int3"}}, r"`model.dtype` must be 'bfloat16', 'float16', 'float32' or 'auto', got \"int3\""),
        ({"bogus": 1}, r"`bogus` is not a known field"),
        ({"engine": {"max_num_seqs": 0}}, r"`engine.max_num_seqs` must be greater than or equal to 1, got 0"),
        ({"classify": {"categories": ["a"]}}, r"`classify.categories` must list at least 2 categories"),
        ({"classify": {"categories": ["Sport", "tech"]}}, r"must be lower-case names"),
        ({"classify": {"categories": ["tech", "tech"]}}, r"must be unique"),
        ({"classify": {"categories": ["reject", "tech"]}}, r"must not contain 'reject'"),
        ({"thresholds": {"min_accuracy": 1.5}}, r"`thresholds.min_accuracy` must be less than or equal to 1, got 1.5"),
    ],
)
def test_errors_name_field_value_and_bound(data, match):
    with pytest.raises(ConfigError, match=match):
        parse_config(PilotConfig, data, "pilot.json")


def test_load_config_errors(tmp_path):
    with pytest.raises(ConfigError, match=r"config file .*nope.json does not exist"):
        load_config(PilotConfig, tmp_path / "nope.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ConfigError, match=r"bad.json: not valid JSON"):
        load_config(PilotConfig, bad)


def test_overrides_and_frozen(tmp_path):
    path = tmp_path / "p.json"
    path.write_text("{}")
    cfg = load_config(PilotConfig, path, {"model.base_model": "/m", "thresholds.min_accuracy": 0.5})
    assert cfg.model.base_model == "/m" and cfg.thresholds.min_accuracy == 0.5
    with pytest.raises(Exception, match="frozen"):
        cfg.seed = 3


def test_classification_hash_ignores_engine_sizing_and_thresholds():
    a = PilotConfig()
    b = parse_config(PilotConfig, {"engine": {"max_num_seqs": 8}, "thresholds": {"min_accuracy": 0.1}})
    c = parse_config(PilotConfig, {"classify": {"max_doc_tokens": 64}})
    assert classification_sha256(a.model, a.classify) == classification_sha256(b.model, b.classify)
    assert classification_sha256(a.model, a.classify) != classification_sha256(c.model, c.classify)


def test_shipped_pilot_config_is_valid():
    from pathlib import Path

    cfg = load_config(PilotConfig, Path(__file__).resolve().parents[4] / "config" / "docpilot.json")
    assert cfg.thresholds.expected_documents == 12
    assert cfg.classify.categories == ("business", "entertainment", "politics", "sport", "tech")
