"""``make pilot``: prove the whole path on 12 documents before the full volume starts.

A pilot is a 12-document run of the batch pipeline (:class:`batch.run.attempt.BatchRun`): the batch's
corpus reader and planner (a folder, JSONL, CSV or Parquet pilot set, read as ``make batch`` reads a
corpus), its Ray pool with the batch config's actor count, core binding and adapter mode, its shard
files, merge to ``results.jsonl`` + ``results.parquet``, quality report, export with ``SHA256SUMS``
and its re-check. On top it adds only what is the pilot's own: the doctor first, the labels, the
checks and thresholds, ``decision.json``/``decision.md`` and the gate record (with the pipeline
settings it ran with, which ``make batch`` compares).

One trial = one NEW run folder ``runs/<utc>-pilot-<id>/`` holding everything a batch run folder
holds (``manifest.json``, ``shards/``, ``progress.json``, ``results.*``, ``summary.json``,
``quality.md``) plus ``params.json``, ``environment.json``, ``inputs.json`` and the decision files.
On failure the first error and the stage reached (:data:`batch.run.hooks.STAGES`) are recorded.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from adapters.registry.registry import Registry
from batch import layout as mf
from batch.lease.clock import lease_end
from batch.pilot.decision import VERDICT_VS_DECISION, build_summary, decide, decision_markdown
from batch.pilot.doctor import blockers, findings_json, run_checks
from batch.pilot.inputs import read_pilot_set
from batch.pilot.measure import measure_pool, nvml_usage, pool_peaks, process_titles
from batch.pool.cluster_check import check_cluster, report_lines
from batch.run.adapter import BatchAdapter, prompt_mismatch, resolve_adapter
from batch.run.attempt import BatchRun
from batch.run.hooks import RunHooks
from batch.run.options import BatchOptions
from classify.config.batch import BatchConfig, load_batch_config
from classify.config.sections import PilotConfig, classification_sha256, config_sha256, load_config
from classify.errors import EnvironmentCheckError, Interrupted
from classify.machine.device import detect_device
from classify.model.model import ModelRef, resolve_model, verify_model
from classify.paths import exports_dir, runs_dir
from classify.runs import storage
from classify.runs.export import export_complete
from classify.runs.gate import gate_key, pipeline_settings, record_pilot
from classify.runs.records import (
    code_revision,
    new_run_dir,
    package_versions,
    read_results,
    signals_raise_interrupted,
    utc_now,
    write_bytes_atomic,
    write_json_atomic,
)
from classify.usercommand import cli_description

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


class PilotHooks(RunHooks):
    """The pilot's additions to the batch run: the stage reached, the engines' measurement, the checks and decision.

    Args:
        cfg: the pilot config (thresholds).
        run_dir: the run folder.
        params: ``params.json`` (written with each outcome).
    """

    mirror_progress = False  # the export location holds the pilot's verified copy only, no stray progress mirror

    def __init__(self, cfg: PilotConfig, run_dir: Path, params: dict[str, Any]):
        self.cfg, self.run_dir, self.params = cfg, run_dir, params
        self.current = "doctor"
        self.input_ids: list[str] = []
        self.labels: dict[str, str] = {}
        self.started = time.time()
        self.procs: dict[int, str] = {}
        self.peaks: dict[str, int] = {}
        self.gpu_bytes: int | None = None
        self.gpu_source = "nvml processes"
        self.first_ready: float | None = None
        self.last_written: float | None = None
        self.engine_model: ModelRef | None = None
        self.lora = False

    def stage(self, name: str) -> None:
        """Record the stage the run entered (logged once per change)."""
        if name != self.current:
            log.debug("pilot stage %s", name)
        self.current = name

    def pool_starting(self, device: str, tp: int, place_timeout_s: float) -> None:
        """On a Ray cluster, ``make cluster-check``'s check before any engine starts; recorded in ``environment.json``.

        A cluster is more than one alive Ray node, or GPUs the engines compute on (``device`` not ``cpu``): one
        probe actor per card in its TP group of ``tp`` (:func:`batch.pool.cluster_check.check_cluster`, waiting up
        to ``place_timeout_s``), its table (node, card, ``CUDA_VISIBLE_DEVICES``, TP group) logged and kept as
        ``environment.json``'s ``cluster``. One node with CPU engines (a plain local pilot) costs one look at
        ``ray.nodes()`` and is recorded as not checked.

        Raises:
            EnvironmentCheckError: a card got no probe (held by another job, a group spread over nodes, a card
                left out by ``tp``): the stage fails and the decision is ``fix-environment``.
        """
        import ray

        nodes = [n for n in ray.nodes() if n.get("Alive")]
        cards = device != "cpu" and any(n.get("Resources", {}).get("GPU", 0) for n in nodes)
        if len(nodes) < 2 and not cards:
            result: dict[str, Any] = {"checked": False, "why": "one Ray node and CPU engines: no card or node to place"}
        else:
            result = {"checked": True, **check_cluster(tp, place_timeout_s, cards=cards)}
            for line in report_lines(result):
                log.info("pilot cluster check: %s", line)
        write_json_atomic(self.run_dir / mf.ENVIRONMENT,
                          {**(json_file(self.run_dir / mf.ENVIRONMENT) or {}), "cluster": result})
        if result.get("ok") is False:
            raise EnvironmentCheckError(
                f"cluster check failed: {'; '.join(result['problems'])} (every card must hold one engine; "
                "`make cluster-check` shows the cluster, docs/cluster.md)")

    def actor_ready(self, info: dict[str, Any]) -> None:
        """Keep the actor's processes (itself and its ``VLLM::`` engine processes) to measure them."""
        if self.first_ready is None:
            self.first_ready = time.perf_counter()
        self.procs.update(process_titles([p["pid"] for p in info.get("procs") or []]))

    def shard_written(self, index: int, n_docs: int) -> None:
        """Sample the engines' peak memory while they still run (``VmHWM`` keeps the high-water mark)."""
        self.last_written = time.perf_counter()
        for name, peak in pool_peaks(self.procs).items():
            self.peaks[name] = max(peak, self.peaks.get(name, 0))
        if detect_device() != "cpu":
            used, self.gpu_source = nvml_usage(list(self.procs))
            self.gpu_bytes = max(used or 0, self.gpu_bytes or 0) or None

    def summarize(self, summary: dict[str, Any]) -> None:
        """The pilot's checks, measurement and decision files on top of the batch's summary (before the export)."""
        results = read_results(self.run_dir / mf.RESULTS)
        summary.update(build_summary(results, self.input_ids, self.labels, self.cfg))
        p = self.params
        seconds = (self.last_written - self.first_ready) if self.first_ready and self.last_written else 0.0
        summary.update(
            run_id=p["run_id"],
            wall_s=round(time.time() - self.started, 2),
            prompt_tokens=sum(r.n_tokens for r in results),
            model_fingerprint=p["model"]["fingerprint"],
            adapter=p["adapter"],
            adapter_mode=p["adapter_mode"],
            merged_model=p["merged_model"],
            pipeline=p["pipeline"],
        )
        model = self.engine_model
        summary["measured"] = measure_pool(self.peaks, self.gpu_bytes, model_path=model.path if model else "",
                                           model_cfg=self.cfg.model, engine_cfg=self.cfg.engine, enable_lora=self.lora,
                                           docs=len(results), tokens=sum(r.n_tokens or 0 for r in results),
                                           seconds=seconds, gpu_source=self.gpu_source,
                                           windows=sum(int(r.n_windows or 0) for r in results))
        # the stage a run that goes on to export and re-check ends at; a failing export rewrites these files
        _write_outcome(self.run_dir, p["run_id"], p, summary, stage="verify", error=None)


