"""``docpilot batch`` / ``make batch``: classify a corpus over Ray engine actors, resumable by manifest.

Order of work: read config and corpus, resolve the model (and adapter), check the pilot gate,
open or create ``runs/<batch-id>/`` (refusing a resume whose corpus, config, model or adapter
changed), run only the shards without a complete shard file, merge, summarize, export with
SHA256SUMS and re-check the copy. See ``docs/batch.md``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from filelock import FileLock, Timeout
from tqdm import tqdm

from batch import _ray_local
from batch import manifest as mf
from batch._config import BatchConfig, load_batch_config, results_config, results_config_sha256
from batch._progress import Progress
from batch.corpus import CorpusPlan, locate_corpus, plan_corpus, quick_fingerprint
from classify import storage
from classify.accounting import export_checked
from classify.config import ModelConfig, classification_sha256
from classify.errors import InputError, VerificationError
from classify.export import export_complete
from classify.model import ModelRef, resolve_model
from classify.paths import exports_dir, runs_dir
from classify.pilotgate import combo_key, require_pilot
from classify.records import Result
from classify.runrecords import (
    code_revision,
    package_versions,
    signals_raise_interrupted,
    utc_now,
    write_json_atomic,
)

log = logging.getLogger("docpilot.batch")

BATCH_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


def parse_args(argv: list[str]) -> argparse.Namespace:
    """Parse ``docpilot batch`` options (see ``--help``)."""
    p = argparse.ArgumentParser(prog="docpilot batch", description="Classify a corpus over Ray engine actors, resumable by batch id.")
    p.add_argument("--config", default="config/docpilot.json", help="batch config JSON (default: %(default)s)")
    p.add_argument("--corpus", help="corpus file or folder (replaces `corpus.path`)")
    p.add_argument("--batch-id", help="run folder name under runs/; an existing one is resumed")
    p.add_argument("--adapter", help="LoRA adapter from the registry, name@version or name@latest")
    p.add_argument("--export-dir", help="parent of the export copy, a folder or an object-storage URL such as "
                                        "s3://bucket/exports (replaces `batch.export_dir`)")
    p.add_argument("--cpu-actors", type=int, help="engine actors on a CPU-only cluster (replaces `batch.cpu_actors`)")
    p.add_argument("--skip-pilot-gate", action="store_true",
                   help="run although this model/adapter/config has not passed a pilot (logged and recorded)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar (progress.json is still written)")
    p.add_argument("--lease-ends", help="when the lot's lease ends (ISO 8601 with timezone); the progress line says "
                                        "whether the rest of the batch and its export fit (default: `lease_ends_at` "
                                        "of --lots-config)")
    p.add_argument("--lots-config", default="config/lots.json", help="lots config holding `lease_ends_at` (default: %(default)s)")
    return p.parse_args(argv)


@dataclass(frozen=True)
class BatchAdapter:
    """The batch's one adapter and how the engines run it (``model.adapter_mode``).

    Attributes:
        resolved: the verified registry adapter (:class:`adapters.registry.ResolvedAdapter`).
        mode: ``merged`` (the engines load ``merged`` as their base model, LoRA off) or ``lora``.
        merged: the cached merged model (:func:`adapters.merged_cache.merged_model`), ``None`` in ``lora`` mode.
    """

    resolved: Any
    mode: str
    merged: ModelRef | None = None

    @property
    def ref(self) -> str:
        """``name@version`` of the adapter."""
        return self.resolved.ref

    @property
    def sha256(self) -> str:
        """The adapter's content hash from its registry card."""
        return self.resolved.sha256

    def handle(self) -> Any:
        """The LoRA handle the engines apply per request; ``None`` in merged mode (the weights hold the adapter)."""
        return None if self.merged is not None else self.resolved.handle()

    def engine_model(self, model_cfg: ModelConfig, base_fingerprint: str) -> tuple[ModelConfig, str]:
        """The model section and expected fingerprint the engine actors get.

        Args:
            model_cfg: the config's model section.
            base_fingerprint: the base model's fingerprint.

        Returns:
            ``(model_cfg, base_fingerprint)`` in lora mode; in merged mode the section with
            ``base_model`` set to the merged folder and the merged weights' fingerprint.
        """
        if self.merged is None:
            return model_cfg, base_fingerprint
        return model_cfg.model_copy(update={"base_model": self.merged.path}), self.merged.fingerprint

    def describe(self) -> dict[str, Any]:
        """``{"adapter_mode", "merged_model"}`` for ``manifest.json`` and ``summary.json``."""
        merged = {"path": self.merged.path, "fingerprint": self.merged.fingerprint} if self.merged else None
        return {"adapter_mode": self.mode, "merged_model": merged}


