"""Adapters the engine cannot apply are refused before vLLM sees them (issue 12, item 3).

Each refused feature is a peft-written ``adapter_config.json`` (``LoraConfig.save_pretrained``) with a
weights file of the tensor names and shapes peft writes for the real base model; two adapters are made
by peft itself on the real base model. Then the same refusal through publish, ``docpilot adapters
verify`` (exit 4), ``docpilot pilot --adapter`` (stage load-adapter, exit 4, no engine started) and the
server (422, the engine never called).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from adapters.registry.compat import CONFIG_RULES, check_engine_compat, compat_problems
from adapters.registry.registry import Registry
from classify.config.sections import EngineConfig, PilotConfig, load_config
from classify.errors import AdapterIncompatible
from classify.model.model import resolve_model

ROOT = Path(__file__).resolve().parents[4]
ENGINE = EngineConfig(max_lora_rank=8)
HIDDEN, INTER, KV, VOCAB = 576, 1536, 192, 49152  # SmolLM2-135M: config.json hidden/intermediate/kv heads*64/vocab
SHAPES = {"q_proj": (HIDDEN, HIDDEN), "k_proj": (KV, HIDDEN), "v_proj": (KV, HIDDEN), "o_proj": (HIDDEN, HIDDEN),
          "gate_proj": (INTER, HIDDEN), "up_proj": (INTER, HIDDEN), "down_proj": (HIDDEN, INTER)}
PREFIX = "base_model.model.model.layers.0"


@pytest.fixture(scope="module")
def base() -> Path:
    cfg = load_config(PilotConfig, ROOT / "config" / "docpilot.json")
    return Path(resolve_model(cfg.model).path)


def _lora(module: str, r: int, shape: tuple[int, int]) -> dict[str, np.ndarray]:
    out_dim, in_dim = shape
    return {f"{module}.lora_A.weight": np.zeros((r, in_dim), np.float16),
            f"{module}.lora_B.weight": np.zeros((out_dim, r), np.float16)}


def make_adapter(folder: Path, extra: dict | None = None, tensors: dict | None = None, patch: dict | None = None,
                 **lora) -> Path:
    """A peft-written config (``LoraConfig(**lora).save_pretrained``) plus a weights file peft's names/shapes."""
    from peft import LoraConfig

    lora.setdefault("r", 8)
    lora.setdefault("target_modules", ["q_proj", "v_proj"])
    folder.mkdir(parents=True, exist_ok=True)
    LoraConfig(**lora).save_pretrained(folder)
    if patch:
        cfg = json.loads((folder / "adapter_config.json").read_text())
        (folder / "adapter_config.json").write_text(json.dumps({**cfg, **patch}))
    if tensors is None:
        tensors = {}
        targets = lora["target_modules"] if isinstance(lora["target_modules"], list) else ["q_proj", "v_proj"]
        for m in targets:
            if m in SHAPES:
                tensors |= _lora(f"{PREFIX}.self_attn.{m}" if m.endswith(("q_proj", "k_proj", "v_proj", "o_proj"))
                                 else f"{PREFIX}.mlp.{m}", lora["r"], SHAPES[m])
    save_file({**tensors, **(extra or {})}, str(folder / "adapter_model.safetensors"))
    return folder


