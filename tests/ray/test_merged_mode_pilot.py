"""The single-adapter fast path: the merged-model cache, the gate key's adapter mode, and a real pilot in both modes.

Unit tests stand a fake merge in for peft (it writes a small weight file and the card), so the
cache's build-once / reuse / rebuild / lock logic runs in milliseconds. The real-engine test pilots
one random tiny LoRA twice: through vLLM's LoRA slots (the session engine) and merged (its own engine).

Split by tier: this file holds the ray tests; the others of the same subject are in ``tests/unit/adapters/registry/test_merged_mode.py``.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest

from classify.config.sections import classification_sha256
from classify.runs.gate import combo_key

ROOT = Path(__file__).resolve().parents[2]
PILOT = ROOT / "data" / "pilot"


def _tiny_lora(model_path: str, out: Path, seed: int, scale: float = 0.1) -> Path:
    """A random peft LoRA (r=8 on q_proj, v_proj) with B scaled down: it moves the scores, not most answers."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    base = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    peft_model = get_peft_model(base, LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"],
                                                 init_lora_weights=False))
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_B" in name:
                param.mul_(scale)
    peft_model.save_pretrained(out)
    return out


@pytest.mark.engine
@pytest.mark.slow  # about 100 s on 2 cores: a second engine for the merged model (make test-slow)
def test_a_merged_mode_pilot_proceeds_and_answers_as_the_lora_mode_pilot(pilot_config, engine, tmp_path):
    """Two pilots through the batch pipeline (real Ray, real vLLM engine actors): lora mode and merged mode."""
    from adapters.registry.registry import Registry
    from batch.pilot.run import run_pilot
    from classify.engine.args import compute_dtype
    from classify.model.model import resolve_model
    from classify.runs.gate import pilot_status

    model = resolve_model(pilot_config.model)
    card = {"base_model": {"name": model.name, "fingerprint": model.fingerprint}, "training": {"kind": "random-init test"}}
    Registry().publish(_tiny_lora(model.path, tmp_path / "lora", seed=7), "tiny-merge", 1, card)
    # a random adapter has no accuracy to show: every other check (rejects, invariants, export) still applies
    cfg = pilot_config.model_copy(update={"thresholds": pilot_config.thresholds.model_copy(update={"min_accuracy": 0.0})})
    lora_cfg = cfg.model_copy(update={"model": cfg.model.model_copy(update={"adapter_mode": "lora"})})
    assert cfg.model.adapter_mode == "merged"

    lora = run_pilot(lora_cfg, PILOT, "tiny-merge@1")
    t0 = time.monotonic()
    merged = run_pilot(cfg, PILOT, "tiny-merge@1")
    merged_s = time.monotonic() - t0

    def rows(outcome):
        return {r["id"]: r for r in map(json.loads, (outcome.run_dir / "results.jsonl").read_text().splitlines())}

    a, b = rows(lora), rows(merged)
    assert a.keys() == b.keys() and len(a) == 12
    scored = [i for i in a if a[i]["score"] is not None]
    diffs = {i: abs(b[i]["score"] - a[i]["score"]) for i in scored}
    if compute_dtype(pilot_config.model) == "float32":
        # one fp32 sum W + (alpha/r) B A vs vLLM adding x A B per step: the same answers to rounding
        assert {i: r["category"] for i, r in a.items()} == {i: r["category"] for i, r in b.items()}
        assert max(diffs.values()) <= 0.02, diffs
        assert merged.summary["accuracy"] == lora.summary["accuracy"]
    else:
        # bfloat16 (AVX-512-BF16 CPUs, accelerators): both paths round to 8 mantissa bits, in different
        # places (the merged weights once; vLLM's x A B and its sum every step). Measured on a Zen 4
        # EPYC: per-document |score difference| up to 0.077, mean 0.02 over these 11. A wrong merge
        # (scale alpha/r missed, an adapter layer dropped) moves every score, so the mean is the guard.
        assert max(diffs.values()) <= 0.12 and sum(diffs.values()) / len(diffs) <= 0.04, diffs
        for i in scored:  # a clear winner (top score >= 0.6, the runner-up <= 0.4) cannot swap
            if a[i]["score"] >= 0.6:
                assert b[i]["category"] == a[i]["category"], (i, a[i], b[i])
        assert sum(a[i]["category"] == b[i]["category"] for i in a) >= 10, (a, b)
    assert merged.decision == lora.decision == "proceed", (merged.summary.get("failed_checks"), lora.summary.get("failed_checks"))
    # the adapter did something: its scores differ from the base model's
    from batch.pilot.inputs import read_pilot_set

    docs, *_ = read_pilot_set(PILOT, pilot_config.classify, pilot_config.thresholds.expected_documents)
    base_scores = {r.id: r.score for r in engine.classify(docs)}
    assert any(s is not None and abs(s - (a[i]["score"] or 0)) > 1e-3 for i, s in base_scores.items())

    p_lora = json.loads((lora.run_dir / "params.json").read_text())
    p_merged = json.loads((merged.run_dir / "params.json").read_text())
    assert p_lora["adapter_mode"] == "lora" and p_lora["merged_model"] is None
    assert p_merged["adapter_mode"] == "merged" and p_merged["merged_model"]["fingerprint"].startswith("sha256:")
    assert p_merged["model"]["fingerprint"] == model.fingerprint  # the gate keys on the base model, not the merge
    sha = p_merged["adapter"]["sha256"]
    cls = classification_sha256(pilot_config.model, pilot_config.classify)
    for mode, outcome in (("lora", lora), ("merged", merged)):
        status = pilot_status(combo_key(model.fingerprint, sha, cls, mode))
        assert status["run_id"] == outcome.run_id and status["verdict"] == "pass" and status["adapter_mode"] == mode
    folder = Path(p_merged["merged_model"]["path"])
    assert folder.parent.name == "merged" and folder.is_dir()
    print(f"merged-mode pilot incl. merge and engine start: {merged_s:.1f} s")
    shutil.rmtree(folder)  # the model cache is shared with `make model`: leave no test merge behind
    Path(f"{folder}.lock").unlink(missing_ok=True)