def run_pilot(
    cfg: PilotConfig,
    input_path: Path = DEFAULT_INPUT,
    adapter_ref: str | None = None,
    *,
    export_root: Path | str | None = None,
    config_path: str = "",
    lease_ends_at: str | None = None,
    batch_cfg: BatchConfig | None = None,
    progress: bool = False,
    _engine_actor: Any = None,
) -> PilotOutcome:
    """Run one pilot trial (a 12-document batch run) end to end and record its decision.

    Args:
        cfg: the pilot config.
        input_path: pilot set: a folder (``documents/`` + ``labels.json``/``labels.csv``), a ``.jsonl``,
            ``.csv`` or ``.parquet`` file with ``id``, ``text`` (or JSONL ``path``) and ``label`` (see
            :mod:`batch.pilot.inputs`).
        adapter_ref: ``name@version`` (or ``name@latest``) from the adapter registry, or ``None``.
        export_root: parent of the export copy (default ``exports/``): a folder or an object-storage URL
            (``s3://bucket/pilots``, :mod:`classify.runs.storage`); the copy is ``<export_root>/<run_id>/``, and a URL
            copy is read back from the store for the re-check.
        config_path: the config file; its ``corpus`` and ``batch`` sections are the pipeline the pilot
            runs (actors, binding, shard sizes), ``""``: the defaults (or ``batch_cfg``).
        lease_ends_at: the lease end the trial runs under (ISO 8601), recorded in ``params.json``.
        batch_cfg: the batch config to pilot (default: read from ``config_path``); its ``model``,
            ``engine`` and ``classify`` sections are replaced by ``cfg``'s.
        progress: show the batch's progress bar.
        _engine_actor: PRIVATE, for tests and ``bench/`` only: an actor class run in place of the vLLM
            engine actor (as :func:`batch.run.driver.run_batch`'s); no config field or option reaches it.

    Returns:
        The :class:`PilotOutcome`. A failed stage does not raise: it is recorded in the run folder
        (``summary.json`` ``first_error``/``stage_reached``) and in the decision.
    """
    run_id, run_dir = new_run_dir("pilot", runs_dir())
    t_start = time.monotonic()
    error: BaseException | None = None
    summary: dict[str, Any] | None = None
    params = _pilot_params(cfg, run_id, input_path, config_path, lease_ends_at)
    hooks = PilotHooks(cfg, run_dir, params)
    model: ModelRef | None = None
    adapter: BatchAdapter | None = None
    try:
        base = batch_cfg or (load_batch_config(config_path) if config_path else BatchConfig())
        bcfg = base.model_copy(update={"model": cfg.model, "engine": cfg.engine, "classify": cfg.classify})
        bcfg = _one_shard_per_actor(bcfg, cfg.thresholds.expected_documents)
        params["pipeline"] = pipeline_settings(bcfg.engine, bcfg.batch, cfg.model.adapter_mode if adapter_ref else None)
        params["batch_config"] = {"corpus": bcfg.corpus.model_dump(mode="json"), "batch": bcfg.batch.model_dump(mode="json")}
        checks = run_checks(cfg, check_model=False)
        write_json_atomic(run_dir / mf.ENVIRONMENT, findings_json(checks))
        if blockers(checks):
            raise EnvironmentCheckError("; ".join(f"{c.name}: {c.detail}" for c in blockers(checks)))

        hooks.stage("read-inputs")  # the batch's reader: locate, plan (one streaming pass), read the shards
        docs, labels, bcfg, plan = read_pilot_set(Path(input_path), cfg.classify, cfg.thresholds.expected_documents, bcfg)
        where, fmt = Path(plan.path), plan.format
        hooks.input_ids, hooks.labels = [d.id for d in docs], labels
        write_json_atomic(run_dir / "inputs.json", {
            "path": str(input_path),
            "corpus": {"path": str(where), "format": fmt},
            "ids": hooks.input_ids,
            "labels": labels,
            "sha256": {d.id: d.input_sha256 for d in docs},
        })

        hooks.stage("load-model")
        model = verify_model(resolve_model(cfg.model))  # re-hashed against fingerprint.json before it loads
        params["model"] = {"name": model.name, "path": model.path, "fingerprint": model.fingerprint, "source": model.source}
        hooks.engine_model = model
        if adapter_ref:
            hooks.stage("load-adapter")  # resolve, verify, engine compatibility, merge: the batch's preparation
            adapter = _load_adapter(adapter_ref, model, cfg, params, hooks)
        gate = {"key": _gate_key(model, adapter, cfg), "passed": None, "override": False, "pilot_run_id": run_id,
                "role": "pilot", "checked_at": utc_now()}
        options = BatchOptions(config=config_path or "config/docpilot.json",
                               export_dir=str(export_root or exports_dir()), no_progress=not progress,
                               lease_ends=lease_ends_at, lots_config=None)
        BatchRun(options, bcfg, where, fmt, model, adapter, gate, run_id, run_dir, t_start, _engine_actor,
                 corpus_plan=plan, labels=labels, hooks=hooks).run()
        summary = json_file(run_dir / mf.SUMMARY)
    except Exception as err:  # every stage failure is recorded, never lost
        error = err
        log.error("pilot stage %s failed: %s: %s", hooks.current, type(err).__name__, err)
    stage = hooks.current

    if error is None:  # written before the export with the stage a verified run ends at: the copy says the same
        decision = json_file(run_dir / "decision.json")
    else:
        summary = dict(summary or json_file(run_dir / mf.SUMMARY) or {})
        summary.setdefault("checks", [])
        summary["verdict"] = "fail"
        summary["failed_checks"] = [*summary.get("failed_checks", []), f"stage:{stage}"]
        summary["run_id"] = run_id
        decision = _write_outcome(run_dir, run_id, params, summary, stage=stage, error=error)
    assert summary is not None
    # The gate records a verdict only for the combination that was piloted: not for a stopped run, and not
    # when the adapter asked for never loaded (that says nothing about the base model without it).
    if model is not None and not isinstance(error, Interrupted) and (adapter_ref is None or adapter is not None):
        _record_gate(cfg, model, adapter, params=params, summary=summary, decision=decision, stage=stage,
                     run_dir=run_dir)
    export_dir = storage.join(storage.as_dest(export_root or exports_dir()), run_id)
    return PilotOutcome(run_id, run_dir, export_dir if error is None and export_complete(export_dir) else None,
                        decision["decision"], summary["verdict"], stage, summary,
                        0 if error is None else getattr(error, "exit_code", 1))


