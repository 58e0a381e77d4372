"""Tests of ``make plan`` (batch/plan/plan.py, classify/model/memory.py).

Prices come from the shipped example table in ``config/lots.json``. Memory figures are
hand-computed here from the models' published ``config.json`` numbers; the last tests
check the formulas against what the real vLLM engine allocated and the real safetensors file.

Split by tier: this file holds the unit tests; the others of the same subject are in ``tests/engine/test_plan_kv.py``.
"""

from __future__ import annotations

import json
import re
import struct
from pathlib import Path

import pytest

from batch.plan.lots import JobShape, LotsConfig, job_shape
from batch.plan.plan import build_plan, main, model_shape, order_summary, ray_plan
from classify.config.sections import EngineConfig, ModelConfig, load_config, parse_config
from classify.config.training import LINEAR_MODULES
from classify.errors import ConfigError
from classify.model.memory import (
    BUILTIN_SHAPES,
    GIB,
    activation_bytes,
    kv_bytes_per_token,
    serving_estimate,
    training_estimate,
)
from classify.model.shape import lora_parameter_count

ROOT = Path(__file__).resolve().parents[4]
LOTS = ROOT / "config" / "lots.json"
QKVO = ("q_proj", "k_proj", "v_proj", "o_proj")


def lots(**changes) -> LotsConfig:
    """The shipped config with top-level fields replaced (validated like a file)."""
    data = json.loads(LOTS.read_text())
    data.update(changes)
    return parse_config(LotsConfig, data, "lots.json")


def test_shipped_config_is_valid():
    cfg = load_config(LotsConfig, LOTS)
    assert {"H100", "H200", "B200", "MI300X", "L40S", "L4"} <= set(cfg.gpus)
    assert cfg.gpus["B200"].cards_per_lot == 2
    assert cfg.gpus["MI300X"].backend == "rocm"
    assert all(g.cards_per_lot == 1 for name, g in cfg.gpus.items() if name != "B200")


@pytest.mark.parametrize(
    ("gpu", "days", "n", "cards", "total"),
    [
        ("H100", 7, 1, 1, 400.0),
        ("H100", 3, 4, 4, 720.0),
        ("H200", 30, 4, 4, 9000.0),
        ("MI300X", 7, 3, 3, 1080.0),
        ("L40S", 30, 10, 10, 6200.0),
        ("L4", 3, 10, 10, 400.0),
        ("B200", 3, 1, 2, 720.0),
        ("B200", 7, 2, 4, 3200.0),
        ("B200", 30, 10, 20, 65000.0),
    ],
)
def test_order_totals(gpu, days, n, cards, total):
    order = order_summary(lots(gpu_model=gpu, period_days=days, lots=n))
    assert (order["gpu_model"], order["period_days"], order["lots"]) == (gpu, days, n)
    assert order["total_cards"] == cards
    assert order["total_usd"] == total