def _resolve_adapter(ref: str | None, model: ModelRef, engine: Any = None,
                     model_cfg: ModelConfig | None = None) -> BatchAdapter | None:
    """Resolve and verify the batch's adapter; in merged mode build or reuse its merged model.

    Args:
        ref: ``name@version`` / ``name@latest``, or ``None`` for the base model alone.
        model: the resolved base model.
        engine: the engine config whose LoRA limits the adapter must fit (checked in both modes:
            the server runs the same adapter through LoRA).
        model_cfg: the model section (its ``adapter_mode`` and dtype); default ``ModelConfig()``.

    Returns:
        The :class:`BatchAdapter`, or ``None`` without ``ref``.

    Raises:
        AdapterError: unknown, tampered or incompatible adapter, or a merge that fails its check.
    """
    if ref is None:
        return None
    from adapters.registry import Registry  # imported only when an adapter is asked for

    model_cfg = model_cfg or ModelConfig()
    resolved = Registry().resolve(ref, base_fingerprint=model.fingerprint, engine=engine, base_model_path=model.path)
    if model_cfg.adapter_mode == "lora":
        return BatchAdapter(resolved, "lora")
    from adapters.merged_cache import merged_model
    from classify.device import compute_dtype

    return BatchAdapter(resolved, "merged", merged_model(resolved, model, compute_dtype(model_cfg)))


def _open_run(batch_id: str | None) -> tuple[str, Path]:
    root = runs_dir()
    if batch_id is None:
        from classify.runrecords import new_run_dir

        return new_run_dir("batch", root)
    if not BATCH_ID_RE.match(batch_id):
        raise InputError(f"`--batch-id` must match {BATCH_ID_RE.pattern}, got {batch_id!r}")
    run_dir = root / batch_id
    run_dir.mkdir(parents=True, exist_ok=True)
    return batch_id, run_dir


def build_manifest(batch_id: str, cfg: BatchConfig, corpus: CorpusPlan, model: ModelRef, adapter: Any,
                   gate: dict[str, Any]) -> dict[str, Any]:
    """The manifest this invocation would write for a new batch (see :mod:`batch.manifest`).

    Args:
        batch_id: the run folder's name.
        cfg: the batch config.
        corpus: the planned corpus (:func:`batch.corpus.plan_corpus`): its description and shard plan.
        model: the resolved base model.
        adapter: the resolved adapter, or ``None``.
        gate: the pilot-gate record.

    Returns:
        A JSON-able dict with the resume keys, the shard plan and provenance.
    """
    return {
        "manifest_version": mf.MANIFEST_VERSION,
        "batch_id": batch_id,
        "created_at": utc_now(),
        "corpus": corpus.describe(),
        "corpus_fingerprint": corpus.fingerprint,
        "config": results_config(cfg),
        "config_sha256": results_config_sha256(cfg),
        "full_config": cfg.model_dump(mode="json"),
        "model": {"name": model.name, "path": model.path, "source": model.source},
        "model_fingerprint": model.fingerprint,
        "adapter": adapter.ref if adapter else None,
        "adapter_sha256": adapter.sha256 if adapter else None,
        **(adapter.describe() if adapter else {"adapter_mode": None, "merged_model": None}),
        "pilot_gate": gate,
        "shard_docs": cfg.batch.shard_docs,
        "shard_target_bytes": cfg.batch.shard_target_bytes,
        "shards": corpus.shards,
        "code": code_revision(),
        "packages": package_versions(),
        "attempts": [],
    }