def _pilot_params(cfg: PilotConfig, run_id: str, input_path: Path, config_path: str,
                  lease_ends_at: str | None) -> dict[str, Any]:
    """``params.json`` of a new pilot run before its stages fill ``model``, ``adapter`` and ``pipeline``."""
    return {
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
        "pipeline": None,
        "batch_config": None,
        "code": code_revision(),
        "packages": package_versions(),
        "seed": cfg.seed,
        "lease_ends_at": lease_ends_at,
    }


def _load_adapter(adapter_ref: str, model: ModelRef, cfg: PilotConfig, params: dict[str, Any],
                  hooks: PilotHooks) -> BatchAdapter:
    """Resolve and prepare the pilot's adapter as a batch does (:func:`batch.run.adapter.resolve_adapter`);
    record it in ``params`` and point ``hooks`` at the engine model (the merged one in merged mode).

    Raises:
        as :func:`batch.run.adapter.resolve_adapter` (unknown adapter, failed verification, engine limits).
    """
    adapter = resolve_adapter(adapter_ref, model, cfg.engine, cfg.model)
    handle = adapter.resolved.handle()
    params["adapter_mode"] = adapter.mode
    params["merged_model"] = adapter.describe()["merged_model"]
    if adapter.merged is not None:
        params["merged_model"]["source"] = adapter.merged.source
        hooks.engine_model = adapter.merged
    hooks.lora = adapter.mode == "lora"
    params["adapter"] = {"ref": adapter.ref, "path": handle.path, "sha256": adapter.sha256,
                         "prompt_mismatch": prompt_mismatch(adapter.card, cfg.classify)}
    if params["adapter"]["prompt_mismatch"]:
        log.warning("adapter %s was trained on another prompt than this pilot builds (%s): expect lower "
                    "accuracy; pilot it with the classify settings it was trained with",
                    adapter.ref, "; ".join(params["adapter"]["prompt_mismatch"]))
    return adapter