Q = f"{PREFIX}.self_attn.q_proj"
REFUSED = [
    # (id, LoraConfig kwargs / patch / extra tensors, the message part that names the field and the setting)
    ("rank-over-limit", {"r": 16}, r"`r` is 16, over engine.max_lora_rank 8; raise `engine.max_lora_rank` or retrain"),
    ("rank-pattern-over-limit", {"rank_pattern": {"model.layers.0.self_attn.q_proj": 16}, "tensors": {
        **_lora(Q, 16, SHAPES["q_proj"])}},
     r"`rank_pattern` raises `model.layers.0.self_attn.q_proj` to r=16, over engine.max_lora_rank 8"),
    ("modules-to-save-lm-head", {"modules_to_save": ["lm_head"],
                                 "extra": {"base_model.model.lm_head.weight": np.zeros((8, HIDDEN), np.float16)}},
     r"`modules_to_save` is \['lm_head'\]: vLLM does not load fully trained modules"),
    ("dora", {"use_dora": True, "extra": {f"{Q}.lora_magnitude_vector": np.zeros(HIDDEN, np.float16)}},
     r"`use_dora` is True: vLLM does not apply DoRA"),
    ("bias-lora-only", {"bias": "lora_only"}, r"`bias` is 'lora_only'; vLLM applies no adapter bias \(allowed: 'none'\)"),
    ("lora-bias", {"lora_bias": True, "extra": {f"{Q}.lora_B.bias": np.zeros(HIDDEN, np.float16)}},
     r"`lora_bias` is True: vLLM does not apply LoRA bias"),
    ("init-pissa", {"init_lora_weights": "pissa"}, r"`init_lora_weights` is 'pissa': vLLM loads only \['gaussian'"),
    # peft 0.22's Astra (and any init string vLLM's allow-list does not name) rewrites or may rewrite base weights
    ("init-astra", {"patch": {"init_lora_weights": "astra", "astra_config": {"calib_size": 64}}},
     r"`init_lora_weights` is 'astra': vLLM loads only"),
    ("init-future", {"patch": {"init_lora_weights": "some_future_init"}}, r"`init_lora_weights` is 'some_future_init'"),
    ("init-loftq", {"patch": {"init_lora_weights": "loftq"}}, r"`init_lora_weights` is 'loftq'"),
    ("layer-replication", {"layer_replication": [[0, 1]]}, r"`layer_replication` is \[\[0, 1\]\]: vLLM does not replicate"),
    ("alora", {"alora_invocation_tokens": [1, 2]}, r"`alora_invocation_tokens` is \[1, 2\]: vLLM does not apply Activated"),
    ("qalora", {"use_qalora": True}, r"`use_qalora` is True: vLLM does not apply QALoRA"),
    ("bdlora", {"patch": {"use_bdlora": {"nblocks": 2, "target_modules_bd_a": ["q_proj"]}}}, r"`use_bdlora` is \{"),
    ("trainable-tokens", {"trainable_token_indices": [1, 2],
                          "extra": {"base_model.model.model.embed_tokens.token_adapter.trainable_tokens_delta":
                                    np.zeros((2, HIDDEN), np.float16)}},
     r"`trainable_token_indices` is \[1, 2\]: vLLM does not load trainable-token deltas"),
    ("target-parameters", {"target_parameters": ["mlp.experts.gate_up_proj"]}, r"`target_parameters` is \['mlp.experts"),
    ("fan-in-fan-out", {"fan_in_fan_out": True}, r"`fan_in_fan_out` is True"),
    ("kasa", {"patch": {"kasa_config": {"beta": 0.0001}}}, r"`kasa_config` is \{'beta': 0.0001\}: vLLM does not apply KaSA"),
    ("monteclora", {"patch": {"monteclora_config": {"num_samples": 8}}}, r"`monteclora_config` is .*MonteCLoRA"),
    ("arrow", {"patch": {"arrow_config": {"top_k": 3}}}, r"`arrow_config` is .*Arrow routing"),
    ("unknown-field", {"patch": {"use_fancy_variant": True}}, r"sets fields docpilot does not know \['use_fancy_variant'\]"),
    ("not-lora", {"patch": {"peft_type": "IA3"}}, r"`peft_type` must be LORA .*got 'IA3'"),
    ("target-norm", {"target_modules": ["q_proj", "input_layernorm"]}, r"`target_modules` \['input_layernorm'\] are not modules vLLM"),
    ("weights-rank-over-limit", {"tensors": _lora(Q, 16, SHAPES["q_proj"])},
     r"`base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight` has rank 16, over engine.max_lora_rank 8"),
    ("weights-disagree-with-config", {"r": 4, "tensors": _lora(Q, 8, SHAPES["q_proj"])},
     r"has rank 8 but adapter_config.json gives `model.layers.0.self_attn.q_proj` r=4"),
    ("module-not-in-base", {"tensors": _lora("base_model.model.model.layers.99.self_attn.q_proj", 8, SHAPES["q_proj"])},
     r"adapts `model.layers.99.self_attn.q_proj`, which the base model does not have"),
    ("other-base-shape", {"tensors": _lora(Q, 8, (1024, 1024))}, r"does not fit the base model's `model.layers.0.self_attn.q_proj` \[576, 576\]"),
    ("norm-module-tensor", {"tensors": {"base_model.model.model.norm.lora_A.weight": np.zeros((8, HIDDEN), np.float16),
                                        "base_model.model.model.norm.lora_B.weight": np.zeros((HIDDEN, 8), np.float16)}},
     r"adapts `model.norm`, not a module vLLM applies LoRA to"),
    ("saved-embedding", {"extra": {"base_model.model.model.embed_tokens.base_layer.weight": np.zeros((8, 8), np.float16)}},
     r"holds `base_model.model.model.embed_tokens.base_layer.weight` .*vLLM skips saved embedding weights"),
    ("half-a-pair", {"tensors": {f"{Q}.lora_A.weight": np.zeros((8, HIDDEN), np.float16)}}, r"\['A'\] for `model.layers.0.self_attn.q_proj` but not both"),
]


