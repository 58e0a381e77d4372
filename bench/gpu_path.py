"""GPU-path checks on a machine with an NVIDIA card and torch (no vLLM, no Ray needed): issue 37's device script.

Run from the repository root on the GPU machine::

    python3 -m bench.gpu_path --model-dir DIR --bbc-dir DIR --out OUT

``DIR`` holds the default model's ``config.json`` and tokenizer files (no weights: the weights are random, made
here from the config, so the figures are for the default model's *shapes*); ``--bbc-dir`` the BBC News CSVs.
Sections, each timed and independent (one failing does not stop the others), all written to ``OUT/gpu_path.json``:

1. ``facts``: nvidia-smi (card, driver, CUDA), torch and its CUDA runtime.
2. ``probe``: ``python3 -m classify.machine.probe show`` / ``check`` (the profile ``make setup`` would install).
3. ``doctor``: :func:`batch.pilot.doctor.run_checks` (no model): machine vs venv, the CUDA compute check, card memory.
4. ``nvml_pids``: do NVML's process ids match this container's (the pilot's GPU memory figure relies on it)?
5. ``train``: the project's own LoRA loop (:func:`adapters.train.loop.run_loop`) on the card, real BBC training examples,
   the shipped training settings; peak ``torch.cuda.max_memory_allocated`` beside ``make plan``'s training estimate;
   the same steps on this machine's CPU, per-step time side by side.
6. ``forward``: documents/s of the card's forward pass for the classify prompt (the default model's shapes, bf16,
   the real prompt ids of the BBC articles), as ``transformers`` runs it (no vLLM: a lower bound for the engine).
7. ``host``: one actor's host work without the forward pass (parse shard bytes + prompt ids with the real
   tokenizer), at 1, 2, 8 and 16 tokenizer threads, each in its own process pinned to that many cores.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any


def _sh(cmd: list[str], timeout: float = 60) -> str:
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        return (out.stdout + out.stderr).strip()
    except Exception as err:  # noqa: BLE001 - a record, not a check
        return f"{type(err).__name__}: {err}"


def _texts(bbc: Path) -> tuple[list[str], list[str]]:
    texts, labels = [], []
    for name in ("train", "test"):
        with (bbc / f"{name}.csv").open(encoding="utf-8", newline="") as fh:
            for row in csv.DictReader(fh):
                texts.append(row["text"])
                labels.append(row["category"])
    return texts, labels


def facts() -> dict[str, Any]:
    import torch

    return {"nvidia_smi": _sh(["nvidia-smi", "--query-gpu=name,memory.total,driver_version,compute_cap",
                               "--format=csv,noheader"]),
            "nvidia_smi_head": _sh(["nvidia-smi"]).splitlines()[:4],
            "torch": torch.__version__, "torch_cuda": torch.version.cuda, "available": torch.cuda.is_available(),
            "device": torch.cuda.get_device_name(0), "capability": torch.cuda.get_device_capability(0),
            "cpu_cores": len(os.sched_getaffinity(0)), "python": sys.version.split()[0]}


def probe() -> dict[str, Any]:
    return {"show": json.loads(_sh([sys.executable, "-m", "classify.machine.probe", "show"]) or "{}"),
            "check": _sh([sys.executable, "-m", "classify.machine.probe", "check"])}


def doctor() -> list[dict[str, Any]]:
    from batch.pilot.doctor import run_checks
    from classify.config.sections import PilotConfig, load_config

    cfg = load_config(PilotConfig, "config/docpilot.json")
    return [{"name": c.name, "status": c.status, "detail": c.detail} for c in run_checks(cfg, check_model=False)]


def nvml_pids() -> dict[str, Any]:
    import torch

    x = torch.empty(512 * 2**20, dtype=torch.uint8, device="cuda")  # hold 512 MiB
    torch.cuda.synchronize()
    apps = _sh(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"])
    from batch.pilot.measure import nvml_bytes

    ours = nvml_bytes([os.getpid()])
    try:
        import pynvml

        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        procs = [(p.pid, p.usedGpuMemory) for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h)]
        device_used = pynvml.nvmlDeviceGetMemoryInfo(h).used
    except Exception as err:  # noqa: BLE001
        procs, device_used = f"{type(err).__name__}: {err}", None
    del x
    return {"our_pid": os.getpid(), "nvidia_smi_apps": apps, "nvml_procs": procs, "nvml_bytes_for_our_pid": ours,
            "pid_matches": str(os.getpid()) in apps.split(",")[0::1] or any(str(os.getpid()) == a.split(",")[0].strip()
                                                                              for a in apps.splitlines()),
            "device_used_bytes": device_used}


def _random_model(model_dir: Path, dest: Path) -> Path:
    import shutil

    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    config = AutoConfig.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(dest)
    for f in model_dir.iterdir():
        if f.name.startswith("tokenizer") or f.name.endswith(".jinja"):
            shutil.copy(f, dest / f.name)
    return dest


def train(model_path: Path, bbc: Path, steps: int, cpu_steps: int) -> dict[str, Any]:
    import torch
    from transformers import AutoTokenizer

    from adapters.train.loop import build_lora_model, run_loop
    from classify.config.sections import load_config
    from classify.config.training import TrainConfig
    from classify.engine.prompt import build_training_examples
    from classify.model.memory import training_estimate
    from classify.model.shape import shape_from_folder

    base = load_config(TrainConfig, "config/docpilot.json")
    texts, labels = _texts(bbc)
    tok = AutoTokenizer.from_pretrained(model_path)
    examples = build_training_examples(tok, base.classify, texts[:2000], labels[:2000])
    examples = [e for e in examples if len(e["input_ids"]) <= base.training.max_seq_tokens]
    out: dict[str, Any] = {"examples": len(examples), "max_seq_tokens": base.training.max_seq_tokens,
                           "batch_size": base.training.batch_size, "grad_accum_steps": base.training.grad_accum_steps,
                           "lora": base.lora.model_dump(mode="json")}
    devices = (("cuda", steps), ("cpu", cpu_steps)) if torch.cuda.is_available() else (("cpu", cpu_steps),)  # a dry run here
    for device, n in devices:
        t = base.training.model_copy(update={"max_steps": n, "device": device, "checkpoint_every_steps": 20,
                                             "threads": len(os.sched_getaffinity(0)), "warmup_steps": 0})
        cfg = base.model_copy(update={"training": t})
        run_dir = Path(f"/tmp/gpu-train-{device}")
        t0 = time.perf_counter()
        model = build_lora_model(cfg, str(model_path))
        where = {str(p.device) for p in model.parameters()}
        state = run_loop(cfg, model, examples, pad_id=tok.pad_token_id or tok.eos_token_id, run_dir=run_dir,
                         config_sha256="gpu-path")
        walls = [h["wall_s"] for h in state["history"]]
        steady = walls[2:] or walls
        out[device] = {"steps": n, "dtype": cfg.training.compute_dtype(), "param_devices": sorted(where),
                       "device": state["device"], "first_step_s": walls[0], "steady_step_s": sum(steady) / len(steady),
                       "tokens_per_s_steady": sum(h["tokens"] for h in state["history"][2:]) / max(sum(steady), 1e-9),
                       "loss_first": state["history"][0]["loss"], "loss_last": state["history"][-1]["loss"],
                       "peak_device_bytes": state.get("peak_device_bytes"), "wall_s": time.perf_counter() - t0,
                       "checkpoints": sorted(p.name for p in (run_dir / "checkpoints").iterdir())}
        del model
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    shape = shape_from_folder(model_path)
    est = training_estimate(shape, 2, lora_rank=base.lora.rank, lora_targets=tuple(base.lora.target_modules),
                            batch_size=base.training.batch_size, seq_len=base.training.max_seq_tokens,
                            gradient_checkpointing=False, overhead_bytes=0, usable_bytes=140 * 2**30)
    out["plan_training_estimate_bytes_without_overhead"] = est.needed
    out["plan_parts"] = est.parts
    if "cuda" in out:
        out["measured_over_estimate"] = (out["cuda"]["peak_device_bytes"] or 0) / est.needed
        out["cpu_over_cuda_step_time"] = out["cpu"]["steady_step_s"] / out["cuda"]["steady_step_s"]
    return out


def forward(model_path: Path, bbc: Path, batch: int) -> dict[str, Any]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from classify.config.sections import ClassifyConfig, PilotConfig, load_config
    from classify.engine.prompt import build_prompts

    cfg: ClassifyConfig = load_config(PilotConfig, "config/docpilot.json").classify
    texts, _ = _texts(bbc)
    tok = AutoTokenizer.from_pretrained(model_path)
    ids = [p.ids for p in build_prompts(tok, cfg, texts)]
    ids.sort(key=len)
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.bfloat16).to("cuda").eval()
    head = model.get_output_embeddings()

    def one_pass() -> None:
        for s in range(0, len(ids), batch):
            part = ids[s: s + batch]
            width = max(map(len, part))
            x = torch.tensor([[0] * (width - len(p)) + p for p in part], device="cuda")  # left pad: last = answer slot
            mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in part], device="cuda")
            hidden = model.model(input_ids=x, attention_mask=mask, use_cache=False).last_hidden_state
            head(hidden[:, -1, :]).float().log_softmax(-1)
        torch.cuda.synchronize()

    with torch.inference_mode():
        one_pass()  # warm-up
        t0 = time.perf_counter()
        reps = 3
        for _ in range(reps):
            one_pass()
        sec = (time.perf_counter() - t0) / reps
    tokens = sum(map(len, ids))
    return {"docs": len(ids), "mean_prompt_tokens": tokens / len(ids), "batch": batch,
            "docs_per_s": len(ids) / sec, "prompt_tokens_per_s": tokens / sec, "seconds_per_pass": sec,
            "peak_bytes": torch.cuda.max_memory_allocated()}


HOST_CODE = r"""
import json, os, sys, time
sys.path.insert(0, os.getcwd())
from transformers import AutoTokenizer
from batch.corpus.shard import ShardInput
from classify.config.sections import PilotConfig, load_config
from classify.engine.scoring import Scorer
from bench.gpu_path import _texts
from pathlib import Path
cfg = load_config(PilotConfig, "config/docpilot.json")
texts, _ = _texts(Path(sys.argv[2]))
scorer = Scorer(AutoTokenizer.from_pretrained(sys.argv[1]), cfg.classify, cfg.model.max_model_len)
shards = []
for s in range(0, len(texts), 1000):
    part = texts[s:s + 1000]
    body = "".join(json.dumps({"id": f"d{s + i}", "text": t}) + "\n" for i, t in enumerate(part)).encode()
    shards.append(ShardInput.of_jsonl("b.jsonl", "b.jsonl", s + 1, body, len(part)))
