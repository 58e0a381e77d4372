"""Score calibration, review flags and the quality reports (accuracy, confusion matrix, pictures).

Fast tests: a fake tokenizer and fake vLLM outputs drive the real :class:`classify.engine.Scorer`
through the offline (pilot, batch) and async (serve) classifiers, and the reports run on
hand-made result rows.
"""

from __future__ import annotations

import asyncio
import json
import math
from types import SimpleNamespace

import pytest

from classify.config import ClassifyConfig
from classify.documents import document_from_text
from classify.engine import AdapterHandle, Classifier, Scorer, card_temperature, softmax_at
from classify.errors import AdapterError

CATS = ClassifyConfig().categories
# first-token log-probs the fake engine answers with (already normalised over the categories)
LOGPROBS = dict(zip(range(len(CATS)), [math.log(p) for p in (0.70, 0.20, 0.05, 0.03, 0.02)], strict=True))


class FakeTokenizer:
    """Category i starts with token i; prompts are rendered through the chat template stand-in."""

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [CATS.index(text) if text in CATS else 99] + [7] * (len(text) // 8)}

    def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=True):
        return "\n".join(m["content"] for m in messages)

    def encode(self, text, add_special_tokens=False):
        return [7] * max(1, len(text) // 8)

    def decode(self, ids):
        return "x" * len(ids)


def _completion():
    return SimpleNamespace(token_ids=[0], text=CATS[0], cumulative_logprob=LOGPROBS[0],
                           logprobs=[{t: SimpleNamespace(logprob=lp) for t, lp in LOGPROBS.items()}])


class FakeLLM:
    """``vllm.LLM.generate`` stand-in: every prompt answers category 0 with :data:`LOGPROBS`."""

    def generate(self, prompts, params, use_tqdm=False, lora_request=None):
        return [SimpleNamespace(outputs=[_completion()]) for _ in prompts]


class FakeAsyncLLM:
    """``AsyncLLM.generate`` stand-in (one final output per request)."""

    async def generate(self, prompt, params, request_id, lora_request=None):
        yield SimpleNamespace(outputs=[_completion()])


def _scorer(**cfg):
    return Scorer(FakeTokenizer(), ClassifyConfig(**cfg), 4096)


def _docs():
    return [document_from_text("a", "Shares fell after the results.", 10_000), document_from_text("b", "", 10_000)]


@pytest.fixture(autouse=True)
def _no_vllm_sampling(monkeypatch):
    monkeypatch.setattr(Scorer, "sampling_params", lambda self: None)


def test_softmax_at_is_raw_at_t1_and_flattens_above():
    assert softmax_at(LOGPROBS, 0) == pytest.approx(0.70)
    tempered = [softmax_at(LOGPROBS, k, 2.0) for k in LOGPROBS]
    assert sum(tempered) == pytest.approx(1.0)
    expected = math.sqrt(0.70) / sum(math.sqrt(p) for p in (0.70, 0.20, 0.05, 0.03, 0.02))
    assert tempered[0] == pytest.approx(expected) and tempered[0] < 0.70
    assert softmax_at(LOGPROBS, 0, 0.01) == pytest.approx(1.0)  # sharp T: no underflow to 0/0


@pytest.mark.parametrize("card, expected", [
    (None, 1.0), ({}, 1.0), ({"calibration": {}}, 1.0), ({"calibration": {"temperature": 1.7}}, 1.7),
    ({"calibration": {"temperature": 2}}, 2.0),
])
def test_card_temperature_reads_the_card(card, expected):
    assert card_temperature(card) == expected


@pytest.mark.parametrize("bad", [0, -1.0, float("nan"), "2", True, 1e6])
def test_card_temperature_refuses_a_bad_value(bad):
    with pytest.raises(AdapterError, match=r"calibration.temperature` must be a number in \(0, 100\]"):
        card_temperature({"calibration": {"temperature": bad}})


def _registry_adapter(tmp_path, temperature):
    from adapters.registry import Registry

    reg = Registry(tmp_path / "registry")
    src = tmp_path / "src"
    src.mkdir()
    (src / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 8}))
    (src / "adapter_model.safetensors").write_bytes(b"weights are not read here")
    card = {"base_model": {"name": "fake-base", "fingerprint": "sha256:" + "0" * 64}}
    if temperature is not None:
        card["calibration"] = {"temperature": temperature}
    reg.publish(src, "cal", 1, card)
    return reg.resolve("cal@latest")


@pytest.mark.parametrize("temperature", [None, 2.5])
def test_pilot_batch_and_serve_apply_the_card_temperature_identically(tmp_path, temperature):
    from serve.engine import AsyncClassifier

    resolved = _registry_adapter(tmp_path, temperature)
    handle = resolved.handle()
    t = 1.0 if temperature is None else temperature
    assert handle.temperature == t
    expected = round(softmax_at(LOGPROBS, 0, t), 6)
    offline = Classifier(FakeLLM(), _scorer(), None, lora_enabled=True)
    lora = offline.classify(_docs(), adapter=handle)  # pilot and batch in LoRA mode (the batch actor's call)
    merged = Classifier(FakeLLM(), _scorer(), None, lora_enabled=False).classify(_docs(), temperature=handle.temperature)
    served = asyncio.run(AsyncClassifier(FakeAsyncLLM(), _scorer(), None, True).classify(_docs(), adapter=handle))
    assert lora == merged == served
    assert lora[0].score == expected and lora[1].status == "rejected"
    if temperature is None:  # no calibration: the raw probability, as before calibration existed
        assert lora[0].score == 0.7
    base = offline.classify(_docs())  # the base model: never tempered
    assert base[0].score == 0.7


def test_handle_default_temperature_is_one():
    assert AdapterHandle("x@1", "/nowhere", 1).temperature == 1.0
