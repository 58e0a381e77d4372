"""End-of-run checks: the loss fell, checkpoints exist, and validation rows come out in the inference format."""

from __future__ import annotations

import logging
import os
import shutil
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from adapters.registry import merge
from adapters.registry.card import content_sha256
from adapters.registry.registry import lora_int_id
from adapters.train.checkpoint import list_checkpoints
from adapters.train.data import Row
from classify.config.training import TrainConfig
from classify.documents.read import document_from_text
from classify.engine.args import compute_dtype
from classify.engine.build import Classifier, build_engine
from classify.engine.prompt import answer_text, build_prompt
from classify.engine.scoring import AdapterHandle, Scorer, mean_logprobs
from classify.errors import EngineError
from classify.model.model import ModelRef
from classify.runs.files import tree_sha256

log = logging.getLogger("adapters.train")

ENGINE_STEP_TIMEOUT_S = 3600
"""Longest vLLM model step tolerated during the check (``VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS``), unless set."""

FORMAT_ROWS = 40
"""Validation rows given to the free-generation format check (greedy decoding is the slow part)."""

PROGRESS_ROWS = 10
"""Rows between two progress lines of the free-answer check."""

ENGINE_CHUNK_ROWS = 16
"""Validation rows per vLLM call in the engine check, so that a progress line follows each call."""