@pytest.mark.parametrize(("kwargs", "message"), [c[1:] for c in REFUSED], ids=[c[0] for c in REFUSED])
def test_each_feature_the_engine_cannot_apply_is_refused_by_name(tmp_path, base, kwargs, message):
    folder = make_adapter(tmp_path / "a", **kwargs)
    with pytest.raises(AdapterIncompatible, match=message) as err:
        check_engine_compat(folder, ENGINE, base, label="x@1")
    assert str(err.value).startswith("adapter x@1 cannot be applied by the engine (vLLM LoRA) and was not loaded: ")
    assert err.value.exit_code == 4 and err.value.http_status == 422


ALLOWED = [
    ("plain-all-projections", {"target_modules": list(SHAPES)}),
    ("rank-pattern-lowers", {"rank_pattern": {"q_proj": 4}, "tensors": {**_lora(Q, 4, SHAPES["q_proj"])}}),
    ("alpha-pattern-rslora", {"alpha_pattern": {"q_proj": 32}, "use_rslora": True}),
    ("regex-targets", {"target_modules": r".*\.layers\.0\.self_attn\.(q|v)_proj"}),
    ("some-layers", {"layers_to_transform": [0], "layers_pattern": "layers"}),
    ("exclude-modules", {"exclude_modules": ["k_proj"]}),
    ("gaussian-init-velora", {"init_lora_weights": "gaussian", "patch": {"velora_config": {"num_groups": 32}}}),
    # a newer peft's field at its default (peft 0.22 writes "astra_config": null): accepted, known or not
    ("astra-config-off", {"patch": {"astra_config": None}}),
    ("unknown-field-at-default", {"patch": {"use_fancy_variant": False, "fancy_config": None}}),
    ("embed-tokens-lm-head", {"target_modules": ["embed_tokens", "lm_head"], "tensors": {
        "base_model.model.model.embed_tokens.lora_embedding_A": np.zeros((8, VOCAB), np.float16),
        "base_model.model.model.embed_tokens.lora_embedding_B": np.zeros((HIDDEN, 8), np.float16),
        **_lora("base_model.model.lm_head", 8, (VOCAB, HIDDEN))}}),
]


@pytest.mark.parametrize("kwargs", [c[1] for c in ALLOWED], ids=[c[0] for c in ALLOWED])
def test_features_vllm_applies_pass(tmp_path, base, kwargs):
    assert compat_problems(make_adapter(tmp_path / "a", **kwargs), ENGINE, base) == []


def test_every_field_peft_writes_has_a_rule(tmp_path):
    written = json.loads((make_adapter(tmp_path / "a") / "adapter_config.json").read_text())
    assert sorted(set(written) - set(CONFIG_RULES)) == []


