"""The pilot gate's keys and its fallback order (classify/runs/gate.py), without a model."""

from __future__ import annotations

import pytest

from classify.config.sections import ClassifyConfig, PilotConfig, classification_sha256
from classify.errors import PilotGateError
from classify.runs.gate import adapter_keys, combo_key, record_pilot, require_pilot

FP, SHA = "sha256:" + "f" * 64, "ab" * 32


def test_adapter_keys_are_the_lora_then_the_merged_combo_keys_of_the_served_config():
    cls = classification_sha256(PilotConfig().model, PilotConfig().classify)
    assert adapter_keys(FP, SHA, cls) == (combo_key(FP, SHA, cls, "lora"), combo_key(FP, SHA, cls, "merged"))
    other = PilotConfig(classify=ClassifyConfig(categories=("a", "b")))
    assert set(adapter_keys(FP, SHA, cls)).isdisjoint(adapter_keys(FP, SHA, classification_sha256(other.model, other.classify)))
    assert combo_key(FP, None, cls, "merged") == combo_key(FP, None, cls, "lora")  # the mode counts only with an adapter


@pytest.mark.parametrize(
    ("records", "opens"),
    [
        ({}, False),
        ({"lora": "pass"}, True),
        ({"merged": "pass"}, True),  # the fallback key opens when the first has no record
        ({"lora": "fail", "merged": "pass"}, False),  # the first key with a record decides
        ({"lora": "pass", "merged": "fail"}, True),
    ],
)
def test_require_pilot_asks_the_fallback_keys_in_order(tmp_path, records, opens):
    lora, merged = adapter_keys(FP, SHA, "c" * 64)
    for mode, verdict in records.items():
        record_pilot({"lora": lora, "merged": merged}[mode], f"run-{mode}", verdict, {}, folder=tmp_path)
    if opens:
        assert require_pilot(lora, "x", folder=tmp_path, also=(merged,))["passed"]
        return
    with pytest.raises(PilotGateError, match=r"^x has not passed a pilot \((never piloted|latest pilot run-lora verdict fail)\)"):
        require_pilot(lora, "x", folder=tmp_path, also=(merged,))
    gate = require_pilot(lora, "x", override=True, folder=tmp_path, also=(merged,))
    assert gate["override"] and not gate["passed"]
