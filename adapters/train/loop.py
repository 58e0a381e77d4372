"""The LoRA optimisation loop: model setup, the answer-only loss, checkpoints and resume.

Resume is exact: the data order is a pure function of (seed, step), and a checkpoint holds
the LoRA weights, AdamW and scheduler state and the torch RNG (dropout), so a new process
that loads step N continues as the uninterrupted run would have.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from adapters.train.checkpoint import resume_latest, save_checkpoint
from adapters.train.data import collate_left, micro_batch_indices
from classify.config.training import TrainConfig

log = logging.getLogger("adapters.train")


def total_steps(cfg: TrainConfig, n_train: int) -> int:
    """Optimizer steps of the run: ``max_steps``, or ``epochs`` x rows / effective batch, rounded up."""
    t = cfg.training
    if t.max_steps is not None:
        return t.max_steps
    return max(1, math.ceil(t.epochs * n_train / (t.batch_size * t.grad_accum_steps)))


def build_lora_model(cfg: TrainConfig, model_path: str) -> Any:
    """Load the base model in ``training.dtype`` on the run's device and wrap it with a seeded peft LoRA.

    The device is :meth:`~classify.config.training.TrainingSection.run_device` (the card on a GPU lot), the dtype
    ``training.dtype`` resolved for that device. The LoRA weights are created on the same device (peft puts a
    new adapter beside its base layer's weight) and initialised from the seeded CPU generator, so a card and a
    CPU start from the same adapter.

    Returns:
        The peft model in training mode, every parameter on the run's device.
    """
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(cfg.training.seed)
    device = cfg.training.run_device()
    base = AutoModelForCausalLM.from_pretrained(model_path, dtype=getattr(torch, cfg.training.compute_dtype()))
    base.to(device)
    lora = LoraConfig(
        r=cfg.lora.rank,
        lora_alpha=cfg.lora.alpha,
        lora_dropout=cfg.lora.dropout,
        target_modules=list(cfg.lora.target_modules),
        layers_to_transform=list(cfg.lora.layers) if cfg.lora.layers is not None else None,
        bias="none",
        task_type="CAUSAL_LM",
    )
    model = get_peft_model(base, lora)
    model.train()
    return model


def _lr_lambda(warmup: int, total: int):
    def factor(step: int) -> float:
        if warmup and step < warmup:
            return (step + 1) / warmup
        return max(0.0, (total - step) / max(1, total - warmup))

    return factor


PLAIN_HEAD_MODEL_TYPES = frozenset({"llama", "mistral", "qwen2", "qwen3"})
"""``config.model_type`` values whose causal-LM forward is ``lm_head(hidden_states)`` with nothing after it
(``transformers`` 5.x ``LlamaForCausalLM``, ``MistralForCausalLM``, ``Qwen2ForCausalLM``, ``Qwen3ForCausalLM``)."""


def answer_loss_sum(model: Any, batch: dict[str, Any]) -> tuple[Any, int]:
    """Summed cross-entropy over answer tokens only, computing logits for the last positions only
    (:func:`answer_logits`).

    Args:
        model: as :func:`answer_logits`.
        batch: as :func:`answer_logits`.

    Returns:
        ``(loss_sum tensor, answer token count)``.
    """
    import torch

    logits, labels = answer_logits(model, batch)
    loss = torch.nn.functional.cross_entropy(logits, labels, ignore_index=-100, reduction="sum")
    return loss, int((labels != -100).sum())


def answer_logits(model: Any, batch: dict[str, Any]) -> tuple[Any, Any]:
    """Float32 logits of the last ``answer_len`` positions' next tokens and their labels, computing no others.

    With left padding every answer ends at the last position, so the hidden states of the last
    ``answer_len + 1`` positions predict every answer token (the vocabulary projection is the
    costliest single layer of a small model, so the prompt's logits are never computed). Those
    ``batch x answer_len`` hidden states are gathered into one contiguous 2-D matrix before the
    projection: ``transformers``' own ``logits_to_keep`` slice is a strided 3-D view, for which
    torch broadcasts the whole (vocabulary x hidden) weight per row of the batch into a batched
    product (measured on a 2-core CPU: about a quarter of a 4-document step, forward and backward).
    That shortcut is taken only for :data:`PLAIN_HEAD_MODEL_TYPES`, whose logits are exactly the
    projection; any other architecture (Granite's ``logits_scaling``, Cohere's ``logit_scale``,
    Gemma 2's soft-capping) goes through its own forward with ``logits_to_keep``.

    Args:
        model: a peft ``PeftModel`` (or a plain ``transformers`` causal LM) whose decoder is its
            ``base_model`` and whose vocabulary projection is its output embeddings.
        batch: from :func:`adapters.train.data.collate_left`: ``input_ids``, ``attention_mask``,
            ``position_ids`` and ``labels`` of shape (batch, seq), ``answer_len`` (int).

    Returns:
        ``(logits, labels)``: ``(batch * answer_len, vocab)`` float32 and ``(batch * answer_len,)`` (``-100``
        where a shorter answer's window holds prompt), row ``j``'s positions at ``j * answer_len ...``.
    """
    k = batch["answer_len"]
    causal = model.get_base_model() if hasattr(model, "get_base_model") else model
    if getattr(causal.config, "model_type", None) in PLAIN_HEAD_MODEL_TYPES:
        hidden = causal.base_model(
            input_ids=batch["input_ids"],
            attention_mask=batch["attention_mask"],
            position_ids=batch["position_ids"],
            use_cache=False,
        ).last_hidden_state
        last = hidden[:, -(k + 1):-1, :].reshape(-1, hidden.size(-1))
        logits = causal.get_output_embeddings()(last).float()
    else:  # the model's own forward: it may scale or soft-cap its logits after the projection
        out = model(
            input_ids=batch["input_ids"],
            attention_mask=batch["attention_mask"],
            position_ids=batch["position_ids"],
            logits_to_keep=k + 1,
            use_cache=False,
        )
        logits = out.logits[:, :-1, :].float().reshape(-1, out.logits.size(-1))
    return logits, batch["labels"][:, -k:].reshape(-1)


def run_loop(cfg: TrainConfig, model: Any, examples: list[dict[str, list[int]]], *, pad_id: int, run_dir: Path,
             config_sha256: str, steps: int | None = None,
             after_step: Callable[[int, dict[str, Any]], str | None] | None = None) -> dict[str, Any]:
    """Train to the last step on the model's device, checkpointing by steps and by wall time; resume from the latest.

    Args:
        cfg: resolved train config.
        model: the peft model from :func:`build_lora_model`.
        examples: tokenized training examples.
        pad_id: the tokenizer's pad token id.
        run_dir: the run folder (``checkpoints/`` lives there).
        config_sha256: hash of the resolved config (checked on resume).
        steps: optimizer steps to train (the linear schedule's length); ``None``: :func:`total_steps`.
        after_step: called after each step (before its checkpoint) with ``(step, state)``; may add JSON-able
            entries to ``state`` (they are checkpointed with it) and returns why to stop before ``steps``, or
            ``None`` (the scaled recipe's early stopping, :mod:`adapters.train.recipe`).

    Returns:
        State: ``history`` (one entry per step: loss, lr, tokens, cpu_s, wall_s), ``tokens``,
        ``cpu_s``, ``wall_s``, ``resumed_from``, ``skipped_checkpoints`` (unusable ones passed over on
        resume), ``steps``, ``device`` (in words) and, on a card, ``peak_device_bytes``
        (``torch.cuda.max_memory_allocated``, bytes), ``stopped`` (why the loop ended: the last step, or
        ``after_step``'s reason; ``steps`` is then the step it stopped at).

    Raises:
        ConfigError: the checkpoint to resume from was written with another config.
        EnvironmentCheckError: a checkpoint could not be written (full disk, quota, I/O error).
    """
    import torch

    t = cfg.training
    device = next(model.parameters()).device
    if device.type == "cpu":
        torch.set_num_threads(t.threads)  # a card's run leaves the host's threads alone (data collation, the tokenizer)
    else:
        torch.cuda.reset_peak_memory_stats(device)
    steps = total_steps(cfg, len(examples)) if steps is None else steps
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=t.learning_rate, weight_decay=t.weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, _lr_lambda(t.warmup_steps, steps))
    ckpt_root = run_dir / "checkpoints"
    state: dict[str, Any] = {"history": [], "tokens": 0, "cpu_s": 0.0, "wall_s": 0.0, "resumed_from": []}
    step = 0
    resumed = resume_latest(ckpt_root, model, optimizer, scheduler, config_sha256)
    if resumed.path is not None:
        step, state = resumed.step, resumed.state
        state["resumed_from"] = [*state.get("resumed_from", []), step]
        log.info("resumed from %s (step %d of %d)", resumed.path.name, step, steps)
    else:
        torch.manual_seed(t.seed + 1)  # dropout stream, independent of the LoRA init
    state["skipped_checkpoints"] = [*state.get("skipped_checkpoints", []), *resumed.skipped]
    on = f"{device} ({torch.cuda.get_device_name(device)})" if device.type == "cuda" else f"cpu, {t.threads} thread(s)"
    log.info("training %d steps on %s: %d rows, batch %d x accum %d, lr %.2e, %s", steps, on, len(examples),
             t.batch_size, t.grad_accum_steps, t.learning_rate, t.compute_dtype())
    state["device"] = on
    last_checkpoint = time.monotonic()
    stopped = state.get("stopped") if step < steps else None
    while step < steps and not stopped:
        cpu0, wall0 = time.process_time(), time.time()
        micro = [micro_batch_indices(step, m, accum=t.grad_accum_steps, batch=t.batch_size, n=len(examples), seed=t.seed)
                 for m in range(t.grad_accum_steps)]
        n_answer = sum(sum(1 for x in examples[i]["labels"] if x != -100) for idx in micro for i in idx)
        loss_total, tokens = 0.0, 0
        for idx in micro:
            batch = on_device(collate_left([examples[i] for i in idx], pad_id), device)
            loss_sum, _ = answer_loss_sum(model, batch)
            (loss_sum / n_answer).backward()
            loss_total += float(loss_sum.detach())
            tokens += int(batch["attention_mask"].sum())
        if t.max_grad_norm > 0:
            torch.nn.utils.clip_grad_norm_(params, t.max_grad_norm)
        lr = scheduler.get_last_lr()[0]
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        step += 1
        cpu_s, wall_s = time.process_time() - cpu0, time.time() - wall0
        state["tokens"] += tokens
        state["cpu_s"] += cpu_s
        state["wall_s"] += wall_s
        entry = {"step": step, "loss": round(loss_total / n_answer, 6), "lr": lr, "tokens": tokens,
                 "cpu_s": round(cpu_s, 3), "wall_s": round(wall_s, 3)}
        state["history"].append(entry)
        log.info("step %d/%d loss %.4f lr %.2e tokens %d (%.0f tok/s cpu, %.0f tok/s wall)",
                 step, steps, entry["loss"], lr, tokens, tokens / max(cpu_s, 1e-9), tokens / max(wall_s, 1e-9))
        if after_step is not None:  # before the checkpoint, which then holds what it added to the state
            stopped = after_step(step, state)
            if stopped:
                state["stopped"] = stopped
                log.info("%s", stopped)
        by_time = t.checkpoint_every_s is not None and time.monotonic() - last_checkpoint >= t.checkpoint_every_s
        if step % t.checkpoint_every_steps == 0 or step == steps or by_time:
            if device.type == "cuda":
                state["peak_device_bytes"] = max(int(torch.cuda.max_memory_allocated(device)), state.get("peak_device_bytes", 0))
            path = save_checkpoint(ckpt_root, step, model, optimizer, scheduler, state=state, config_sha256=config_sha256,
                                   keep=t.keep_checkpoints)
            last_checkpoint = time.monotonic()
            log.info("checkpoint %s%s", path.name, f" ({t.checkpoint_every_s:g} s since the last)" if by_time else "")
    state["steps"] = step
    state.setdefault("stopped", f"step budget reached ({steps} steps)")
    return state


def on_device(batch: dict[str, Any], device: Any) -> dict[str, Any]:
    """``batch`` with every tensor moved to ``device`` (ints such as ``answer_len`` stay as they are)."""
    return {k: v.to(device, non_blocking=True) if hasattr(v, "to") else v for k, v in batch.items()}
