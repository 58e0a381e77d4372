"""The server's ``engine.tensor_parallel_size``: ``auto`` resolved by the batch's function over this machine's cards,
the number recorded in ``/readyz``. The cards are faked at their edge (a fake ``nvidia-smi`` on PATH, the device
``cuda``); the engine is the fake one (no vLLM here)."""

from __future__ import annotations

import logging

import pytest

from classify.config.sections import EngineConfig, ModelConfig, PilotConfig
from classify.errors import ConfigError
from classify.model.memory import resolve_tensor_parallel
from serve.app import server_engine
from tests.support.serve_app import make_client as make_client  # noqa: F401  (fixture)
from tests.support.serve_app import registry as registry  # noqa: F401  (fixture)

H200 = "NVIDIA H200, 143771, 580.95.05, 9.0"


@pytest.fixture
def cards(tmp_path, monkeypatch):
    """``cards(n)``: this machine reports ``n`` H200 cards (a fake ``nvidia-smi``) and computes on ``cuda``."""
    fake = tmp_path / "bin"
    fake.mkdir()
    monkeypatch.setenv("PATH", f"{fake}:/usr/bin:/bin")
    monkeypatch.setattr("serve.app.detect_device", lambda: "cuda")

    def make(n: int) -> None:
        tool = fake / "nvidia-smi"
        tool.write_text("#!/bin/sh\ncat <<'OUT'\n" + "\n".join([H200] * n) + "\nOUT\n")
        tool.chmod(0o755)

    return make


def config(tp, model: str = "llama-3-70b") -> PilotConfig:
    return PilotConfig(model=ModelConfig(base_model=model, dtype="bfloat16"), engine=EngineConfig(tensor_parallel_size=tp))


def test_auto_is_the_batchs_resolution_over_this_machines_cards(cards, caplog):
    cards(2)
    caplog.set_level(logging.INFO, logger="serve.app")
    engine = server_engine(config("auto"))
    # a 70B model does not start on one 141 GiB card (its weights alone are 131 GiB + one sequence + overhead), on two it does
    assert engine.tensor_parallel_size == 2
    assert engine.tensor_parallel_size == resolve_tensor_parallel(config("auto").engine, config("auto").model, "cuda",
                                                                  cards_per_node=2, card_mib=143771)
    assert "engine on cuda: tensor_parallel_size 2 (configured auto)" in caplog.text
    assert server_engine(config("auto", "llama-3-8b")).tensor_parallel_size == 1  # an 8B model: one card


def test_auto_on_too_few_cards_is_refused_with_the_figures(cards):
    cards(1)
    with pytest.raises(ConfigError, match=r"llama-3-70b does not start on up to 1 card\(s\) of 143771 MiB on one node "
                                          r"\(one card needs 134.5 GiB, usable 119.3 GiB\)"):
        server_engine(config("auto"))


def test_a_number_is_kept_and_the_cpu_runs_with_one(cards):
    cards(2)
    assert server_engine(config(4)).tensor_parallel_size == 4  # as given on an accelerator
    assert server_engine(config(4), device="cpu").tensor_parallel_size == 1
    assert server_engine(config("auto"), device="cpu").tensor_parallel_size == 1


def test_readyz_records_the_tp_the_engine_was_built_with(cards, registry, make_client, monkeypatch):
    from tests.support.serve_app import FakeEngine

    cards(2)
    built = []

    def build_async_engine(model, model_cfg, engine_cfg, classify_cfg, enable_lora):  # the default factory's target
        built.append(engine_cfg.tensor_parallel_size)
        return FakeEngine()

    monkeypatch.setattr("serve.app.build_async_engine", build_async_engine)
    client = make_client(factory=None, config=config("auto"))
    ready = client.get("/readyz")
    assert ready.status_code == 200 and ready.json()["tensor_parallel_size"] == 2, ready.json()
    assert built == [2]  # the engine was given the number /readyz reports


@pytest.fixture
def host(tmp_path, monkeypatch):
    """``host(kind)``: this machine is :mod:`tests.support.fake_smi`'s ``kind`` (8 x H100, an H100 in MIG mode)."""
    from tests.support import fake_smi

    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:/usr/bin:/bin")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr("serve.app.detect_device", lambda: "cuda")
    return lambda kind: fake_smi.install(tmp_path / "bin", getattr(fake_smi, kind)())


def test_auto_counts_only_the_cards_in_cuda_visible_devices(host, monkeypatch):
    host("eight_h100")
    assert server_engine(config("auto")).tensor_parallel_size == 4  # the whole host: 70B bf16 over 4 x 80 GB
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    with pytest.raises(ConfigError, match=r"llama-3-70b does not start on up to 1 card\(s\) of 81559 MiB"):
        server_engine(config("auto"))  # one card visible: not TP 4 over cards vLLM cannot see
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-00000003,GPU-00000005")
    with pytest.raises(ConfigError, match=r"up to 2 card\(s\)"):
        server_engine(config("auto"))


def test_auto_sizes_a_mig_slice_by_its_own_memory(host):
    host("h100_in_mig")
    # an 8B model (15 GiB of weights) fits the 80 GB card but not its 1g.10gb slice
    with pytest.raises(ConfigError, match=r"llama-3-8b does not start on up to 1 card\(s\) of 9536 MiB"):
        server_engine(config("auto", "llama-3-8b"))
    with pytest.raises(ConfigError, match=r"of 9536 MiB"):  # the batch's call (card memory from the probe)
        resolve_tensor_parallel(config("auto", "llama-3-8b").engine, config("auto", "llama-3-8b").model, "cuda",
                                cards_per_node=1)
