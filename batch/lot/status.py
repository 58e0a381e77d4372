"""``docpilot status BATCH`` / ``make status BATCH=<id>``: a batch's progress, read from its run folder.

Works from any shell while the batch runs (it only reads ``progress.json``, ``manifest.json``
and the shard files) and after it ended (``summary.json``). ``--follow`` draws the live bar until the
batch ends and exits with its status (``exit.json``, :mod:`docpilot.detach`); ``--from LOCATION`` reads
the progress mirrored to the export location (:mod:`batch.run.mirror`) from any machine.
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import json
import logging
import sys
import time
from pathlib import Path
from typing import Any

from batch import layout as mf
from batch.lease.clock import DEFAULT_UPLOAD_MIB_PER_S, eta_text, lease_check, lease_end
from batch.run.export import export_partial
from batch.run.mirror import MIRROR_SUFFIX
from batch.run.offpod import LEDGER, read_remote_ledger
from batch.run.progress import progress_bar
from batch.run.resume import corpus_to_name, resume_command
from batch.runfiles import EarlierRunFolder, ProgressFile
from classify.config.batch import BATCH_ID_RE
from classify.errors import InputError, StoreUnreachable
from classify.paths import runs_dir
from classify.runs import storage
from classify.runs.detached import OLD_RECORD_NOTE, log_path, pid_alive, read_detach, read_exit, record_is_old
from classify.runs.export import SHA256SUMS, compare_sha256, read_sums
from classify.usercommand import user_command, user_flag

log = logging.getLogger(__name__)


def _driver_alive(progress: ProgressFile) -> bool | None:
    """Whether the driver process is still running (``None`` when it ran on another host): :func:`classify.runs.detached.pid_alive`."""
    return pid_alive(progress.pid, progress.host, progress.pid_started, progress.boot_id, progress.updated_at)


def batch_status(batch_id: str, root: Path | None = None) -> dict[str, Any]:
    """Collect a batch's progress from its run folder.

    Args:
        batch_id: the run folder name under ``runs/``.
        root: parent of run folders (default :func:`classify.paths.runs_dir`).

    Returns:
        ``{batch_id, state, done, total, accepted, rejected, docs_per_s, eta_s, last_error, shards_done, shards,
        classified, export}``. ``done`` counts ids in complete shard files, so it is right even after a crash.
        ``classified``: the results are merged (``summary.json``); ``export``: ``{to, verified_at}`` of the
        export an attempt copied and re-checked, or ``None``. ``state`` is ``done`` only with both.

    Raises:
        InputError: no such batch, or a folder that is not a batch run.
        EarlierRunFolder: a run folder made by an earlier docpilot (:func:`batch.runfiles.earlier_run_folder`).
    """
    if not BATCH_ID_RE.match(batch_id):  # the batch-id rule of `docpilot batch`
        raise InputError(f"batch id must be a run folder name (letters, digits, '.', '_', '-'), got {batch_id!r}")
    run_dir = (root or runs_dir()) / batch_id
    manifest = mf.read_manifest(run_dir) if run_dir.is_dir() else None
    if manifest is None:
        known = batch_ids(root)
        shown = (f"the {len(known[-5:])} newest of {len(known)}: {', '.join(known[-5:])}; "
                 f"`{user_command('docpilot status')}` lists them all" if len(known) > 5 else ", ".join(known) or "none")
        if run_dir.is_dir():
            raise InputError(f"{run_dir} holds no {mf.MANIFEST}: not a batch (a pilot, training job or plan folder), "
                             f"or a batch refused before it planned (batches there: {shown})")
        raise InputError(f"no batch {batch_id!r} under {run_dir.parent} (batches there: {shown})")
    progress = ProgressFile.read(run_dir / mf.PROGRESS)
    sizes = {s.index: s.n_docs for s in manifest.shards}
    complete = mf.complete_shard_indexes(run_dir, manifest)
    state = progress.state
    if state == "running" and _driver_alive(progress) is False:
        old = f"; {OLD_RECORD_NOTE}" if record_is_old(progress.pid_started, progress.pid) else ""
        state = f"interrupted (driver gone; resume it with the command under `resume`{old})"
    export = next(({"to": a.get("exported_to"), "verified_at": a["export_verified_at"]}
                   for a in reversed(manifest.attempts) if a.get("export_verified_at")), None)
    classified = (run_dir / mf.SUMMARY).is_file()
    if classified and state != "running":  # "done" only once a verified export exists
        state = "done" if export is not None else ("classified, not exported: the results are merged but no verified "
                                                   "export exists yet; rerun the same command to export and re-check it")
    return {
        "batch_id": batch_id, "run_dir": str(run_dir), "created_at": manifest.created_at, "state": state,
        "done": sum(sizes[i] for i in complete), "total": manifest.corpus.get("distinct_ids"),
        "accepted": progress.accepted, "rejected": progress.rejected,
        "docs_per_s": progress.docs_per_s, "eta_s": progress.eta_s,
        "steady_docs_per_s": progress.steady_docs_per_s, "steady_tokens_per_s": progress.steady_tokens_per_s,
        "last_error": progress.last_error or (manifest.attempts[-1].get("error") if manifest.attempts else None),
        "shards_done": len(complete), "shards": len(sizes), "retries": progress.retries,
        "updated_at": progress.updated_at, "skip_pilot_gate": manifest.pilot_gate.get("override"),
        "classified": classified, "export": export,
        "resume": _resume(batch_id, manifest) if not classified and state != "running" else None,
    }


def _resume(batch_id: str, manifest: Any) -> str:
    """The command that resumes a stopped batch (:func:`batch.run.resume.resume_command`), from its manifest."""
    corpus = corpus_to_name(manifest.corpus.get("path"), (manifest.full_config or {}).get("corpus"))
    config = next((a["config"] for a in reversed(manifest.attempts or []) if a.get("config")), None)
    return resume_command(batch_id, corpus, manifest.adapter,
                          bool((manifest.pilot_gate or {}).get("override")), config)


def batch_ids(root: Path | None = None) -> list[str]:
    """The batch ids under the runs folder, oldest first, as :func:`list_batches` orders them, from each manifest's
    ``created_at`` alone (no status is worked out: what an unknown id's message names)."""
    root = root or runs_dir()
    found = []
    for run_dir in root.glob("*"):
        if "-pilot-" in run_dir.name or not (run_dir / mf.MANIFEST).is_file():
            continue
        try:
            created = json.loads((run_dir / mf.MANIFEST).read_text(encoding="utf-8")).get("created_at") or ""
        except (OSError, ValueError, AttributeError):
            created = ""
        found.append((str(created), run_dir.name))
    return [name for _, name in sorted(found)]


def list_batches(root: Path | None = None) -> list[dict[str, Any]]:
    """The batches under the runs folder (pilots left out), oldest first (by the manifest's ``created_at``; a batch id
    is a name the user may choose, so its order says nothing): what ``docpilot status`` without an id lists.

    Args:
        root: parent of run folders (default :func:`classify.paths.runs_dir`).

    Returns:
        One :func:`batch_status` dict per run folder holding a ``manifest.json`` (``{"batch_id", "state":
        "unreadable: ..."}`` for a folder it cannot read).
    """
    root = root or runs_dir()
    out = []
    for run_dir in sorted(p for p in root.glob("*") if (p / mf.MANIFEST).is_file() and "-pilot-" not in p.name):
        try:
            out.append(batch_status(run_dir.name, root))
        except (InputError, EarlierRunFolder, OSError, ValueError) as err:
            out.append({"batch_id": run_dir.name, "state": f"unreadable: {err}", "done": None, "total": None})
    return sorted(out, key=lambda st: (st.get("created_at") or "", st["batch_id"]))


def _print_batches(root: Path) -> int:
    batches = list_batches(root)
    if not batches:
        print(f"no batches under {root} yet: start one with `{user_command('docpilot batch')}`")
        return 0
    print(f"batches under {root} (oldest first):")
    for st in batches:
        counts = f"{st['done']}/{st['total']} ids" if st.get("total") is not None else "-"
        print(f"  {st['batch_id']}  {counts}  {st['state']}")
    print(f"one batch in detail: `{user_command('docpilot status ' + batches[-1]['batch_id'])}`")
    return 0


def remote_status(location: str) -> dict[str, Any]:
    """A batch's last mirrored progress, read from its export location (any machine, the pod gone or not).

    Looks, in order, at ``location`` itself when it names a ``.json`` file, at the running batch's mirror
    ``<location>.progress.json`` (:mod:`batch.run.mirror`), then at the ``progress.json`` inside a complete
    export copy ``<location>/`` (which also says the copy exists).

    Args:
        location: ``<export root>/<batch-id>`` (folder or URL such as ``s3://bucket/exports/<batch-id>``),
            or the mirror file itself.

    Returns:
        ``{batch_id, state, done, total, accepted, rejected, docs_per_s, eta_s, lease, updated_at, age_s, source,
        exported}``; ``age_s`` is how old the record is (seconds), ``exported`` whether a complete export copy
        (its ``SHA256SUMS``) is there.

    Raises:
        InputError: nothing readable there (names every place looked at).
        StoreUnreachable: the object store did not answer within :func:`classify.runs.storage.store_limits` (exit 6).
    """
    dest = storage.as_dest(location)
    text = str(location).rstrip("/")
    candidates = ([dest] if text.endswith(".json") else
                  [storage.as_dest(text + MIRROR_SUFFIX), storage.join(dest, mf.PROGRESS)])
    found: tuple[Any, bytes] | None = None
    errors: list[str] = []
    for target in candidates:
        try:
            if isinstance(target, Path):
                found = (target, target.read_bytes())
            else:
                fs, path = storage.filesystem(target)
                fs.invalidate_cache()
                with storage.store_call("read", target):  # a stalled store: StoreUnreachable (an OSError) in time
                    found = (target, fs.cat_file(path))
            break
        except FileNotFoundError:
            errors.append(f"{target}: not there")
        except StoreUnreachable:
            raise  # the same store holds every candidate: one outage is one message, not a wait per candidate
        except (OSError, ImportError, ValueError) as err:
            errors.append(f"{target}: {type(err).__name__}: {err}")
    if found is None:
        raise InputError(f"no mirrored progress at {location} ({'; '.join(errors)}); give `<export root>/<batch-id>`, "
                         "the export location the batch ran with (`batch.export_dir` / --export-dir) plus its id")
    source, data = found
    try:
        progress = ProgressFile.model_validate(json.loads(data.decode("utf-8")))
    except ValueError as err:
        raise InputError(f"{source} is not a progress record: {err}") from None
    age_s = None
    if progress.updated_at:
        try:
            age_s = round((dt.datetime.now(dt.UTC) - dt.datetime.fromisoformat(progress.updated_at)).total_seconds(), 1)
        except ValueError:
            pass
    base = dest if not text.endswith(".json") else None
    exported = bool(base is not None and storage.exists(base, SHA256SUMS))
    copy_problems = copy_mismatches(base) if exported else []
    exported = exported and not copy_problems  # a copy that no longer matches its SHA256SUMS is not a complete copy
    off_pod = _off_pod(base, progress)
    state = progress.state
    if copy_problems:
        state = (f"{state}; its export copy is DAMAGED: it no longer matches its {SHA256SUMS} ({copy_problems[0]}"
                 f"{f' and {len(copy_problems) - 1} more' if len(copy_problems) > 1 else ''}), e.g. written by two "
                 "drivers; keep the run folder that holds the batch, remove the copy, and export again from there")
    elif state == "done" and not exported:  # the mirror says "done" once classified; the export comes after it
        state = ("classified, not exported: no complete export copy beside this record (yet); the batch may still be "
                 "exporting, or its export failed (see its run folder or log)")
    return {"batch_id": progress.batch_id, "state": state, "done": progress.done, "total": progress.total,
            "accepted": progress.accepted, "rejected": progress.rejected, "docs_per_s": progress.docs_per_s,
            "steady_docs_per_s": progress.steady_docs_per_s, "steady_tokens_per_s": progress.steady_tokens_per_s,
            "eta_s": progress.eta_s, "retries": progress.retries, "last_error": progress.last_error,
            "lease": progress.lease, "host": progress.host, "updated_at": progress.updated_at, "age_s": age_s,
            "source": str(source).split("?", 1)[0], "exported": exported, "copy_problems": copy_problems,
            "off_pod": off_pod}


COPY_RECHECK_MAX_BYTES = 16 * 1024**2
"""Largest file of an export copy that ``status --from`` reads back and hashes. Only the records are read (manifest,
summary, progress, ledgers: what a second writer always rewrites); the shards are checked by name and against the
ledger, and every byte by the re-check of ``docpilot batch`` / ``wrap-up``."""


def copy_mismatches(base: Any) -> list[str]:
    """Where a complete export copy no longer matches its ``SHA256SUMS`` (cheap enough for a status line).

    Checks: the objects there are exactly the files ``SHA256SUMS`` lists; every listed file up to
    :data:`COPY_RECHECK_MAX_BYTES` (the manifest, summary and records that a second writer always rewrites) has the
    listed sha256; the shard ledger (``offpod.sha256``) agrees with ``SHA256SUMS`` on every shard they both list.

    Args:
        base: the copy, ``<export root>/<batch-id>`` (a folder or a URL) holding ``SHA256SUMS``.

    Returns:
        Problems, each naming the file (empty: nothing found).

    Raises:
        StoreUnreachable: the store did not answer within :func:`classify.runs.storage.store_limits`.
    """

    def read(rel: str) -> bytes:
        if isinstance(base, Path):
            return (base / rel).read_bytes()
        target = storage.join(base, rel)
        fs, path = storage.filesystem(target)
        with storage.store_call("read", target):
            return fs.cat_file(path)

    def parse(data: bytes) -> dict[str, str]:
        return {rel: digest for digest, _, rel in (line.partition("  ") for line in data.decode("utf-8").splitlines())
                if rel}

    listed = parse(read(SHA256SUMS))
    if isinstance(base, Path):
        sizes = {p.relative_to(base).as_posix(): p.stat().st_size for p in base.rglob("*") if p.is_file()}
    else:
        fs, root = storage.filesystem(base)
        fs.invalidate_cache()
        with storage.store_call("list", base):
            found = fs.find(root, detail=True)
        sizes = {str(path)[len(root) + 1:]: int(info.get("size") or 0) for path, info in found.items()
                 if str(path).rstrip("/") != root}
    sizes.pop(SHA256SUMS, None)
    problems = compare_sha256(listed, {rel: listed.get(rel, "?") for rel in sizes}, SHA256SUMS,
                              missing="missing from the copy")
    for rel, size in sorted(sizes.items()):
        if rel in listed and size <= COPY_RECHECK_MAX_BYTES and not rel.startswith(f"{mf.SHARDS}/"):
            got = hashlib.sha256(read(rel)).hexdigest()
            if got != listed[rel]:
                problems.append(f"{rel}: sha256 {got[:12]}... != listed {listed[rel][:12]}...")
    if LEDGER in listed and LEDGER in sizes:
        ledger = parse(read(LEDGER))
        problems += [f"{rel}: {LEDGER} {digest[:12]}... != {SHA256SUMS} {listed[rel][:12]}..."
                     for rel, digest in ledger.items() if rel in listed and listed[rel] != digest]
    return problems


def _off_pod(base: Any, progress: ProgressFile) -> dict[str, Any] | None:
    """How many shards are safe at the copy ``base`` (its ``offpod.sha256`` ledger, :mod:`batch.run.offpod`), with the
    copy's lag as last mirrored; ``None`` when ``base`` holds no ledger and the record names no copy."""
    lag = progress.offpod or {}
    safe: int | None = None
    try:
        if isinstance(base, Path):
            safe = len(read_sums(base / LEDGER)) if (base / LEDGER).is_file() else None
        elif base is not None:
            safe = len(read_remote_ledger(base)) or None
    except (OSError, ImportError, ValueError) as err:
        log.warning("cannot read the shard ledger at %s: %s", base, err)
    if safe is None and not lag:
        return None
    return {"shards_safe": safe if safe is not None else lag.get("shards_copied", 0),
            "shards_total": lag.get("shards_total"), "shards_waiting": lag.get("shards_pending"),
            "oldest_waiting_s": lag.get("oldest_pending_s"), "copy_errors": lag.get("errors")}


def _steady(st: dict[str, Any]) -> str:
    """``" (steady X docs/s Y tokens/s after the first shard)"`` when ``progress.json`` holds a steady rate."""
    if not st.get("steady_docs_per_s"):
        return ""
    return (f" (steady {st['steady_docs_per_s']:.2f} docs/s {st.get('steady_tokens_per_s') or 0:.0f} tokens/s after "
            "the first shard)")


def _print_remote(st: dict[str, Any]) -> None:
    bid = st["batch_id"]
    pct = 100 * (st["done"] or 0) / st["total"] if st["total"] else 100.0
    age = f" ({eta_text(st['age_s'])} ago)" if st["age_s"] is not None else ""
    print(f"batch {st['batch_id']}: {st['state']} (as last mirrored from {st['host']}{age})")
    print(f"  done      {st['done']}/{st['total']} ids ({pct:.1f}%)   rejected {st['rejected']}   accepted {st['accepted']}")
    print(f"  rate      {st['docs_per_s'] or 0:.2f} docs/s{_steady(st)}   ETA {eta_text(st['eta_s']) if st['state'] == 'running' else '-'}")
    print(f"  retries   {st['retries']}   last error: {st['last_error'] or 'none'}")
    if st["lease"]:
        print(f"  lease     {st['lease'].get('message') or st['lease'].get('short')}")
    off = st.get("off_pod")
    if off:
        of = f" of {off['shards_total']}" if off.get("shards_total") else ""
        wait = (f"; {off['shards_waiting']} waiting for their copy as last mirrored (oldest "
                f"{eta_text(off['oldest_waiting_s'])})" if off.get("shards_waiting") else "")
        print(f"  off pod   {off['shards_safe']}{of} shards safe at the export location{wait}; resume on a new pod "
              f"with `{user_command(f'docpilot batch --resume-from <export-root>/{bid}')}`")
    print(f"  source    {st['source']}   updated {st['updated_at']}")
    if st.get("copy_problems"):
        print(f"  exported  NO: the copy there no longer matches its SHA256SUMS: {'; '.join(st['copy_problems'][:5])}")
    else:
        print(f"  exported  {'yes: a complete copy (SHA256SUMS) is there' if st['exported'] else 'no complete copy there yet'}")
    if st["state"] == "running" and st["age_s"] is not None and st["age_s"] > 180:
        print("  NOTE      the record is older than the mirror interval: the driver or its pod may be gone; resume with "
              f"`{user_command(f'docpilot batch --batch-id {bid}')}` on the same pod, or with "
              f"`{user_command(f'docpilot batch --resume-from <export-root>/{bid}')}` on a new one (the shards "
              "safe off the pod are kept)")


def _print_detached(run_dir: Path) -> None:
    """The detached run's log and, once it ended, its exit status (:mod:`docpilot.detach`)."""
    detach, ended = read_detach(run_dir), read_exit(run_dir)
    if detach:
        print(f"  detached  pid {detach.get('supervisor_pid')} on {detach.get('host')}, log {detach.get('log')}")
    if ended:
        print(f"  exit      {ended.get('exit_code')} at {ended.get('ended_at')}")
        if ended.get("last_start"):
            print(f"  last      {_last_start_line(ended['last_start'], ended.get('exit_code'))}")


def _last_start_line(last: dict[str, Any], attempt_code: Any) -> str:
    """The words for a detached start that ended before an attempt of its own (``exit.json``'s ``last_start``)."""
    how = ("re-checked the complete batch, nothing run" if last.get("exit_code") == 0 else
           f"exit {last.get('exit_code')} before an attempt began (refused or stopped; the reason ends the log)")
    return f"the last start, at {last.get('ended_at')}: {how}; the attempt that last ran ended with exit {attempt_code}"


def _run_processes(run_dir: Path, detach: dict[str, Any] | None) -> tuple[list[bool | None], bool]:
    """Whether each recorded process of a run (its detached supervisor, its running driver) still runs
    (:func:`classify.runs.detached.pid_alive`), and whether any record is old (no process start time)."""
    alive = [pid_alive(detach.get("supervisor_pid"), detach.get("host"), detach.get("supervisor_started"),
                       detach.get("boot_id"), detach.get("started_at"))] if detach else []
    old = bool(detach) and record_is_old(detach.get("supervisor_started"), detach.get("supervisor_pid"))
    progress = ProgressFile.read_or_none(run_dir / mf.PROGRESS)
    if progress is not None and progress.state in ("running", "starting"):
        alive.append(pid_alive(progress.pid, progress.host, progress.pid_started, progress.boot_id, progress.updated_at))
        old = old or record_is_old(progress.pid_started, progress.pid)
    return alive, old


FOLLOW_POLL_S = 2.0
"""Seconds between two reads of the run folder by ``docpilot status --follow``."""


def follow(batch_id: str, root: Path | None = None, poll_s: float = FOLLOW_POLL_S, file: Any = None) -> int:
    """Draw a batch's progress bar from its run folder until it ends; return its exit status.

    The end is the run folder's ``exit.json`` (written by a detached batch's supervisor, or by a
    foreground ``docpilot batch`` as it returns, :mod:`docpilot.detach`). A batch whose processes are gone
    without that record (SIGKILL, a reboot) ends the follow with 1 and says how to resume.

    Args:
        batch_id: the run folder name under ``runs/``.
        root: parent of run folders (default :func:`classify.paths.runs_dir`).
        poll_s: seconds between reads.
        file: where the bar is drawn (default stderr).

    Returns:
        The batch's exit status (0 when it completed, exported and re-checked).

    Raises:
        InputError: no such run folder.
        EarlierRunFolder: a run folder made by an earlier docpilot.
    """
    check = BATCH_ID_RE.match(batch_id)
    run_dir = (root or runs_dir()) / batch_id
    if not check or not run_dir.is_dir():
        raise InputError(f"no run folder {batch_id!r} under {run_dir.parent}")
    bar = None
    gone_since: float | None = None
    try:
        while True:
            ended = read_exit(run_dir)
            try:
                st = batch_status(batch_id, root)
            except EarlierRunFolder:
                raise  # never readable: waiting would not change it
            except InputError:
                st = None  # not planned yet (or a training job's folder): no counts to draw
            if st is not None and st["total"] is not None:
                if bar is None:
                    bar = progress_bar(int(st["total"]), 0, f"batch {batch_id}", file=file)
                bar.n = int(st["done"])
                bar.show_steady((st["steady_docs_per_s"], st["steady_tokens_per_s"] or 0) if st.get("steady_docs_per_s") else None)
                progress = ProgressFile.read_or_none(run_dir / mf.PROGRESS)
                lease = (progress.lease or {}).get("short") if progress else None
                bar.set_postfix_str(f"{st['state'].split(' ')[0]}" + (f", {lease}" if lease else ""), refresh=False)
                bar.refresh()
            if ended is not None:
                now = ProgressFile.read_or_none(run_dir / mf.PROGRESS)
                # an earlier attempt's record while a resumed batch runs (UTC ISO stamps compare as text)
                stale = (now is not None and now.state in ("running", "starting") and now.started_at
                         and str(now.started_at) > str(ended.get("ended_at") or ""))
                if not stale:
                    break
            detach = read_detach(run_dir)
            alive, old = _run_processes(run_dir, detach)
            if alive and not any(a is not False for a in alive):
                gone_since = gone_since or time.monotonic()
                if time.monotonic() - gone_since > 3 * poll_s:  # the exit record may land just after the process ends
                    if bar is not None:
                        bar.close()
                    again = (st or {}).get("resume") or user_command(f"docpilot batch --batch-id {batch_id}")
                    print(f"batch {batch_id}: its processes are gone without an exit status (killed: SIGKILL, out of "
                          f"memory, a reboot? or the folder names another machine or a process id now reused); complete shards are kept: resume with "
                          f"`{again}` (with {user_flag('--detach')} to outlive this terminal)" + (f"; log: {log_path(run_dir, 'batch')}" if detach else "")
                          + (f"; {OLD_RECORD_NOTE}" if old else ""), file=sys.stderr)
                    return 1
            else:
                gone_since = None
            time.sleep(poll_s)
    finally:
        if bar is not None:
            bar.close()
    last = ended.get("last_start")  # this start ran no attempt: its own status, the batch's is kept beside it
    code = int((last or ended).get("exit_code", 1))
    detach = read_detach(run_dir)
    where = f"; log: {detach['log']}" if detach else ""
    what = "training job" if detach and detach.get("kind") == "train" else "batch"
    if code != 0 and detach and Path(detach["log"]).is_file():  # the error is at the end of the log
        tail = Path(detach["log"]).read_text(encoding="utf-8", errors="replace").splitlines()[-4:]
        print("\n".join(f"  | {line}" for line in tail), file=sys.stderr)
    if last:
        print(f"{what} {batch_id}: {_last_start_line(last, ended.get('exit_code'))}{where}", file=sys.stderr)
        return code
    how = {0: "done", 9: "done here, not yet off the pod: run `" + user_command(f"docpilot batch --batch-id {batch_id}")
           + "` on this pod to finish the copy"}.get(code, "failed or stopped")
    print(f"{what} {batch_id} ended: exit {code} ({how}){where}", file=sys.stderr)
    return code


def main(argv: list[str] | None = None) -> int:
    """``docpilot status BATCH [--json] [--lease-ends T] [--follow]`` or ``docpilot status --from LOCATION``:
    done/total, rejected, docs/s, ETA, the last error, and with a lease end (``--lease-ends`` or the lots
    config's ``lease_ends_at``) whether it fits.

    Args:
        argv: command-line arguments (default ``sys.argv[1:]``).

    Returns:
        0 (without a batch id: the batches there are, :func:`list_batches`); with ``--follow`` the batch's own
        exit status.

    Raises:
        InputError: unknown batch id, or nothing readable at ``--from``.
    """
    p = argparse.ArgumentParser(prog="docpilot status", description="Progress of a batch run, from its run folder.")
    p.add_argument("batch_id", nargs="?", help="the batch id (run folder name under runs/)")
    p.add_argument("--json", action="store_true", help="print the status as JSON")
    p.add_argument("--lease-ends", help="when the lease ends, ISO 8601 with timezone (replaces the lots "
                                        "config's lease_ends_at)")
    p.add_argument("--lots-config", default="config/lots.json", help="lots config holding lease_ends_at "
                                                                       "(default %(default)s)")
    p.add_argument("--export-partial", metavar="DEST",
                   help="copy the run folder as it is now (complete shards) to DEST/<batch-id>-partial-<utc>/ "
                        "(folder or object-storage URL) with SHA256SUMS, read back and re-checked")
    p.add_argument("--upload-mib-per-s", type=float, default=DEFAULT_UPLOAD_MIB_PER_S,
                   help="assumed upload rate for the export estimate, MiB/s (default %(default)s)")
    p.add_argument("--follow", action="store_true",
                   help="draw the live progress bar until the batch ends, then exit with the batch's exit status")
    p.add_argument("--from", dest="from_", metavar="LOCATION",
                   help="read the progress mirrored off the pod: <export root>/<batch-id> (folder or s3://...), from "
                        "any machine")
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    if args.from_:
        st = remote_status(args.from_)
        if args.json:
            print(json.dumps(st, indent=2))
        else:
            _print_remote(st)
        return 0
    if args.follow and args.batch_id:
        return follow(args.batch_id)
    if not args.batch_id:
        return _print_batches(runs_dir())
    st = batch_status(args.batch_id)
    lease = lease_end(args.lots_config, args.lease_ends)
    if lease is not None:
        if not args.upload_mib_per_s > 0:
            raise InputError(f"--upload-mib-per-s must be > 0, got {args.upload_mib_per_s}")
        st["lease"] = lease_check(st, lease, upload_mib_per_s=args.upload_mib_per_s)
    if args.export_partial:
        st["partial_export"] = str(export_partial(st, args.export_partial))
    if args.json:
        print(json.dumps(st, indent=2))
        return 0
    pct = 100 * st["done"] / st["total"] if st["total"] else 100.0
    print(f"batch {st['batch_id']}: {st['state']}")
    print(f"  done      {st['done']}/{st['total']} ids ({pct:.1f}%), shards {st['shards_done']}/{st['shards']}")
    print(f"  rejected  {st['rejected'] if st['rejected'] is not None else '?'}   accepted {st['accepted'] if st['accepted'] is not None else '?'}")
    print(f"  rate      {st['docs_per_s'] or 0:.2f} docs/s{_steady(st)}   ETA {eta_text(st['eta_s']) if st['state'] == 'running' else '-'}")
    print(f"  retries   {st['retries']}   last error: {st['last_error'] or 'none'}")
    if st.get("resume"):
        print(f"  resume    `{st['resume']}` (complete shards are kept; only the rest runs)")
    if st["skip_pilot_gate"]:
        print(f"  WARNING   started with {user_flag('--skip-pilot-gate')} (no passed pilot)")
    print(f"  folder    {st['run_dir']}   updated {st['updated_at']}")
    if st.get("export"):
        print(f"  export    {st['export']['to']} (exported and verified {st['export']['verified_at']})")
    elif st.get("classified"):
        print("  export    none verified yet (classified only)")
    _print_detached(Path(st["run_dir"]))
    if "lease" in st:
        print(f"  lease     {st['lease']['message']}")
    if "partial_export" in st:
        print(f"  exported  {st['partial_export']} (partial: complete shards so far; SHA256SUMS re-checked)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
