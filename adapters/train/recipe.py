"""The ``scaled`` training recipe (``train.training.recipe: scaled``, issue 56): a run that fits its row count.

With a handful of labelled rows the fixed recipe is wrong both ways: a few epochs are a few steps (20 rows at
batch 4 and 2 epochs: 10 steps), and many epochs memorise. The scaled recipe decides from the rows:

1. **Step budget** (:func:`step_budget`): ``max(min_steps, steps of the configured epochs or max_steps)``. On
   1,357 rows at batch 4 and 2 epochs that is the fixed recipe's 679 steps; on 15 rows it is ``min_steps``
   (60: 16 passes), an upper bound the next rule cuts short.
2. **Early stopping on the check rows** (``data.validation_rows``, held out): every ``eval_every_steps``
   steps the mean answer-token cross-entropy of the check rows is computed (:func:`check_eval`, the
   training loss's own measure, continuous, so it still ranks steps when 5 check rows are all right); the
   selection fit stops after ``patience_evals`` evaluations without a new lowest value (:class:`EarlyStop`),
   or at the budget. The chosen length is the best evaluation's step, as epochs of the training rows.
3. **Final fit on every row** (check rows included): a fresh LoRA from the same seed, the same settings,
   for the chosen epochs over all rows (:func:`final_steps`), so no label is spent on checking only.

The check rows' per-category first-token log-probs at the chosen step (held out then) are what the score
temperature is fitted on; the end-of-run checks after the final fit run on rows it trained on, so they prove
the path and the format, not the accuracy. The run's ``summary.json`` gets a ``recipe`` block: rows, the
budget and its rule, every evaluation, the chosen step and epochs, why the selection fit stopped, and the
final fit's rows, steps and epochs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from adapters.train.data import collate_left
from adapters.train.loop import answer_logits, on_device

RULE = ("budget = max(training.min_steps, steps of training.epochs (or max_steps) on the training rows); stop when "
        "the check rows' answer loss has not reached a new low for training.patience_evals evaluations (one every "
        "training.eval_every_steps steps); final fit on all rows for the chosen epochs")
"""The scaled recipe's rule in one line (``summary.json``'s ``recipe.rule``)."""


def step_budget(n_examples: int, effective_batch: int, *, epochs: float | None, max_steps: int | None,
                min_steps: int) -> int:
    """The selection fit's step budget: ``max(min_steps, max_steps or ceil(epochs * n / batch))``.

    Args:
        n_examples: training examples (rows; windows in ``windows`` mode).
        effective_batch: ``batch_size * grad_accum_steps``.
        epochs: configured passes (``None`` when ``max_steps`` is set).
        max_steps: configured steps (``None`` when ``epochs`` is set).
        min_steps: the floor.

    Returns:
        Optimizer steps, at least ``min_steps`` and at least 1.
    """
    fixed = max_steps if max_steps is not None else math.ceil((epochs or 0) * n_examples / effective_batch)
    return max(1, min_steps, fixed)


def final_steps(chosen_step: int, n_selection: int, n_all: int, effective_batch: int) -> tuple[int, float]:
    """Steps of the final fit on all ``n_all`` examples for the epochs the selection fit chose.

    Args:
        chosen_step: the selection fit's best step.
        n_selection: its training examples.
        n_all: every example (check rows included).
        effective_batch: ``batch_size * grad_accum_steps``.

    Returns:
        ``(steps, epochs)``: ``epochs = chosen_step * batch / n_selection``, ``steps = ceil(epochs * n_all / batch)``.
    """
    epochs = chosen_step * effective_batch / max(1, n_selection)
    return max(1, math.ceil(epochs * n_all / effective_batch)), epochs


@dataclass
class EarlyStop:
    """Early stopping on a loss measured every few steps: the lowest wins, ``patience`` evaluations without a new one stop.

    Attributes:
        patience: evaluations without a new lowest loss that stop the fit.
        min_delta: how much lower a loss must be to count as new (nats per answer token).
        evals: ``{"step", "loss"}`` per evaluation, in order (restored from a checkpoint on resume).
        best: the evaluation with the lowest loss so far, with the check rows' log-probs of that step.
    """

    patience: int
    min_delta: float = 1e-4
    evals: list[dict[str, Any]] = field(default_factory=list)
    best: dict[str, Any] | None = None

    def update(self, step: int, loss: float, logprobs: dict[str, list[float]] | None = None) -> str | None:
        """Record the loss of ``step``; return why to stop, or ``None`` to go on."""
        self.evals.append({"step": step, "loss": round(loss, 6)})
        if self.best is None or loss < self.best["loss"] - self.min_delta:
            self.best = {"step": step, "loss": loss, "logprobs": logprobs or {}}
            return None
        since = sum(1 for e in self.evals if e["step"] > self.best["step"])
        if since >= self.patience:
            return (f"early stop at step {step}: no check loss below {self.best['loss']:.4f} (step {self.best['step']}) "
                    f"in {since} evaluations")
        return None


def check_eval(model: Any, examples: list[dict[str, list[int]]], ids: list[str], first_tokens: list[int] | None, *,
               pad_id: int, batch_size: int) -> tuple[float, dict[str, list[float]]]:
    """The check rows' mean answer-token cross-entropy, and each row's first-token log-probs of the categories.

    Args:
        model: the peft model being trained (put in eval mode for the call, then back in train mode).
        examples: the check rows' examples (one per row in ``cut`` mode; windows of a row share its id).
        ids: the row id of each example.
        first_tokens: the categories' first answer token ids (``None``: categories share one; no log-probs).
        pad_id: the tokenizer's pad id.
        batch_size: examples per forward pass.

    Returns:
        ``(loss, logprobs)``: nats per answer token over all examples; ``row id -> k`` log-probs (log-softmax
        over the vocabulary at the first answer position, as the engine's first-token scores; windows averaged).
    """
    import torch  # lazy: pulls in torch

    device = next(model.parameters()).device
    model.eval()
    total, count = 0.0, 0
    sums: dict[str, list[float]] = {}
    seen: dict[str, int] = {}
    try:
        with torch.no_grad():
            for at in range(0, len(examples), batch_size):
                part = examples[at:at + batch_size]
                batch = on_device(collate_left(part, pad_id), device)
                logits, labels = answer_logits(model, batch)
                total += float(torch.nn.functional.cross_entropy(logits, labels, ignore_index=-100, reduction="sum"))
                count += int((labels != -100).sum())
                if first_tokens is None:
                    continue
                k = batch["answer_len"]
                logp = torch.log_softmax(logits.view(len(part), k, -1), dim=-1)
                lab = labels.view(len(part), k)
                for j in range(len(part)):
                    first = int((lab[j] != -100).nonzero()[0])
                    row = [float(logp[j, first, t]) for t in first_tokens]
                    rid = ids[at + j]
                    old = sums.get(rid)
                    sums[rid] = row if old is None else [a + b for a, b in zip(old, row, strict=True)]
                    seen[rid] = seen.get(rid, 0) + 1
    finally:
        model.train()
    return total / max(1, count), {rid: [v / seen[rid] for v in row] for rid, row in sums.items()}
