"""``docpilot plan`` (``make plan``): the lot order summary, the Ray plan and the per-card memory fit.

Reads the lot from ``config/lots.json`` (:class:`batch.plan.lots.LotsConfig`) and the job it sizes (model,
engine, training) from ``config/docpilot.json`` (:func:`batch.plan.lots.job_shape`), the file every other
command reads, so the memory fit is the one of the job that runs. Prints the order (GPU model, period,
lots, cards, total USD), the number of Ray engine actors the batch will start, the
backend check against the serving image, and per-card memory estimates for serving
and LoRA training with a fit verdict. Memory is never pooled across cards: every
card holds a full model copy. The plan is written to ``runs/<utc>-plan-<id>/plan.json``.
Nothing here imports vLLM or torch.
"""

from __future__ import annotations

import argparse
import datetime as dt
from pathlib import Path
from typing import Any

from pydantic import AwareDatetime, ValidationError

from batch.plan.lots import JobShape, LotsConfig, gpu_spec, job_shape, load_lease_part, load_lots
from classify.config import Frozen, ModelConfig, config_sha256
from classify.errors import ConfigError
from classify.memory import (
    BUILTIN_SHAPES,
    DTYPE_BYTES,
    GIB,
    kv_bytes_per_token,
    serving_estimate,
    training_estimate,
)
from classify.modelshape import ModelShape, shape_from_folder

_NAMES = {"cuda": "CUDA", "rocm": "ROCm"}


class _Lease(Frozen):
    lease_ends_at: AwareDatetime


def parse_lease_end(text: str) -> dt.datetime:
    """Parse a lease end given on the command line (``--lease-ends``).

    Args:
        text: ISO 8601 with a timezone, e.g. ``2026-12-03T18:00:00Z`` or ``2026-12-03T19:00:00+01:00``.

    Returns:
        The aware datetime.

    Raises:
        ConfigError: not ISO 8601, or no timezone (a lease clock without one is ambiguous).
    """
    try:
        return _Lease(lease_ends_at=text).lease_ends_at
    except ValidationError:
        raise ConfigError(f"`lease_ends_at` must be ISO 8601 with a timezone (e.g. 2026-12-03T18:00:00Z), "
                          f"got {text!r}") from None


def lease_end(lots_config: str | Path | None = "config/lots.json", override: str | None = None) -> dt.datetime | None:
    """The lease end in force: ``override`` (``--lease-ends``) if given, else the lots config's ``lease_ends_at``.

    Args:
        lots_config: ``config/lots.json``; a missing file means no lease end (``None`` skips it).
        override: a ``--lease-ends`` value.

    Returns:
        The aware datetime, or ``None`` when neither gives one.

    Raises:
        ConfigError: an invalid value or lots config.
    """
    if override:
        return parse_lease_end(override)
    if lots_config is None or not Path(lots_config).is_file():
        return None
    return load_lease_part(lots_config).lease_ends_at


def order_summary(cfg: LotsConfig) -> dict[str, Any]:
    """The order: model, period, lots, total cards and total price.

    ``total_usd = usd_per_lot[period] x lots``. The lot price already covers every card of the
    lot (a B200 lot's two cards), so it is never multiplied by ``cards_per_lot``.

    Args:
        cfg: the lots config.

    Returns:
        ``{gpu_model, period_days, lots, cards_per_lot, total_cards, usd_per_lot, total_usd,
        usd_per_card_day}``.

    Raises:
        ConfigError: unknown GPU model or missing price.

    Example:
        >>> order_summary(cfg)["total_usd"]  # doctest: +SKIP
        3200.0
    """
    spec = gpu_spec(cfg)
    price = spec.usd_per_lot[str(cfg.period_days)]
    total_cards = cfg.lots * spec.cards_per_lot
    total = round(price * cfg.lots, 2)
    return {
        "gpu_model": cfg.gpu_model,
        "period_days": cfg.period_days,
        "lots": cfg.lots,
        "cards_per_lot": spec.cards_per_lot,
        "total_cards": total_cards,
        "usd_per_lot": price,
        "total_usd": total,
        "usd_per_card_day": round(total / (total_cards * cfg.period_days), 2),
    }


