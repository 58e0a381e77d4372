"""classify.model.shape: one LoRA parameter count for the lot plan and training, checked against peft."""

from __future__ import annotations

import pytest

from classify.config.training import LINEAR_MODULES
from classify.errors import ConfigError
from classify.model.shape import lora_parameter_count, shape_from_config

# A Qwen3-style block: head_dim set explicitly, so the query/output projections (heads x head_dim = 128)
# are wider than hidden_size (64), and grouped-query attention gives k/v projections of 2 x 32 = 64.
TINY = {"model_type": "qwen3", "num_hidden_layers": 3, "hidden_size": 64, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 32, "intermediate_size": 96, "vocab_size": 128,
        "tie_word_embeddings": True, "max_position_embeddings": 64}


def _peft_trainable(config: dict, targets: tuple[str, ...], rank: int, layers: list[int] | None) -> int:
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    peft = pytest.importorskip("peft")
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(**config))
    lora = peft.LoraConfig(r=rank, lora_alpha=rank, target_modules=list(targets), layers_to_transform=layers)
    wrapped = peft.get_peft_model(model, lora)
    return sum(p.numel() for p in wrapped.parameters() if p.requires_grad)


@pytest.mark.parametrize(("targets", "rank", "layers"), [
    (("q_proj", "k_proj", "v_proj", "o_proj"), 4, None),
    (LINEAR_MODULES, 2, [1, 2]),
])
def test_lora_count_matches_peft_on_a_model_whose_heads_are_wider_than_hidden(targets, rank, layers):
    shape = shape_from_config(TINY, "tiny-qwen3")
    counted = lora_parameter_count(shape, targets, rank, None if layers is None else len(layers))
    assert counted == _peft_trainable(TINY, targets, rank, layers)


def test_lora_count_by_hand_for_qwen3_0_6b():
    # Qwen/Qwen3-0.6B config.json: hidden 1024, 16 heads of 128 (q/o 2048 wide), 8 KV heads, 28 layers
    shape = shape_from_config({"num_hidden_layers": 28, "hidden_size": 1024, "num_attention_heads": 16,
                               "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 3072,
                               "vocab_size": 151936, "tie_word_embeddings": True}, "qwen3-0.6b")
    per_layer = (1024 + 2048) + (1024 + 1024) + (1024 + 1024) + (2048 + 1024)  # q, k, v, o: in + out
    assert lora_parameter_count(shape, ("q_proj", "k_proj", "v_proj", "o_proj"), 8) == 8 * 28 * per_layer == 2_293_760
    assert lora_parameter_count(shape, ("q_proj",), 8, layers=4) == 8 * 4 * (1024 + 2048)


def test_unknown_target_is_a_config_error():
    shape = shape_from_config(TINY, "tiny")
    with pytest.raises(ConfigError, match=r"\['lm_head'\] are not linear layers"):
        lora_parameter_count(shape, ("q_proj", "lm_head"))