def _init_ray() -> Any:
    """Join ``RAY_ADDRESS`` (or the job's cluster) or start a small local Ray.

    Returns:
        The local session this call started (end it with :func:`batch._ray_local.stop`), else None.
    """
    return _ray_local.start(include_dashboard=False, object_store_memory=512 * 1024**2, log_to_driver=_verbose())


def _verbose() -> bool:
    """Whether Ray's and vLLM's own log lines are wanted (``docpilot --verbose`` / ``DOCPILOT_VERBOSE=1``)."""
    return os.environ.get("DOCPILOT_VERBOSE", "") not in ("", "0")


class _ShardRef:
    """A planned shard that the pool reads only when it dispatches it (``len()`` = its documents, for deadlines)."""

    def __init__(self, corpus: CorpusPlan, shard: dict[str, Any], max_doc_bytes: int):
        self.corpus, self.shard, self.max_doc_bytes = corpus, shard, max_doc_bytes

    def __len__(self) -> int:
        return int(self.shard["n_docs"])

    def load(self) -> list[Any]:
        """The shard's documents, read from the corpus now."""
        return self.corpus.read_shard(self.shard, self.max_doc_bytes)


def _run_shards(cfg: BatchConfig, run_dir: Path, corpus: CorpusPlan, manifest: dict[str, Any], pending: list[int],
                adapter: Any, progress: Progress, show_bar: bool, engine_actor: Any = None,
                lease_ends_at: Any = None) -> dict[str, Any]:
    from batch._actor import actor_class, reap
    from batch._placement import actor_options
    from batch._pool import Deadlines, run_pool
    from batch.status import LeaseWatch

    local_ray = _init_ray()
    try:
        if progress.previous_actors:
            reap(progress.previous_actors)  # engine processes an earlier, killed attempt left behind
        n_actors, options = actor_options(cfg.batch.cpu_actors, cfg.batch.actor_num_cpus, cfg.batch.cpu_bind)
        n_actors = min(n_actors, len(pending))
        cls = engine_actor if engine_actor is not None else actor_class()
        handle = adapter.handle() if adapter else None
        plan = {s["index"]: s for s in manifest["shards"]}
        shards = [(i, _ShardRef(corpus, plan[i], cfg.classify.max_doc_bytes)) for i in pending]
        bar = progress_bar(progress.total, progress.done, f"batch {manifest['batch_id']}", disable=not show_bar)
        lease = LeaseWatch(lease_ends_at, run_dir, manifest["batch_id"])
        lease.tick(progress, bar, force=True)
        actors: dict[int, dict[str, Any]] = {}

        def on_event(name: str, detail: dict[str, Any]) -> None:
            if name == "actor-ready":
                actors[detail["slot"]] = detail
                progress.update(actors=list(actors.values()))
            elif name == "retry":
                progress.update(last_error=detail["error"], retries=progress.retries + 1)

        def on_done(index: int, rows: list[Any]) -> None:
            results = [Result.of(r) for r in rows]  # rows cross Ray as dicts (cheaper to pickle than models)
            mf.write_shard(run_dir, index, results, mf.manifest_version(manifest))
            progress.shard_done(results)
            lease.tick(progress, bar)
            bar.update(len(results))

        actor_model, actor_fingerprint = (adapter.engine_model(cfg.model, manifest["model_fingerprint"]) if adapter
                                          else (cfg.model, manifest["model_fingerprint"]))
        deadlines = Deadlines(cfg.batch.shard_timeout_base_s, cfg.batch.shard_timeout_per_doc_s,
                              cfg.batch.actor_start_timeout_s, cfg.batch.actor_place_timeout_s)
        with _logging_redirect():
            stats = run_pool(lambda slot: cls.options(**options[slot]).remote(
                                 actor_model, cfg.engine, cfg.classify, handle, actor_fingerprint),
                             n_actors, shards, on_done, cfg.batch.max_shard_retries, on_event, deadlines)
        lease.tick(progress, bar, force=True)
        bar.close()
        return {"actors": n_actors, "actors_started": stats.actors_started, "retries": stats.retries,
                "errors": stats.errors, "first_shard_s": stats.first_ready_s}
    finally:
        _ray_local.stop(local_ray)  # a local Ray leaves no process behind; a joined cluster is left alone


