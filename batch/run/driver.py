"""``docpilot batch`` / ``make batch``: classify a corpus over Ray engine actors, resumable by manifest.

Order of work: read config and corpus, resolve the model (and adapter), check the pilot gate,
open or create ``runs/<batch-id>/`` (refusing a resume whose corpus, config, model or adapter
changed), run only the shards without a complete shard file, merge, summarize, export with
SHA256SUMS and re-check the copy (:class:`batch.run.attempt.BatchRun`). See ``docs/batch.md``.
"""

from __future__ import annotations

import argparse
import logging
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any

from filelock import FileLock, Timeout

from adapters.registry.registry import Registry
from batch.corpus.plan import corpus_settings_for, locate_corpus, require_id_column
from batch.layout import MANIFEST, read_manifest
from batch.run.adapter import resolve_adapter
from batch.run.attempt import BatchRun
from batch.run.export import check_export_root, export_dest
from batch.run.offpod import restore_run, resume_location
from batch.run.options import BatchOptions as BatchOptions  # the options' home; imported here by name
from batch.run.owner import ExportOwner
from batch.run.resume import corpus_to_name, resume_command
from classify.config.batch import BATCH_ID_RE, check_batch_id, load_batch_config  # noqa: F401 - BATCH_ID_RE: part of this module's API
from classify.documents.text import not_text_reason
from classify.errors import DocpilotError, InputError, Interrupted, OffPodPending
from classify.model.model import resolve_model, verify_model
from classify.paths import runs_dir
from classify.runs.detached import DetachPlan, record_exit
from classify.runs.gate import gate_key, pipeline_differences, pipeline_settings, require_pilot
from classify.runs.records import new_run_dir, signals_raise_interrupted, utc_now
from classify.runs.storage import as_dest
from classify.usercommand import user_command, user_flag

log = logging.getLogger("docpilot.batch")



def parse_args(argv: list[str]) -> BatchOptions:
    """Parse ``docpilot batch`` options (see ``--help``) into :class:`BatchOptions`.

    Raises:
        SystemExit: bad options (argparse prints the usage), or ``--help``.
    """
    p = argparse.ArgumentParser(prog="docpilot batch", description="Classify a corpus over Ray engine actors, resumable by batch id.")
    p.add_argument("--config", default="config/docpilot.json", help="batch config JSON (default: %(default)s)")
    p.add_argument("--corpus", help="corpus file or folder (replaces corpus.path)")
    p.add_argument("--batch-id", help="run folder name under runs/; an existing one is resumed")
    p.add_argument("--adapter", help="LoRA adapter from the registry, name@version or name@latest")
    p.add_argument("--export-dir", help="parent of the export copy, a folder or an object-storage URL such as "
                                        "s3://bucket/exports (replaces batch.export_dir)")
    p.add_argument("--cpu-actors", type=int, help="engine actors on a CPU-only cluster (replaces batch.cpu_actors)")
    p.add_argument("--skip-pilot-gate", action="store_true",
                   help="run although this model/adapter/config has not passed a pilot (logged and recorded)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar (progress.json is still written)")
    p.add_argument("--lease-ends", help="when the lot's lease ends (ISO 8601 with timezone); the progress line says "
                                        "whether the rest of the batch and its export fit (default: lease_ends_at "
                                        "of --lots-config)")
    p.add_argument("--lots-config", default="config/lots.json", help="lots config holding lease_ends_at (default: %(default)s)")
    p.add_argument("--detach", action="store_true",
                   help="run in its own session, detached from this terminal (a dropped SSH connection does not stop "
                        "it); prints the batch id, the log and 'docpilot status BATCH --follow'")
    p.add_argument("--stop-when-done", action="store_true",
                   help="with --detach: when the batch succeeded, wrap up to the export location (or --wrap-up-to) and "
                        "run the lots config's lease.stop_command if every copy was re-checked")
    p.add_argument("--wrap-up-to", help="destination of the --stop-when-done wrap-up (default: the export location)")
    p.add_argument("--resume-from", metavar="EXPORT/BATCH_ID",
                   help="continue a batch on this machine from its off-pod copy, <export root>/<batch-id> (e.g. "
                        "s3://bucket/exports/<batch-id>): the copied shards are verified and only the missing ids run; "
                        "the export location becomes <export root>")
    p.add_argument("--take-over-export", action="store_true",
                   help="take the export location over from the driver that owns it when that owner's heartbeat is "
                        "stale (its pod is gone); a live owner is never taken over")
    return resume_options(BatchOptions(**vars(p.parse_args(argv))))


