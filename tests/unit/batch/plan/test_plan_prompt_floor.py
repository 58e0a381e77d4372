"""``make plan`` proposes only a ``model.max_model_len`` that holds the prompt: never below the newest pilot's longest
prompt (else the template's bound + ``classify.max_doc_tokens``), and says so when no such length fits the card."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from batch.plan.lots import JobShape, LotsConfig
from batch.plan.plan import CHAT_TEMPLATE_TOKENS, build_plan, prompt_length
from classify.config.sections import ClassifyConfig, ModelConfig, parse_config
from classify.engine.prompt import template_text

ROOT = Path(__file__).resolve().parents[4]


def lots(gpu: str) -> LotsConfig:
    return parse_config(LotsConfig, {**json.loads((ROOT / "config" / "lots.json").read_text()), "gpu_model": gpu}, "lots.json")


def proposed_lengths(plan: dict) -> list[int]:
    return [int(n) for line in plan["memory"]["serving_advice"] for n in re.findall(r"`model\.max_model_len: (\d+)`", line)]


def test_the_bound_is_the_templates_bytes_plus_the_chat_markup_plus_max_doc_tokens():
    classify = ClassifyConfig()
    length = prompt_length(classify)
    template = len(template_text(classify).encode()) + CHAT_TEMPLATE_TOKENS
    assert length["tokens"] == template + 256 and length["min_max_model_len"] == template + 257
    assert 300 < length["tokens"] < 600  # SmolLM2's tokenizer gives 58 template ids + 256 = 314: the bound is above it


@pytest.mark.parametrize(("model", "gpu"), [("llama-3-8b", "L4"), ("llama-3-70b", "B200")])
def test_a_proposed_max_model_len_holds_the_prompt(model, gpu):
    plan = build_plan(lots(gpu), JobShape(model=ModelConfig(base_model=model)))
    floor = plan["prompt_length"]["min_max_model_len"]
    lengths = proposed_lengths(plan)
    assert lengths and all(n >= floor for n in lengths), plan["memory"]["serving_advice"]  # was 50 and 231


def test_the_newest_pilots_longest_prompt_is_the_floor(tmp_path):
    pilot = tmp_path / "20261207T000000Z-pilot-0000abcd"
    pilot.mkdir()
    block = {"mode": "cut", "max_doc_tokens": 256, "max_windows": 1, "scored": 11, "truncated": 3,
             "truncated_share": 0.27, "windows": 11, "windows_per_doc": 1.0, "doc_tokens_per_doc": 200.0,
             "longest_prompt_tokens": 318}
    (pilot / "summary.json").write_text(json.dumps({"long_documents": block}))
    plan = build_plan(lots("L4"), JobShape(model=ModelConfig(base_model="llama-3-8b")), runs=tmp_path)
    assert plan["prompt_length"] == {"tokens": 318, "min_max_model_len": 319,
                                     "source": f"the longest prompt of pilot {pilot.name}"}
    assert proposed_lengths(plan) == [319]
    line = next(x for x in plan["memory"]["serving_advice"] if "max_model_len: 319" in x)
    assert line.startswith("or set `model.max_model_len: 319` (from 1024; no shorter: the prompt is 318 tokens, the "
                           f"longest prompt of pilot {pilot.name}): then ")


def test_when_no_length_that_holds_the_prompt_fits_the_plan_says_so():
    job = JobShape(model=ModelConfig(base_model="llama-3-8b", max_model_len=32768),
                   classify=ClassifyConfig(max_doc_tokens=30000))
    plan = build_plan(lots("L4"), job)
    advice = plan["memory"]["serving_advice"]
    assert proposed_lengths(plan) == []  # was `model.max_model_len: 50`
    assert any(line.startswith("nothing that holds the prompt fits: one 30256-token sequence needs 3.7 GiB of KV cache "
                               "per card, 1.6 GiB is left on one L4 card") for line in advice), advice
    assert "proposal: nothing that holds the prompt fits" in " ".join(plan["warnings"])


def test_a_configured_length_below_the_prompt_is_named_and_a_length_that_holds_it_proposed():
    plan = build_plan(lots("L4"), JobShape(model=ModelConfig(base_model="llama-3-8b", max_model_len=300)))
    floor = plan["prompt_length"]["min_max_model_len"]
    assert any(w.startswith(f"`model.max_model_len` 300 does not hold the prompt ({floor - 1} tokens") for w in plan["warnings"])
    assert proposed_lengths(plan) == [floor]
    assert not any("max_num_seqs" in line for line in plan["memory"]["serving_advice"])  # not at a length that rejects
