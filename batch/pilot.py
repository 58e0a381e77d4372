"""``make pilot``: prove the whole path on 12 documents before the full volume starts.

One trial = one NEW run folder ``runs/<utc>-pilot-<id>/`` with ``results.jsonl``,
``summary.json``, ``params.json``, ``environment.json``, ``inputs.json``,
``decision.json`` and ``decision.md``; then a copy under ``--export-dir`` with
``SHA256SUMS``, re-read and re-checked; then the outcome is recorded for the
(base model, adapter, config) combination, which ``make batch`` and the server check.
On failure the first error and the stage reached are recorded.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from batch._pilot_adapter import adapter_mode, merged_for_pilot, prompt_mismatch, resolve_adapter
from batch._pilot_inputs import read_pilot_set
from batch._pilot_measure import measure_pilot
from batch._pilot_report import STAGES, build_summary, decide, decision_markdown, recheck_copy
from classify import storage
from classify.accounting import recheck_export
from classify.config import PilotConfig, classification_sha256, config_sha256, load_config
from classify.doctor import blockers, findings_json, run_checks
from classify.engine import Classifier, build_engine
from classify.errors import EngineError, EnvironmentCheckError, Interrupted
from classify.export import export_complete, export_run
from classify.model import ModelRef, resolve_model, verify_model
from classify.paths import exports_dir, runs_dir
from classify.pilotgate import combo_key, record_pilot
from classify.records import Document
from classify.runrecords import (
    code_revision,
    new_run_dir,
    package_versions,
    signals_raise_interrupted,
    utc_now,
    write_bytes_atomic,
    write_json_atomic,
    write_jsonl_atomic,
)
from classify.scoring import AdapterHandle

log = logging.getLogger(__name__)

DEFAULT_INPUT = Path("data/pilot")


@dataclass
class PilotOutcome:
    """What one pilot trial produced.

    Attributes:
        run_id: the run folder's name.
        run_dir: the run folder.
        export_dir: the verified copy (``None`` if the run stopped before export).
        decision: ``proceed``, ``fix-environment`` or ``revisit-configuration``.
        verdict: ``pass`` or ``fail``.
        stage: last stage reached.
        summary: ``summary.json`` content.
        exit_code: 0, or the first error's :attr:`DocpilotError.exit_code` (1 for an unexpected error).
    """

    run_id: str
    run_dir: Path
    export_dir: Path | str | None
    decision: str
    verdict: str
    stage: str
    summary: dict[str, Any] = field(default_factory=dict)
    exit_code: int = 0


def run_pilot(
    cfg: PilotConfig,
    input_path: Path = DEFAULT_INPUT,
    adapter_ref: str | None = None,
    export_root: Path | str | None = None,
    engine: Classifier | None = None,
    config_path: str = "",
    lease_ends_at: str | None = None,
) -> PilotOutcome:
    """Run one pilot trial end to end and record its decision.

    Args:
        cfg: the pilot config.
        input_path: pilot set folder, JSONL or CSV (see :func:`batch._pilot_inputs.read_pilot_set`).
        adapter_ref: ``name@version`` (or ``name@latest``) from the adapter registry, or ``None``.
        export_root: parent of the export copy (default ``exports/``): a folder or an object-storage URL
            (``s3://bucket/pilots``, :mod:`classify.storage`); the copy is ``<export_root>/<run_id>/``, and a URL
            copy is read back from the store for the re-check.
        engine: an already-built classifier for this config (tests share one); else one is built
            and shut down at the end. With an adapter, ``model.adapter_mode`` decides: ``merged``
            builds or reuses the merged model (:mod:`adapters.merged_cache`) and runs it with LoRA off,
            ``lora`` reserves LoRA slots; a given LoRA-enabled classifier always pilots ``lora``.
        config_path: where ``cfg`` was read from, for ``params.json``.
        lease_ends_at: the lease end the trial runs under (ISO 8601), recorded in ``params.json``.

    Returns:
        The :class:`PilotOutcome`. A failed stage does not raise: it is recorded in the run folder
        (``summary.json`` ``first_error``/``stage_reached``) and in the decision.
    """
    run_id, run_dir = new_run_dir("pilot", runs_dir())
    export_dir = storage.join(storage.as_dest(export_root or exports_dir()), run_id)
    started = time.time()
    stage = STAGES[0]
    error: BaseException | None = None
    summary: dict[str, Any] | None = None
    params: dict[str, Any] = {
        "run_id": run_id,
        "created": utc_now(),
        "config_path": config_path,
        "config": cfg.model_dump(mode="json"),
        "config_sha256": config_sha256(cfg),
        "classification_sha256": classification_sha256(cfg.model, cfg.classify),
        "input": str(input_path),
        "model": None,
        "adapter": None,
        "adapter_mode": None,
        "merged_model": None,
        "code": code_revision(),
        "packages": package_versions(),
        "seed": cfg.seed,
        "lease_ends_at": lease_ends_at,
    }
    docs: list[Document] = []
    labels: dict[str, str] = {}
    model: ModelRef | None = None
    resolved_adapter: Any = None
    own_engine = engine is None
    try:
        checks = run_checks(cfg, check_model=False)
        write_json_atomic(run_dir / "environment.json", findings_json(checks))
        if blockers(checks):
            raise EnvironmentCheckError("; ".join(f"{c.name}: {c.detail}" for c in blockers(checks)))

        stage = "read-inputs"
        docs, labels = read_pilot_set(Path(input_path), cfg.classify, cfg.thresholds.expected_documents)
        write_json_atomic(run_dir / "inputs.json", {
            "path": str(input_path),
            "ids": [d.id for d in docs],
            "labels": labels,
            "sha256": {d.id: d.input_sha256 for d in docs},
        })

        stage = "load-model"
        mode = adapter_mode(cfg, adapter_ref, engine)
        # re-hashed before it loads (an engine passed in has loaded its weights already)
        model = engine.model if engine is not None and mode != "merged" else verify_model(resolve_model(cfg.model))
        params["model"] = {"name": model.name, "path": model.path, "fingerprint": model.fingerprint, "source": model.source}
        handle: AdapterHandle | None = None
        merged: ModelRef | None = None
        if adapter_ref:
            stage = "load-adapter"
            handle, resolved_adapter = resolve_adapter(adapter_ref, model, cfg)
            if mode == "merged":  # what the batch runs: the adapter merged into the base weights, LoRA off
                merged = merged_for_pilot(resolved_adapter, model, cfg, engine)
                params["merged_model"] = {"path": merged.path, "fingerprint": merged.fingerprint, "source": merged.source}
            params["adapter_mode"] = mode
            params["adapter"] = {"ref": handle.name, "path": handle.path, "sha256": handle.sha256,
                                 "prompt_mismatch": prompt_mismatch(resolved_adapter.card, cfg.classify)}
            if params["adapter"]["prompt_mismatch"]:
                log.warning("adapter %s was trained on another prompt than this pilot builds (%s): expect lower "
                            "accuracy; pilot it with the classify settings it was trained with",
                            handle.name, "; ".join(params["adapter"]["prompt_mismatch"]))
        if engine is None:
            stage = "load-model"
            if merged is not None:
                engine = build_engine(cfg.model.model_copy(update={"base_model": merged.path}), cfg.engine, cfg.classify,
                                      enable_lora=False, model=merged)
            else:
                engine = build_engine(cfg.model, cfg.engine, cfg.classify, enable_lora=handle is not None, model=model)

        stage = "classify"
        classify_started = time.perf_counter()
        if merged is not None and handle is not None:  # the weights hold the adapter; its card's temperature still applies
            results = engine.classify(docs, temperature=handle.temperature)
        else:
            results = engine.classify(docs, adapter=handle)
        if len(results) != len(docs):
            raise EngineError(f"engine returned {len(results)} results for {len(docs)} documents")
        classify_s = time.perf_counter() - classify_started

        stage = "write"
        write_jsonl_atomic(run_dir / "results.jsonl", (r.row() for r in results))
        summary = build_summary(results, [d.id for d in docs], labels, cfg)
        summary.update(
            run_id=run_id,
            wall_s=round(time.time() - started, 2),
            prompt_tokens=sum(r.n_tokens for r in results),
            model_fingerprint=model.fingerprint,
            adapter=params["adapter"],
            adapter_mode=params["adapter_mode"],
            merged_model=params["merged_model"],
        )
        summary["measured"] = measure_pilot(engine, cfg, results, classify_s)
        summary.update(_quality(run_dir, run_id, results, labels, cfg))
        _write_outcome(run_dir, run_id, params, summary, stage, None)

        stage = "export"
        export_run(run_dir, export_dir)

        stage = "verify"
        recheck_export(export_dir, lambda folder: recheck_copy(folder, cfg), "export copy")
    except Exception as err:  # every stage failure is recorded, never lost
        error = err
        log.error("pilot stage %s failed: %s: %s", stage, type(err).__name__, err)
    finally:
        if own_engine and engine is not None:
            engine.shutdown()

    if error is not None:
        summary = dict(summary or {})
        summary.setdefault("checks", [])
        summary["verdict"] = "fail"
        summary["failed_checks"] = [*summary.get("failed_checks", []), f"stage:{stage}"]
        summary["run_id"] = run_id
    assert summary is not None
    decision = _write_outcome(run_dir, run_id, params, summary, stage, error)
    # The gate records a verdict only for the combination that was piloted: not for a stopped run, and not
    # when the adapter asked for never loaded (that says nothing about the base model without it).
    if model is not None and not isinstance(error, Interrupted) and (adapter_ref is None or params["adapter"]):
        key = combo_key(model.fingerprint, params["adapter"]["sha256"] if params["adapter"] else None,
                        params["classification_sha256"], params["adapter_mode"] or "lora")
        record_pilot(key, run_id, summary["verdict"], {
            "decision": decision["decision"],
            "model_fingerprint": model.fingerprint,
            "adapter": params["adapter"],
            "adapter_mode": params["adapter_mode"],
            "merged_model": params["merged_model"],
            "classification_sha256": params["classification_sha256"],
            "run_dir": str(run_dir),
        })
        if resolved_adapter is not None:
            from adapters.registry import Registry

            Registry().set_pilot_status(resolved_adapter.ref, "passed" if summary["verdict"] == "pass" else "failed", run_id)
    return PilotOutcome(run_id, run_dir, export_dir if export_complete(export_dir) else None, decision["decision"],
                        summary["verdict"], stage, summary,
                        0 if error is None else getattr(error, "exit_code", 1))


def _quality(run_dir: Path, run_id: str, results: list[Any], labels: dict[str, str], cfg: PilotConfig) -> dict[str, Any]:
    """The quality report (:mod:`batch.quality`): PNGs and ``quality.md`` in the run folder.

    Returns:
        ``{"quality": report}`` plus ``{"review": ...}`` (flags per category) when ``classify.review_below_score`` is set.
    """
    from batch.quality import tally_rows, write_report

    report = write_report(run_dir, tally_rows((r.row() for r in results), labels, cfg.classify.categories,
                                              cfg.classify.review_below_score), run_id)
    return {"quality": report, **({"review": report["review"]} if "review" in report else {})}


def _write_outcome(run_dir: Path, run_id: str, params: dict, summary: dict, stage: str,
                   error: BaseException | None) -> dict[str, Any]:
    decision = decide(summary if error is None else None, stage, error)
    summary["stage_reached"] = stage
    summary["first_error"] = decision["first_error"]
    what = f"base {params['model']['name'] if params['model'] else '?'}" + (
        f" + adapter {params['adapter']['ref']}" if params["adapter"] else " (no adapter)")
    write_json_atomic(run_dir / "params.json", params)
    write_json_atomic(run_dir / "summary.json", summary)
    write_json_atomic(run_dir / "decision.json", {"run_id": run_id, **decision})
    write_bytes_atomic(run_dir / "decision.md", decision_markdown(run_id, decision, summary if summary.get("checks") else None, what).encode())
    return decision


def main(argv: list[str]) -> int:
    """``docpilot pilot [--config F] [--input P] [--adapter name@version] [--export-dir D] [--require-proceed]``.

    Returns:
        0 when the trial ran through and recorded its decision (any decision; with
        ``--require-proceed`` only ``proceed``, else 10); the error's exit code when a stage failed.
    """
    parser = argparse.ArgumentParser(prog="docpilot pilot", description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="config/docpilot.json")
    parser.add_argument("--input", default=str(DEFAULT_INPUT), help="pilot folder, .jsonl or .csv (default data/pilot)")
    parser.add_argument("--adapter", help="adapter from the registry: name@version or name@latest")
    parser.add_argument("--export-dir", help="parent of the export copy: a folder or a URL such as s3://bucket/pilots "
                                             "(default exports/)")
    parser.add_argument("--lease-ends", help="when the lot's lease ends (ISO 8601 with timezone), recorded in "
                                             "params.json (default: `lease_ends_at` of --lots-config)")
    parser.add_argument("--lots-config", default="config/lots.json", help="lots config holding `lease_ends_at`")
    parser.add_argument("--require-proceed", action="store_true", help="exit 10 unless the decision is proceed")
    args = parser.parse_args(argv)
    cfg = load_config(PilotConfig, args.config)
    from batch.plan import lease_end

    lease = lease_end(args.lots_config, args.lease_ends)
    with signals_raise_interrupted():  # SIGTERM / Ctrl-C: the run folder still gets its summary and decision
        outcome = run_pilot(cfg, Path(args.input), args.adapter, args.export_dir,
                            config_path=args.config, lease_ends_at=lease.isoformat() if lease else None)
    print((outcome.run_dir / "decision.md").read_text())
    print(f"run folder: {outcome.run_dir}\nexport copy: {outcome.export_dir or '(none)'}")
    first = outcome.summary.get("first_error")
    if first:
        print(f"error [{first['kind']}] at stage {first['stage']}: {first['type']}: {first['message']}", file=sys.stderr)
        return outcome.exit_code
    if args.require_proceed and outcome.decision != "proceed":
        return 10
    return 0
