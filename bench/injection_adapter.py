"""Prompt injection with a trained LoRA adapter: category flips, string prompt vs token ids, real vLLM engine.

The base-model bench (:mod:`bench.injection`) shows that the small base model follows the word ``sport``
whatever wraps it. This one asks the question issue #25 measured with a trained adapter: does a document
still steer an adapter that has learnt the task once its forged chat turns are text?

1. A short LoRA adapter is trained with docpilot's training API (:func:`adapters.train.train.train`, the shipped
   ``config/docpilot.json`` ``train`` section with fewer steps) on the BBC **train** split only
   (``train.csv``; ``data.validation_rows`` of it are held out as the validation split, which the
   end-of-run engine check classifies). ``test.csv`` is never read by training.
2. The same LoRA-enabled engine then classifies :mod:`bench.injection`'s set (the first 40 non-sport BBC
   test articles cut before 600 characters, each injection of :data:`bench.injection.INJECTIONS`) with
   that adapter, through main's string prompt and through token ids.

Run: ``python -m bench.run --only injection_adapter`` (a few minutes of training on 2 cores, the engine start,
about 560 prompts); alone: ``python -m bench.injection_adapter [--quick]``.
"""

from __future__ import annotations

import os
from typing import Any

from bench.common import run_alone
from bench.injection import INJECTIONS, N_ARTICLES, measure, table
from classify.config.sections import PilotConfig, load_config

BENCH_STEPS = 80
"""Optimizer steps of the bench's adapter (batch 4: 320 training examples, a few minutes on the 2-core CPU)."""
BENCH_VALIDATION_ROWS = 100
"""Rows of ``train.csv`` held out as the validation split (stratified, seeded: :func:`adapters.train.data.split_rows`)."""


def train_adapter(classifier: Any, steps: int = BENCH_STEPS, validation_rows: int = BENCH_VALIDATION_ROWS,
                  max_train_rows: int | None = None, learning_rate: float = 1e-3) -> tuple[Any, dict[str, Any]]:
    """Train a short LoRA adapter on the BBC train split with docpilot's training API and return its engine handle.

    The shipped ``config/docpilot.json`` ``train`` section (LoRA r=8 on layers 15-29, batch 4, the shipped
    ``classify`` section: what is trained is what pilot, batch and serve send) with ``steps`` optimizer
    steps, one checkpoint at the end, and the format and accuracy thresholds at 0 (the figures are reported,
    the caller judges them). The end-of-run engine check runs on ``classifier``. Nothing is published: the
    adapter stays in the run folder under ``DOCPILOT_RUNS``.

    Args:
        classifier: a running LoRA-enabled :class:`classify.engine.build.Classifier` on the default base model.
        steps: optimizer steps (>= 1).
        validation_rows: rows of ``train.csv`` held out and classified by the engine check (>= 1).
        max_train_rows: keep at most this many training rows (``None``: all).
        learning_rate: peak learning rate (linear warm-up over a tenth of the steps, at most 8, then linear decay).

    Returns:
        ``(handle, figures)``: a :class:`classify.engine.scoring.AdapterHandle` for the run's adapter (temperature from
        the engine check's calibration) and ``{"run_id", "steps", "train_rows", "validation_rows", "tokens",
        "wall_s", "final_loss", "validation_accuracy", "format_share", "batch_size", "learning_rate"}``
        (accuracy and format share 0-1, seconds).

    Raises:
        ConfigError, InputError, EnvironmentCheckError, VerificationError: as :func:`adapters.train.train.train`.
    """
    from adapters.registry.resolved import lora_int_id
    from adapters.train.train import train
    from classify.config.training import TrainConfig
    from classify.engine.scoring import AdapterHandle

    cfg = load_config(TrainConfig, "config/docpilot.json")
    cfg = cfg.model_copy(update={
        "data": cfg.data.model_copy(update={"validation_rows": validation_rows, "max_train_rows": max_train_rows}),
        "training": cfg.training.model_copy(update={
            "max_steps": steps, "epochs": None, "learning_rate": learning_rate, "warmup_steps": min(8, steps // 10),
            "checkpoint_every_steps": steps, "keep_checkpoints": 1, "loss_window_steps": max(1, min(10, steps // 4))}),
        "checks": cfg.checks.model_copy(update={"validation_engine": "vllm", "min_format_share": 0.0,
                                                "min_validation_accuracy": 0.0}),
        "output": cfg.output.model_copy(update={"adapter_name": "bbc-news-injection", "publish": False}),
    })
    os.environ.setdefault("VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS", "3600")  # a shared CPU can exceed vLLM's 300 s per step
    outcome = train(cfg, classifier=classifier, publish=False)
    s = outcome.summary
    ref = f"bbc-news-injection@{outcome.run_id}"
    eng = s["checks"]["engine"]
    handle = AdapterHandle(name=ref, path=str(outcome.run_dir / "adapter"), int_id=lora_int_id(ref),
                           temperature=float(eng["calibration"]["temperature"]))
    figures = {
        "run_id": outcome.run_id, "steps": s["steps"], "train_rows": s["data"]["train_rows"],
        "validation_rows": s["data"]["validation_rows"], "tokens": s["tokens"], "wall_s": s["wall_s"],
        "final_loss": s["final_loss"], "validation_accuracy": eng["accuracy"],
        "format_share": s["checks"]["free_answers"]["format_share"], "batch_size": cfg.training.batch_size,
        "learning_rate": learning_rate, "dtype": s["dtype"],
    }
    return handle, figures


def run(quick: bool = False) -> dict[str, Any]:
    """Train the adapter, measure the injections through one LoRA-enabled engine, and format.

    Args:
        quick: 20 training steps, 40 validation rows, 12 articles (a smoke test of the bench, not a figure).

    Returns:
        ``{"title", "figures", "markdown"}`` for ``bench/run.py``.
    """
    from classify.engine.build import build_engine

    cfg = load_config(PilotConfig, "config/docpilot.json")
    os.environ.setdefault("VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS", "3600")
    engine = build_engine(cfg.model, cfg.engine, cfg.classify, enable_lora=True)
    try:
        handle, training = train_adapter(engine, 20 if quick else BENCH_STEPS, 40 if quick else BENCH_VALIDATION_ROWS)
        figures = measure(engine, 12 if quick else N_ARTICLES, adapter=handle)
    finally:
        engine.shutdown()
    figures["training"] = training
    t = training
    by = {(r["injection"], r["path"]): r for r in figures["rows"]}
    changed = "; ".join(f"{name}: string {by[(name, 'string')]['changed_of_correct']}, ids {by[(name, 'ids')]['changed_of_correct']}"
                        for name in INJECTIONS)
    md = "\n".join([
        f"Adapter trained here on the BBC train split only ({t['train_rows']} rows of train.csv; {t['validation_rows']} "
        f"held out): {t['steps']} steps x batch {t['batch_size']}, lr {t['learning_rate']}, {t['dtype']}, "
        f"{t['tokens']} tokens in {t['wall_s']} s wall, final loss {t['final_loss']:.4f}. Validation split through vLLM "
        f"with the adapter: accuracy {t['validation_accuracy']:.1%}; free answers in the inference format: "
        f"{t['format_share']:.0%}.",
        "",
        table(figures, f"Base + this adapter ({handle.name})"),
        f"Correct articles whose category changed at all (to any category): {changed}.",
    ])
    return {"title": "Prompt injection with a trained adapter (string prompt vs token ids)", "figures": figures,
            "markdown": md + "\n"}


if __name__ == "__main__":
    run_alone(run, __doc__)
