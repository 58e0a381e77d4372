"""``make plan`` tells the truth about fit: the verdict is what vLLM needs to start (one ``max_model_len`` sequence of
KV beside the weights), it agrees with the sequence count, and a short fit comes with proposals and their figures.

Figures are hand-computed from the models' published ``config.json`` numbers (:data:`classify.model.memory.BUILTIN_SHAPES`).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from batch.plan.lots import JobShape, LotsConfig
from batch.plan.plan import build_plan, main
from classify.config.sections import EngineConfig, ModelConfig, parse_config
from classify.config.training import LINEAR_MODULES
from classify.model.memory import BUILTIN_SHAPES, GIB
from classify.model.shape import lora_parameter_count

ROOT = Path(__file__).resolve().parents[4]
LOTS = ROOT / "config" / "lots.json"


def lots(**changes) -> LotsConfig:
    data = json.loads(LOTS.read_text())
    data.update(changes)
    return parse_config(LotsConfig, data, "lots.json")


def job(model: str, max_model_len: int = 1024, **engine) -> JobShape:
    return JobShape(model=ModelConfig(base_model=model, max_model_len=max_model_len),
                    engine=EngineConfig(max_lora_rank=8, **engine))


def sequences(model: str, card_gib: float, tp: int, max_model_len: int = 1024) -> int:
    """Full-length sequences by hand: (usable - weights/tp - LoRA slots/tp - 2 GiB overhead) // per-card KV of one."""
    shape = BUILTIN_SHAPES[model]
    usable = int(int(card_gib * GIB) * 0.85)
    weights = -(-shape.num_parameters() * 2 // tp)
    lora = -(-2 * 8 * lora_parameter_count(shape, LINEAR_MODULES) * 2 // tp)
    per_token = shape.num_layers * 2 * max(1, shape.num_kv_heads // tp) * shape.head_dim * 2
    return max(0, (usable - weights - lora - 2 * GIB) // (per_token * max_model_len))


def test_8b_on_an_l4_starts_with_13_sequences_and_proposes_fewer_sequences(tmp_path, capsys):
    """The issue's case: an 8B model on L4 was 'does not fit: needs 49.0 GiB' beside 'holds 13 sequences'."""
    assert BUILTIN_SHAPES["llama-3-8b"].num_parameters() == 8_030_261_248  # Meta-Llama-3-8B
    config = tmp_path / "job.json"
    config.write_text(json.dumps({"model": {"base_model": "llama-3-8b", "max_model_len": 1024},
                                  "engine": {"max_lora_rank": 8}}))
    assert main(["--config", str(config), "--lots-config", str(LOTS), "--gpu-model", "L4", "--lots", "2"]) == 0
    raw = capsys.readouterr().out
    plan = json.loads(Path(re.search(r"plan written to (\S+)", raw.replace("\n", "")).group(1)).read_text())
    out = " ".join(raw.split())  # rich wraps lines
    serving = plan["memory"]["serving"]
    assert sequences("llama-3-8b", 22.0, 1) == 13
    assert (serving["fits"], serving["full_sequences"], plan["memory"]["max_full_sequences"]) == (True, 13, 13)
    assert serving["parts"]["kv_cache"] == 131_072 * 1024  # ONE full-length sequence, not 256 of them
    assert plan["memory"]["serving_worst_case"]["needed_gib"] > 49  # the old verdict's figure, kept as the worst case
    assert "starts" in out and "DOES NOT START" not in out and "holds 13 full-length (1024-token) sequences" in out
    assert "serving starts on one L4 card, holding 13 full-length sequences at once, fewer than `engine.max_num_seqs` 256" in out
    assert "proposal: set `engine.max_num_seqs: 13`" in out
    assert "tensor_parallel_size" not in " ".join(plan["memory"]["serving_advice"])  # one card per L4 lot: no TP across lots
    assert (plan["ray"]["engine_actors"], plan["ray"]["num_gpus_per_actor"]) == (2, 1)


def test_70b_on_a_b200_lot_proposes_tp_2_over_its_two_cards():
    plan = build_plan(lots(gpu_model="B200"), job("llama-3-70b"))
    serving, advice = plan["memory"]["serving"], plan["memory"]["serving_advice"]
    one, two = sequences("llama-3-70b", 179.1, 1), sequences("llama-3-70b", 179.1, 2)
    assert (one, two) == (58, 539)
    assert serving["fits"] and serving["full_sequences"] == one and serving["tensor_parallel_size"] == 1
    assert advice[0] == (f"set `engine.tensor_parallel_size: 2` (over 2 of the 2 cards of one B200 lot): weights 65.7 GiB "
                         f"per card, {two} full-length sequences fit at once (max_num_seqs 256)")
    assert advice[1].startswith("or set `engine.max_num_seqs: 58`")
    # taken: one engine actor per lot holding both cards, every sequence fits, nothing left to propose
    plan2 = build_plan(lots(gpu_model="B200", lots=3), job("llama-3-70b", tensor_parallel_size=2))
    s2 = plan2["memory"]["serving"]
    assert (s2["full_sequences"], s2["concurrent"], plan2["memory"]["serving_advice"]) == (two, 256, [])
    assert (plan2["ray"]["engine_actors"], plan2["ray"]["num_gpus_per_actor"], plan2["ray"]["actors_per_lot"]) == (3, 2, 1)
    assert s2["parts"]["weights"] == -(-BUILTIN_SHAPES["llama-3-70b"].num_parameters() * 2 // 2)


def test_auto_takes_the_smallest_tp_that_starts_on_one_lot():
    # 65,536-token sequences: one needs 20 GiB of KV on one B200 card (18.4 GiB left): TP=2 starts with 8
    plan = build_plan(lots(gpu_model="B200"), job("llama-3-70b", 65536, tensor_parallel_size="auto"))
    assert sequences("llama-3-70b", 179.1, 1, 65536) == 0 and sequences("llama-3-70b", 179.1, 2, 65536) == 8
    assert plan["memory"]["tensor_parallel_size"] == 2 and plan["memory"]["serving"]["full_sequences"] == 8
    assert plan["ray"]["num_gpus_per_actor"] == 2
    assert build_plan(lots(gpu_model="B200"), job("llama-3-70b", tensor_parallel_size="auto"))["memory"][
        "tensor_parallel_size"] == 1  # 1,024 tokens start on one card


def test_70b_on_an_h100_does_not_start_and_says_tp_would_span_lots():
    plan = build_plan(lots(gpu_model="H100", lots=2), job("llama-3-70b"))
    serving = plan["memory"]["serving"]
    assert (serving["fits"], serving["full_sequences"]) == (False, 0)
    assert any(w.startswith("serving does not start on one H100 card: weights, LoRA slots, overhead and one 1024-token "
                            "sequence need") for w in plan["warnings"])
    # TP=2 leaves 67.7 - 65.7 weights - 2 overhead - LoRA < one sequence per card: 4 cards would be needed
    assert (sequences("llama-3-70b", 79.6, 1), sequences("llama-3-70b", 79.6, 2), sequences("llama-3-70b", 79.6, 4)) == (0, 0, 418)
    assert ("proposal: it would need `engine.tensor_parallel_size: 4`, more cards than one H100 lot holds (1); a "
            "tensor-parallel group never spans lots: choose a card with more memory") in plan["warnings"]
    # TP=2 set on a one-card lot: no engine actor can start, and the plan says so
    refused = build_plan(lots(gpu_model="H100", lots=2), job("llama-3-70b", tensor_parallel_size=2))
    assert refused["ray"]["engine_actors"] == 0
    assert any("needs 2 cards on one machine, but a H100 lot holds 1" in w for w in refused["warnings"])


@pytest.mark.parametrize("model", sorted(BUILTIN_SHAPES))
@pytest.mark.parametrize("gpu", ["L4", "RTX4090", "L40S", "H100", "B200"])
@pytest.mark.parametrize("max_model_len", [1024, 32768])
def test_the_verdict_and_the_sequence_count_agree(model, gpu, max_model_len):
    memory = build_plan(lots(gpu_model=gpu), job(model, max_model_len))["memory"]
    assert memory["serving"]["fits"] == (memory["max_full_sequences"] >= 1)
    assert memory["serving"]["full_sequences"] == memory["max_full_sequences"]