def ray_plan(cfg: LotsConfig) -> dict[str, Any]:
    """How the batch maps onto the lots: one Ray engine actor per card (``num_gpus=1``).

    Returns:
        ``{engine_actors, num_gpus_per_actor, machines, needs_cluster, backend, image_backend,
        backend_ok, warnings}``.
    """
    spec = gpu_spec(cfg)
    warnings = []
    if spec.backend != cfg.image_backend:
        build = "vLLM's ROCm build (rocm/vllm base image)" if spec.backend == "rocm" else "the official CUDA vLLM build"
        warnings.append(
            f"{cfg.gpu_model} needs a {_NAMES[spec.backend]} vLLM but the serving image is built for "
            f"{_NAMES[cfg.image_backend]} (`image_backend`): rebuild the image on {build} before renting"
        )
    if cfg.lots > 1:
        warnings.append(
            f"{cfg.lots} lots are {cfg.lots} machines: start a Ray cluster across them and run the batch "
            "with RAY_ADDRESS set (or `ray job submit`); a local Ray sees one lot only"
        )
    return {
        "engine_actors": cfg.lots * spec.cards_per_lot,
        "num_gpus_per_actor": 1,
        "machines": cfg.lots,
        "needs_cluster": cfg.lots > 1,
        "backend": spec.backend,
        "image_backend": cfg.image_backend,
        "backend_ok": spec.backend == cfg.image_backend,
        "warnings": warnings,
    }


def model_shape(model_cfg: ModelConfig) -> ModelShape:
    """The base model's shape: a built-in 7B-class table entry, or the model folder's ``config.json``.

    Raises:
        ConfigError: a Hugging Face id that is not a local folder (the plan never downloads).
        EngineError: the default model cannot be provisioned (from :func:`classify.model.resolve_model`).
    """
    if model_cfg.base_model in BUILTIN_SHAPES:
        return BUILTIN_SHAPES[model_cfg.base_model]
    from classify.model import resolve_model

    ref = resolve_model(model_cfg)
    if not Path(ref.path).is_dir():
        raise ConfigError(
            f"`model.base_model` {model_cfg.base_model!r} is not a local folder; the plan reads config.json "
            f"without downloading: give a folder or one of {sorted(BUILTIN_SHAPES)}"
        )
    return shape_from_folder(ref.path)