BAR_FORMAT = "{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}<{remaining}, {rate_noinv_fmt}{postfix}]"
"""tqdm's default layout with ``rate_noinv_fmt``: always docs/s (the default turns a rate below 1 into s/doc)."""


def progress_bar(total: int, initial: int, desc: str, disable: bool = False, file: Any = None) -> tqdm:
    """The batch progress bar: documents done of ``total``, rate always in docs/s.

    Args:
        total: distinct documents in the corpus.
        initial: documents already done (a resumed batch).
        desc: the label, e.g. ``"batch <id>"``.
        disable: no bar at all (``--no-progress``).
        file: where to draw it (default stderr).

    Returns:
        A started ``tqdm`` bar.
    """
    return tqdm(total=total, initial=initial, unit="docs", desc=desc, disable=disable, dynamic_ncols=True,
                bar_format=BAR_FORMAT, file=file)


def _logging_redirect() -> Any:
    """Keep log lines from tearing the progress bar (tqdm's logging redirect)."""
    from tqdm.contrib.logging import logging_redirect_tqdm

    return logging_redirect_tqdm()


def run_batch(args: argparse.Namespace, *, _engine_actor: Any = None) -> dict[str, Any]:
    """Run or resume one batch (the body of :func:`main`).

    Args:
        args: :func:`parse_args` output.
        _engine_actor: PRIVATE, for ``bench/`` and tests only: a ``ray.remote`` actor class run in
            place of the vLLM engine actor (``bench.instant_engine.InstantEngineActor`` measures the
            batch machinery alone). No config field or command-line option reaches it.

    Returns:
        The summary written to ``summary.json`` (with ``run_dir`` and ``export_dir`` added).

    Raises:
        ConfigError, InputError, AdapterError, PilotGateError, EngineError, VerificationError:
            as described in ``docs/batch.md``.
    """
    t_start = time.monotonic()
    overrides: dict[str, Any] = {}
    if args.cpu_actors is not None:
        overrides["batch.cpu_actors"] = args.cpu_actors
    cfg = load_batch_config(args.config, overrides)
    corpus_path, corpus_format = locate_corpus(cfg.corpus, args.corpus)  # fail early; planned once the run is locked
    model = resolve_model(cfg.model)
    adapter = _resolve_adapter(args.adapter, model, cfg.engine, cfg.model)
    what = (f"base model {cfg.model.base_model} ({model.fingerprint[:19]}) + "
            f"{f'adapter {adapter.ref} ({adapter.mode} mode)' if adapter else 'no adapter'}")
    key = combo_key(model.fingerprint, adapter.sha256 if adapter else None, classification_sha256(cfg.model, cfg.classify),
                    adapter.mode if adapter else "lora")
    gate = require_pilot(key, what, override=args.skip_pilot_gate)
    gate_record = {"key": key, "passed": gate["passed"], "override": gate["override"],
                   "pilot_run_id": (gate["pilot"] or {}).get("run_id"), "checked_at": utc_now()}
    batch_id, run_dir = _open_run(args.batch_id)
    lock = FileLock(str(run_dir / ".driver.lock"))
    try:
        lock.acquire(timeout=0)
    except Timeout:
        raise InputError(f"batch {batch_id} is already running (another driver holds {run_dir}/.driver.lock); "
                         f"watch it with `docpilot status {batch_id}`") from None
    try:
        with signals_raise_interrupted():  # SIGTERM / Ctrl-C: Ray is shut down, the attempt recorded, exit 130
            return _run_locked(args, cfg, (corpus_path, corpus_format), model, adapter, gate_record, batch_id, run_dir,
                               t_start, _engine_actor)
    finally:
        lock.release()


