"""Private: one attempt of one batch once its run folder is locked (the body of :func:`batch.run.driver.run_batch`).

:class:`BatchRun` holds what the attempt needs (options, config, model, adapter, gate record,
run folder) so that its steps take only what changes between them: plan or reuse the corpus
plan, refuse a changed resume, run the shards without a file over the Ray pool, merge, summarize,
export and re-check.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from batch import layout as mf
from batch.corpus.plan import CorpusPlan, plan_corpus, quick_fingerprint
from batch.corpus.shard import ShardOutput
from batch.corpus.source import StoreObject
from batch.lease.clock import LeaseWatch, lease_end
from batch.pool import local_ray as _ray_local
from batch.pool.actor import actor_class, reap
from batch.pool.placement import NodeWatch, actor_options, node_gpus
from batch.pool.scheduler import Deadlines, run_pool
from batch.report.quality import batch_report, tally_rows, write_report
from batch.run.adapter import BatchAdapter
from batch.run.debris import remove_stale_temporaries
from batch.run.export import check_export_root, export_batch, export_dest
from batch.run.finish import off_pod_within
from batch.run.hooks import RunHooks
from batch.run.manifest import build_manifest
from batch.run.merge import merge_results
from batch.run.mirror import progress_mirror
from batch.run.offpod import ShardUploader, offpod_short
from batch.run.owner import ExportOwner
from batch.run.progress import Progress, closing_on_error, logging_redirect, progress_bar
from batch.run.resume import is_default_config
from batch.runfiles import Manifest
from classify.config.batch import BatchConfig
from classify.config.engine import COMPILE_MIN_DOCS_PER_ENGINE
from classify.config.file import DEFAULT_CONFIG
from classify.errors import InputError, Interrupted, OffPodPending, VerificationError
from classify.machine.device import cpp_compiler, detect_device
from classify.model.memory import resolve_tensor_parallel
from classify.model.model import ModelRef
from classify.paths import verbose_logs
from classify.runs import storage
from classify.runs.disk import full_disk_is_environment
from classify.runs.export import export_complete
from classify.runs.records import read_jsonl, utc_now, write_bytes_atomic, write_json_atomic
from classify.runs.storage import redact

if TYPE_CHECKING:
    from batch.run.options import BatchOptions

log = logging.getLogger("docpilot.batch")

UPLOAD_WAIT_ON_FAILURE_S = 60.0
"""Most seconds a failed attempt waits for its complete shards to be copied off the pod before it exits (a stopped
one, SIGTERM or the store deadline past, does not wait)."""

CLAIM_WAIT_S = 2.0
"""Most seconds the start of a batch waits for the store to answer the claim of its export location
(:mod:`batch.run.owner`); a store slower than that delays only the copy (nothing is written before the claim)."""

MIRROR_FINAL_WAIT_S = 5.0
"""Most seconds the end of the pool waits for the last progress mirror; the rest is waited for under the store
deadline (:mod:`batch.run.finish`), or not at all when the batch was stopped."""

STOP_STORE_WAIT_S = 1.0
"""Most seconds a stopped batch (SIGTERM, or the store deadline past) waits for each last store call: the removal of
its owner record, the last progress mirror (a record left stale is taken over later)."""


def _bounded(call: Any, wait_s: float) -> None:
    """Run ``call()`` in a daemon thread and wait for it up to ``wait_s`` seconds (a store call a stop must not wait on)."""
    import threading

    thread = threading.Thread(target=call, name="bounded-store-call", daemon=True)
    thread.start()
    thread.join(wait_s)


def _init_ray() -> Any:
    """Join ``RAY_ADDRESS`` (or the job's cluster) or start a small local Ray (``num_gpus=0`` when the run computes on the CPU).

    Returns:
        The local session this call started (end it with :func:`batch.pool.local_ray.stop`), else None.
    """
    # a CPU venv declares no GPUs in its own local Ray, whatever NVML counts (one device decision)
    gpus = {"num_gpus": 0} if detect_device() == "cpu" else {}
    return _ray_local.start(include_dashboard=False, object_store_memory=512 * 1024**2, log_to_driver=verbose_logs(),
                            **gpus)


def plan_or_reuse(cfg: BatchConfig, where: Path | StoreObject, fmt: str, old: Manifest | None, batch_id: str) -> CorpusPlan:
    """The corpus plan: the stored one when the corpus bytes are unchanged (a resume), else a new planning pass.

    ``old`` is a manifest of the current layout (one of an earlier layout is refused when it is read:
    :func:`batch.layout.read_manifest` with ``doing="resume"``).

    Raises:
        InputError: as :func:`batch.corpus.plan.plan_corpus`.
    """
    if old is not None and old.corpus.get("format") == fmt:
        fingerprint = quick_fingerprint(where, fmt, old.corpus)
        if fingerprint is not None and fingerprint == old.corpus_fingerprint:
            log.info("batch %s: corpus unchanged (%s); reusing its shard plan", batch_id, fingerprint[:19])
            plan = CorpusPlan.from_manifest(old, str(where))
            if isinstance(where, StoreObject):  # the same bytes under a new etag: reads are checked against the new one
                plan.reading = {**plan.reading, "object": where.expected}
            return plan
    t0 = time.monotonic()
    plan = plan_corpus(cfg.corpus, cfg.batch.shard_docs, cfg.batch.shard_target_bytes, where, cfg.classify.max_doc_bytes)
    log.info("planned %s: %d rows, %d distinct ids, %d shards in %.1f s", where, plan.input_rows, plan.distinct_ids,
             len(plan.shards), time.monotonic() - t0)
    return plan


@dataclass
class BatchRun:
    """One attempt of one batch, its run folder locked by this process.

    Attributes:
        options: the command's options.
        cfg: the batch config.
        corpus_path, corpus_format: where the corpus is (:func:`batch.corpus.plan.locate_corpus`).
        model: the resolved base model; adapter: the resolved adapter or ``None``.
        gate_record: the pilot-gate record for the manifest and summary.
        batch_id, run_dir: the run folder.
        t_start: ``time.monotonic()`` when the command started (wall time in the summary).
        engine_actor: PRIVATE (bench and tests): an actor class run in place of the vLLM engine actor.
        lease_ends_at: the lease end (set by :meth:`run` from the options).
        corpus_plan: the corpus already planned by the caller (the pilot plans it to check its count first),
            else planned (or reused) by :meth:`run`.
        labels: id -> expected label for the quality report (the pilot's labels file), else the corpus's
            ``corpus.label_column``.
        hooks: the caller's additions (:class:`RunHooks`), told each stage.
    """

    options: BatchOptions
    cfg: BatchConfig
    corpus_path: Path | StoreObject
    corpus_format: str
    model: ModelRef
    adapter: BatchAdapter | None
    gate_record: dict[str, Any]
    batch_id: str
    run_dir: Path
    t_start: float
    engine_actor: Any = None
    lease_ends_at: Any = None
    corpus_plan: CorpusPlan | None = None
    labels: dict[str, str] | None = None
    hooks: RunHooks | None = None
    uploader: ShardUploader | None = None
    owner: ExportOwner | None = None

    def _stage(self, name: str) -> None:
        if self.hooks is not None:
            self.hooks.stage(name)

    def run(self) -> dict[str, Any]:
        """Plan (or reuse the plan), run the shards without a file, merge, summarize, export and re-check.

        Returns:
            The summary written to ``summary.json``, with ``run_dir`` and ``export_dir`` added.

        Raises:
            InputError: a resume whose corpus, config, model, adapter or merged model changed.
            VerificationError: merged results that break the invariants, or an export that fails its re-check.
            EnvironmentCheckError: no space left in the run folder or the export destination (exit 6, naming the
                folder and its free space; :mod:`classify.runs.disk`).
        """
        state: dict[str, Any] = {}
        dest = export_dest(self.options.export_dir or self.cfg.batch.export_dir, self.batch_id)
        written = [self.run_dir] + ([dest.parent] if isinstance(dest, Path) else [])
        with full_disk_is_environment(written, f"batch {self.batch_id}", state):  # exit 6 naming the folder, not a traceback
            return self._run(state)

    def _run(self, state: dict[str, Any]) -> dict[str, Any]:
        self.lease_ends_at = lease_end(self.options.lots_config, self.options.lease_ends)
        dest = export_dest(self.options.export_dir or self.cfg.batch.export_dir, self.batch_id)
        check_export_root(dest)  # before any work: a bad --export-dir is found now, not at the end
        remove_stale_temporaries(self.run_dir, dest)  # a killed attempt's debris (this process holds the lock)
        self._stage("plan")
        old = mf.read_manifest(self.run_dir, "resume")  # an earlier layout is refused (EarlierRunFolder)
        corpus = self.corpus_plan or plan_or_reuse(self.cfg, self.corpus_path, self.corpus_format, old, self.batch_id)
        new = build_manifest(self.batch_id, self.cfg, corpus, self.model, adapter=self.adapter, gate=self.gate_record)
        manifest = new if old is None else self._resumable(old, new)
        log.info("batch %s: %d distinct ids (%d input rows) in %d shards, run folder %s",
                 self.batch_id, corpus.distinct_ids, corpus.input_rows, len(manifest.shards), self.run_dir)
        done = mf.scan_done(self.run_dir, manifest)
        pending = [s.index for s in manifest.shards if s.index not in done]
        if not pending and (self.run_dir / mf.SUMMARY).is_file() and export_complete(dest):
            return self._recheck_only(manifest, len(done), dest)
        export_root = self.options.export_dir or self.cfg.batch.export_dir
        finished_copy = not pending and storage.is_url(dest) and export_complete(dest)  # only re-checked: no writer
        if storage.is_url(dest):  # a bad value is refused now, not after the work; the user sees the limits
            limits, deadline_s = storage.store_limits(), storage.store_deadline_s()
            log.info("off the pod: each store request %g s x %d attempt(s) (DOCPILOT_STORE_TIMEOUT_S, "
                     "DOCPILOT_STORE_ATTEMPTS); once the work is done here the batch waits at most %g s in all for "
                     "the store (DOCPILOT_STORE_DEADLINE_S)", limits.timeout_s, limits.attempts, deadline_s)
        if export_root and storage.is_url(dest) and not finished_copy:  # one writer per export location
            self.owner = ExportOwner(str(dest), self.batch_id, self.run_dir, take_over=self.options.take_over_export)
            self.uploader = ShardUploader(self.run_dir, str(dest), len(manifest.shards), self.owner)
            self.uploader.claim(CLAIM_WAIT_S)  # refused here, before anything is written there
        attempt = {"started_at": utc_now(), "pid": os.getpid(), "host": socket.gethostname(),
                   "config": _config_file(self.options.config),
                   "pilot_gate": self.gate_record, "cpu_actors": self.cfg.batch.cpu_actors,
                   "lease_ends_at": self.lease_ends_at.isoformat() if self.lease_ends_at else None}
        manifest.add_attempt(attempt)
        mf.write_manifest(self.run_dir, manifest)
        if self.uploader is not None:
            self.uploader.start(sorted(done))  # in the background: the pool never waits for the store
        mirror = progress_mirror(export_root, self.batch_id) if self._mirrors() else None
        if mirror is not None:
            mirror.final_wait_s = MIRROR_FINAL_WAIT_S  # the rest is waited for under the store deadline (finish.py)
            if self.owner is not None:
                owner = self.owner
                mirror.gate = lambda: owner.held
        progress = Progress(self.run_dir, self.batch_id, total=corpus.distinct_ids, mirror=mirror,
                            offpod=self.uploader.lag if self.uploader else None)
        progress.start(done)
        log.info("batch %s: %d shards complete, %d to run", self.batch_id, len(done), len(pending))
        try:
            summary = self._run_and_merge(corpus, manifest, pending, progress, attempt)
            if storage.is_url(dest):  # done here: the copy off the pod within the store deadline (exit 9 past it)
                export = off_pod_within(lambda stage: self._finish_off_pod(dest, mirror, stage),
                                        batch_id=self.batch_id, run_dir=self.run_dir, dest=dest)
            else:
                export = export_batch(self.run_dir, dest, self.hooks)
            self.uploader = None
            attempt.update(exported_to=redact(export), export_verified_at=utc_now())
            mf.write_manifest(self.run_dir, manifest)  # `docpilot status`: "exported and verified", not only classified
        except Exception as err:
            stopped = isinstance(err, (Interrupted, OffPodPending))  # SIGTERM or the deadline: no more waiting
            if self.uploader is not None:  # what is complete still goes off the pod, for a while
                self.uploader.close(wait_s=0.0 if stopped else UPLOAD_WAIT_ON_FAILURE_S)
            if self.owner is not None and not isinstance(err, OffPodPending):  # pending: this pod still holds it
                _bounded(self.owner.release, STOP_STORE_WAIT_S if stopped else UPLOAD_WAIT_ON_FAILURE_S)
            if stopped and mirror is not None:
                mirror.final_wait_s = STOP_STORE_WAIT_S
            try:
                progress.fail(f"{type(err).__name__}: {err}")
                attempt.update(failed_at=utc_now(), error=f"{type(err).__name__}: {err}"[:2000])
                mf.write_manifest(self.run_dir, manifest)
            except OSError as unrecorded:  # the run folder is full too: say so, raise the first error
                state["unrecorded"] = f"writing {self.run_dir}: {unrecorded.strerror or unrecorded}"
                log.error("batch %s: the attempt's failure could not be recorded in %s: %s", self.batch_id, self.run_dir,
                          unrecorded)
            raise
        summary["run_dir"], summary["export_dir"] = str(self.run_dir), str(export)
        return summary

    def _recheck_only(self, manifest: Manifest, n_done: int, dest: storage.Dest) -> dict[str, Any]:
        """A batch complete here and in its export: re-check both, write nothing new; its summary, marked
        ``rechecked_only`` (the caller's lines: this_attempt is the last attempt's, not this call's)."""
        log.info("batch %s is already complete: %d shards; re-checking it, writing nothing", self.batch_id, n_done)
        self._merge(manifest, write=False)
        summary = json.loads((self.run_dir / mf.SUMMARY).read_text(encoding="utf-8"))
        summary["run_dir"], summary["export_dir"] = str(self.run_dir), str(export_batch(self.run_dir, dest, self.hooks))
        summary["rechecked_only"] = True
        if manifest.attempts and not any(a.get("export_verified_at") for a in manifest.attempts):  # an older run folder
            manifest.attempts[-1].update(exported_to=redact(dest), export_verified_at=utc_now())
            mf.write_manifest(self.run_dir, manifest)
        return summary

    def _finish_off_pod(self, dest: storage.Dest, mirror: Any, stage: Any) -> storage.Dest:
        """The copy off the pod of a batch done here: the shards still queued, the final export and its re-check,
        the owner record marked exported, the last progress mirror (run under :func:`batch.run.finish.off_pod_within`).

        Raises:
            InputError: the export location is another driver's (refused or taken over): nothing more is written.
            StoreUnreachable, VerificationError: as :func:`export_batch`.
        """
        reuse = None
        if self.uploader is not None:
            stage("copying the shards still queued")
            self.uploader.manifest_written()
            self.uploader.close(wait_s=None)
            self.uploader.raise_if_refused()
            reuse = self.uploader.copied
        if self.owner is not None and not self.owner.held:
            stage("claiming the export location")
            self.owner.claim()
        stage("writing the export and re-checking it")
        if self.owner is not None:
            self.owner.check()
            with self.owner.beating():  # a long export keeps its claim alive
                export = export_batch(self.run_dir, dest, self.hooks, reuse)
            self.owner.check()
        else:
            export = export_batch(self.run_dir, dest, self.hooks, reuse)
        if self.owner is not None:
            stage("marking the owner record exported")
            self.owner.finished()
        if mirror is not None:
            stage("mirroring the last progress.json")
            mirror.wait(None)
        return export

    def _resumable(self, old: Manifest, new: Manifest) -> Manifest:
        mf.check_resume(self.run_dir, old, new)  # a changed `model.adapter_mode` is a config change: refused there
        if (old.merged_model or {}).get("fingerprint") != (new.merged_model or {}).get("fingerprint"):
            raise InputError(f"batch {self.batch_id} cannot resume: the merged model changed: {old.merged_model} -> "
                             f"{new.merged_model}. Rerun with the original merge, or start a new batch id")
        return old

    def _merge(self, manifest: Manifest, write: bool = True) -> dict[str, Any]:
        counts, problems = merge_results(self.run_dir, manifest, write=write)  # results.jsonl + .parquet, streamed
        if problems:
            raise VerificationError(f"batch {self.batch_id}: merged results break the invariants: {'; '.join(problems)}")
        return counts

    def _run_and_merge(self, corpus: CorpusPlan, manifest: Manifest, pending: list[int], progress: Progress,
                       attempt: dict[str, Any]) -> dict[str, Any]:
        pool: dict[str, Any] = {"actors": 0}
        t_pool = time.monotonic()
        if pending:
            with _ray_local.interrupts():  # SIGTERM / Ctrl-C inside Ray's blocking calls -> Interrupted (exit 130)
                pool = self.run_shards(corpus, manifest, pending, progress)
        t_end = t_merge = time.monotonic()
        self._stage("merge")
        counts = self._merge(manifest)
        processed, tokens = progress.processed, progress.processed_tokens
        steady = progress.steady()
        pool_s = max(t_end - t_pool, 1e-9)
        adapter = self.adapter
        summary = counts
        summary.update({
            "batch_id": self.batch_id,
            "corpus": corpus.describe(),
            "model_fingerprint": self.model.fingerprint,
            "adapter": adapter.ref if adapter else None,
            **(adapter.describe() if adapter else {"adapter_mode": None, "merged_model": None}),
            "pilot_gate": self.gate_record,
            "this_attempt": {
                "processed_docs": processed, "processed_tokens": tokens,
                "docs_per_s": round(processed / pool_s, 3), "tokens_per_s": round(tokens / pool_s, 1),
                "steady_docs_per_s": round(steady[0], 3) if steady else None,  # after the first shard: sizes a lease
                "steady_tokens_per_s": round(steady[1], 1) if steady else None,
                "pool_wall_s": round(pool_s, 2), "wall_s": round(t_end - self.t_start, 2),
                "merge_s": round(time.monotonic() - t_merge, 2), **pool,
            },
            "attempts": len(manifest.attempts),
            "finished_at": utc_now(),
            "invariants": {"accepted_plus_rejected_eq_distinct_ids":
                           counts["accepted"] + counts["rejected"] == corpus.distinct_ids, "problems": []},
        })
        summary.update(self._quality(corpus))
        if self.hooks is not None:
            self.hooks.summarize(summary)
        write_json_atomic(self.run_dir / mf.SUMMARY, summary)
        attempt.update(finished_at=utc_now(), processed_docs=processed, wall_s=round(time.monotonic() - self.t_start, 2))
        mf.write_manifest(self.run_dir, manifest)
        progress.finish()
        return summary

    def _mirrors(self) -> bool:
        return self.hooks is None or self.hooks.mirror_progress

    def _quality(self, corpus: CorpusPlan) -> dict[str, Any]:
        """The quality report (:func:`batch.report.quality.batch_report`): PNGs and ``quality.md`` in the run folder.

        Returns:
            ``{"quality": report}``, plus ``accuracy`` on a labelled corpus and ``review`` (flags per
            category) when ``classify.review_below_score`` is set.
        """
        cfg = self.cfg
        if self.labels is not None:  # the pilot's labels file: a few rows, tallied in memory
            tally = tally_rows(read_jsonl(self.run_dir / mf.RESULTS), self.labels, cfg.classify.categories,
                               cfg.classify.review_below_score)
            report = write_report(self.run_dir, tally, self.batch_id, "Labels from the pilot set's labels.")
        else:
            report = batch_report(self.run_dir, corpus, label_column=cfg.corpus.label_column,
                                  categories=cfg.classify.categories,
                                  review_below_score=cfg.classify.review_below_score, run=self.batch_id)
        out: dict[str, Any] = {"quality": report}
        if "labelled" in report:
            out["accuracy"] = report["labelled"]["accuracy"]
        if "review" in report:
            out["review"] = report["review"]
        return out

    def run_shards(self, corpus: CorpusPlan, manifest: Manifest, pending: list[int], progress: Progress) -> dict[str, Any]:
        """Run the ``pending`` shards over engine actors; each completed shard is written and counted at once.

        Returns:
            ``{actors, actors_started, retries, errors, first_shard_s, enforce_eager, compiled}`` of the pool;
            ``enforce_eager`` is what the engines were given (:meth:`classify.config.sections.EngineConfig.for_workload`:
            ``false`` when ``"auto"`` turned torch.compile on for this attempt's documents per engine),
            ``compiled`` what the actors' engines reported (``["false"]``, ``["true"]``, ``["none"]`` for
            a stand-in engine; two values if actors differed).
        """
        cfg, run_dir, adapter = self.cfg, self.run_dir, self.adapter
        hooks = self.hooks or RunHooks()
        hooks.stage("start-pool")
        local_ray = _init_ray()
        try:
            if progress.previous_actors:
                reap(progress.previous_actors)  # engine processes an earlier, killed attempt left behind
            device = detect_device()
            tp = resolve_tensor_parallel(cfg.engine, cfg.model, device,
                                         cards_per_node=max(node_gpus().values(), default=0))
            n_actors, options = actor_options(cfg.batch.cpu_actors, cfg.batch.actor_num_cpus, cfg.batch.cpu_bind,
                                              device=device, tensor_parallel_size=tp)
            hooks.pool_starting(device, tp, cfg.batch.actor_place_timeout_s)  # the pilot checks a cluster here
            n_actors = min(n_actors, len(pending))
            options = options[:n_actors]
            grow = NodeWatch(options, device, tp, cfg.batch.actor_num_cpus)  # a lot added mid-run gets actors too
            cls = self.engine_actor if self.engine_actor is not None else actor_class()
            handle = adapter.handle() if adapter else None
            plan = {s.index: s for s in manifest.shards}
            shards = [(i, corpus.lazy(plan[i], cfg.classify.max_doc_bytes)) for i in pending]
            per_engine = -(-sum(plan[i].n_docs for i in pending) // max(n_actors, 1))
            engine_cfg = _engine_for_workload(cfg.engine, per_engine, lora=handle is not None)
            if engine_cfg.tensor_parallel_size != tp:  # "auto" resolved: every engine gets the number its actor holds
                engine_cfg = engine_cfg.model_copy(update={"tensor_parallel_size": tp})
            bar = progress_bar(progress.total, progress.done, f"batch {self.batch_id}", disable=self.options.no_progress)
            lease = LeaseWatch(self.lease_ends_at, run_dir, self.batch_id)
            lease.tick(progress, bar, force=True)
            on_event = _PoolEvents(self.batch_id, hooks, progress, bar)
            actors = on_event.actors

            def on_done(index: int, out: ShardOutput) -> None:
                hooks.stage("write")
                if out.ids_sha256 != plan[index].ids_sha256:  # the shard file as the actor wrote it: check its ids
                    raise VerificationError(f"shard {index}: the engine actor returned {out.n_docs} results whose ids "
                                            f"differ from the planned shard ({plan[index].n_docs} ids); nothing written")
                write_bytes_atomic(mf.shard_path(run_dir, index), out.body)
                if self.uploader is not None:
                    self.uploader.raise_if_refused()  # the export location is another driver's: stop here
                    self.uploader.shard_written(index)  # copied off the pod in the background
                progress.shard_counted(out.n_docs, out.accepted, out.rejected, out.n_tokens)
                hooks.shard_written(index, out.n_docs)
                hooks.stage("classify")
                lease.tick(progress, bar)
                if self.uploader is not None:
                    bar.set_postfix_str(offpod_short(self.uploader.lag(), progress.lease), refresh=False)
                bar.show_steady(progress.steady())
                if bar.n + out.n_docs < bar.total:
                    bar.update(out.n_docs)
                else:  # the last shard: one final line, drawn by close() (update() first would draw a second 100% one)
                    bar.n = bar.total
                    bar.close()

            actor_model, actor_fingerprint = (adapter.engine_model(cfg.model, manifest.model_fingerprint) if adapter
                                              else (cfg.model, manifest.model_fingerprint))
            deadlines = Deadlines(cfg.batch.shard_timeout_base_s, cfg.batch.shard_timeout_per_doc_s,
                                  cfg.batch.actor_start_timeout_s, cfg.batch.actor_place_timeout_s)
            hooks.stage("load-adapter" if handle is not None else "load-model")  # the engines start (LoRA: with slots)
            with logging_redirect(), closing_on_error(bar):  # stopped: the bar's line ends before the message
                stats = run_pool(lambda slot: cls.options(**options[slot]).remote(
                                     actor_model, engine_cfg, cfg.classify, handle, actor_fingerprint,
                                     temperature=adapter.temperature if adapter else None),  # merged mode: no handle carries T
                                 n_actors, shards, on_done, cfg.batch.max_shard_retries, on_event=on_event,
                                 deadlines=deadlines, grow=grow)
            lease.tick(progress, bar, force=True)
            bar.close()
            return {"actors": len(options), "actors_started": stats.actors_started, "retries": stats.retries,
                    "errors": stats.errors, "first_shard_s": stats.first_ready_s, "tensor_parallel_size": tp,
                    "enforce_eager": engine_cfg.enforce_eager,
                    "compiled": sorted({str(a.get("compiled")).lower() for a in actors.values()})}
        finally:
            _ray_local.stop(local_ray)  # a local Ray leaves no process behind; a joined cluster is left alone


class _PoolEvents:
    """The pool's events (:func:`batch.pool.scheduler.run_pool`'s ``on_event``) turned into ``progress.json``, the
    progress bar and the run hooks: an actor ready, a retry, a node that joined, the shards each actor holds."""

    def __init__(self, batch_id: str, hooks: Any, progress: Progress, bar: Any):
        self.batch_id, self.hooks, self.progress, self.bar = batch_id, hooks, progress, bar
        self.actors: dict[int, dict[str, Any]] = {}
        self.flights: dict[int, list[int]] = {}

    def __call__(self, name: str, detail: dict[str, Any]) -> None:
        if name == "actor-ready":
            if not self.actors:
                self.hooks.stage("classify")
            self.actors[detail["slot"]] = detail
            self.hooks.actor_ready(detail)
            self._publish()
            self.bar.set_postfix_str(f"{len(self.actors)} actor(s)")
        elif name == "retry":
            self.progress.update(last_error=detail["error"], retries=self.progress.retries + 1)
        elif name == "actors-added":
            log.info("batch %s: a node joined: %d engine actor(s) now", self.batch_id, detail["actors"])
            self.bar.set_postfix_str(f"{detail['actors']} actor(s), {detail['added']} added")
        elif name == "in-flight":
            self.flights.clear()
            self.flights.update(detail["in_flight"])
            self._publish()

    def _publish(self) -> None:
        for slot, entry in self.actors.items():  # which shards each started actor holds (progress.json)
            entry["shards"] = self.flights.get(slot, [])
        self.progress.update(actors=list(self.actors.values()))


def _engine_for_workload(engine: Any, per_engine: int, *, lora: bool) -> Any:
    """The engine section the actors get for ``per_engine`` documents each (:meth:`EngineConfig.for_workload`).

    ``"auto"`` compiles when each engine has enough documents; not under LoRA, where vLLM's CPU backend
    turns compilation off anyway (and accelerators' ``"auto"`` already compiles), and not without a C++
    compiler (a warning says so). Returns ``engine`` itself when nothing changes.
    """
    engine_cfg = engine.for_workload(per_engine) if not lora else engine
    if engine_cfg is not engine and cpp_compiler() is None:
        # "auto" stays auto: eager on CPU engines, compiled on accelerators (whose compile does not need one here)
        log.warning("engine: no C++ compiler ($CXX or g++) on %s for torch.compile: CPU engines stay eager "
                    "(`engine.enforce_eager: auto`); install one (`apt-get install g++`) for faster steps on a batch "
                    "this long", socket.gethostname())
        return engine
    if engine_cfg is not engine:
        log.info("engine: torch.compile on (`engine.enforce_eager: auto`, %d documents per engine >= %d): each "
                 "engine start takes a minute or two longer, every step after it is faster", per_engine,
                 COMPILE_MIN_DOCS_PER_ENGINE)
    return engine_cfg


def _config_file(config: str) -> str:
    """The config file as a resume hint names it (``docpilot status`` may run elsewhere): absolute, unless it is
    the default (:data:`classify.config.file.DEFAULT_CONFIG`)."""
    return DEFAULT_CONFIG if is_default_config(config) else str(Path(config).resolve())
