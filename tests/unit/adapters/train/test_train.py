"""LoRA training: config, data checks, smoke run through the real engine, kill-and-resume in a new process.

Split by tier: this file holds the unit tests; the others of the same subject are in ``tests/engine/test_train_engine.py``, ``tests/slow/test_train_slow.py``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from adapters.train.data import collate_left, micro_batch_indices
from adapters.train.support import disk_plan
from adapters.train.train import train
from adapters.train.validate import loss_fell
from classify.config.sections import PilotConfig, load_config, parse_config
from classify.config.training import TrainConfig
from classify.errors import ConfigError, EngineError, EnvironmentCheckError, InputError, Interrupted
from classify.runs.disk import check_disk
from tests.support.training import quick_config
from tests.support.training import train_config as train_config  # noqa: F401  (fixture)

ROOT = Path(__file__).resolve().parents[4]


def test_train_config_classify_section_equals_the_pilot_config(train_config: TrainConfig):
    pilot = load_config(PilotConfig, ROOT / "config" / "docpilot.json")
    assert train_config.classify == pilot.classify
    assert train_config.model.base_model == pilot.model.base_model and train_config.engine == pilot.engine
    assert train_config.lora.rank <= pilot.engine.max_lora_rank


@pytest.mark.parametrize(
    ("patch", "message"),
    [
        ({"lora": {"rank": 32}}, r"`lora.rank` must be <= engine.max_lora_rank \(16\), got 32"),
        ({"training": {"max_steps": 5, "epochs": 1}}, r"`training` exactly one of `max_steps` and `epochs` must be set, got max_steps=5, epochs=1$"),
        ({"training": {"epochs": 0.5, "max_steps": 7}}, r"got max_steps=7, epochs=0.5$"),
        ({"lora": {"target_modules": ["qkv"]}}, r"`lora.target_modules` must be a non-empty subset of \['q_proj', .*\], got \['qkv'\]"),
        ({"training": {"max_steps": 5, "batch_size": 0}}, r"`training.batch_size` must be greater than or equal to 1, got 0"),
        ({"training": {"max_steps": 5, "lr": 1}}, r"`training.lr` is not a known field"),
        ({"training": {"max_steps": 5, "dtype": None}}, r"`training.dtype` must be 'auto', 'float32' or 'bfloat16', got null$"),
    ],
)
def test_bad_train_configs_name_the_field(patch, message):
    with pytest.raises(ConfigError, match=message):
        parse_config(TrainConfig, patch, "train.json")


def _csv(path: Path, rows: list[tuple[str, str]], header: str = "text,category") -> Path:
    import csv

    with path.open("w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        writer.writerow(header.split(","))
        writer.writerows(rows)
    return path


GOOD = [("Shares rose sharply on Monday after profits beat forecasts.", "business")] * 12


@pytest.mark.parametrize(
    ("rows", "header", "message"),
    [
        (GOOD + [("A film premiere.", "movies")], "text,category",
         r"bad training data, nothing was trained: 1 row\(s\) have a `category` outside \['business', 'entertainment', 'politics', 'sport', 'tech'\]: data-0012 \('movies'\)$"),
        (GOOD + [("   ", "sport")], "text,category",
         r"bad training data, nothing was trained: 1 row\(s\) have unusable `text`: data-0012 \(empty document: only whitespace\)$"),
        (GOOD, "body,category", r"training data has no column\(s\) \['text'\] \(header: \['body', 'category'\]\); set train.data.text_column / train.data.category_column$"),
    ],
)
def test_bad_training_data_stops_before_training_with_a_support_note(train_config, tmp_path, rows, header, message):
    data = _csv(tmp_path / "data.csv", rows, header)
    cfg = quick_config(train_config).model_copy(update={"data": train_config.data.model_copy(update={"path": str(data)})})
    with pytest.raises(InputError, match=message):
        train(cfg, smoke=True)
    run = sorted((Path(os.environ["DOCPILOT_RUNS"])).glob("*-train-*"))[-1]
    assert not (run / "checkpoints").exists() and not (run / "adapter").exists()
    note = (run / "support_note.md").read_text()
    for needed in ("stage reached: read-data", "image/template:", "device: cpu", "sequence length: max_seq_tokens 160",
                   "batch size: 2 x grad_accum_steps 1", "## last 20 lines of the training log", "InputError"):
        assert needed in note


def test_training_csv_with_an_unclosed_quote_stops_before_training(train_config, tmp_path):
    data = _csv(tmp_path / "data.csv", GOOD)
    data.write_text(data.read_text() + '"an unclosed quote,sport\nmore,tech\n')
    cfg = quick_config(train_config).model_copy(update={"data": train_config.data.model_copy(update={"path": str(data)})})
    with pytest.raises(InputError, match=r"data\.csv: cannot read training CSV: unexpected end of data$"):
        train(cfg, smoke=True)


def test_disk_shortfall_stops_with_the_numbers(tmp_path):
    plan = disk_plan(base_bytes=2**60, base_cached=False, lora_params=1000, keep_checkpoints=2, merge=True)
    with pytest.raises(EnvironmentCheckError, match=r"^not enough free disk at .*: the run needs \d+\.\d MiB \(base_weights \d+\.\d MiB, .*merged_model .* MiB\) but only \d+\.\d MiB is free"):
        check_disk(tmp_path / "not-yet", plan)
    assert check_disk(tmp_path, disk_plan(10, True, 1000, 2, False))["free"] > 0


def test_data_order_is_a_pure_function_of_seed_and_step():
    seen = [i for step in range(5) for i in micro_batch_indices(step, 0, accum=1, batch=4, n=20, seed=3)]
    assert sorted(seen) == list(range(20))  # one epoch = one permutation
    assert micro_batch_indices(7, 1, accum=2, batch=4, n=20, seed=3) == micro_batch_indices(7, 1, accum=2, batch=4, n=20, seed=3)
    assert micro_batch_indices(0, 0, accum=1, batch=4, n=20, seed=3) != micro_batch_indices(0, 0, accum=1, batch=4, n=20, seed=4)


def test_left_padding_puts_every_answer_at_the_end():
    batch = collate_left([{"input_ids": [5, 6, 7], "labels": [-100, -100, 7]},
                          {"input_ids": [5, 6, 7, 8, 9], "labels": [-100, -100, -100, 8, 9]}], pad_id=0)
    assert batch["input_ids"].tolist() == [[0, 0, 5, 6, 7], [5, 6, 7, 8, 9]]
    assert batch["position_ids"].tolist() == [[0, 0, 0, 1, 2], [0, 1, 2, 3, 4]]
    assert batch["labels"][:, -batch["answer_len"]:].tolist() == [[-100, 7], [8, 9]]


@pytest.mark.parametrize("arch", ["llama", "granite"])
def test_answer_loss_matches_the_full_model_forward_and_its_gradients(arch):
    """The answer loss equals HF's own ``logits_to_keep`` loss and LoRA gradients.

    Llama takes the 2-D projection shortcut; Granite scales its logits after the projection
    (``logits_scaling``), so it must go through its own forward.
    """
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import GraniteConfig, GraniteForCausalLM, LlamaConfig, LlamaForCausalLM

    from adapters.train.loop import PLAIN_HEAD_MODEL_TYPES, answer_loss_sum

    torch.manual_seed(0)
    shape = dict(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                 num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=True)
    if arch == "llama":
        base = LlamaForCausalLM(LlamaConfig(**shape))
    else:
        base = GraniteForCausalLM(GraniteConfig(**shape, logits_scaling=8.0))
    assert (arch in PLAIN_HEAD_MODEL_TYPES) == (arch == "llama")
    model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, init_lora_weights=False, target_modules=["q_proj", "down_proj"],
                                            task_type="CAUSAL_LM"))
    batch = collate_left([{"input_ids": [5, 6, 7, 8, 9, 10], "labels": [-100, -100, -100, -100, 9, 10]},
                          {"input_ids": [11, 12, 13], "labels": [-100, 13, -100]}], pad_id=0)
    loss, n = answer_loss_sum(model, batch)
    loss.backward()
    ours = {k: p.grad.clone() for k, p in model.named_parameters() if p.requires_grad}
    model.zero_grad()
    k = batch["answer_len"]
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                   position_ids=batch["position_ids"], logits_to_keep=k + 1, use_cache=False).logits[:, :-1].float()
    ref = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), batch["labels"][:, -k:].reshape(-1),
                                            ignore_index=-100, reduction="sum")
    ref.backward()
    assert n == 3
    assert float(loss.detach()) == pytest.approx(float(ref.detach()), rel=1e-5)
    assert ours and all(torch.allclose(ours[k], p.grad, atol=1e-6) for k, p in model.named_parameters() if p.requires_grad)
    assert any(float(g.abs().sum()) > 0 for g in ours.values())


def test_training_dtype_auto_follows_the_cpu(train_config, monkeypatch):
    import classify.machine.device as device

    auto = train_config.training.model_copy(update={"dtype": "auto"})
    monkeypatch.setattr(device, "on_accelerator", lambda: False)
    monkeypatch.setattr(device, "cpu_has_native_bf16", lambda: True)
    assert auto.compute_dtype() == "bfloat16"
    monkeypatch.setattr(device, "cpu_has_native_bf16", lambda: False)
    assert auto.compute_dtype() == "float32"
    assert auto.model_copy(update={"dtype": "bfloat16"}).compute_dtype() == "bfloat16"
    with pytest.raises(ConfigError, match="dtype"):
        parse_config(TrainConfig, {**train_config.model_dump(mode="json"),
                                   "training": {**train_config.training.model_dump(mode="json"), "dtype": "fp8"}})


def test_a_resumed_run_keeps_the_dtype_it_started_in_where_the_cpu_can(train_config, tmp_path, monkeypatch, caplog):
    import classify.machine.device as device
    from adapters.train.train import resume_dtype

    monkeypatch.setattr(device, "on_accelerator", lambda: False)
    run = tmp_path / "run"
    run.mkdir()

    def resume(started, native_bf16, dtype="auto"):
        (run / "config.json").write_text(json.dumps({"config_sha256": "x", "compute_dtypes": started}))
        monkeypatch.setattr(device, "cpu_has_native_bf16", lambda: native_bf16)
        cfg = train_config.model_copy(update={"training": train_config.training.model_copy(update={"dtype": dtype})})
        cfg, dtypes = resume_dtype(cfg, run)
        assert json.loads((run / "config.json").read_text())["compute_dtypes"] == dtypes  # the record follows
        return cfg.training.compute_dtype(), dtypes

    assert resume(["bfloat16"], True) == ("bfloat16", ["bfloat16"])
    assert resume(["float32"], True) == ("float32", ["float32"])  # pinned: the whole run in float32
    with caplog.at_level("WARNING", logger="adapters.train"):
        assert resume(["bfloat16"], False) == ("float32", ["bfloat16", "float32"])
    assert "started in bfloat16" in caplog.text and "no native bf16" in caplog.text
    assert resume(["bfloat16", "float32"], True) == ("bfloat16", ["bfloat16", "float32", "bfloat16"])
    assert resume(["bfloat16"], True, dtype="float32") == ("float32", ["bfloat16", "float32"])  # (a set dtype is kept)
    (run / "config.json").write_text(json.dumps({"config_sha256": "x"}))  # a run from before the record
    assert resume_dtype(train_config, run)[1] == [train_config.training.compute_dtype()]


def test_loss_fell_compares_first_and_last_window():
    hist = [{"step": i, "loss": 5.0 - i} for i in range(1, 5)]
    assert loss_fell(hist, 10) == {"passed": True, "first_window_loss": 3.5, "last_window_loss": 1.5, "window_steps": 2}
    assert not loss_fell(list(reversed(hist)), 1)["passed"]


@pytest.mark.parametrize("fail_in", ["merge", "engine-start"])
@pytest.mark.parametrize("error", [Interrupted("stopped by SIGTERM"), EngineError("vLLM could not load it")])
def test_end_check_leaves_no_merged_copy_when_its_engine_never_starts(train_config, tmp_path, monkeypatch, fail_in, error):
    from types import SimpleNamespace

    import adapters.train.validate as validate

    assert train_config.model.adapter_mode == "merged"
    adapter_dir = tmp_path / "run" / "adapter"
    adapter_dir.mkdir(parents=True)
    merged_dir = adapter_dir.parent / ".check-merged"

    def merge(cfg, adapter, model_ref, out_dir, label):
        (out_dir / "model.safetensors").parent.mkdir(parents=True)
        (out_dir / "model.safetensors").write_bytes(b"weights")
        if fail_in == "merge":
            raise error
        return model_ref

    def start(*args, **kwargs):
        raise error

    monkeypatch.setattr(validate, "_merge_for_check", merge)
    monkeypatch.setattr(validate, "build_engine", start)
    with pytest.raises(type(error)):
        validate.through_engine(train_config, adapter_dir, [], SimpleNamespace(name="base"), classifier=None, label="check")
    assert not merged_dir.exists()