def memory_plan(cfg: LotsConfig, shape: ModelShape, job: JobShape | None = None) -> dict[str, Any]:
    """Per-card serving and training estimates for the ordered card (memory is not pooled).

    Args:
        cfg: the lots config (card, overhead).
        shape: the model shape.
        job: the configured job (:func:`batch.plan.lots.job_shape`; default: the defaults of every section).

    Returns:
        ``{card_memory_gib, dtype_bytes, parameters, kv_bytes_per_token, serving, training,
        max_full_sequences}`` where ``max_full_sequences`` is how many ``max_model_len``
        sequences the KV space left on one card holds.
    """
    spec = gpu_spec(cfg)
    job = job or JobShape()
    dtype_bytes = DTYPE_BYTES.get(job.model.dtype, 2)  # "auto": Hugging Face checkpoints are 16-bit
    card = int(spec.card_memory_gib * GIB)
    overhead = int(cfg.overhead_gib_per_card * GIB)
    eng, tr = job.engine.resolve(spec.backend), job.training  # "auto" fields as the lot's backend gets them
    serving = serving_estimate(
        shape, dtype_bytes, max_model_len=job.model.max_model_len, max_num_seqs=eng.max_num_seqs,
        max_loras=eng.max_loras, max_lora_rank=eng.max_lora_rank, overhead_bytes=overhead,
        usable_bytes=int(card * eng.gpu_memory_utilization),
    )
    training = training_estimate(
        shape, dtype_bytes, lora_rank=tr.lora_rank, lora_targets=tr.lora_targets, batch_size=tr.batch_size,
        seq_len=tr.seq_len_tokens, gradient_checkpointing=tr.gradient_checkpointing, overhead_bytes=overhead,
        usable_bytes=card,
    )
    per_token = kv_bytes_per_token(shape, dtype_bytes)
    kv_space = serving.usable - serving.needed + serving.parts["kv_cache"]
    return {
        "card_memory_gib": spec.card_memory_gib,
        "dtype_bytes": dtype_bytes,
        "parameters": shape.num_parameters(),
        "kv_bytes_per_token": per_token,
        "max_full_sequences": max(0, kv_space // (per_token * job.model.max_model_len)),
        "serving": serving.as_dict(),
        "training": training.as_dict(),
    }


def build_plan(cfg: LotsConfig, job: JobShape | None = None, shape: ModelShape | None = None) -> dict[str, Any]:
    """The whole plan as one JSON-ready dict (order, Ray, memory, warnings).

    Args:
        cfg: the lots config.
        job: the configured job (:func:`batch.plan.lots.job_shape` of ``config/docpilot.json``; default: the
            defaults of every section).
        shape: the model shape (default: :func:`model_shape` of ``job.model``).

    Raises:
        ConfigError: unknown GPU model, missing price, unreadable model shape.
    """
    order = order_summary(cfg)
    ray = ray_plan(cfg)
    job = job or JobShape()
    shape = shape or model_shape(job.model)
    memory = memory_plan(cfg, shape, job)
    warnings = list(ray["warnings"])
    for part in ("serving", "training"):
        if not memory[part]["fits"]:
            warnings.append(
                f"{part} does not fit one {cfg.gpu_model} card: needs {memory[part]['needed_gib']} GiB, "
                f"usable {memory[part]['usable_gib']} GiB (memory is not pooled across cards)"
            )
    return {
        "order": order,
        "ray": ray,
        "model": {"base_model": job.model.base_model, "shape": shape.__dict__},
        "memory": memory,
        "warnings": warnings,
        "config": cfg.model_dump(mode="json"),
        "config_sha256": config_sha256(cfg),
        "job": job.model_dump(mode="json"),
        "job_sha256": config_sha256(job),
    }


def _print(plan: dict[str, Any], json_path: Path) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    o, r, m = plan["order"], plan["ray"], plan["memory"]
    order = Table(title="Lot order", show_header=False)
    for key, label in (("gpu_model", "GPU model"), ("period_days", "period (days)"), ("lots", "lots"),
                       ("cards_per_lot", "cards per lot"), ("total_cards", "total cards"),
                       ("usd_per_lot", "USD per lot (period)"), ("total_usd", "total USD"),
                       ("usd_per_card_day", "USD per card-day")):
        order.add_row(label, f"{o[key]:,}" if isinstance(o[key], float) else str(o[key]))
    order.add_row("Ray engine actors", f"{r['engine_actors']} (num_gpus=1 each, {r['machines']} machine(s))")
    order.add_row("backend", f"{r['backend']} card, {r['image_backend']} image: {'ok' if r['backend_ok'] else 'MISMATCH'}")
    console.print(order)
    mem = Table(title=f"Memory per card (GiB), 1 x {o['gpu_model']} = {m['card_memory_gib']} GiB")
    mem.add_column("part")
    mem.add_column("serving", justify="right")
    mem.add_column("training", justify="right")
    s, t = m["serving"], m["training"]
    for part in ("weights", "kv_cache", "lora_slots", "lora_state", "activations", "overhead"):
        mem.add_row(part, *(f"{j['parts'][part] / GIB:.2f}" if part in j["parts"] else "-" for j in (s, t)))
    mem.add_row("needed", f"{s['needed_gib']:.2f}", f"{t['needed_gib']:.2f}")
    mem.add_row("usable", f"{s['usable_gib']:.2f}", f"{t['usable_gib']:.2f}")
    mem.add_row("margin", f"{s['margin_gib']:.2f}", f"{t['margin_gib']:.2f}")
    mem.add_row("verdict", *("fits" if j["fits"] else "[red]DOES NOT FIT[/red]" for j in (s, t)))
    console.print(mem)
    console.print(f"KV cache: {m['kv_bytes_per_token']:,} bytes/token; one card holds "
                  f"{m['max_full_sequences']:,} full-length sequences at once")
    for line in plan["warnings"]:
        console.print(f"[yellow]warning:[/yellow] {line}")
    console.print(f"plan written to {json_path}")


def main(argv: list[str]) -> int:
    """``docpilot plan [--config config/docpilot.json] [--lots-config config/lots.json] [--gpu-model M] [--period-days D] [--lots N]``.

    Prints the order, Ray and memory tables and writes ``plan.json`` in a new run folder. The lot comes
    from ``--lots-config``, the job it sizes (model, engine, training) from ``--config``.

    Returns:
        0 (a plan that does not fit is reported as a warning, not an error).

    Raises:
        ConfigError: invalid config or overrides (exit 2 through the CLI).
    """
    from classify.paths import runs_dir
    from classify.runrecords import code_revision, new_run_dir, utc_now, write_json_atomic

    parser = argparse.ArgumentParser(prog="docpilot plan", description="lot order summary and per-card memory fit")
    parser.add_argument("--config", default="config/docpilot.json",
                        help="the job's config: model, engine and train sections (default: %(default)s)")
    parser.add_argument("--lots-config", default="config/lots.json",
                        help="the lot: GPU model, period, lots, prices, lease end (default: %(default)s)")
    parser.add_argument("--gpu-model", help="override gpu_model")
    parser.add_argument("--period-days", type=int, help="override period_days (3, 7 or 30)")
    parser.add_argument("--lots", type=int, help="override lots (1 to 10)")
    args = parser.parse_args(argv)
    overrides = {k: v for k, v in (("gpu_model", args.gpu_model), ("period_days", args.period_days),
                                   ("lots", args.lots)) if v is not None}
    job = job_shape(args.config)
    cfg = load_lots(args.lots_config, overrides)
    plan = build_plan(cfg, job)
    run_id, run_dir = new_run_dir("plan", runs_dir())
    plan.update(run_id=run_id, created=utc_now(), code_revision=code_revision())
    write_json_atomic(run_dir / "plan.json", plan)
    _print(plan, run_dir / "plan.json")
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main(sys.argv[1:]))