def test_b200_lot_price_is_not_multiplied_by_cards():
    cfg = lots(gpu_model="B200", period_days=7, lots=3)
    order = order_summary(cfg)
    lot_price = cfg.gpus["B200"].usd_per_lot["7"]
    assert order["cards_per_lot"] == 2 and order["total_cards"] == 6
    assert order["total_usd"] == lot_price * 3 == 4800.0
    assert order["total_usd"] != lot_price * 3 * 2
    assert ray_plan(cfg)["engine_actors"] == 6


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"lots": 0}, "lots.json: `lots` must be greater than or equal to 1, got 0"),
        ({"lots": 11}, "lots.json: `lots` must be less than or equal to 10, got 11"),
        ({"period_days": 14}, "lots.json: `period_days` must be 3, 7 or 30, got 14"),
        ({"period_days": "7"}, "lots.json: `period_days` must be 3, 7 or 30, got \"7\""),
        ({"colour": "red"}, "lots.json: `colour` is not a known field"),
    ],
)
def test_range_errors(changes, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        lots(**changes)


def test_unknown_gpu_model():
    with pytest.raises(ConfigError, match=re.escape(
        "`gpu_model` must be one of ['B200', 'H100', 'H200', 'L4', 'L40S', 'MI300X', 'RTX4090'], got 'A100'"
    )):
        order_summary(lots(gpu_model="A100"))


def test_missing_price_and_bad_price():
    data = json.loads(LOTS.read_text())
    data["gpus"]["L4"]["usd_per_lot"] = {"3": 40, "30": 350}
    cfg = parse_config(LotsConfig, {**data, "gpu_model": "L4", "period_days": 7}, "lots.json")
    with pytest.raises(ConfigError, match=re.escape("`gpus.L4.usd_per_lot` has no price for period_days 7 (listed: ['3', '30'])")):
        order_summary(cfg)
    data["gpus"]["L4"]["usd_per_lot"] = {"3": 0}
    with pytest.raises(ConfigError, match=re.escape("`gpus.L4.usd_per_lot` must hold prices > 0 USD, got {'3': 0.0}")):
        parse_config(LotsConfig, data, "lots.json")


def test_cli_range_error_exit_code(capsys):
    from docpilot.cli import main as cli

    assert cli(["plan", "--lots-config", str(LOTS), "--lots", "11"]) == 2
    assert "`lots` must be less than or equal to 10, got 11" in capsys.readouterr().err


def test_backend_warning_for_mi300x_on_cuda_image():
    ray = ray_plan(lots(gpu_model="MI300X"))
    assert ray["backend_ok"] is False
    assert ray["warnings"] == [
        "MI300X needs a ROCm vLLM but the serving image is built for CUDA (`image_backend`): "
        "rebuild the image on vLLM's ROCm build (rocm/vllm base image) before renting"
    ]
    assert ray_plan(lots(gpu_model="MI300X", image_backend="rocm"))["warnings"] == []
    assert ray_plan(lots(gpu_model="H100", image_backend="rocm"))["backend_ok"] is False


def test_ray_plan_one_actor_per_card_and_cluster_note():
    ray = ray_plan(lots(gpu_model="H200", lots=4))
    assert (ray["engine_actors"], ray["num_gpus_per_actor"], ray["machines"], ray["needs_cluster"]) == (4, 1, 4, True)
    assert "RAY_ADDRESS" in ray["warnings"][0]
    assert ray_plan(lots(lots=1))["needs_cluster"] is False


# ---- memory: hand-computed values ------------------------------------------------------------
# SmolLM2-135M config.json: 30 layers, hidden 576, 9 heads, 3 KV heads, head_dim 64, MLP 1536,
# vocab 49152, tied embeddings. Per layer: q 576*576 + k 576*192 + v 576*192 + o 576*576 = 884,736;
# MLP 3*576*1536 = 2,654,208; 2 norms 1,152 -> 3,540,096. Total: 49152*576 (28,311,552)
# + 30*3,540,096 (106,202,880) + final norm 576 = 134,515,008.
SMOL_PARAMS = 134_515_008
SMOL_KV_PER_TOKEN = 30 * 2 * 3 * 64 * 2  # = 23,040 bytes in bf16
# LoRA (in + out) per layer: q 1152, k 768, v 768, o 1152, gate 2112, up 2112, down 2112 = 10,176.
SMOL_LORA_ALL_PER_RANK = 30 * 10_176  # = 305,280
SMOL_LORA_QKVO_PER_RANK = 30 * 3_840  # = 115,200


def test_default_model_shape_and_serving_estimate():
    shape = model_shape(ModelConfig())
    assert (shape.num_layers, shape.hidden_size, shape.num_kv_heads, shape.head_dim) == (30, 576, 3, 64)
    assert shape.num_parameters() == SMOL_PARAMS
    assert kv_bytes_per_token(shape, 2) == SMOL_KV_PER_TOKEN == 23_040
    assert lora_parameter_count(shape, LINEAR_MODULES) == SMOL_LORA_ALL_PER_RANK
    est = serving_estimate(shape, 2, max_model_len=1024, max_num_seqs=64, max_loras=2, max_lora_rank=16,
                           overhead_bytes=2 * GIB, usable_bytes=80 * GIB)
    assert est.parts == {
        "weights": 269_030_016,  # 134,515,008 * 2
        "kv_cache": 1_509_949_440,  # 23,040 * 1024 tokens * 64 sequences
        "lora_slots": 19_537_920,  # 2 slots * rank 16 * 305,280 * 2 bytes
        "overhead": 2 * GIB,
    }
    assert est.needed == 269_030_016 + 1_509_949_440 + 19_537_920 + 2_147_483_648
    assert est.margin == 80 * GIB - est.needed and est.fits


def test_default_model_training_estimate():
    shape = model_shape(ModelConfig())
    # activations, s=512, b=8, h=576, a=9, 30 layers, checkpointing:
    # one full layer 512*8*576*34 + 5*9*512^2*8 = 80,216,064 + 94,371,840 = 174,587,904
    # kept layer inputs 30*2*512*8*576 = 141,557,760; logits 8*512*49152*(2+8) = 2,013,265,920
    acts = {ckpt: activation_bytes(shape, batch_size=8, seq_len=512, gradient_checkpointing=ckpt, dtype_bytes=2)
            for ckpt in (True, False)}
    assert acts[True] == 174_587_904 + 141_557_760 + 2_013_265_920
    assert acts[False] == 30 * 174_587_904 + 2_013_265_920
    est = training_estimate(shape, 2, lora_rank=16, lora_targets=QKVO, batch_size=8, seq_len=512, gradient_checkpointing=True,
                            overhead_bytes=0, usable_bytes=24 * GIB)
    assert est.parts == {
        "weights": 269_030_016,
        "lora_state": 16 * 16 * SMOL_LORA_QKVO_PER_RANK,  # 1,843,200 trainable * 16 bytes = 29,491,200
        "activations": 2_329_411_584,
        "overhead": 0,
    }


def test_7b_class_estimates():
    llama, mistral = BUILTIN_SHAPES["llama-2-7b"], BUILTIN_SHAPES["mistral-7b"]
    # Llama-2-7B: 2*32000*4096 + 32*(4*4096^2 + 3*4096*11008 + 2*4096) + 4096
    assert llama.num_parameters() == 6_738_415_616
    assert kv_bytes_per_token(llama, 2) == 32 * 2 * 32 * 128 * 2 == 524_288  # 0.5 MiB per token
    # Mistral-7B: GQA with 8 KV heads, MLP 14336
    assert mistral.num_parameters() == 7_241_732_096
    assert kv_bytes_per_token(mistral, 2) == 131_072
    # peft's documented count for Llama-2-7B, r=8 on q_proj and v_proj: 4,194,304 trainable
    assert lora_parameter_count(llama, ("q_proj", "v_proj"), 8) == 4_194_304
    assert lora_parameter_count(llama, QKVO, 16) == 16_777_216
    # serving 4096-token sequences x 64 on one H100 (79.6 GiB x 0.85): the KV cache alone is 128 GiB
    usable = int(int(79.6 * GIB) * 0.85)
    est = serving_estimate(llama, 2, max_model_len=4096, max_num_seqs=64, max_loras=2, max_lora_rank=16,
                           overhead_bytes=2 * GIB, usable_bytes=usable)
    assert est.parts["weights"] == 13_476_831_232
    assert est.parts["kv_cache"] == 128 * GIB
    assert est.parts["lora_slots"] == 2 * 16 * 32 * (4 * 8192 + 3 * (4096 + 11008)) * 2 == 159_907_840
    assert not est.fits and est.margin == usable - est.needed
    # training r=16 q,k,v,o, b=1, s=2048, checkpointing, on a 24 GB card
    tr = training_estimate(llama, 2, lora_rank=16, lora_targets=QKVO, batch_size=1, seq_len=2048, gradient_checkpointing=True,
                           overhead_bytes=2 * GIB, usable_bytes=int(23.6 * GIB))
    acts = 32 * 2 * 2048 * 4096 + (2048 * 4096 * 34 + 5 * 32 * 2048**2) + 2048 * 32000 * 10
    assert tr.parts == {"weights": 13_476_831_232, "lora_state": 268_435_456, "activations": acts, "overhead": 2 * GIB}
    assert tr.fits  # 12.55 + 0.25 + 1.9 + 2 GiB < 23.6 GiB


def test_plan_no_pooling_across_b200_cards():
    cfg = lots(gpu_model="B200", lots=2)
    plan = build_plan(cfg, JobShape(model=ModelConfig(base_model="llama-2-7b", max_model_len=4096),
                                    engine=EngineConfig(max_num_seqs=256)))
    usable = int(int(179.1 * GIB) * 0.85)
    serving = plan["memory"]["serving"]
    assert serving["usable"] == usable  # one card, not two
    # vLLM starts (one 4096-token sequence of KV fits beside the weights); 256 sequences at full length would not
    llama = BUILTIN_SHAPES["llama-2-7b"]
    lora = 2 * 16 * lora_parameter_count(llama, LINEAR_MODULES) * 2
    per_seq = 32 * 2 * 32 * 128 * 2 * 4096  # 2 GiB
    assert serving["fits"] and serving["full_sequences"] == (usable - llama.num_parameters() * 2 - lora - 2 * GIB) // per_seq
    assert plan["memory"]["serving_worst_case"]["fits"] is False
    assert any(w.startswith(f"serving starts on one B200 card, holding {serving['full_sequences']} full-length")
               for w in plan["warnings"])


def test_main_writes_plan_json(capsys):
    from classify.paths import runs_dir

    assert main(["--lots-config", str(LOTS), "--gpu-model", "B200", "--lots", "2", "--period-days", "30"]) == 0
    out = capsys.readouterr().out
    assert "13,000.0" in out and "Ray engine actors" in out
    written = sorted(runs_dir().glob("*-plan-*/plan.json"))
    plan = json.loads(written[-1].read_text())
    assert plan["order"]["total_usd"] == 13000.0 and plan["order"]["total_cards"] == 4
    assert plan["ray"]["engine_actors"] == 4
    assert plan["memory"]["parameters"] == SMOL_PARAMS
    assert plan["memory"]["serving"]["fits"] and plan["memory"]["training"]["fits"]
    assert plan["run_id"] == written[-1].parent.name


# ---- checked against the real artefacts ------------------------------------------------------


def test_weights_estimate_matches_safetensors():
    shape = model_shape(ModelConfig())
    path = Path(shape.name) / "model.safetensors"
    with open(path, "rb") as fh:
        header_len = struct.unpack("<Q", fh.read(8))[0]
        header = json.loads(fh.read(header_len))
    header.pop("__metadata__", None)
    assert {t["dtype"] for t in header.values()} == {"BF16"}
    tensor_bytes = sum(t["data_offsets"][1] - t["data_offsets"][0] for t in header.values())
    assert tensor_bytes == SMOL_PARAMS * 2 == path.stat().st_size - 8 - header_len


def test_cpu_serving_estimate_parts():
    """The CPU figure the pilot compares its measured peak RSS with: weights + the whole CPU KV space + runtime."""
    from classify.model.memory import (
        CPU_ENGINE_PROCESSES,
        CPU_RUNTIME_BYTES_PER_PROCESS,
        cpu_serving_estimate,
    )

    shape = model_shape(ModelConfig())
    est = cpu_serving_estimate(shape, 4, kv_cache_space_gib=1, max_loras=2, max_lora_rank=8, enable_lora=False,
                               usable_bytes=16 * GIB)
    assert est.parts == {"weights": SMOL_PARAMS * 4, "kv_cache": GIB, "lora_slots": 0,
                         "runtime": CPU_ENGINE_PROCESSES * CPU_RUNTIME_BYTES_PER_PROCESS}
    assert est.parts["runtime"] == 3 * GIB
    assert est.needed == 538_060_032 + GIB + 3 * GIB and est.fits
    lora = cpu_serving_estimate(shape, 4, kv_cache_space_gib=1, max_loras=2, max_lora_rank=8, enable_lora=True,
                                usable_bytes=16 * GIB)
    assert lora.parts["lora_slots"] == 2 * 8 * SMOL_LORA_ALL_PER_RANK * 4


def test_memory_functions_take_at_most_three_positional_parameters():
    """Sizing numbers go by keyword: ``serving_estimate(shape, 2, max_model_len=..., ...)``, never eight bare ints."""
    import inspect

    import classify.model.memory as memory

    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    public = {name: fn for name, fn in vars(memory).items()
              if inspect.isfunction(fn) and fn.__module__ == memory.__name__ and not name.startswith("_")}
    assert {"serving_estimate", "training_estimate", "cpu_serving_estimate", "activation_bytes"} <= public.keys()
    for name, fn in public.items():
        params = inspect.signature(fn).parameters.values()
        assert sum(p.kind in positional for p in params) <= 3, name
    with pytest.raises(TypeError):
        memory.serving_estimate(model_shape(ModelConfig()), 2, 1024, 64, 2, 16, 0, GIB)  # type: ignore[misc]


def test_auto_engine_fields_resolve_for_the_lots_backend():
    """An `"auto"` engine section is sized as a CUDA/ROCm engine runs it on the lot (256 sequences)."""
    job = JobShape(engine=EngineConfig(max_num_seqs="auto", enforce_eager="auto"))
    memory = build_plan(lots(), job)["memory"]
    assert memory["serving_worst_case"]["parts"]["kv_cache"] == SMOL_KV_PER_TOKEN * 1024 * 256
    assert memory["serving"]["max_num_seqs"] == 256 and memory["serving"]["parts"]["kv_cache"] == SMOL_KV_PER_TOKEN * 1024


# ---- the plan sizes the configured job (config/docpilot.json), the lot comes from lots.json ----------------

def test_shipped_lots_config_holds_only_the_lot():
    data = json.loads(LOTS.read_text())
    assert not {"model", "engine", "training"} & set(data)
    assert {"gpu_model", "period_days", "lots", "gpus", "lease_ends_at", "overhead_gib_per_card"} <= set(data)


def test_plan_sizes_the_job_of_docpilot_json_and_follows_its_edits(tmp_path, capsys):
    """`make plan` after an edit of engine.max_lora_rank and train.training.batch_size prints another estimate."""
    shipped = json.loads((ROOT / "config" / "docpilot.json").read_text())
    job = job_shape(ROOT / "config" / "docpilot.json")
    assert job.engine.max_lora_rank == shipped["engine"]["max_lora_rank"]
    assert job.training.batch_size == shipped["train"]["training"]["batch_size"]
    assert job.training.seq_len_tokens == shipped["train"]["training"]["max_seq_tokens"]
    assert list(job.training.lora_targets) == shipped["train"]["lora"]["target_modules"]

    def plan_of(config: Path) -> tuple[str, dict]:
        assert main(["--config", str(config), "--lots-config", str(LOTS)]) == 0
        out = capsys.readouterr().out
        written = re.search(r"plan written to (\S+)", out.replace("\n", "")).group(1)  # rich may wrap the path
        return out, json.loads(Path(written).read_text())

    before_out, before = plan_of(ROOT / "config" / "docpilot.json")
    edited = json.loads(json.dumps(shipped))
    edited["engine"]["max_lora_rank"] = 64
    edited["train"]["training"]["batch_size"] = 32
    path = tmp_path / "docpilot.json"
    path.write_text(json.dumps(edited))
    after_out, after = plan_of(path)
    assert after["job"]["engine"]["max_lora_rank"] == 64 and after["job"]["training"]["batch_size"] == 32
    lora = lambda p: p["memory"]["serving"]["parts"]["lora_slots"]  # noqa: E731
    acts = lambda p: p["memory"]["training"]["parts"]["activations"]  # noqa: E731
    assert lora(after) == lora(before) * 64 // shipped["engine"]["max_lora_rank"]
    assert acts(after) > acts(before)
    assert before_out != after_out and f"{after['memory']['training']['needed_gib']:.2f}" in after_out


def test_an_old_lots_config_with_job_sections_says_what_moved_where(tmp_path, capsys):
    from docpilot.cli import main as cli

    old = {**json.loads(LOTS.read_text()), "model": {"base_model": "smollm2-135m-instruct"},
           "engine": {"max_lora_rank": 16}, "training": {"batch_size": 8}}
    path = tmp_path / "lots.json"
    path.write_text(json.dumps(old))
    assert cli(["plan", "--lots-config", str(path)]) == 2
    err = capsys.readouterr().err
    assert "`model` -> `model` of config/docpilot.json" in err and "`engine` -> `engine` of config/docpilot.json" in err
    assert "`training` -> `train.training` (batch_size, max_seq_tokens) and `train.lora`" in err
    assert cli(["plan", "--config", str(LOTS)]) == 2  # the lots file where the job's config goes
    assert "pass the lots file as --lots-config" in capsys.readouterr().err


def test_an_old_lots_config_only_warns_where_its_lease_fields_are_read(tmp_path, caplog):
    """batch, pilot, status and wrap-up read only the lease fields: an old lots.json warns there, never stops them."""
    from batch.lease.clock import lease_end
    from batch.lease.stop import stop_settings

    old = {**json.loads(LOTS.read_text()), "lease_ends_at": "2026-12-03T18:00:00Z",
           "model": {"base_model": "smollm2-135m-instruct"}, "engine": {"max_lora_rank": 16}}
    path = tmp_path / "lots.json"
    path.write_text(json.dumps(old))
    with caplog.at_level("WARNING"):
        assert lease_end(str(path), None).isoformat() == "2026-12-03T18:00:00+00:00"
        assert stop_settings(path).stop_command is None
    assert "`engine` -> `engine` of config/docpilot.json" in caplog.text
    bad = {**old, "lease_ends_at": "tomorrow"}
    path.write_text(json.dumps(bad))
    with pytest.raises(ConfigError, match="lease_ends_at"):
        lease_end(str(path), None)