def _record_gate(cfg: PilotConfig, model: ModelRef, adapter: BatchAdapter | None, *, params: dict[str, Any],
                 summary: dict[str, Any], decision: dict[str, Any], stage: str, run_dir: Path) -> None:
    """Record the pilot's verdict for the piloted combination (:func:`classify.runs.gate.record_pilot`) and,
    with an adapter, its pilot status in the registry."""
    run_id = params["run_id"]
    record_pilot(_gate_key(model, adapter, cfg), run_id, summary["verdict"], {
        "decision": decision["decision"],
        "model_fingerprint": model.fingerprint,
        "adapter": params["adapter"],
        "adapter_mode": params["adapter_mode"],
        "merged_model": params["merged_model"],
        "classification_sha256": params["classification_sha256"],
        "pipeline": params["pipeline"],
        "stage_reached": stage,
        "run_dir": str(run_dir),
    })
    if adapter is not None:
        Registry().set_pilot_status(adapter.resolved.ref, "passed" if summary["verdict"] == "pass" else "failed",
                                    run_id)


def _gate_key(model: ModelRef, adapter: BatchAdapter | None, cfg: PilotConfig) -> str:
    return gate_key(model.fingerprint, cfg.model, cfg.classify, adapter.sha256 if adapter else None,
                    adapter.mode if adapter else None)