def _plan_or_reuse(cfg: BatchConfig, where: Path, fmt: str, old: dict[str, Any] | None, batch_id: str) -> CorpusPlan:
    """The corpus plan: the stored one when the corpus bytes are unchanged (a resume), else a new planning pass."""
    if old is not None and mf.manifest_version(old) < mf.MANIFEST_VERSION:
        raise InputError(
            f"batch {batch_id} was started by an earlier docpilot (run folder manifest_version {mf.manifest_version(old)}, "
            f"shards/NNNNN.jsonl over a corpus read whole); this version plans and reads corpora in streams "
            f"(manifest_version {mf.MANIFEST_VERSION}) and cannot resume it. Finish it with the docpilot that started it, "
            "or start a new batch id (its complete shards stay readable: `docpilot status` and the export re-check)")
    if old is not None and old.get("corpus", {}).get("format") == fmt:
        fingerprint = quick_fingerprint(where, fmt, old["corpus"])
        if fingerprint is not None and fingerprint == old.get("corpus_fingerprint"):
            log.info("batch %s: corpus unchanged (%s); reusing its shard plan", batch_id, fingerprint[:19])
            return CorpusPlan.from_manifest(old, str(where))
    t0 = time.monotonic()
    plan = plan_corpus(cfg.corpus, cfg.batch.shard_docs, cfg.batch.shard_target_bytes, where, cfg.classify.max_doc_bytes)
    log.info("planned %s: %d rows, %d distinct ids, %d shards in %.1f s", where, plan.input_rows, plan.distinct_ids,
             len(plan.shards), time.monotonic() - t0)
    return plan


def _run_locked(args: argparse.Namespace, cfg: BatchConfig, located: tuple[Path, str], model: ModelRef, adapter: Any,
                gate_record: dict[str, Any], batch_id: str, run_dir: Path, t_start: float,
                engine_actor: Any = None) -> dict[str, Any]:
    from batch.plan import lease_end

    lease_ends_at = lease_end(getattr(args, "lots_config", None), getattr(args, "lease_ends", None))
    old = mf.read_manifest(run_dir)
    corpus = _plan_or_reuse(cfg, located[0], located[1], old, batch_id)
    new = build_manifest(batch_id, cfg, corpus, model, adapter, gate_record)
    if old is not None:
        mf.check_resume(run_dir, old, new)  # a changed `model.adapter_mode` is a config change: refused there
        if (old.get("merged_model") or {}).get("fingerprint") != (new.get("merged_model") or {}).get("fingerprint"):
            raise InputError(f"batch {batch_id} cannot resume: the merged model changed: {old.get('merged_model')} -> "
                             f"{new.get('merged_model')}. Rerun with the original merge, or start a new batch id")
        manifest = old
    else:
        manifest = new
    log.info("batch %s: %d distinct ids (%d input rows) in %d shards, run folder %s",
             batch_id, corpus.distinct_ids, corpus.input_rows, len(manifest["shards"]), run_dir)
    done = mf.scan_done(run_dir, manifest)
    pending = [s["index"] for s in manifest["shards"] if s["index"] not in done]
    export_root = storage.as_dest(args.export_dir or cfg.batch.export_dir or exports_dir())
    if not pending and (run_dir / mf.SUMMARY).is_file() and export_complete(storage.join(export_root, batch_id)):
        log.info("batch %s is already complete: %d shards; re-checking it, writing nothing", batch_id, len(done))
        _, problems = mf.merge_results(run_dir, manifest, write=False)
        if problems:
            raise VerificationError(f"batch {batch_id}: merged results break the invariants: {'; '.join(problems)}")
        summary = json.loads((run_dir / mf.SUMMARY).read_text(encoding="utf-8"))
        summary["run_dir"], summary["export_dir"] = str(run_dir), str(_export(run_dir, storage.join(export_root, batch_id)))
        return summary
    attempt = {"started_at": utc_now(), "pid": os.getpid(), "host": socket.gethostname(), "pilot_gate": gate_record,
               "cpu_actors": cfg.batch.cpu_actors, "lease_ends_at": lease_ends_at.isoformat() if lease_ends_at else None}
    manifest["attempts"].append(attempt)
    mf.write_manifest(run_dir, manifest)
    progress = Progress(run_dir, batch_id, total=corpus.distinct_ids)
    progress.start(done)
    log.info("batch %s: %d shards complete, %d to run", batch_id, len(done), len(pending))
    pool: dict[str, Any] = {"actors": 0}
    t_pool = time.monotonic()
    try:
        if pending:
            with _ray_local.interrupts():  # SIGTERM / Ctrl-C inside Ray's blocking calls -> Interrupted (exit 130)
                pool = _run_shards(cfg, run_dir, corpus, manifest, pending, adapter, progress, not args.no_progress,
                                   engine_actor, lease_ends_at)
        t_end = time.monotonic()
        t_merge = time.monotonic()
        counts, problems = mf.merge_results(run_dir, manifest)  # results.jsonl + results.parquet, streamed
        if problems:
            raise VerificationError(f"batch {batch_id}: merged results break the invariants: {'; '.join(problems)}")
        processed = progress.processed
        tokens = progress.processed_tokens
        pool_s = max(t_end - t_pool, 1e-9)
        summary = counts
        summary.update({
            "batch_id": batch_id,
            "corpus": corpus.describe(),
            "model_fingerprint": model.fingerprint,
            "adapter": adapter.ref if adapter else None,
            **(adapter.describe() if adapter else {"adapter_mode": None, "merged_model": None}),
            "pilot_gate": gate_record,
            "this_attempt": {
                "processed_docs": processed, "processed_tokens": tokens,
                "docs_per_s": round(processed / pool_s, 3), "tokens_per_s": round(tokens / pool_s, 1),
                "pool_wall_s": round(pool_s, 2), "wall_s": round(t_end - t_start, 2),
                "merge_s": round(time.monotonic() - t_merge, 2), **pool,
            },
            "attempts": len(manifest["attempts"]),
            "finished_at": utc_now(),
            "invariants": {"accepted_plus_rejected_eq_distinct_ids":
                           counts["accepted"] + counts["rejected"] == corpus.distinct_ids, "problems": problems},
        })
        write_json_atomic(run_dir / mf.SUMMARY, summary)
        attempt.update(finished_at=utc_now(), processed_docs=processed, wall_s=round(time.monotonic() - t_start, 2))
        mf.write_manifest(run_dir, manifest)
        progress.finish()
        export = _export(run_dir, storage.join(export_root, batch_id))
    except Exception as err:
        progress.fail(f"{type(err).__name__}: {err}")
        attempt.update(failed_at=utc_now(), error=f"{type(err).__name__}: {err}"[:2000])
        mf.write_manifest(run_dir, manifest)
        raise
    summary["run_dir"], summary["export_dir"] = str(run_dir), str(export)
    return summary