scorer.prompts(shards[0].documents(cfg.classify.max_doc_bytes))
best = 1e9
for _ in range(3):
    t0 = time.perf_counter()
    for sh in shards:
        scorer.prompts(sh.documents(cfg.classify.max_doc_bytes))
    best = min(best, time.perf_counter() - t0)
print(json.dumps({"threads": int(os.environ["RAYON_NUM_THREADS"]), "docs": len(texts), "docs_per_s": len(texts) / best}))
"""


def host(model_path: Path, bbc: Path) -> list[dict[str, Any]]:
    rows = []
    for n in (1, 2, 8, 16):
        env = {**os.environ, "RAYON_NUM_THREADS": str(n), "TOKENIZERS_PARALLELISM": "true"}
        cores = ",".join(str(c) for c in sorted(os.sched_getaffinity(0))[:n])
        out = subprocess.run(["taskset", "-c", cores, sys.executable, "-c", HOST_CODE, str(model_path), str(bbc)],
                             capture_output=True, text=True, timeout=240, env=env)
        try:
            rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
        except Exception:  # noqa: BLE001
            rows.append({"threads": n, "error": (out.stdout + out.stderr)[-2000:]})
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", type=Path, required=True)
    parser.add_argument("--bbc-dir", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--cpu-steps", type=int, default=6)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--only", default="facts,probe,doctor,nvml_pids,train,forward,host")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {"command": " ".join(sys.argv), "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    model = Path("/tmp/smollm2-random")
    wanted = args.only.split(",")
    sections = {
        "facts": facts, "probe": probe, "doctor": doctor, "nvml_pids": nvml_pids,
        "train": lambda: train(model, args.bbc_dir, args.steps, args.cpu_steps),
        "forward": lambda: forward(model, args.bbc_dir, args.batch),
        "host": lambda: host(args.model_dir, args.bbc_dir),
    }
    if {"train", "forward"} & set(wanted):
        _random_model(args.model_dir, model)
    for name in wanted:
        t0 = time.perf_counter()
        try:
            result[name] = sections[name]()
        except Exception:  # noqa: BLE001 - each section stands alone
            result[name] = {"error": traceback.format_exc()[-3000:]}
        result.setdefault("seconds", {})[name] = round(time.perf_counter() - t0, 1)
        print(f"== {name} ({result['seconds'][name]} s)\n{json.dumps(result[name], indent=1, default=str)[:4000]}", flush=True)
        (args.out / "gpu_path.json").write_text(json.dumps(result, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
