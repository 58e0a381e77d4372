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
from pathlib import Path
from typing import Any

from batch.plan.lots import JobShape, LotsConfig, gpu_spec, job_shape, load_lots
from classify.config.sections import ClassifyConfig, config_sha256
from classify.engine.prompt import template_text
from classify.model.memory import (
    DTYPE_BYTES,
    GIB,
    TP_SIZES,
    ServingFit,
    choose_tensor_parallel,
    kv_bytes_per_token,
    kv_bytes_per_token_per_card,
    model_shape,
    serving_estimate,
    serving_fit,
    training_estimate,
)
from classify.model.shape import ModelShape
from classify.paths import runs_dir
from classify.runs.records import code_revision, new_run_dir, utc_now, write_json_atomic

_NAMES = {"cuda": "CUDA", "rocm": "ROCm"}


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


def ray_plan(cfg: LotsConfig, tp: int = 1) -> dict[str, Any]:
    """How the batch maps onto the lots: one Ray engine actor per tensor-parallel group of ``tp`` cards of one lot.

    Args:
        cfg: the lots config.
        tp: the engine's tensor-parallel size (cards per engine actor, ``num_gpus=tp``); a group never spans lots.

    Returns:
        ``{engine_actors, num_gpus_per_actor, actors_per_lot, machines, needs_cluster, backend, image_backend,
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
            f"{cfg.lots} lots are {cfg.lots} machines: start one Ray cluster across them (docs/cluster.md), check it "
            "with `make cluster-check`, and run the batch with RAY_ADDRESS set (or `ray job submit`); a local Ray "
            "sees one lot only"
        )
    per_lot = spec.cards_per_lot // tp
    if per_lot == 0:
        warnings.append(
            f"`engine.tensor_parallel_size` {tp} needs {tp} cards on one machine, but a {cfg.gpu_model} lot holds "
            f"{spec.cards_per_lot}: a tensor-parallel group never spans lots; the batch would refuse to start"
        )
    return {
        "engine_actors": cfg.lots * per_lot,
        "num_gpus_per_actor": tp,
        "actors_per_lot": per_lot,
        "machines": cfg.lots,
        "needs_cluster": cfg.lots > 1,
        "backend": spec.backend,
        "image_backend": cfg.image_backend,
        "backend_ok": spec.backend == cfg.image_backend,
        "warnings": warnings,
    }


def _gib(n: int) -> str:
    return f"{n / GIB:.1f} GiB"


def serving_advice(cfg: LotsConfig, fit_for: Any, fit: ServingFit, max_model_len: int, per_token: Any, *,
                   prompt: dict[str, Any] | None = None) -> list[str]:
    """What to change when vLLM would not start on the lot's cards, or would hold fewer sequences than ``max_num_seqs``.

    Proposes, with the figures: tensor parallelism over one lot's cards (never across lots), a smaller
    ``engine.max_num_seqs`` (the sequences that fit) and a ``model.max_model_len`` that is never below
    ``prompt["min_max_model_len"]`` (the job's longest prompt + the answer token, :func:`prompt_length`): a shorter
    length would start an engine that rejects the documents (a configured length below it gets that length proposed).
    When no length that holds the prompt fits, it says so instead.

    Args:
        cfg: the lots config.
        fit_for: ``tp -> ServingFit`` for this job.
        fit: the fit at the job's tensor-parallel size.
        max_model_len: the job's ``model.max_model_len``.
        per_token: ``tp -> KV bytes per token per card``.
        prompt: :func:`prompt_length`'s answer (``None``: no floor but vLLM's 16-token block).

    Returns:
        Lines of advice (empty when every ``max_num_seqs`` sequence fits at a length that holds the prompt).
    """
    spec = gpu_spec(cfg)
    cards, card = spec.cards_per_lot, f"{cfg.gpu_model}"
    floor = max(16, prompt["min_max_model_len"] if prompt else 0)
    why = f"; no shorter: the prompt is {prompt['tokens']} tokens, {prompt['source']}" if prompt else ""
    out: list[str] = []
    bigger = [fit_for(t) for t in TP_SIZES if t > fit.tp]
    in_lot = [f for f in bigger if f.tp <= cards and f.sequences > fit.sequences]
    if in_lot:
        best = next((f for f in in_lot if f.concurrent >= f.max_num_seqs), in_lot[-1])
        out.append(f"set `engine.tensor_parallel_size: {best.tp}` (over {best.tp} of the {cards} cards of one {card} lot): "
                   f"weights {_gib(best.start.parts['weights'])} per card, {best.sequences:,} full-length sequences "
                   f"fit at once (max_num_seqs {best.max_num_seqs})")
    elif not fit.start.fits:
        beyond = next((f for f in bigger if f.start.fits), None)
        if beyond is not None:
            out.append(f"it would need `engine.tensor_parallel_size: {beyond.tp}`, more cards than one {card} lot holds "
                       f"({cards}); a tensor-parallel group never spans lots: choose a card with more memory")
    if fit.start.fits and fit.concurrent < fit.max_num_seqs and max_model_len >= floor:
        out.append(f"{'or ' if out else ''}set `engine.max_num_seqs: {fit.sequences}`: the sequences that fit at once "
                   f"({fit.sequences:,} of max_num_seqs {fit.max_num_seqs}; vLLM queues the rest)")
    room = fit.kv_space // per_token(fit.tp) if fit.kv_space > 0 else 0
    if (fit.concurrent < fit.max_num_seqs or max_model_len < floor) and room >= floor:
        all_len = room // fit.max_num_seqs
        if all_len >= floor and fit.concurrent < fit.max_num_seqs:
            out.append(f"{'or ' if out else ''}set `model.max_model_len: {all_len}` (from {max_model_len}): then all "
                       f"{fit.max_num_seqs} sequences fit at full length")
        elif floor != max_model_len:
            out.append(f"{'or ' if out else ''}set `model.max_model_len: {floor}` (from {max_model_len}{why}): then "
                       f"{min(room // floor, fit.max_num_seqs):,} sequences fit at once")
    if 0 < fit.kv_space and room < floor and not in_lot:
        out.append(f"nothing that holds the prompt fits: one {floor}-token sequence needs "
                   f"{_gib(per_token(fit.tp) * floor)} of KV cache per card, {_gib(fit.kv_space)} is left on one {card} "
                   "card after the weights, LoRA slots and overhead; no `model.max_model_len` helps"
                   + (f" (the prompt is {prompt['tokens']} tokens, {prompt['source']})" if prompt else "")
                   + ": choose a card with more memory, or lower `classify.max_doc_tokens`")
    if fit.kv_space <= 0:
        out.append(f"the weights ({_gib(fit.start.parts['weights'])} per card), LoRA slots and overhead alone take more "
                   f"than the usable {_gib(fit.start.usable)} of one {card} card")
    return out


def memory_plan(cfg: LotsConfig, shape: ModelShape, job: JobShape | None = None,
                prompt: dict[str, Any] | None = None) -> dict[str, Any]:
    """Serving and training memory for the ordered card (memory is not pooled; tensor parallelism splits one
    engine over the cards of one lot).

    Serving is what vLLM needs to start (:func:`classify.model.memory.serving_fit`: the weights' share of each card,
    one ``max_model_len`` sequence of KV, LoRA slots, overhead) at the job's ``engine.tensor_parallel_size``
    (``auto``: the smallest that starts on one lot's cards), with the full-length sequences it then holds; the
    worst case (every ``max_num_seqs`` sequence at full length) is kept beside it.

    Args:
        cfg: the lots config (card, overhead).
        shape: the model shape.
        job: the configured job (:func:`batch.plan.lots.job_shape`; default: the defaults of every section).
        prompt: :func:`prompt_length` of the job (the floor of a proposed ``model.max_model_len``; ``None``: none).

    Returns:
        ``{card_memory_gib, dtype_bytes, parameters, kv_bytes_per_token, tensor_parallel_size, serving,
        serving_worst_case, serving_advice, training, max_full_sequences}``: ``serving.fits`` (vLLM starts) is
        ``max_full_sequences >= 1``.
    """
    spec = gpu_spec(cfg)
    job = job or JobShape()
    dtype_bytes = DTYPE_BYTES.get(job.model.dtype, 2)  # "auto": Hugging Face checkpoints are 16-bit
    card = int(spec.card_memory_gib * GIB)
    overhead = int(cfg.overhead_gib_per_card * GIB)
    eng, tr = job.engine.resolve(spec.backend), job.training  # "auto" fields as the lot's backend gets them
    usable = int(card * eng.gpu_memory_utilization)

    def fit_for(tp: int) -> ServingFit:
        return serving_fit(shape, dtype_bytes, tp=tp, max_model_len=job.model.max_model_len,
                           max_num_seqs=eng.max_num_seqs, max_loras=eng.max_loras, max_lora_rank=eng.max_lora_rank,
                           overhead_bytes=overhead, usable_bytes=usable)

    configured = job.engine.tensor_parallel_size
    if configured == "auto":
        chosen = choose_tensor_parallel(fit_for, spec.cards_per_lot)
        tp = chosen.tp if chosen is not None else 1
    else:
        tp = configured
    fit = fit_for(tp)
    worst = serving_estimate(
        shape, dtype_bytes, max_model_len=job.model.max_model_len, max_num_seqs=eng.max_num_seqs,
        max_loras=eng.max_loras, max_lora_rank=eng.max_lora_rank, overhead_bytes=overhead, usable_bytes=usable,
    )
    training = training_estimate(
        shape, dtype_bytes, lora_rank=tr.lora_rank, lora_targets=tr.lora_targets, batch_size=tr.batch_size,
        seq_len=tr.seq_len_tokens, gradient_checkpointing=tr.gradient_checkpointing, overhead_bytes=overhead,
        usable_bytes=card,
    )
    return {
        "card_memory_gib": spec.card_memory_gib,
        "dtype_bytes": dtype_bytes,
        "parameters": shape.num_parameters(),
        "kv_bytes_per_token": kv_bytes_per_token(shape, dtype_bytes),
        "kv_bytes_per_token_per_card": kv_bytes_per_token_per_card(shape, dtype_bytes, tp),
        "tensor_parallel_size": tp,
        "tensor_parallel_configured": configured,
        "max_full_sequences": fit.sequences,
        "serving": fit.as_dict(),
        "serving_worst_case": worst.as_dict(),
        "serving_advice": serving_advice(cfg, fit_for, fit, job.model.max_model_len,
                                         lambda t: kv_bytes_per_token_per_card(shape, dtype_bytes, t), prompt=prompt),
        "training": training.as_dict(),
    }


def latest_pilot_reading(runs: Path | None, classify: ClassifyConfig) -> dict[str, Any] | None:
    """The newest pilot's ``long_documents`` block (:func:`batch.pilot.decision.long_documents_block`) measured
    with the same ``long_documents``, ``max_doc_tokens`` and ``max_windows`` as ``classify``, with its run id.

    Args:
        runs: the runs folder (``runs/``; ``None`` or missing: no pilot).
        classify: the job's classify section.

    Returns:
        The block plus ``run_id``, or ``None`` when no pilot run folder there holds a matching one.
    """
    import json

    if runs is None or not runs.is_dir():
        return None
    want = {"mode": classify.long_documents, "max_doc_tokens": classify.max_doc_tokens,
            "max_windows": classify.max_windows if classify.long_documents == "windows" else 1}
    for folder in sorted((p for p in runs.iterdir() if "-pilot-" in p.name), reverse=True):
        try:
            block = json.loads((folder / "summary.json").read_text(encoding="utf-8")).get("long_documents")
        except (OSError, ValueError, AttributeError):
            continue
        if isinstance(block, dict) and block.get("scored") and all(block.get(k) == v for k, v in want.items()):
            return {**block, "run_id": folder.name}
    return None


def prompts_plan(classify: ClassifyConfig, full_sequences: int, runs: Path | None = None) -> dict[str, Any]:
    """Prompts each document costs (``classify.long_documents``), and what that makes of the per-card figures.

    In ``cut`` mode a document is one prompt. With ``windows`` a document of ``t`` tokens is ``ceil(t /
    max_doc_tokens)`` prompts, at most ``max_windows``: the figure is the newest matching pilot's measured
    windows per document (tokens per document measured on the pilot set, :func:`latest_pilot_reading`), else
    ``max_windows``, the bound. Every prompt is one engine sequence, so the documents a card holds at once and
    the documents per second are the sequences and prompts per second divided by it.

    Args:
        classify: the job's classify section.
        full_sequences: full-length sequences one card (TP group) holds at once (:func:`memory_plan`).
        runs: the runs folder holding pilot run folders (``None``: use the bound).

    Returns:
        ``{long_documents, max_doc_tokens, max_windows, prompts_per_doc, source, documents_at_once,
        truncated_share, doc_tokens_per_doc}`` (the last two only from a pilot).
    """
    windows = classify.long_documents == "windows"
    bound = classify.max_windows if windows else 1
    out: dict[str, Any] = {"long_documents": classify.long_documents, "max_doc_tokens": classify.max_doc_tokens,
                           "max_windows": bound, "prompts_per_doc": float(bound),
                           "source": "max_windows (no matching pilot: the bound)" if windows else "cut: one prompt per document"}
    pilot = latest_pilot_reading(runs, classify)
    if pilot is not None:
        out.update(truncated_share=pilot["truncated_share"], doc_tokens_per_doc=pilot.get("doc_tokens_per_doc"),
                   source=f"pilot {pilot['run_id']} ({pilot['scored']} documents)")
        if windows:
            out["prompts_per_doc"] = float(pilot["windows_per_doc"])
    out["documents_at_once"] = int(full_sequences // max(1.0, out["prompts_per_doc"]))
    return out


CHAT_TEMPLATE_TOKENS = 64
"""Tokens allowed for a chat template's own markup (role headers, turn and control tokens, a date line) when the
template's tokens are bounded without a tokenizer (:func:`prompt_length`): Llama 3.1's adds about 30, ChatML's 10."""


def prompt_length(classify: ClassifyConfig, runs: Path | None = None) -> dict[str, Any]:
    """The job's longest prompt in tokens: what every ``model.max_model_len`` the plan proposes must stay above.

    The newest pilot's measured longest prompt (``longest_prompt_tokens`` of the matching pilot that
    :func:`latest_pilot_reading` finds: the same ``long_documents``, ``max_doc_tokens`` and ``max_windows``), else a
    bound without a tokenizer (the plan downloads none): the template's text in UTF-8 bytes (a byte-level BPE or
    byte-fallback tokenizer makes at most one token per byte; :func:`classify.engine.prompt.template_text`) plus
    :data:`CHAT_TEMPLATE_TOKENS` for the chat markup, plus ``classify.max_doc_tokens`` (one window's document).
    The scorer needs the prompt below ``max_model_len`` (one token for the answer), hence ``min_max_model_len``.

    Args:
        classify: the job's classify section.
        runs: the runs folder holding pilot run folders (``None``: the bound).

    Returns:
        ``{tokens, min_max_model_len, source}``.
    """
    pilot = latest_pilot_reading(runs, classify)
    if pilot is not None and pilot.get("longest_prompt_tokens"):
        tokens = int(pilot["longest_prompt_tokens"])
        source = f"the longest prompt of pilot {pilot['run_id']}"
    else:
        template = len(template_text(classify).encode("utf-8")) + CHAT_TEMPLATE_TOKENS
        tokens = template + classify.max_doc_tokens
        source = (f"at most {template} template tokens + classify.max_doc_tokens {classify.max_doc_tokens}, until a "
                  "pilot measures it")
    return {"tokens": tokens, "min_max_model_len": tokens + 1, "source": source}


def build_plan(cfg: LotsConfig, job: JobShape | None = None, shape: ModelShape | None = None,
               runs: Path | None = None) -> dict[str, Any]:
    """The whole plan as one JSON-ready dict (order, Ray, memory, warnings).

    Args:
        cfg: the lots config.
        job: the configured job (:func:`batch.plan.lots.job_shape` of ``config/docpilot.json``; default: the
            defaults of every section).
        shape: the model shape (default: :func:`model_shape` of ``job.model``).
        runs: the runs folder whose pilot run folders give the measured windows per document
            (:func:`prompts_plan`; ``None``: the bound).

    Raises:
        ConfigError: unknown GPU model, missing price, unreadable model shape.
    """
    order = order_summary(cfg)
    job = job or JobShape()
    shape = shape or model_shape(job.model)
    prompt = prompt_length(job.classify, runs)
    memory = memory_plan(cfg, shape, job, prompt)
    ray = ray_plan(cfg, memory["tensor_parallel_size"])
    warnings = list(ray["warnings"])
    s, tp = memory["serving"], memory["tensor_parallel_size"]
    cards = f"one {cfg.gpu_model} card" if tp == 1 else f"{tp} {cfg.gpu_model} cards (tensor parallel)"
    if not s["fits"]:
        warnings.append(
            f"serving does not start on {cards}: weights, LoRA slots, overhead and one {job.model.max_model_len}-token "
            f"sequence need {s['needed_gib']} GiB per card, usable {s['usable_gib']} GiB (memory is not pooled "
            "across cards)"
        )
    elif s["concurrent"] < s["max_num_seqs"]:
        warnings.append(
            f"serving starts on {cards}, holding {s['full_sequences']:,} full-length sequences at once, fewer than "
            f"`engine.max_num_seqs` {s['max_num_seqs']}"
        )
    if job.model.max_model_len < prompt["min_max_model_len"]:
        warnings.append(f"`model.max_model_len` {job.model.max_model_len} does not hold the prompt ({prompt['tokens']} "
                        f"tokens, {prompt['source']}): its longer documents would be rejected at run time; set it to at "
                        f"least {prompt['min_max_model_len']}")
    warnings += [f"proposal: {line}" for line in memory["serving_advice"]]
    prompts = prompts_plan(job.classify, memory["max_full_sequences"], runs)
    if prompts["long_documents"] == "cut" and prompts.get("truncated_share"):
        warnings.append(f"{prompts['truncated_share']:.0%} of the pilot's documents were cut at classify.max_doc_tokens "
                        f"{prompts['max_doc_tokens']} ({prompts['source']}); `classify.long_documents: windows` reads "
                        "them whole at more prompts per document")
    if not memory["training"]["fits"]:
        t = memory["training"]
        warnings.append(
            f"training does not fit one {cfg.gpu_model} card: needs {t['needed_gib']} GiB, "
            f"usable {t['usable_gib']} GiB (memory is not pooled across cards)"
        )
    return {
        "order": order,
        "ray": ray,
        "model": {"base_model": job.model.base_model, "shape": shape.__dict__},
        "memory": memory,
        "prompts": prompts,
        "prompt_length": prompt,
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
    order.add_row("Ray engine actors", f"{r['engine_actors']} (num_gpus={r['num_gpus_per_actor']} each: tensor parallel "
                  f"{r['num_gpus_per_actor']}, {r['actors_per_lot']} per lot, {r['machines']} machine(s))")
    order.add_row("backend", f"{r['backend']} card, {r['image_backend']} image: {'ok' if r['backend_ok'] else 'MISMATCH'}")
    console.print(order)
    mem = Table(title=f"Memory per card (GiB), 1 x {o['gpu_model']} = {m['card_memory_gib']} GiB; serving: what vLLM "
                      f"needs to start (one full-length sequence), tensor parallel {m['tensor_parallel_size']}")
    mem.add_column("part")
    mem.add_column("serving", justify="right")
    mem.add_column("training", justify="right")
    s, t = m["serving"], m["training"]
    for part in ("weights", "kv_cache", "lora_slots", "lora_state", "activations", "overhead"):
        mem.add_row(part, *(f"{j['parts'][part] / GIB:.2f}" if part in j["parts"] else "-" for j in (s, t)))
    mem.add_row("needed", f"{s['needed_gib']:.2f}", f"{t['needed_gib']:.2f}")
    mem.add_row("usable", f"{s['usable_gib']:.2f}", f"{t['usable_gib']:.2f}")
    mem.add_row("margin", f"{s['margin_gib']:.2f}", f"{t['margin_gib']:.2f}")
    mem.add_row("verdict", "starts" if s["fits"] else "[red]DOES NOT START[/red]",
                "fits" if t["fits"] else "[red]DOES NOT FIT[/red]")
    console.print(mem)
    group = "one card" if m["tensor_parallel_size"] == 1 else f"the {m['tensor_parallel_size']}-card TP group"
    console.print(f"KV cache: {m['kv_bytes_per_token']:,} bytes/token ({m['kv_bytes_per_token_per_card']:,} per card); "
                  f"{group} holds {m['max_full_sequences']:,} full-length ({plan['job']['model']['max_model_len']}-token) "
                  f"sequences at once (max_num_seqs {s['max_num_seqs']}); the worst case, all of them at full length, "
                  f"needs {m['serving_worst_case']['needed_gib']:.2f} GiB per card")
    p = plan["prompts"]
    console.print(f"Prompts: classify.long_documents {p['long_documents']}: {p['prompts_per_doc']:g} prompts per document "
                  f"({p['source']}); {group} holds {p['documents_at_once']:,} documents at once, and documents/s are "
                  "prompts/s divided by the prompts per document")
    pl = plan["prompt_length"]
    console.print(f"Prompt: {pl['tokens']} tokens ({pl['source']}); a proposed `model.max_model_len` is at least "
                  f"{pl['min_max_model_len']}")
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
    plan = build_plan(cfg, job, runs=runs_dir())
    run_id, run_dir = new_run_dir("plan", runs_dir())
    plan.update(run_id=run_id, created=utc_now(), code_revision=code_revision())
    write_json_atomic(run_dir / "plan.json", plan)
    _print(plan, run_dir / "plan.json")
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main(sys.argv[1:]))