def json_file(path: Path) -> dict[str, Any] | None:
    """``path`` parsed as JSON, or ``None`` when it is missing or unreadable."""
    import json

    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _one_shard_per_actor(bcfg: BatchConfig, n_docs: int) -> BatchConfig:
    """The batch config with shards small enough that every configured engine actor gets one of the pilot's documents.

    A batch plans shards of up to ``batch.shard_docs`` documents (1,000 by default), so 12 documents
    would make one shard and start one actor whatever ``batch.cpu_actors`` says; the pilot would then
    never place, bind or start the others. On a machine with GPUs the pool starts one actor per GPU.

    Args:
        bcfg: the batch config the pilot gates.
        n_docs: documents in the pilot set (``thresholds.expected_documents``).

    Returns:
        ``bcfg`` with ``batch.shard_docs`` = ceil(n_docs / actors) when that is smaller, else ``bcfg``.
    """
    actors = bcfg.batch.cpu_actors
    if detect_device() != "cpu":  # cuda or rocm: one actor per GPU
        import torch

        actors = max(1, torch.cuda.device_count())
    per_actor = max(1, -(-n_docs // max(actors, 1)))
    if per_actor >= bcfg.batch.shard_docs:
        return bcfg
    return bcfg.model_copy(update={"batch": bcfg.batch.model_copy(update={"shard_docs": per_actor})})


def _write_outcome(run_dir: Path, run_id: str, params: dict, summary: dict, *, stage: str,
                   error: BaseException | None) -> dict[str, Any]:
    decision = decide(summary if error is None else None, stage, error)
    summary["stage_reached"] = stage
    summary["first_error"] = decision["first_error"]
    summary["decision"], summary["verdict_vs_decision"] = decision["decision"], VERDICT_VS_DECISION
    loaded = params["model"]  # None when a stage before load-model failed: the configured model is named
    what = f"base {loaded['name'] if loaded else params['config']['model']['base_model']}" + (
        f" + adapter {params['adapter']['ref']}" if params["adapter"] else " (no adapter)") + (
        "" if loaded else "; not loaded: the run stopped before load-model")
    write_json_atomic(run_dir / "params.json", params)
    write_json_atomic(run_dir / mf.SUMMARY, summary)
    write_json_atomic(run_dir / "decision.json", {"run_id": run_id, **decision})
    write_bytes_atomic(run_dir / "decision.md", decision_markdown(run_id, decision, summary if summary.get("checks") else None, what).encode())
    return decision


def main(argv: list[str]) -> int:
    """``docpilot pilot [--config F] [--input P] [--adapter name@version] [--export-dir D] [--require-proceed]``.

    Returns:
        0 when the trial ran through and recorded its decision (any decision; with
        ``--require-proceed`` only ``proceed``, else 10); the error's exit code when a stage failed.
    """
    parser = argparse.ArgumentParser(prog="docpilot pilot", description=cli_description(__doc__))
    parser.add_argument("--config", default="config/docpilot.json", help="the config file: model, engine, classify and pilot sections (default: %(default)s)")
    parser.add_argument("--input", default=str(DEFAULT_INPUT), help="pilot folder (documents/ + labels.json), .jsonl, .csv or .parquet (default data/pilot)")
    parser.add_argument("--adapter", help="adapter from the registry: name@version or name@latest")
    parser.add_argument("--export-dir", help="parent of the export copy: a folder or a URL such as s3://bucket/pilots "
                                             "(default exports/)")
    parser.add_argument("--lease-ends", help="when the lot's lease ends (ISO 8601 with timezone), recorded in "
                                             "params.json (default: lease_ends_at of --lots-config)")
    parser.add_argument("--lots-config", default="config/lots.json", help="lots config holding lease_ends_at")
    parser.add_argument("--require-proceed", action="store_true", help="exit 10 unless the decision is proceed")
    args = parser.parse_args(argv)
    cfg = load_config(PilotConfig, args.config)
    lease = lease_end(args.lots_config, args.lease_ends)
    with signals_raise_interrupted():  # SIGTERM / Ctrl-C: the run folder still gets its summary and decision
        outcome = run_pilot(cfg, Path(args.input), args.adapter, export_root=args.export_dir,
                            config_path=args.config, lease_ends_at=lease.isoformat() if lease else None,
                            progress=sys.stderr.isatty())
    print((outcome.run_dir / "decision.md").read_text())
    print(f"run folder: {outcome.run_dir}\nexport copy: {outcome.export_dir or '(none)'}")
    first = outcome.summary.get("first_error")
    if first:
        print(f"error [{first['kind']}] at stage {first['stage']}: {first['type']}: {first['message']}", file=sys.stderr)
        return outcome.exit_code
    if args.require_proceed and outcome.decision != "proceed":
        return 10
    return 0
