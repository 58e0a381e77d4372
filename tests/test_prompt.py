"""The one prompt builder with the real base-model tokenizer (no engine needed)."""

from __future__ import annotations

import pytest

from classify.config import ClassifyConfig
from classify.prompt import answer_text, build_prompt, build_training_example, category_first_tokens


@pytest.fixture(scope="module")
def tokenizer(pilot_config):
    from transformers import AutoTokenizer

    from classify.model import resolve_model

    return AutoTokenizer.from_pretrained(resolve_model(pilot_config.model).path)


def test_prompt_lists_categories_and_ends_at_the_answer(tokenizer):
    cfg = ClassifyConfig()
    prompt = build_prompt(tokenizer, cfg, "Shares rose sharply on Monday.")
    assert "Categories: business, entertainment, politics, sport, tech." in prompt.text
    assert "Shares rose sharply on Monday." in prompt.text
    assert prompt.text.endswith("<|im_start|>assistant\n")
    assert not prompt.truncated and prompt.n_tokens == len(tokenizer(prompt.text, add_special_tokens=False)["input_ids"])


def test_long_document_is_cut_to_the_token_budget(tokenizer):
    cfg = ClassifyConfig(max_doc_tokens=16)
    long_prompt = build_prompt(tokenizer, cfg, "word " * 500)
    short_prompt = build_prompt(tokenizer, cfg, "word")
    assert long_prompt.truncated and long_prompt.n_doc_tokens == 16
    assert long_prompt.n_tokens - short_prompt.n_tokens == 16 - short_prompt.n_doc_tokens


def test_training_example_puts_loss_on_the_answer_only(tokenizer):
    cfg = ClassifyConfig()
    ex = build_training_example(tokenizer, cfg, "The striker scored twice.", "sport")
    prompt = build_prompt(tokenizer, cfg, "The striker scored twice.")
    n_prompt = prompt.n_tokens
    assert len(ex["input_ids"]) == len(ex["labels"])
    assert ex["labels"][:n_prompt] == [-100] * n_prompt
    answer = tokenizer.decode(ex["labels"][n_prompt:])
    assert answer == answer_text(tokenizer, "sport") == "sport<|im_end|>"
    assert tokenizer.decode(ex["input_ids"]) == prompt.text + "sport<|im_end|>"
    with pytest.raises(ValueError, match=r"`category` must be one of .*got 'weather'"):
        build_training_example(tokenizer, cfg, "x", "weather")


def test_first_tokens_distinct_for_bbc_and_collision_detected(tokenizer):
    firsts = category_first_tokens(tokenizer, ClassifyConfig().categories)
    assert firsts is not None and len(set(firsts)) == 5
    assert category_first_tokens(tokenizer, ("sport", "sports")) is None