def resume_options(options: BatchOptions) -> BatchOptions:
    """Fill in the batch id and export location a ``--resume-from <export root>/<batch-id>`` implies.

    Returns:
        ``options`` unchanged without ``resume_from``; else with ``batch_id`` and ``export_dir`` set from it.

    Raises:
        InputError: ``resume_from`` is not ``<URL>/<batch-id>``, or ``--batch-id`` / ``--export-dir`` name another
            batch or location (the copy would be split in two).
    """
    if not options.resume_from:
        return options
    root, batch_id = resume_location(options.resume_from)
    check_batch_id(batch_id)
    if options.batch_id not in (None, batch_id):
        raise InputError(f"--batch-id {options.batch_id} differs from the batch of --resume-from {options.resume_from} "
                         f"({batch_id}); give one of them")
    if options.export_dir is not None and as_dest(options.export_dir) != as_dest(root):
        raise InputError(f"--export-dir {options.export_dir} differs from the export location of --resume-from "
                         f"({root}); the resumed batch keeps copying to {root}: leave --export-dir out")
    return options.model_copy(update={"batch_id": batch_id, "export_dir": root})


def warn_pipeline(pilot: dict[str, Any], cfg: Any, adapter_mode: str | None) -> list[str]:
    """Say plainly, before the batch starts, where its pipeline settings differ from the ones its pilot ran with.

    The answers are the same (the gate key covers what decides them); what the pilot did not prove is
    this pipeline: another actor count, binding or engine section can fail where the pilot's did not.

    Args:
        pilot: the gate's latest pilot record (its ``pipeline`` block, :func:`classify.runs.gate.pipeline_settings`).
        cfg: the batch config.
        adapter_mode: the batch's adapter mode, ``None`` without adapter.

    Returns:
        The differences (also logged as one warning, once); empty when they agree.
    """
    diffs = pipeline_differences(pilot.get("pipeline"), pipeline_settings(cfg.engine, cfg.batch, adapter_mode))
    if diffs:
        line = (f"this batch runs another pipeline than pilot {pilot.get('run_id')} proved ({'; '.join(diffs)}); "
                "the answers are the same, but run `make pilot` with these settings to prove this pipeline too")
        log.warning("%s", line)
    return diffs


def _open_run(batch_id: str | None) -> tuple[str, Path]:
    root = runs_dir()
    if batch_id is None:
        return new_run_dir("batch", root)
    check_batch_id(batch_id)
    run_dir = root / batch_id
    run_dir.mkdir(parents=True, exist_ok=True)
    return batch_id, run_dir


