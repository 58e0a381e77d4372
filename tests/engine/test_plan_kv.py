"""Tests of ``make plan`` (batch/plan/plan.py, classify/model/memory.py).

Prices come from the shipped example table in ``config/lots.json``. Memory figures are
hand-computed here from the models' published ``config.json`` numbers; the last tests
check the formulas against what the real vLLM engine allocated and the real safetensors file.

Split by tier: this file holds the engine tests; the others of the same subject are in ``tests/unit/batch/plan/test_plan.py``.
"""

from __future__ import annotations

from batch.plan.plan import model_shape
from classify.model.memory import (
    GIB,
    kv_bytes_per_token,
    serving_estimate,
)

# ---- memory: hand-computed values ------------------------------------------------------------
# SmolLM2-135M config.json: 30 layers, hidden 576, 9 heads, 3 KV heads, head_dim 64, MLP 1536,
# vocab 49152, tied embeddings. Per layer: q 576*576 + k 576*192 + v 576*192 + o 576*576 = 884,736;
# MLP 3*576*1536 = 2,654,208; 2 norms 1,152 -> 3,540,096. Total: 49152*576 (28,311,552)
# + 30*3,540,096 (106,202,880) + final norm 576 = 134,515,008.
# LoRA (in + out) per layer: q 1152, k 768, v 768, o 1152, gate 2112, up 2112, down 2112 = 10,176.


# ---- checked against the real artefacts ------------------------------------------------------


def test_kv_estimate_matches_vllm_allocation(engine, pilot_config):
    """vLLM sized its KV cache from VLLM_CPU_KVCACHE_SPACE: our bytes/token reproduces its block count."""
    import torch

    vc = engine.llm.llm_engine.vllm_config
    mc, cc = vc.model_config, vc.cache_config
    shape = model_shape(pilot_config.model)
    assert mc.get_num_layers(vc.parallel_config) == shape.num_layers
    assert mc.get_total_num_kv_heads() == shape.num_kv_heads
    assert mc.get_head_size() == shape.head_dim
    from classify.engine.args import compute_dtype

    assert mc.dtype == getattr(torch, compute_dtype(pilot_config.model)) and cc.cache_dtype == "auto"
    nbytes = mc.dtype.itemsize  # KV cache stored in the compute dtype: 4 bytes in float32, 2 in bf16
    per_token = kv_bytes_per_token(shape, nbytes)
    reserved = cc.kv_cache_memory_bytes
    assert reserved == pilot_config.engine.kv_cache_space_gib * GIB
    assert cc.num_gpu_blocks == reserved // (cc.block_size * per_token)
    tokens = cc.num_gpu_blocks * cc.block_size
    assert reserved - cc.block_size * per_token < tokens * per_token <= reserved
    # the pilot config's worst case (64 full sequences) is more than the 1 GiB it reserved:
    est = serving_estimate(shape, nbytes, max_model_len=pilot_config.model.max_model_len,
                           max_num_seqs=pilot_config.engine.resolve("cpu").max_num_seqs,
                           max_loras=pilot_config.engine.max_loras, max_lora_rank=pilot_config.engine.max_lora_rank,
                           overhead_bytes=0, usable_bytes=reserved)
    assert est.parts["kv_cache"] > reserved
    assert tokens // pilot_config.model.max_model_len < pilot_config.engine.resolve("cpu").max_num_seqs
    assert vc.lora_config.max_loras == pilot_config.engine.max_loras
    assert vc.lora_config.max_lora_rank == pilot_config.engine.max_lora_rank


# ---- the plan sizes the configured job (config/docpilot.json), the lot comes from lots.json ----------------
