"""The single-adapter fast path: the merged-model cache, the gate key's adapter mode, and a real pilot in both modes.

Unit tests stand a fake merge in for peft (it writes a small weight file and the card), so the
cache's build-once / reuse / rebuild / lock logic runs in milliseconds. The real-engine test pilots
one random tiny LoRA twice: through vLLM's LoRA slots (the session engine) and merged (its own engine).

Split by tier: this file holds the unit tests; the others of the same subject are in ``tests/ray/test_merged_mode_pilot.py``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from adapters.registry import merged_cache
from classify.config.sections import ClassifyConfig, ModelConfig, classification_sha256
from classify.errors import AdapterError, PilotGateError
from classify.model.model import FINGERPRINT_FILE, ModelRef, weights_fingerprint
from classify.runs.gate import combo_key, record_pilot, require_pilot

ROOT = Path(__file__).resolve().parents[4]
BASE = ModelRef("base-model", "/nowhere", "sha256:" + "cd" * 32, "test")
ADAPTER = SimpleNamespace(ref="tiny@1", sha256="ab" * 32)


class FakeMerge:
    """Stands in for :func:`adapters.registry.merge.merge_adapter`: a weight file, config.json and the card, after ``delay_s``."""

    def __init__(self, delay_s: float = 0.0):
        self.calls = 0
        self.delay_s = delay_s
        self._lock = threading.Lock()

    def __call__(self, adapter, out_dir, dtype="bfloat16", base=None):
        with self._lock:
            self.calls += 1
        time.sleep(self.delay_s)
        out_dir.mkdir()
        (out_dir / "config.json").write_text("{}")
        (out_dir / "model.safetensors").write_bytes(b"merged weights " + adapter.sha256.encode())
        card = {"name": f"{base.name}+{adapter.ref}", "fingerprint": weights_fingerprint(out_dir), "source": "fake",
                "adapter": adapter.ref, "adapter_sha256": adapter.sha256, "base_fingerprint": base.fingerprint,
                "dtype": dtype}
        (out_dir / FINGERPRINT_FILE).write_text(json.dumps(card))
        return card


@pytest.fixture
def fake_merge(monkeypatch):
    fake = FakeMerge()
    monkeypatch.setattr(merged_cache.merge, "merge_adapter", fake)
    return fake


def test_merged_once_then_reused_with_its_weights_rehashed(tmp_path, fake_merge):
    first = merged_cache.merged_model(ADAPTER, BASE, "float32", tmp_path)
    second = merged_cache.merged_model(ADAPTER, BASE, "float32", tmp_path)
    assert fake_merge.calls == 1 and first == second
    folder = Path(first.path)
    assert folder == (tmp_path / "merged" / f"{'cd' * 8}-{'ab' * 8}-float32").resolve()
    assert first.fingerprint == weights_fingerprint(folder)
    # another dtype or another adapter is another merge
    merged_cache.merged_model(ADAPTER, BASE, "bfloat16", tmp_path)
    merged_cache.merged_model(SimpleNamespace(ref="tiny@2", sha256="ef" * 32), BASE, "float32", tmp_path)
    assert fake_merge.calls == 3


@pytest.mark.parametrize("tamper, reason", [
    (lambda f: (f / "model.safetensors").write_bytes(b"edited"), "modified since the merge"),
    (lambda f: (f / "model.safetensors").unlink(), "no weight files"),
    (lambda f: (f / FINGERPRINT_FILE).write_text(json.dumps({**json.loads((f / FINGERPRINT_FILE).read_text()),
                                                             "adapter_sha256": "00" * 32})), "names another merge"),
    (lambda f: (f / FINGERPRINT_FILE).write_text("{not json"), "unreadable"),
])
def test_a_tampered_cache_entry_is_named_moved_aside_and_rebuilt(tmp_path, fake_merge, caplog, tamper, reason):
    good = merged_cache.merged_model(ADAPTER, BASE, "float32", tmp_path)
    tamper(Path(good.path))
    with caplog.at_level(logging.WARNING, logger="adapters.registry.merged_cache"):
        again = merged_cache.merged_model(ADAPTER, BASE, "float32", tmp_path)
    assert fake_merge.calls == 2 and again == good
    assert "FAILED its check" in caplog.text and reason in caplog.text
    assert [p.name for p in (tmp_path / "merged").iterdir() if not p.name.endswith(".lock")] == [Path(good.path).name]


def test_a_fresh_merge_that_fails_its_own_check_is_refused(tmp_path, monkeypatch):
    def bad_merge(adapter, out_dir, dtype="bfloat16", base=None):
        FakeMerge()(adapter, out_dir, dtype, base)
        (out_dir / "model.safetensors").write_bytes(b"changed after hashing")

    monkeypatch.setattr(merged_cache.merge, "merge_adapter", bad_merge)
    with pytest.raises(AdapterError, match="just written fails its own check: weights of .* hash to"):
        merged_cache.merged_model(ADAPTER, BASE, "float32", tmp_path)


def test_concurrent_builders_merge_once_and_share_the_result(tmp_path, monkeypatch):
    fake = FakeMerge(delay_s=0.5)
    monkeypatch.setattr(merged_cache.merge, "merge_adapter", fake)
    refs: list[ModelRef] = []
    threads = [threading.Thread(target=lambda: refs.append(merged_cache.merged_model(ADAPTER, BASE, "float32", tmp_path)))
               for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert fake.calls == 1 and len(refs) == 4 and len(set(refs)) == 1


def test_a_hub_id_without_local_weights_cannot_be_merged(tmp_path):
    hub = ModelRef("org/model", "org/model", "", "huggingface-hub")
    with pytest.raises(AdapterError, match='no local weights .* set `model.adapter_mode` to "lora"'):
        merged_cache.merged_model(ADAPTER, hub, "float32", tmp_path)


def test_gate_key_carries_the_mode_only_with_an_adapter():
    cls = classification_sha256(ModelConfig(), ClassifyConfig())
    legacy = hashlib.sha256(f"fp|{'ab' * 32}|{cls}".encode()).hexdigest()
    assert combo_key("fp", "ab" * 32, cls) == combo_key("fp", "ab" * 32, cls, "lora") == legacy  # lora keeps old keys
    assert combo_key("fp", "ab" * 32, cls, "merged") != legacy
    assert combo_key("fp", None, cls, "merged") == combo_key("fp", None, cls, "lora")
    with pytest.raises(ValueError, match=r"`adapter_mode` must be one of \('lora', 'merged'\), got 'fused'"):
        combo_key("fp", "ab" * 32, cls, "fused")


def test_adapter_mode_is_not_part_of_the_classification_hash_but_is_validated():
    from classify.config.sections import PilotConfig, parse_config
    from classify.errors import ConfigError

    c = ClassifyConfig()
    assert classification_sha256(ModelConfig(adapter_mode="lora"), c) == classification_sha256(ModelConfig(), c)
    with pytest.raises(ConfigError, match="`model.adapter_mode` must be 'merged' or 'lora'"):
        parse_config(PilotConfig, {"model": {"adapter_mode": "fused"}})


@pytest.mark.parametrize("piloted, runs", [("lora", "merged"), ("merged", "lora")])
def test_a_pilot_in_one_mode_never_opens_a_batch_in_the_other(tmp_path, piloted, runs):
    cls = "c" * 64
    record_pilot(combo_key("fp", "ab" * 32, cls, piloted), "pilot-1", "pass", {}, folder=tmp_path)
    assert require_pilot(combo_key("fp", "ab" * 32, cls, piloted), "x", folder=tmp_path)["passed"]
    with pytest.raises(PilotGateError, match="never piloted"):
        require_pilot(combo_key("fp", "ab" * 32, cls, runs), f"adapter ({runs} mode)", folder=tmp_path)


def test_batch_manifest_records_the_mode_and_resume_refuses_a_changed_one(tmp_path):
    from batch import layout as mf
    from batch.run.adapter import BatchAdapter
    from batch.run.manifest import build_manifest
    from classify.config.batch import load_batch_config

    corpus = SimpleNamespace(describe=lambda: {"path": "c.jsonl", "input_rows": 1}, fingerprint="sha256:c", docs=[], shards=[])
    resolved = SimpleNamespace(ref="tiny@1", sha256="ab" * 32, handle=lambda: "lora-handle")
    merged = ModelRef("m", str(tmp_path / "merged"), "sha256:" + "ee" * 32, "test")
    manifests = {}
    for mode in ("merged", "lora"):
        cfg = load_batch_config(ROOT / "config" / "docpilot.json", {"model.adapter_mode": mode})
        adapter = BatchAdapter(resolved, mode, merged if mode == "merged" else None)
        manifests[mode] = build_manifest("b", cfg, corpus, BASE, adapter=adapter, gate={})
        actor_cfg, actor_fp = adapter.engine_model(cfg.model, BASE.fingerprint)
        if mode == "merged":
            assert adapter.handle() is None and actor_cfg.base_model == merged.path and actor_fp == merged.fingerprint
        else:
            assert adapter.handle() == "lora-handle" and actor_cfg == cfg.model and actor_fp == BASE.fingerprint
    assert manifests["merged"].adapter_mode == "merged"
    assert manifests["merged"].merged_model == {"path": merged.path, "fingerprint": merged.fingerprint}
    assert manifests["lora"].adapter_mode == "lora" and manifests["lora"].merged_model is None
    changes = mf.resume_changes(manifests["lora"], manifests["merged"])
    assert changes and "model.adapter_mode" in changes[0]
