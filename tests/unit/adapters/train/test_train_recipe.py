"""The ``scaled`` training recipe (issue 56, item 1): step budget from the rows, early stopping on the check rows,
a final fit on every row, and a summary that says rows, epochs, steps and why it stopped.

A tiny Llama (two blocks, 32 hidden units) with the base model's own tokenizer keeps the whole ``train()`` run
to seconds; the real base model's training is ``tests/engine/test_train_engine.py``'s.
"""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pytest

from adapters.train.recipe import EarlyStop, final_steps, step_budget
from adapters.train.train import train
from tests.support.training import quick_config
from tests.support.training import train_config as train_config  # noqa: F401  (fixture)

TOPICS = {
    "business": ["Shares rose after profits beat forecasts.", "The bank cut interest rates again.",
                 "Oil prices fell as demand slowed.", "The firm agreed a takeover deal."],
    "entertainment": ["The film won three awards at the festival.", "The singer released a new album.",
                      "A new comedy series starts on Friday.", "The actor joined the cast of the play."],
    "politics": ["The minister resigned after the vote.", "MPs debated the new bill for hours.",
                 "The election campaign opened on Monday.", "The party leader gave a speech."],
    "sport": ["The striker scored twice in the final.", "She won the marathon in record time.",
              "The coach named his squad for the cup.", "The team lost the match at home."],
    "tech": ["The phone maker unveiled a faster chip.", "Hackers attacked the website overnight.",
             "The new console sold out in a day.", "Broadband speeds doubled this year."],
}


@pytest.mark.parametrize(
    ("n", "batch", "epochs", "max_steps", "min_steps", "budget"),
    [
        (15, 4, 2.0, None, 60, 60),  # 4 labels per category, 5 held out: the floor (16 passes)
        (1357, 4, 2.0, None, 60, 679),  # the full BBC split: the fixed recipe's 679 steps
        (160, 4, 2.0, None, 60, 80),
        (15, 4, None, 30, 60, 60),
        (15, 4, None, 90, 60, 90),
    ],
)
def test_the_step_budget_grows_as_the_rows_shrink(n, batch, epochs, max_steps, min_steps, budget):
    assert step_budget(n, batch, epochs=epochs, max_steps=max_steps, min_steps=min_steps) == budget


def test_the_final_fit_keeps_the_chosen_epochs_over_all_rows():
    assert final_steps(30, 15, 20, 4) == (40, 8.0)  # step 30 of 4 on 15 rows = 8 epochs; 8 epochs of 20 rows = 40 steps
    assert final_steps(1, 1357, 1557, 4) == (2, 4 / 1357)


def test_early_stop_keeps_the_lowest_loss_and_stops_after_patience():
    stop = EarlyStop(patience=2)
    assert stop.update(5, 1.0) is None
    assert stop.update(10, 0.5, {"r1": [-0.1, -3.0]}) is None
    assert stop.update(15, 0.50005) is None  # not lower by min_delta: does not count as new
    reason = stop.update(20, 0.7)
    assert reason == "early stop at step 20: no check loss below 0.5000 (step 10) in 2 evaluations"
    assert stop.best["step"] == 10 and stop.best["logprobs"] == {"r1": [-0.1, -3.0]}
    assert [e["step"] for e in stop.evals] == [5, 10, 15, 20]


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory, train_config):
    """A two-block Llama with the base model's tokenizer, saved as a local model folder."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from classify.model.model import resolve_model

    tokenizer = AutoTokenizer.from_pretrained(resolve_model(train_config.model).path)
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64,
                                         num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
                                         max_position_embeddings=512, tie_word_embeddings=True))
    folder = tmp_path_factory.mktemp("tiny-llama")
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def _scaled_config(train_config, tiny_model: Path, data: Path, **training):
    cfg = quick_config(train_config)
    return cfg.model_copy(update={
        "model": cfg.model.model_copy(update={"base_model": str(tiny_model)}),
        "classify": cfg.classify.model_copy(update={"max_doc_tokens": 48}),
        "data": cfg.data.model_copy(update={"path": str(data), "validation_rows": 5}),
        "lora": cfg.lora.model_copy(update={"layers": None}),
        "training": cfg.training.model_copy(update={
            "recipe": "scaled", "max_seq_tokens": 160, "batch_size": 2, "epochs": 0.5, "max_steps": None,
            "min_steps": 6, "eval_every_steps": 2, "patience_evals": 2, "learning_rate": 5e-3, "warmup_steps": 0,
            "checkpoint_every_steps": 4, "dtype": "float32", **training}),
        "checks": cfg.checks.model_copy(update={"min_format_share": 0.0}),  # a random tiny model answers anything
        "output": cfg.output.model_copy(update={"publish": False}),
    })


def _labels_csv(tmp_path) -> Path:
    """TOPICS as a labelled CSV (text, category) in ``tmp_path``."""
    data = tmp_path / "labels.csv"
    with data.open("w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        writer.writerow(["text", "category"])
        writer.writerows((text, cat) for cat, texts in TOPICS.items() for text in texts)
    return data


def test_a_scaled_run_chooses_its_length_on_the_check_rows_and_refits_on_all_rows(train_config, tiny_model, tmp_path):
    data = _labels_csv(tmp_path)
    out = train(_scaled_config(train_config, tiny_model, data))
    recipe = json.loads((out.run_dir / "summary.json").read_text())["recipe"]
    sel = recipe["selection"]
    assert recipe["name"] == "scaled" and recipe["rows"] == 20
    assert sel["train_examples"] == 15 and sel["check_rows"] == 5 and sel["budget_steps"] == 6  # max(6, ceil(0.5 * 15 / 2))
    assert [e["step"] for e in sel["evals"]] == list(range(2, sel["steps_run"] + 1, 2))
    best = min(sel["evals"], key=lambda e: e["loss"])
    assert sel["best_step"] == best["step"]
    assert sel["stopped"].startswith("early stop at step") or sel["stopped"] == "step budget reached (6 steps)"
    assert recipe["epochs"] == pytest.approx(sel["best_step"] * 2 / 15, abs=1e-3)
    assert recipe["final_fit"]["examples"] == 20
    assert recipe["steps"] == recipe["final_fit"]["steps"] == math.ceil(sel["best_step"] * 2 / 15 * 20 / 2)
    assert "check_logprobs" not in recipe and recipe["calibration"]["fitted_on"] == "validation split, n=5"
    assert (out.run_dir / "select" / "choice.json").is_file() and (out.run_dir / "adapter").is_dir()
    assert out.summary["steps"] == recipe["steps"]
    assert f"chose step {sel['best_step']}" in recipe["summary"]


def test_the_fixed_recipe_summary_says_rows_steps_epochs_and_why_it_stopped(train_config, tiny_model, tmp_path):
    data = _labels_csv(tmp_path)
    out = train(_scaled_config(train_config, tiny_model, data, recipe="fixed", max_steps=2, epochs=None))
    recipe = out.summary["recipe"]
    assert recipe == {"name": "fixed", "rows": 15, "examples": 15, "steps": 2, "epochs": 0.267,
                      "stopped": "step budget reached (2 steps)",
                      "summary": "15 training rows, 2 steps = 0.27 epochs; step budget reached (2 steps)"}