def run_batch(options: BatchOptions, *, _engine_actor: Any = None) -> dict[str, Any]:
    """Run or resume one batch (the body of :func:`main`).

    Args:
        options: the command's options (:func:`parse_args`, or built directly).
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
    check_batch_id(options.batch_id)
    cfg, corpus_path, corpus_format, model = _checked_inputs(options)
    model = verify_model(model)  # re-hashed: what runs is what was verified
    adapter = resolve_adapter(options.adapter, model, cfg.engine, cfg.model)
    gate = _gate(options, cfg, model, (adapter.ref, adapter.sha256, adapter.mode) if adapter else None)
    gate_record = {"key": gate["key"], "passed": gate["passed"], "override": gate["override"],
                   "pilot_run_id": (gate["pilot"] or {}).get("run_id"), "checked_at": utc_now()}
    if gate["pilot"] is not None:
        gate_record["pipeline_differences"] = warn_pipeline(gate["pilot"], cfg, adapter.mode if adapter else None)
    batch_id, run_dir = _open_run(options.batch_id)
    lock = _driver_lock(batch_id, run_dir, user_command(f"docpilot status {batch_id}"))
    finished = False
    try:
        if options.resume_from:
            _restore(options.resume_from, run_dir, options.take_over_export)
        with signals_raise_interrupted():  # SIGTERM / Ctrl-C: Ray is shut down, the attempt recorded, exit 130
            summary = BatchRun(options, cfg, corpus_path, corpus_format, model, adapter, gate_record, batch_id, run_dir,
                               t_start, _engine_actor).run()
        finished = True
        return summary
    finally:
        if not finished:
            _drop_empty_run(run_dir)
        lock.release()


def _checked_inputs(options: BatchOptions) -> tuple[Any, Any, str, Any]:
    """The config (with the command's overrides), the corpus located and checked, and the base model resolved.

    Returns:
        ``(cfg, corpus_path, corpus_format, model)``; the model is not re-hashed here (:func:`verify_model`).

    Raises:
        ConfigError, InputError, EngineError: as :func:`load_batch_config`, :func:`locate_corpus`,
            :func:`require_id_column` and :func:`resolve_model`.
    """
    overrides: dict[str, Any] = {}
    if options.cpu_actors is not None:
        overrides["batch.cpu_actors"] = options.cpu_actors
    cfg = load_batch_config(options.config, overrides)
    cfg = cfg.model_copy(update={"corpus": corpus_settings_for(cfg.corpus, options.corpus)})  # its own ids (corpus_settings_for)
    corpus_path, corpus_format = locate_corpus(cfg.corpus, options.corpus)  # fail early; planned once the run is locked
    require_id_column(cfg.corpus, corpus_path, corpus_format)  # no silent row-number ids for a named id column
    return cfg, corpus_path, corpus_format, resolve_model(cfg.model)


def _gate(options: BatchOptions, cfg: Any, model: Any, adapter: tuple[str, str, str] | None) -> dict[str, Any]:
    """The pilot gate for this base model, adapter (``(ref, content sha256, mode)``, ``None`` without one) and config.

    Returns:
        :func:`classify.runs.gate.require_pilot`'s answer with the gate ``key`` added.

    Raises:
        PilotGateError: never piloted, or the latest pilot failed, and no ``--skip-pilot-gate``.
    """
    ref, sha256, mode = adapter or (None, None, None)
    what = (f"base model {cfg.model.base_model} ({model.fingerprint[:19]}) + "
            f"{f'adapter {ref} ({mode} mode)' if ref else 'no adapter'}")
    key = gate_key(model.fingerprint, cfg.model, cfg.classify, sha256, mode)
    return {**require_pilot(key, what, override=options.skip_pilot_gate), "key": key}


def check_start(options: BatchOptions) -> None:
    """Every check of a batch's start that needs no engine, as the foreground start makes them, for ``--detach``.

    Config, corpus (present, a regular file or folder, readable, its id column), the export location (a local one is
    written to and removed; :func:`batch.run.export.check_export_root`), the adapter (known to the registry, its
    hashes and its fit with the base model and the engine's LoRA settings), and the pilot gate. What needs the engine
    or the whole corpus (the weights re-hashed, a merged model built, the corpus planned) is left to the detached run.

    Args:
        options: the batch's options with its ``batch_id`` set.

    Raises:
        ConfigError, InputError, EngineError, AdapterError, PilotGateError, EnvironmentCheckError: the first check
            that fails, with the exit code and message the foreground start gives.
    """
    cfg, corpus_path, _, model = _checked_inputs(options)
    _check_readable(corpus_path)
    check_export_root(export_dest(options.export_dir or cfg.batch.export_dir, str(options.batch_id)))
    resolved = None
    if options.adapter is not None:
        resolved = Registry().resolve(options.adapter, base_fingerprint=model.fingerprint, engine=cfg.engine,
                                      base_model_path=model.path)
    _gate(options, cfg, model, (resolved.ref, resolved.sha256, cfg.model.adapter_mode) if resolved else None)


def _check_readable(where: Any) -> None:
    """Open a local corpus file (read one byte) or list a corpus folder; a store object was read by its locator.

    Raises:
        InputError: the OS refuses (no permission, an I/O error), naming the path and its error.
    """
    if not isinstance(where, Path):
        return
    try:
        if where.is_dir():
            next(os.scandir(where), None)
        else:
            with where.open("rb") as fh:
                fh.read(1)
    except OSError as err:
        raise InputError(f"corpus {where} cannot be read: {err.strerror or err}") from None


def _restore(resume_from: str, run_dir: Path, take_over: bool = False) -> None:
    """Rebuild the new run folder ``run_dir`` from the off-pod copy ``resume_from`` (:func:`batch.run.offpod.restore_run`).

    Raises:
        InputError: as :func:`batch.run.offpod.restore_run`, or the copy is owned by another driver
            (:meth:`batch.run.owner.ExportOwner.check_claimable`: checked first, so nothing is downloaded).
        VerificationError: as :func:`batch.run.offpod.restore_run`.
    """
    ExportOwner(resume_from.rstrip("/"), run_dir.name, run_dir, take_over=take_over).check_claimable()
    t0 = time.monotonic()
    manifest, n = restore_run(resume_from.rstrip("/"), run_dir)
    log.info("batch %s: rebuilt %s from %s: %d of %d shards verified (sha256 and ids) in %.1f s; the rest runs here",
             manifest.batch_id, run_dir, resume_from.split("?", 1)[0], n, len(manifest.shards), time.monotonic() - t0)


def _drop_empty_run(run_dir: Path) -> None:
    """Remove a run folder that a failed attempt left holding nothing but its lock file (the corpus could not
    be planned, so no manifest was written): ``docpilot status`` and a rerun then see no such batch."""
    lock_file = run_dir / ".driver.lock"
    try:
        if any(p.name != lock_file.name for p in run_dir.iterdir()):
            return
        lock_file.unlink(missing_ok=True)  # still held by this process: no other driver can be inside
        run_dir.rmdir()
    except OSError:
        pass  # something appeared meanwhile, or the folder is not ours to remove: leave it


def _resume_command(options: BatchOptions) -> str:
    """The command that resumes this batch (:func:`batch.run.resume.resume_command`): its id, its config file unless
    it is the default, its corpus unless it is the config's own, its adapter, and the pilot-gate override if given."""
    corpus_cfg = None
    if options.corpus is not None:
        try:
            corpus_cfg = load_batch_config(options.config, {}).corpus
        except Exception as err:  # noqa: BLE001 - a hint only: the corpus is then named
            log.debug("cannot read %s for the resume hint: %s", options.config, err)
    return resume_command(options.batch_id, corpus_to_name(options.corpus, corpus_cfg), options.adapter,
                          options.skip_pilot_gate, options.config)


def _say_if_new(batch_id: str) -> None:
    """Log that a named batch id has no run under the runs folder yet (a typo'd id would otherwise start a whole
    new batch without a word); a new batch is started with it, as tests and users name new batches this way."""
    root = runs_dir()
    if not (root / batch_id / MANIFEST).is_file():
        log.info("no batch '%s' under %s: starting a new batch with that id", batch_id, root)


def _new_batch_id() -> str:
    """A new batch id, ``<UTC time>-batch-<8 hex>`` (the form of :func:`classify.runs.records.new_run_dir`), known
    before the run folder exists, so that a stopped batch's message can name the id that resumes it."""
    import datetime as dt
    import uuid

    return f"{dt.datetime.now(dt.UTC):%Y%m%dT%H%M%SZ}-batch-{uuid.uuid4().hex[:8]}"


def _driver_lock(batch_id: str, run_dir: Path, watch: str) -> FileLock:
    """Take the run folder's driver lock (``.driver.lock``) without waiting; the caller releases it.

    Args:
        batch_id: the batch, for the message.
        run_dir: its run folder.
        watch: the command the message offers to watch the running batch with.

    Raises:
        InputError: another driver holds the folder (the batch is already running).
    """
    lock = FileLock(str(run_dir / ".driver.lock"))
    try:
        lock.acquire(timeout=0)
    except Timeout:
        raise InputError(f"batch {batch_id} is already running (another driver holds {run_dir}/.driver.lock); "
                         f"watch it with `{watch}`") from None
    return lock


def attempt_recorded_by(run_dir: Path, pid: int, host: str) -> bool:
    """Whether the process ``pid`` on ``host`` recorded the last attempt in ``run_dir``'s manifest.

    A resume refused before its attempt began (a changed config or corpus, an earlier layout) and the re-check of a
    complete batch record none: the folder keeps the status of the attempt that last ran in it (a foreground batch's
    own check, :func:`_record_foreground_exit`, and a detached batch's supervisor's, :mod:`docpilot.detach`).

    Returns:
        ``False`` also for a folder without a readable manifest (damaged, of an earlier layout, not planned yet).
    """
    try:
        manifest = read_manifest(run_dir)
    except (InputError, OSError):  # damaged, of an earlier layout (EarlierRunFolder) or unreadable: not this run's
        return False
    last = manifest.attempts[-1] if manifest is not None and manifest.attempts else {}
    return last.get("pid") == pid and last.get("host") == host


def _record_foreground_exit(batch_id: str, code: int) -> None:
    """Write the run folder's ``exit.json`` for ``docpilot status --follow`` when this process ran an attempt there
    (:func:`attempt_recorded_by`), unless another driver holds the folder (a batch refused as "already running"
    must not write into the running one's folder)."""
    run_dir = runs_dir() / batch_id
    if not run_dir.is_dir() or not attempt_recorded_by(run_dir, os.getpid(), socket.gethostname()):
        return  # nothing was started (dropped, refused before the folder existed, or before its attempt began)
    lock = FileLock(str(run_dir / ".driver.lock"))
    try:
        lock.acquire(timeout=0)
    except Timeout:
        return
    try:
        record_exit(run_dir, code, detached=False)
    except OSError as err:
        log.warning("could not record the exit status in %s: %s", run_dir, err)
    finally:
        lock.release()


def prepare_detach(argv: list[str]) -> DetachPlan:
    """``docpilot batch --detach``'s share: its options checked; when the front door calls :attr:`DetachPlan.open_run`
    (after the lease's stop command passed) the start's checks that need no engine run (:func:`check_start`), then
    the run folder is made (or the given batch opened).

    Args:
        argv: ``docpilot batch``'s arguments as given.

    Returns:
        The plan the front door starts (:mod:`docpilot.detach`); the child runs with ``--batch-id`` and
        ``--no-progress`` added (its log is a file: ``docpilot status --follow`` draws the bar).

    Raises:
        InputError: ``--stop-when-done`` without ``--detach``, or with nowhere to copy to; a bad ``--batch-id``;
            the batch is already running.
        ConfigError, InputError, EngineError, AdapterError, PilotGateError, EnvironmentCheckError: a check of the
            start that needs no engine failed (:func:`check_start`): nothing is detached, no run folder is made.
    """
    args = parse_args(argv)
    if not args.detach:
        raise InputError("--stop-when-done needs --detach (a foreground batch ends with its terminal); "
                         "after a foreground batch run `docpilot wrap-up --to DEST`")
    wrap_up_to = args.wrap_up_to
    if args.stop_when_done and not wrap_up_to:
        wrap_up_to = args.export_dir or load_batch_config(args.config).batch.export_dir
        if not wrap_up_to:
            raise InputError("--stop-when-done needs somewhere off the pod to copy to first: set `batch.export_dir`, "
                             "--export-dir or --wrap-up-to (a folder or s3://...); the lease is never stopped before "
                             "a verified copy")
    check_batch_id(args.batch_id)
    batch_id = args.batch_id or _new_batch_id()

    def open_run() -> tuple[str, Path, tuple[str, ...]]:
        check_start(args.model_copy(update={"batch_id": batch_id}))  # refused here, not only in the detached run's log
        run_dir = _open_run(batch_id)[1]
        if args.batch_id is not None:
            _driver_lock(batch_id, run_dir, user_command(f"docpilot status {batch_id} --follow")).release()
        added = ("--batch-id", batch_id) if args.batch_id is None else ()
        return batch_id, run_dir, added + (() if "--no-progress" in argv else ("--no-progress",))

    return DetachPlan("batch", args.stop_when_done, wrap_up_to, args.lots_config, open_run,
                      after_exit="batch.run.driver:attempt_recorded_by")


def _all_rejected_as_not_text(summary: dict[str, Any]) -> str | None:
    """The error of a batch whose every row was rejected because its bytes are not text (a compressed or binary
    corpus read as text), or ``None``: such a batch never exits 0."""
    reasons = summary.get("reject_reasons") or {}
    if not summary.get("total") or summary.get("accepted") or not reasons:
        return None
    if not all(not_text_reason(r) for r in reasons):
        return None
    named = ", ".join(f"{r} ({n})" for r, n in list(reasons.items())[:3])
    return (f"batch {summary.get('batch_id')}: every one of its {summary['total']} rows was rejected because its bytes "
            f"are not text ({named}); nothing was classified. Is the corpus compressed or binary? Decompress it "
            f"(`gunzip -k`) or give the text file; the rows are in {summary.get('run_dir')}/results.jsonl")


def main(argv: list[str] | None = None) -> int:
    """``docpilot batch``: run or resume a batch; prints where the results are.

    Args:
        argv: command-line arguments (default ``sys.argv[1:]``).

    Returns:
        0 when the batch completed, was exported and re-checked (never when every row was rejected for bytes that
        are not text: :class:`InputError`, exit 3); with ``--detach``, 0 once the detached batch
        started (its own status goes to ``exit.json`` in the run folder).

    Raises:
        DocpilotError: any known failure (mapped to an exit code by :mod:`docpilot.cli`).
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    if args.detach or args.stop_when_done:
        raise InputError(f"--detach and --stop-when-done are taken by the docpilot command: run "
                         f"`{user_command('docpilot batch --detach ...')}`")
    if args.batch_id is not None and not args.resume_from:
        check_batch_id(args.batch_id)  # refused before any line says it starts or records anything (``../x``)
    if args.skip_pilot_gate:
        log.warning("!!! %s given: the pilot gate is OVERRIDDEN for this batch; recorded in manifest.json",
                    user_flag("--skip-pilot-gate"))
    if args.batch_id is not None and not args.resume_from:
        _say_if_new(args.batch_id)
    args = args.model_copy(update={"batch_id": args.batch_id or _new_batch_id()})
    try:
        summary = run_batch(args)
    except Interrupted as err:
        _record_foreground_exit(args.batch_id, err.exit_code)
        if str(err).startswith("stopped by SIGHUP"):
            raise Interrupted(
                f"{err} (the terminal or SSH connection that started the batch closed); complete shards are kept. "
                f"Resume it detached, so that a dropped connection no longer stops it: "
                f"`{user_command(f'docpilot batch --batch-id {args.batch_id} --detach ...')}`, then "
                f"`{user_command(f'docpilot status {args.batch_id} --follow')}`") from err
        raise Interrupted(f"{err}; batch {args.batch_id}: complete shards are kept. Resume it with:\n"
                          f"  {_resume_command(args)}") from err
    except OffPodPending as err:
        _record_foreground_exit(args.batch_id, err.exit_code)
        raise OffPodPending(f"{err}. Finish the copy later (it re-checks what is there and sends the rest) with:\n"
                            f"  {_resume_command(args)}") from err
    except DocpilotError as err:
        _record_foreground_exit(args.batch_id, err.exit_code)
        raise
    except Exception:
        _record_foreground_exit(args.batch_id, 1)  # an unexpected error: `docpilot` exits 1 with its traceback
        raise
    not_text = _all_rejected_as_not_text(summary)
    _record_foreground_exit(args.batch_id, InputError.exit_code if not_text else 0)
    if not_text:
        raise InputError(not_text)
    t = summary["this_attempt"]
    counts = (f"batch {summary['batch_id']}: {summary['total']} ids = {summary['accepted']} accepted + "
              f"{summary['rejected']} rejected ({summary['input_rows']} input rows, {summary['duplicate_rows']} duplicate rows)")
    if summary.get("rechecked_only"):
        print(f"{counts}; complete already: re-checked, nothing run (the last attempt: {t['processed_docs']} docs at "
              f"{t['docs_per_s']} docs/s)")
    else:
        print(f"{counts}; this attempt {t['processed_docs']} docs at {t['docs_per_s']} docs/s in {t['wall_s']} s "
              "(engine start included)")
        if t.get("steady_docs_per_s"):
            print(f"steady rate after the first shard: {t['steady_docs_per_s']} docs/s, {t['steady_tokens_per_s']} "
                  "tokens/s (the rate to size a lease by)")
    print(f"results: {summary['run_dir']}/results.jsonl  summary: {summary['run_dir']}/summary.json")
    if summary.get("accuracy") is not None:
        lab = summary["quality"]["labelled"]
        print(f"accuracy against the corpus labels: {100 * summary['accuracy']:.1f}% ({lab['correct']}/{lab['documents']})")
    if summary.get("quality"):
        print(f"quality report: {summary['run_dir']}/quality.md ({', '.join(summary['quality']['files'][:-1])})")
    print(f"export (SHA256SUMS verified): {summary['export_dir']}")
    return 0