def _export(run_dir: Path, dest: storage.Dest) -> storage.Dest:
    """Copy the finished run with SHA256SUMS and re-check the copy (an earlier attempt's copy is re-checked, not overwritten).

    ``dest`` is a folder or an object-storage URL; a URL copy is read back from the store for the
    re-check, and an incomplete one (an interrupted upload: no SHA256SUMS) is completed.
    """
    if export_complete(dest):
        log.info("export %s exists (an earlier attempt); re-checking it", dest)
    export_checked(run_dir, dest, mf.check_export, f"export {dest}")
    return dest


def main(argv: list[str] | None = None) -> int:
    """``docpilot batch``: run or resume a batch; prints where the results are.

    Args:
        argv: command-line arguments (default ``sys.argv[1:]``).

    Returns:
        0 when the batch completed, was exported and re-checked.

    Raises:
        DocpilotError: any known failure (mapped to an exit code by :mod:`docpilot.cli`).
    """
    args = parse_args(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.skip_pilot_gate:
        log.warning("!!! --skip-pilot-gate given: the pilot gate is OVERRIDDEN for this batch; recorded in manifest.json")
    summary = run_batch(args)
    t = summary["this_attempt"]
    print(f"batch {summary['batch_id']}: {summary['total']} ids = {summary['accepted']} accepted + "
          f"{summary['rejected']} rejected ({summary['input_rows']} input rows, {summary['duplicate_rows']} duplicate rows); "
          f"this attempt {t['processed_docs']} docs at {t['docs_per_s']} docs/s in {t['wall_s']} s")
    print(f"results: {summary['run_dir']}/results.jsonl  summary: {summary['run_dir']}/summary.json")
    print(f"export (SHA256SUMS verified): {summary['export_dir']}")
    return 0
