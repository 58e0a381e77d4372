"""Pilot bookkeeping: the summary's checks, the verdict and the decision (pure functions, no engine)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from batch.run.hooks import STAGES  # noqa: F401 - the batch's stages, which the pilot reports
from classify.config.sections import PilotConfig
from classify.errors import AdapterError, ConfigError, InputError, Interrupted
from classify.records import Result
from classify.runs.accounting import account

PROCEED, FIX_ENV, REVISIT = "proceed", "fix-environment", "revisit-configuration"

# Checks whose failure means the machine or the code path is broken, not the configuration.
_ENVIRONMENT_CHECKS = {"accounting", "allowed_categories", "reject_reasons", "export_verified"}


def _check(name: str, ok: bool, detail: str) -> dict[str, Any]:
    return {"name": name, "ok": bool(ok), "detail": detail}


def build_summary(
    results: Sequence[Result],
    input_ids: list[str],
    labels: dict[str, str],
    cfg: PilotConfig,
) -> dict[str, Any]:
    """The pilot's checks over the merged results of its run (the batch's ``results.jsonl``).

    Args:
        results: the results (the records of ``results.jsonl``).
        input_ids: the ids read from the input, in order.
        labels: id -> expected category or ``reject``.
        cfg: the pilot config (categories and thresholds).

    Returns:
        The summary dict: counts, duplicate/unknown/missing ids, expected rejects matched,
        accuracy against labels, the thresholds, ``checks`` (each ``{name, ok, detail}``),
        ``failed_checks`` and ``verdict`` (``pass`` only when every check passed). The accounting
        checks are :func:`classify.runs.accounting.account`'s.
    """
    th = cfg.thresholds
    acc = account(results, input_ids, cfg.classify.categories)
    led = acc.ledger
    duplicate_ids, unknown_ids, missing_ids = acc.duplicate_ids, acc.unknown_ids, acc.missing_ids
    bad_category, no_reason = led.bad_category, led.no_reason
    by_id = {r.id: r for r in results}
    expected_rejects = sorted(i for i, lab in labels.items() if lab == "reject")
    matched = [i for i in expected_rejects if i in by_id and by_id[i].status == "rejected"]
    labelled = sorted(i for i, lab in labels.items() if lab != "reject" and i in by_id)
    correct = [i for i in labelled if by_id[i].category == labels[i]]
    unexpected_rejects = [i for i in labelled if by_id[i].status == "rejected"]
    accuracy = len(correct) / len(labelled) if labelled else 0.0
    match_share = len(matched) / len(expected_rejects) if expected_rejects else 1.0
    unlabelled = [i for i in input_ids if i not in labels]
    stray_labels = sorted(set(labels) - set(input_ids))
    checks = [
        _check("count", len(input_ids) == th.expected_documents,
               f"{len(input_ids)} input documents, expected {th.expected_documents}"),
        _check("accounting", acc.balanced,
               f"accepted {led.accepted} + rejected {led.rejected} = {led.total} rows for {len(input_ids)} ids; "
               f"duplicate {duplicate_ids}, unknown {unknown_ids}, missing {missing_ids}"),
        _check("allowed_categories", not bad_category, f"accepted rows outside the allowed set: {bad_category}"),
        _check("reject_reasons", not no_reason, f"rejected rows without a reason: {no_reason}"),
        _check("labels_complete", not unlabelled and not stray_labels,
               f"ids without a label: {unlabelled}; labels for ids not in the input: {stray_labels}"),
        _check("expected_rejects", bool(expected_rejects) and match_share >= th.min_expected_rejects_matched,
               f"{len(matched)}/{len(expected_rejects)} planned rejects rejected "
               f"(min share {th.min_expected_rejects_matched:.2f}; the pilot set needs at least one planned reject)"),
        _check("accuracy", accuracy >= th.min_accuracy,
               f"{len(correct)}/{len(labelled)} labelled documents classified as labelled = {accuracy:.3f} "
               f"(min_accuracy {th.min_accuracy:.2f})"),
    ]
    failed = [c["name"] for c in checks if not c["ok"]]
    return {
        "total": led.total,
        "accepted": led.accepted,
        "rejected": led.rejected,
        "input_ids": len(input_ids),
        "duplicate_ids": duplicate_ids,
        "unknown_ids": unknown_ids,
        "missing_ids": missing_ids,
        "expected_rejects": expected_rejects,
        "expected_rejects_matched": len(matched),
        "unexpected_rejects": unexpected_rejects,
        "labelled": len(labelled),
        "correct": len(correct),
        "accuracy": round(accuracy, 4),
        "per_category": dict(led.per_category),
        "long_documents": long_documents_block(results, cfg.classify),
        "thresholds": th.model_dump(),
        "checks": checks,
        "failed_checks": failed,
        "verdict": "pass" if not failed else "fail",
    }


VERDICT_VS_DECISION = ("verdict is whether every check of this pilot passed (pass|fail); decision is what to do next: "
                       "proceed (only on a pass), fix-environment (the machine or venv is at fault) or "
                       "revisit-configuration (the model, adapter, prompt or config is)")
"""The one line ``summary.json`` (``verdict_vs_decision``), ``decision.md`` and docs/pilot.md give on the two words."""


def _source(measured: dict[str, Any]) -> str:
    """Where the estimate beside the measured peak comes from (``summary.json`` ``measured.estimate_source``)."""
    return measured.get("estimate_source") or "the estimate"


def long_documents_block(results: Sequence[Result], classify_cfg: Any) -> dict[str, Any]:
    """How much of the pilot's documents the model read (``classify.long_documents``), for the summary.

    Args:
        results: the pilot's result records.
        classify_cfg: the classify section (mode, ``max_doc_tokens``, ``max_windows``).

    Returns:
        ``{mode, max_doc_tokens, max_windows, scored, truncated, truncated_share, windows, windows_per_doc,
        doc_tokens_per_doc, longest_prompt_tokens}`` over the documents that reached the model (``n_windows`` > 0):
        ``truncated`` counts the cut ones, ``windows_per_doc`` is the prompts per document a batch of such documents
        costs (1.0 in ``cut`` mode), ``doc_tokens_per_doc`` the document tokens read per document,
        ``longest_prompt_tokens`` the longest single prompt (a window's: template ids + ``ceil(document tokens /
        windows)``, windows being balanced): what ``model.max_model_len`` must stay above (``make plan``'s floor).
    """
    scored = [r for r in results if (r.n_windows or 0) > 0]
    n = len(scored)
    truncated = sum(r.truncated is True for r in scored)
    windows = sum(int(r.n_windows) for r in scored)
    return {"mode": classify_cfg.long_documents, "max_doc_tokens": classify_cfg.max_doc_tokens,
            "max_windows": classify_cfg.max_windows if classify_cfg.long_documents == "windows" else 1,
            "scored": n, "truncated": truncated, "truncated_share": round(truncated / n, 4) if n else 0.0,
            "windows": windows, "windows_per_doc": round(windows / n, 3) if n else 0.0,
            "doc_tokens_per_doc": round(sum(int(r.n_doc_tokens or 0) for r in scored) / n, 1) if n else 0.0,
            "longest_prompt_tokens": max((_longest_prompt(r) for r in scored), default=0)}


def _longest_prompt(r: Result) -> int:
    """Tokens of ``r``'s longest prompt: its windows share the template ids and split the document evenly
    (:func:`classify.engine.prompt.window_spans`), so the longest is template + ``ceil(doc tokens / windows)``."""
    w, doc = int(r.n_windows), int(r.n_doc_tokens or 0)
    return (int(r.n_tokens or 0) - doc) // w + -(-doc // w)


def long_documents_line(block: dict[str, Any] | None) -> str | None:
    """The decision's sentence on how much of the documents was read, or ``None`` (no block: an older summary)."""
    if not block or not block.get("scored"):
        return None
    line = (f"Long documents ({block['mode']}): {block['truncated']}/{block['scored']} documents cut "
            f"({block['truncated_share']:.0%}), {block['windows_per_doc']} windows per document, "
            f"{block['doc_tokens_per_doc']} document tokens read per document (max_doc_tokens {block['max_doc_tokens']}")
    line += f", max_windows {block['max_windows']})." if block["mode"] == "windows" else ")."
    if block["mode"] == "cut" and block["truncated"]:
        line += (" Set `classify.long_documents: windows` to read them whole (each window is one more prompt: "
                 "make plan and the measured tokens/s count them).")
    return line


def measurement_notes(measured: dict[str, Any] | None) -> tuple[list[str], bool]:
    """What the decision says about the measured engine beside the plan's estimate.

    Rule: a gap (``|measured / estimate - 1| > tolerance``) is named as a note and does not change
    the decision: the pilot's own work fitted, and the estimate is what needs revising before a lot is
    sized from it. A peak over the machine's memory (host RAM on CPU, the card on an accelerator)
    does: the volume would not fit, so the decision is ``revisit-configuration``.

    Args:
        measured: ``summary.json``'s ``measured`` block (``None`` when nothing was measured).

    Returns:
        ``(notes, blocks_proceed)``.
    """
    if not measured:
        return [], False
    if "peak_rss_bytes" not in measured:
        return [f"memory: not measured ({measured.get('error', 'unknown reason')})"], False
    notes = []
    peak, est, ratio, tol = measured["peak_rss_bytes"], measured.get("plan_estimate_bytes"), measured.get("ratio"), \
        measured["tolerance"]
    if measured.get("gap"):
        side = "above" if ratio > 1 else "below"
        notes.append(f"memory gap: the engine's measured peak {peak / 2**30:.2f} GiB is {ratio:.2f}x "
                     f"{_source(measured)} {est / 2**30:.2f} GiB ({side} it by more than the tolerance {tol:.0%}); revise "
                     "the plan's figures (engine section, overhead) before sizing lots from them")
    elif est is None:
        notes.append(f"memory: {_source(measured)} could not be made for this model (see summary.json measured.detail)")
    blocks = bool(measured.get("exceeds_machine"))
    if blocks:
        notes.append(f"memory: the engine's measured peak {peak / 2**30:.2f} GiB exceeds the machine's "
                     f"{measured['machine_bytes'] / 2**30:.2f} GiB: lower engine.kv_cache_space_gib / max_num_seqs "
                     "or use a larger machine")
    return notes, blocks


def _first_error(stage: str, error: BaseException) -> dict[str, str]:
    return {"stage": stage, "kind": getattr(error, "kind", "internal"), "type": type(error).__name__, "message": str(error)}


def decide(summary: dict[str, Any] | None, stage: str, error: BaseException | None) -> dict[str, Any]:
    """Choose ``proceed``, ``fix-environment`` or ``revisit-configuration`` with the reasons.

    Args:
        summary: the summary (``None`` when the run stopped before classification).
        stage: the last stage reached.
        error: the first error, if a stage failed.

    Returns:
        ``{"decision", "reasons": [...], "stage_reached", "first_error"}``; ``first_error`` is
        ``{"stage", "kind", "type", "message"}`` (``kind`` as in ``error [kind]: ...``; ``internal`` for an
        error docpilot did not name).
    """
    if isinstance(error, Interrupted):
        return {
            "decision": FIX_ENV,
            "reasons": [f"stage {stage!r} was {error} before the pilot could decide",
                        "nothing was learned about the model or configuration (the pilot gate and adapter card are "
                        "unchanged): run the pilot again when the machine is free"],
            "stage_reached": stage,
            "first_error": _first_error(stage, error),
        }
    if error is not None:
        config_side = isinstance(error, (ConfigError, InputError, AdapterError))
        what = REVISIT if config_side else FIX_ENV
        hint = ("fix the pilot input, config or adapter named above and run the pilot again" if config_side
                else "fix the machine or the model path (see environment.json), then run the pilot again")
        return {
            "decision": what,
            "reasons": [f"stage {stage!r} failed: {type(error).__name__}: {error}", hint],
            "stage_reached": stage,
            "first_error": _first_error(stage, error),
        }
    assert summary is not None
    failed = [c for c in summary["checks"] if not c["ok"]]
    notes, memory_blocks = measurement_notes(summary.get("measured"))
    if not failed and memory_blocks:
        return {"decision": REVISIT, "stage_reached": stage, "first_error": None,
                "reasons": [f"all {len(summary['checks'])} checks passed, but the engine does not fit this machine",
                            *notes]}
    if not failed:
        return {"decision": PROCEED, "stage_reached": stage, "first_error": None,
                "reasons": [f"all {len(summary['checks'])} checks passed: start the planned volume (make batch)", *notes]}
    env = [c for c in failed if c["name"] in _ENVIRONMENT_CHECKS]
    reasons = [f"check {c['name']!r} failed: {c['detail']}" for c in failed] + notes
    if env:
        return {"decision": FIX_ENV, "stage_reached": stage, "first_error": None,
                "reasons": reasons + ["the pipeline itself lost or garbled results: fix the environment before any volume"]}
    if any(c["name"] == "accuracy" for c in failed):
        reasons.append("fine-tune a LoRA adapter (make train), or revise the prompt or categories, then pilot again "
                       "(make pilot ADAPTER=name@version)")
    return {"decision": REVISIT, "stage_reached": stage, "first_error": None, "reasons": reasons}


def decision_markdown(run_id: str, decision: dict[str, Any], summary: dict[str, Any] | None, what: str) -> str:
    """Render ``decision.md``: the decision, why, and the checks table."""
    lines = [f"# Pilot {run_id}: **{decision['decision']}**", "", f"Piloted: {what}", "",
             f"({VERDICT_VS_DECISION}.)", "",
             f"Stage reached: `{decision['stage_reached']}`", "", "## Why", ""]
    lines += [f"- {r}" for r in decision["reasons"]]
    if summary:
        lines += ["", "## Checks", "", "| check | result | detail |", "|---|---|---|"]
        lines += [f"| {c['name']} | {'pass' if c['ok'] else 'FAIL'} | {c['detail']} |" for c in summary["checks"]]
        lines += ["", f"Accepted {summary['accepted']}, rejected {summary['rejected']}, total {summary['total']}; "
                  f"accuracy {summary['accuracy']:.3f} on {summary['labelled']} labelled documents."]
        m = summary.get("measured")
        if m and "peak_rss_bytes" in m:
            est = f"{m['plan_estimate_bytes'] / 2**30:.2f} GiB" if m.get("plan_estimate_bytes") else "not available"
            ratio = f"{m['ratio']:.2f}" if m.get("ratio") is not None else "-"
            lines += ["", "## Measured", "",
                      f"Engine peak memory ({m['device']}) {m['peak_rss_bytes'] / 2**30:.2f} GiB; {_source(m)} "
                      f"{est}; ratio {ratio} (tolerance {m['tolerance']:.0%}, gap: {'yes' if m.get('gap') else 'no'}). "
                      f"Classify stage: {m['docs_per_s']} docs/s, {m['tokens_per_s']} prompt tokens/s "
                      f"({m['docs']} documents in {m['classify_s']} s)."]
        read = long_documents_line(summary.get("long_documents"))
        if read:
            lines += ["", "## Long documents", "", read]
    return "\n".join(lines) + "\n"
