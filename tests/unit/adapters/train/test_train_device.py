"""Training computes on the run's device, with ``dtype: auto`` decided for that device.

The card is faked at its edge: torch's own answers (``torch.cuda.is_available``, the compute capability)
are patched, and torch's ``meta`` device stands in for the card's memory (tensors keep shapes and dtypes,
hold no numbers), so the real model set-up and batch placement run as they would on a card.
Before this, the model and batches stayed on the CPU and ``auto`` chose bf16 because a card was visible.
"""

from __future__ import annotations

import json

import pytest

from classify.config.training import TrainConfig, TrainingSection
from tests.support.training import train_config  # noqa: F401 - fixture


@pytest.fixture
def card(monkeypatch):
    """torch says a CUDA card is there (compute capability 9.0) on an AVX2-only host (no native CPU bf16)."""
    import torch

    import classify.machine.device as device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i=0: (9, 0))
    monkeypatch.setattr(device, "cpu_has_native_bf16", lambda: False)
    return monkeypatch


def test_dtype_auto_is_decided_for_the_device_that_computes(card):
    import torch

    import classify.machine.device as device

    on_card = TrainingSection(max_steps=1)
    assert (on_card.run_device(), on_card.compute_dtype()) == ("cuda", "bfloat16")
    on_cpu = TrainingSection(max_steps=1, device="cpu")
    assert (on_cpu.run_device(), on_cpu.compute_dtype()) == ("cpu", "float32")  # a visible card never makes the CPU bf16
    assert device.auto_dtype("cpu") == "float32" and device.auto_dtype("cuda") == "bfloat16"
    card.setattr(torch.cuda, "get_device_capability", lambda i=0: (7, 5))  # a T4: no bf16
    assert device.auto_dtype("cuda") == "float16"  # the engine serves it in fp16
    assert on_card.compute_dtype() == "float32"  # training on it: fp32 (fp16 weights need loss scaling)


def test_device_cuda_without_a_card_is_refused(monkeypatch):
    import torch

    from classify.errors import EnvironmentCheckError

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(EnvironmentCheckError, match=r"`training.device: cuda` but torch .* sees no card; run `make doctor`"):
        TrainingSection(max_steps=1, device="cuda").run_device()
    assert TrainingSection(max_steps=1).run_device() == "cpu"


def _tiny_llama(folder):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                 num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64,
                                 tie_word_embeddings=True)).save_pretrained(folder)
    return str(folder)


def test_model_and_batches_go_to_the_run_device(card, train_config, tmp_path):  # noqa: F811
    import torch

    import classify.config.training as training
    from adapters.train.data import collate_left
    from adapters.train.loop import build_lora_model, on_device

    card.setattr(training, "torch_device", lambda d=None: "meta")  # the card's memory, faked at torch's edge
    cfg = train_config.model_copy(update={"training": train_config.training.model_copy(update={"dtype": "auto"}),
                                          "lora": train_config.lora.model_copy(update={"layers": None})})
    model = build_lora_model(cfg, _tiny_llama(tmp_path / "m"))
    params = dict(model.named_parameters())
    assert {p.device.type for p in params.values()} == {"meta"}
    assert any("lora_" in k for k in params) and all(params[k].device.type == "meta" for k in params if "lora_" in k)
    assert {p.dtype for k, p in params.items() if "lora_" not in k} == {torch.bfloat16}  # decided for the card
    batch = on_device(collate_left([{"input_ids": [5, 6, 7], "labels": [-100, -100, 7]},
                                    {"input_ids": [5, 6, 7, 8], "labels": [-100, -100, 7, 8]}], pad_id=0), "meta")
    assert {v.device.type for v in batch.values() if hasattr(v, "device")} == {"meta"} and batch["answer_len"] == 2
    # the forward itself needs real numbers (the mask code reads values): it ran on an H200, bench/results/*-gpu-*.md


def test_checkpoints_come_by_wall_time_as_well_as_by_steps(train_config, tmp_path, monkeypatch):  # noqa: F811
    from adapters.train.checkpoint import list_checkpoints
    from adapters.train.loop import build_lora_model, run_loop

    def run(name: str, every_s: float | None) -> list[int]:
        t = train_config.training.model_copy(update={"max_steps": 3, "checkpoint_every_steps": 100, "keep_checkpoints": 10,
                                                     "checkpoint_every_s": every_s, "threads": 1, "dtype": "float32",
                                                     "batch_size": 1, "grad_accum_steps": 1, "warmup_steps": 0})
        cfg: TrainConfig = train_config.model_copy(update={"training": t,
                                                           "lora": train_config.lora.model_copy(update={"layers": None})})
        model = build_lora_model(cfg, _tiny_llama(tmp_path / name / "m"))
        examples = [{"input_ids": [5, 6, 7, 8], "labels": [-100, -100, 7, 8]}] * 4
        state = run_loop(cfg, model, examples, pad_id=0, run_dir=tmp_path / name, config_sha256="x")
        assert state["device"] == "cpu, 1 thread(s)" and "peak_device_bytes" not in state
        return [int(p.name.split("-")[1]) for p in list_checkpoints(tmp_path / name / "checkpoints")]

    assert run("steps", None) == [3]  # only the last step: 100 steps apart
    assert run("time", 1e-6) == [1, 2, 3]  # every step is past the wall-clock interval
    assert json.loads(json.dumps(train_config.training.model_dump(mode="json")))["checkpoint_every_s"] == 600.0