@pytest.fixture(scope="module")
def peft_made(tmp_path_factory, base) -> dict[str, Path]:
    """Adapters written by peft itself on the real base model (the two features of the issue + a fine one)."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    root = tmp_path_factory.mktemp("peft")
    kwargs = {"ok": {}, "rank_pattern": {"rank_pattern": {"model.layers.3.self_attn.q_proj": 16}},
              "lm_head": {"modules_to_save": ["lm_head"]}}
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    for name, extra in kwargs.items():
        peft_model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"],
                                                     layers_to_transform=[3], **extra))
        peft_model.save_pretrained(root / name)
        model = peft_model.unload()
    return {k: root / k for k in kwargs}


def test_peft_made_adapters_over_rank_or_with_saved_lm_head_are_refused(peft_made, base):
    assert compat_problems(peft_made["ok"], ENGINE, base) == []
    with pytest.raises(AdapterIncompatible, match=r"`rank_pattern` raises `model.layers.3.self_attn.q_proj` to r=16, "
                                                  r"over engine.max_lora_rank 8.*q_proj.lora_A.weight` has rank 16"):
        check_engine_compat(peft_made["rank_pattern"], ENGINE, base)
    with pytest.raises(AdapterIncompatible, match=r"`modules_to_save` is \['lm_head'\].*holds `base_model.model.lm_head"):
        check_engine_compat(peft_made["lm_head"], ENGINE, base)


def _card(base_path: Path) -> dict:
    cfg = load_config(PilotConfig, ROOT / "config" / "docpilot.json")
    model = resolve_model(cfg.model)
    return {"base_model": {"name": model.name, "fingerprint": model.fingerprint}}


def test_publish_refuses_and_publishes_nothing(tmp_path, base):
    reg = Registry(tmp_path / "registry")
    src = make_adapter(tmp_path / "src", r=16)
    with pytest.raises(AdapterIncompatible, match=r"adapter over@1 .*`r` is 16, over engine.max_lora_rank 8"):
        reg.publish(src, "over", 1, _card(base), engine=ENGINE, base_model_path=base)
    training = {"config": {"engine": {"max_lora_rank": 8}}}  # what `docpilot train` puts in the card
    with pytest.raises(AdapterIncompatible, match=r"`r` is 16"):
        reg.publish(src, "over", 1, {**_card(base), "training": training})
    assert reg.versions("over") == []
    assert reg.publish(make_adapter(tmp_path / "fine"), "fine", 1, {**_card(base), "training": training},
                       base_model_path=base).ref == "fine@1"


def _publish_unchecked(registry_root: Path, tmp_path: Path, base: Path, **lora) -> str:
    """Publish as an older docpilot did (no engine check), so the later checks are what is tested."""
    reg = Registry(registry_root)
    reg.publish(make_adapter(tmp_path / "over-src", **lora), "over", 1, _card(base))
    reg.set_pilot_status("over@1", "passed", "run-old")
    return "over@1"


def test_cli_verify_exits_4_naming_the_setting(tmp_path, base, capsys):
    from docpilot.cli import main

    ref = _publish_unchecked(tmp_path / "registry", tmp_path, base, rank_pattern={"q_proj": 16},
                             tensors=_lora(Q, 16, SHAPES["q_proj"]))
    code = main(["adapters", "--registry", str(tmp_path / "registry"), "verify", ref,
                 "--config", str(ROOT / "config" / "docpilot.json")])
    assert code == 4
    assert "`rank_pattern` raises `q_proj` to r=16, over engine.max_lora_rank 8" in capsys.readouterr().err


def test_pilot_stops_at_load_adapter_without_starting_the_engine(tmp_path, base, monkeypatch, capsys):
    import batch.run.attempt
    from docpilot.cli import main

    started = []  # the pilot is a batch run: its engines start in the run's pool (Ray, engine actors)
    monkeypatch.setattr(batch.run.attempt.BatchRun, "run_shards", lambda *a, **k: started.append(a) or pytest.fail("pool started"))
    monkeypatch.setenv("DOCPILOT_REGISTRY", str(tmp_path / "registry"))
    ref = _publish_unchecked(tmp_path / "registry", tmp_path, base, r=16)
    t0 = time.monotonic()
    code = main(["pilot", "--adapter", ref, "--export-dir", str(tmp_path / "exports")])
    assert code == 4 and not started and time.monotonic() - t0 < 60
    err = capsys.readouterr().err
    assert "error [adapter_incompatible] at stage load-adapter: AdapterIncompatible: adapter over@1 cannot be applied" in err
    assert "`r` is 16, over engine.max_lora_rank 8" in err
    # the adapter's card keeps its old status: a refused adapter was never piloted
    assert Registry(tmp_path / "registry").show(ref).card["pilot"]["run_id"] == "run-old"


def test_server_answers_422_and_never_calls_the_engine(tmp_path, base):
    from fastapi.testclient import TestClient

    from classify.model.model import ModelRef
    from serve.app import create_app
    from serve.settings import load_settings

    calls = []

    class Engine:
        class llm:  # noqa: N801 - vLLM's AsyncLLM as the server sees it
            errored = False

            @staticmethod
            async def add_lora(request):
                calls.append(("add_lora", request))
                return True

        async def classify(self, docs, adapter=None):
            calls.append(("classify", adapter))
            return []

        def shutdown(self):
            pass

    card = _card(base)["base_model"]
    model = ModelRef(card["name"], str(base), card["fingerprint"], "test")
    _publish_unchecked(tmp_path / "registry", tmp_path, base, modules_to_save=["lm_head"],
                       extra={"base_model.model.lm_head.weight": np.zeros((VOCAB, HIDDEN), np.float16)})
    cfg = load_config(PilotConfig, ROOT / "config" / "docpilot.json")
    token = "tok-" + "0123456789abcdef" * 2  # a usable token (serve refuses a repeated character)
    app = create_app(load_settings(api_token=token, skip_pilot_gate=True), config=cfg, model=model,
                     registry=Registry(tmp_path / "registry"), engine_factory=Engine)
    with TestClient(app) as client:
        deadline = time.time() + 10
        while client.get("/readyz").json()["status"] == "loading" and time.time() < deadline:
            time.sleep(0.02)
        calls.clear()  # the server's own start-up checks may use the engine; the request must not
        resp = client.post("/v1/classify", json={"adapter": "over@1", "documents": [{"id": "a", "text": "x"}]},
                           headers={"Authorization": f"Bearer {token}"})
    assert resp.status_code == 422, resp.text
    error = resp.json()["error"]
    assert error["kind"] == "adapter_incompatible"
    assert "`modules_to_save` is ['lm_head']" in error["message"]
    assert calls == []