def loss_fell(history: list[dict[str, float]], window: int) -> dict[str, Any]:
    """Compare the mean loss of the first and the last ``window`` steps (windows shrink for short runs)."""
    w = max(1, min(window, len(history) // 2))
    first = sum(h["loss"] for h in history[:w]) / w
    last = sum(h["loss"] for h in history[-w:]) / w
    return {"passed": last < first, "first_window_loss": round(first, 6), "last_window_loss": round(last, 6), "window_steps": w}


def checkpoints_exist(run_dir: Path) -> dict[str, Any]:
    """The checkpoint folder holds at least one complete, non-empty checkpoint."""
    found = [p for p in list_checkpoints(run_dir / "checkpoints") if any(p.iterdir())]
    return {"passed": bool(found), "checkpoints": [p.name for p in found]}


def free_answers(model: Any, tokenizer: Any, cfg: TrainConfig, rows: list[Row]) -> dict[str, Any]:
    """Greedy, unconstrained answers of the trained model to the engine's prompt.

    A row is in the inference format when the answer is exactly an allowed category followed by
    the end-of-turn token (:func:`classify.engine.prompt.answer_text`), which is what first-token
    scoring relies on. The prompt is the document's first window (its only one in ``cut`` mode): the format
    does not depend on the window; the accuracy over whole documents is :func:`through_engine`'s.

    Args:
        model: the trained peft model.
        tokenizer: its tokenizer.
        cfg: train config (categories, ``checks.min_format_share``).
        rows: validation rows (the first ``FORMAT_ROWS`` are used; a progress line every ``PROGRESS_ROWS``).

    Returns:
        ``{"passed", "format_share", "accuracy", "rows", "examples"}``.
    """
    import torch  # lazy: pulls in torch

    answers = {c: tokenizer(answer_text(tokenizer, c), add_special_tokens=False)["input_ids"] for c in cfg.classify.categories}
    longest = max(len(a) for a in answers.values())
    model.eval()
    ok = correct = 0
    examples = []
    sample = rows[:FORMAT_ROWS]
    t0 = time.time()
    with torch.no_grad():
        for n, row in enumerate(sample, 1):
            prompt = build_prompt(tokenizer, cfg.classify, row.text)
            ids = torch.tensor([prompt.ids], device=model.device)
            out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=longest,
                                 do_sample=False, pad_token_id=tokenizer.pad_token_id or tokenizer.eos_token_id)
            new = out[0, ids.shape[1]:].tolist()
            said = next((c for c, a in answers.items() if new[: len(a)] == a), None)
            ok += said is not None
            correct += said == row.category
            if len(examples) < 5:
                examples.append({"id": row.id, "label": row.category, "answer": tokenizer.decode(new)})
            if n % PROGRESS_ROWS == 0 or n == len(sample):
                log.info("free answers: %d/%d rows, %d in the answer format, %d right (%.0f s)", n, len(sample), ok,
                         correct, time.time() - t0)
    model.train()
    share = ok / len(sample)
    min_share = cfg.checks.min_format_share
    return {"passed": share >= min_share, "format_share": round(share, 4), "min_format_share": min_share,
            "accuracy": round(correct / len(sample), 4), "rows": len(sample), "examples": examples}


def through_engine(cfg: TrainConfig, adapter_dir: Path, rows: list[Row], model_ref: Any, *, classifier: Any = None,
                   label: str = "candidate") -> dict[str, Any]:
    """Classify validation rows through the real inference path with the new adapter (``cfg.classify``'s
    ``long_documents`` mode included: a long row is scored over its windows as pilot, batch and serve score it).

    The path is the one pilot and batch take for one adapter (``model.adapter_mode``): ``merged``
    (the default) merges the adapter into the base weights (peft ``merge_and_unload``, in a
    temporary ``.check-merged`` folder beside ``adapter_dir``, removed afterwards) and runs vLLM
    without LoRA, about twice as fast on a CPU; ``lora`` runs vLLM with the adapter as a LoRA
    request. A ``classifier`` given by the caller is always used as a LoRA engine.

    Args:
        cfg: train config (its ``classify`` section scores the answers).
        adapter_dir: the saved peft adapter.
        rows: validation rows.
        model_ref: the resolved base model.
        classifier: an already-running LoRA-enabled :class:`classify.engine.build.Classifier` on the same base
            model (tests pass the session engine); else one is built and shut down here.
        label: adapter name shown to vLLM.

    Returns:
        ``{"passed", "accepted", "allowed", "accuracy", "rows", "per_category", "calibration"}``; passed
        means every row came back accepted with an allowed category and accuracy >=
        ``checks.min_validation_accuracy``. ``calibration`` is :func:`fit_calibration`'s block (the
        temperature fitted on these rows' per-category log-probs; reliability PNGs in ``adapter_dir``).

    Raises:
        EngineError: the classifier runs another base model or was built without LoRA.

    Logs the engine start and a progress line (rows done, accepted, right, seconds) after each
    ``ENGINE_CHUNK_ROWS`` rows.
    """
    own = classifier is None
    merged = own and cfg.model.adapter_mode == "merged"
    merged_dir = adapter_dir.parent / ".check-merged"
    t0 = time.time()
    if own:
        # vLLM kills the engine when one model step exceeds this (default 300 s); a shared 2-core CPU can
        # need longer for a batch of 256-token prompts, and a lost check would waste the whole run.
        os.environ.setdefault("VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS", str(ENGINE_STEP_TIMEOUT_S))
        try:  # the merged copy goes whatever stops the engine's start (an error, SIGTERM / Ctrl-C)
            engine_model = _merge_for_check(cfg, adapter_dir, model_ref, merged_dir, label) if merged else model_ref
            log.info("engine check: starting vLLM %s on %s (about a minute on a 2-core CPU)",
                     "with the adapter merged in" if merged else "with LoRA", model_ref.name)
            classifier = build_engine(cfg.model, cfg.engine, cfg.classify, enable_lora=not merged, model=engine_model)
        except BaseException:
            shutil.rmtree(merged_dir, ignore_errors=True)
            raise
        log.info("engine check: vLLM ready in %.0f s", time.time() - t0)
    try:
        if not merged and classifier.model.fingerprint != model_ref.fingerprint:
            raise EngineError(
                f"validation engine runs base model {classifier.model.fingerprint}, the adapter was trained on {model_ref.fingerprint}"
            )
        scorer = Scorer(classifier.llm.get_tokenizer(), cfg.classify, cfg.model.max_model_len)
        captured = _capture_logprobs(scorer)
        engine = Classifier(classifier.llm, scorer, classifier.model, classifier.lora_enabled)
        handle = None if merged else AdapterHandle(f"{label}", str(adapter_dir), lora_int_id(f"{label}:{adapter_dir}"))
        docs = [document_from_text(r.id, r.text, cfg.classify.max_doc_bytes) for r in rows]
        results = []
        t1 = time.time()
        for start in range(0, len(docs), ENGINE_CHUNK_ROWS):
            results += engine.classify(docs[start: start + ENGINE_CHUNK_ROWS], adapter=handle)
            right = sum(r.category == row.category for r, row in zip(results, rows, strict=False))
            log.info("engine check: %d/%d rows classified, %d accepted, %d right (%.0f s)", len(results), len(docs),
                     sum(r.status == "accepted" for r in results), right, time.time() - t1)
    finally:
        if own:
            log.info("engine check: stopping vLLM")
            classifier.shutdown()
            shutil.rmtree(merged_dir, ignore_errors=True)
    accepted = [r for r in results if r.status == "accepted"]
    allowed = [r for r in accepted if r.category in cfg.classify.categories]
    correct = sum(r.category == row.category for r, row in zip(results, rows, strict=True))
    accuracy = correct / len(rows)
    per_category = {c: {"rows": sum(row.category == c for row in rows),
                        "right": sum(r.category == row.category == c for r, row in zip(results, rows, strict=True))}
                    for c in cfg.classify.categories}
    return {
        "passed": len(allowed) == len(rows) and accuracy >= cfg.checks.min_validation_accuracy,
        "rows": len(rows), "accepted": len(accepted), "allowed": len(allowed), "accuracy": round(accuracy, 4),
        "min_validation_accuracy": cfg.checks.min_validation_accuracy, "per_category": per_category,
        "rejected": [{"id": r.id, "reason": r.reason} for r in results if r.status != "accepted"][:5],
        "calibration": _calibration_or_none(captured, rows, cfg.classify.categories, adapter_dir),
    }


def _merge_for_check(cfg: TrainConfig, adapter_dir: Path, model_ref: Any, out_dir: Path, label: str) -> Any:
    """Merge the run's (not yet published) adapter into the base for the engine check.

    Returns:
        A :class:`classify.model.model.ModelRef` on ``out_dir`` (replaced if left by an earlier attempt).

    Raises:
        EnvironmentCheckError: not enough free disk for the merged weights.
    """
    shutil.rmtree(out_dir, ignore_errors=True)
    t0 = time.time()
    candidate = SimpleNamespace(ref=label, path=adapter_dir, sha256=content_sha256(tree_sha256(adapter_dir)), card={},
                                base_fingerprint=model_ref.fingerprint)
    info = merge.merge_adapter(candidate, out_dir, dtype=compute_dtype(cfg.model), base=model_ref)
    log.info("engine check: adapter merged into %s in %.0f s", model_ref.name, time.time() - t0)
    return ModelRef(name=f"{model_ref.name}+{label}", path=str(out_dir.resolve()), fingerprint=info["fingerprint"],
                    source=f"merged {label} for the end check")


def _calibration_or_none(captured: dict[str, list[float]], rows: list[Row], categories: tuple[str, ...],
                         out_dir: Path) -> dict[str, Any] | None:
    """:func:`fit_calibration`, or ``None`` with a warning when it fails (the adapter is kept, scores stay raw)."""
    try:
        return fit_calibration(captured, rows, categories, out_dir)
    except (ValueError, OSError, ImportError) as err:
        log.warning("calibration: no temperature fitted (%s: %s); scores stay uncalibrated (T = 1)", type(err).__name__, err)
        return None


def _capture_logprobs(scorer: Any) -> dict[str, list[float]]:
    """Wrap ``scorer.result`` so that each document's per-category first-token log-probs are kept.

    Returns the dict it fills: document id -> log-probs aligned with ``scorer.cfg.categories``
    (nothing in ``choice`` scoring, where the other categories' log-probs are unknown). A document of several
    windows (``classify.long_documents: windows``) gives its combined log-probs
    (:func:`classify.engine.scoring.mean_logprobs`, as :meth:`classify.engine.scoring.Scorer.combined_logprobs`), the vector its score is the softmax of, so the
    temperature is fitted on what inference scores.
    """
    captured: dict[str, list[float]] = {}
    plain = scorer.result

    def result(doc: Any, prompt: Any, completion: Any, temperature: float = 1.0) -> Any:
        completions = list(completion) if isinstance(completion, (list, tuple)) else [completion]
        if scorer.mode == "first-token" and all(c.logprobs for c in completions):
            got = mean_logprobs([{tid: lp.logprob for tid, lp in c.logprobs[0].items()} for c in completions])
            lps = [got.get(t) for t in scorer.first_tokens]
            if all(lp is not None and lp > float("-inf") for lp in lps):
                captured[doc.id] = lps
        return plain(doc, prompt, completion, temperature)

    scorer.result = result
    return captured


def fit_calibration(logprobs: dict[str, list[float]], rows: list[Row], categories: tuple[str, ...],
                    out_dir: Path | None = None) -> dict[str, Any] | None:
    """Fit the score temperature on the validation rows' per-category log-probs (the card's ``calibration``).

    Args:
        logprobs: row id -> ``k`` first-token log-probs aligned with ``categories`` (rows missing here are left out).
        rows: the validation rows (their ``category`` is the truth).
        categories: the ``k`` categories, in ``logprobs`` order.
        out_dir: where to write ``reliability_validation.png`` (before/after), or ``None``.

    Returns:
        ``{"temperature", "ece_before", "ece_after", "nll_before", "nll_after", "fitted_on", "smoothing"}`` (ECE
        with 15 bins, NLL in nats per row, T fitted with the rule-of-succession smoothing
        :func:`adapters.train.calibration.fit_temperature` names), or ``None`` when no row has log-probs (``choice`` scoring).
    """
    import numpy as np  # lazy: pulls in numpy, only for calibration

    from adapters.train.calibration import (  # lazy: pulls in numpy
        apply_temperature,
        expected_calibration_error,
        fit_temperature,
        negative_log_likelihood,
        reliability_diagram,
        succession_smoothing,
    )

    kept = [r for r in rows if r.id in logprobs]
    if not kept:
        return None
    lp = np.array([logprobs[r.id] for r in kept], dtype=float)
    labels = np.array([categories.index(r.category) for r in kept])
    t = fit_temperature(lp, labels)
    out: dict[str, Any] = {"temperature": round(t, 4)}
    for tag, temp in (("before", 1.0), ("after", t)):
        p = apply_temperature(lp, temp)
        scores, right = p.max(axis=1), p.argmax(axis=1) == labels
        out[f"ece_{tag}"] = round(expected_calibration_error(scores, right), 4)
        out[f"nll_{tag}"] = round(negative_log_likelihood(lp, labels, temp), 4)
        if out_dir is not None:
            reliability_diagram(scores, right, out_dir / f"reliability_validation_{tag}.png",
                                f"validation split, {'raw scores' if tag == 'before' else f'temperature T = {t:.2f}'}")
    out["fitted_on"] = f"validation split, n={len(kept)}"
    out["smoothing"] = round(succession_smoothing(len(kept)), 5)  # rule of succession: no T -> 0 on an error-free split
    log.info("calibration: T = %.3f fitted on %d validation rows: NLL %.3f -> %.3f nats/row (what T is fitted to), "
             "ECE %.2f%% -> %.2f%% (15 bins)", t, len(kept), out["nll_before"], out["nll_after"],
             100 * out["ece_before"], 100 * out["ece_after"])
    log.info("calibration: %s", NLL_VS_ECE)
    return out


NLL_VS_ECE = ("NLL is the mean -log p(true category), lower is better, and the one the temperature minimises; "
              "ECE is the mean gap between score and accuracy over 15 score bins, coarse on a few hundred rows with "
              "few errors, so it may move either way while NLL falls")
"""The one line ``make train`` prints on what its two calibration figures mean."""
