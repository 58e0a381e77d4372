"""``docpilot wrap-up --to DEST`` / ``make wrap-up DEST=...``: copy off the pod everything lost with it, verified.

What is copied, each through the project's one export-and-re-check path for its kind:

=============================  ==========================================  =========================================
what                           where under ``DEST``                        copied and re-checked by
=============================  ==========================================  =========================================
every adapter version           ``adapters/<name>-<version>/``              :func:`adapters.registry.transfer.export_adapter`
(or those named)                                                            (every file's hash read back)
every finished batch            ``<batch-id>/`` (the ``batch.export_dir``   :func:`batch.run.export.export_batch`
                                layout: an earlier export there is          (hashes + the batch's counts recomputed
                                re-checked, not copied again)               from the copy)
every unfinished batch          ``<batch-id>-partial-<utc>/``               :func:`batch.run.export.export_partial`
(complete shards so far)                                                    (hashes)
every pilot run and decision    ``<run-id>/`` (the pilot's export layout)   :func:`classify.runs.accounting.export_checked`
                                                                            (hashes)
=============================  ==========================================  =========================================

A failed copy does not stop the others; each outcome is recorded. The manifest of what was copied,
with hashes (an adapter's content sha256, a run copy's ``SHA256SUMS`` sha256, file counts and bytes),
is written LAST to ``DEST/<utc>-wrapup-<hex>.json`` and to the wrap-up's own run folder
``runs/<utc>-wrapup-<hex>/wrap-up.json``. The command exits 8 (verification) naming every item that is
missing when any copy failed its re-check. Then, and only when every copy verified, at least one thing
was copied, and no batch is still running, the lots config's ``lease.stop_command`` runs
(:func:`batch.lease.stop.stop_the_meter`); the decision and its reason are recorded in that run folder's
``lease-stop.json`` either way.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import sys
from pathlib import Path
from typing import Any

from adapters.registry.registry import Registry, parse_ref
from adapters.registry.transfer import export_adapter
from batch import layout as mf
from batch.lease.stop import check_stop_command, stop_settings, stop_the_meter
from batch.lot.status import batch_status
from batch.run.export import export_batch, export_partial
from batch.run.mirror import write_mirror
from classify.errors import EnvironmentCheckError, VerificationError
from classify.paths import registry_dir, runs_dir
from classify.runs import storage
from classify.runs.accounting import export_checked
from classify.runs.export import SHA256SUMS
from classify.runs.records import new_run_dir, utc_now, write_json_atomic
from classify.runs.storage import Dest
from classify.usercommand import user_flag

log = logging.getLogger("docpilot.wrapup")

RECORD = "wrap-up.json"


def _label(dest: Dest) -> str:
    return str(dest).split("?", 1)[0]


def _sums_digest(dest: Dest) -> tuple[str | None, int]:
    """sha256 of a run copy's ``SHA256SUMS`` (which pins every file's hash) and the files it lists."""
    target = storage.join(dest, SHA256SUMS)
    if isinstance(target, Path):
        data = target.read_bytes()
    else:
        fs, path = storage.filesystem(target)
        with storage.store_call("read", target):
            data = fs.cat_file(path)
    return "sha256:" + hashlib.sha256(data).hexdigest(), sum(1 for line in data.decode().splitlines() if "  " in line)


def _run_bytes(run_dir: Path) -> int:
    return sum(p.stat().st_size for p in run_dir.rglob("*") if p.is_file() and not p.name.startswith("."))


def _copy_adapters(dest: Dest, registry: Any, refs: list[str] | None) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    if refs:
        wanted = refs
    else:
        found, problems = registry.scan()
        wanted = [a.ref for a in found]
        items += [{"kind": "adapter", "name": str(p)[:200], "source": str(registry.root), "dest": None,
                   "verified": False, "problem": f"unreadable in the registry: {p}"} for p in problems]
    for ref in wanted:
        item: dict[str, Any] = {"kind": "adapter", "name": ref, "source": str(registry.root), "verified": False}
        try:
            adapter = registry.resolve(ref)
            name, version = parse_ref(adapter.ref)
            target = storage.join(dest, "adapters", f"{name}-{version}")
            item.update(name=adapter.ref, source=str(adapter.path), dest=_label(target))
            out = export_adapter(registry, adapter.ref, target)  # reads the copy back, re-checks every hash
            item.update(verified=True, sha256=out["sha256"], files=out["files"], bytes=out["bytes"],
                        copied_now=out["written"])
        except Exception as err:  # noqa: BLE001 - each failure is named in the manifest; the other copies go on
            item["problem"] = f"{type(err).__name__}: {err}"
        items.append(item)
    return items


def _copy_runs(dest: Dest, root: Path) -> tuple[list[dict[str, Any]], list[str]]:
    """Finished and unfinished batches and pilot runs under ``root``; returns ``(items, batches still running)``."""
    items: list[dict[str, Any]] = []
    running: list[str] = []
    for run in sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")) if root.is_dir() else []:
        if (run / "decision.json").is_file():  # a pilot (a 12-document batch run: it has a manifest too)
            kind = "pilot"
        elif (run / mf.MANIFEST).is_file():
            kind = "batch"
        else:
            continue  # a training run (its adapter is copied from the registry), a wrap-up record, a detached job
        item: dict[str, Any] = {"kind": kind, "name": run.name, "source": str(run), "verified": False}
        try:
            if kind == "batch":
                st = batch_status(run.name, root)
                if st["state"] == "done" or (st.get("classified") and st["state"] != "running"):  # merged (exported or not)
                    target = storage.join(dest, run.name)
                    item.update(dest=_label(target), kind="batch")
                    export_batch(run, target)  # an earlier copy there is re-checked, never overwritten
                else:
                    if st["state"] == "running":
                        running.append(run.name)
                    item.update(kind="batch-partial", state=st["state"], done=st["done"], total=st["total"])
                    target = export_partial(st, str(dest))
                    item["dest"] = _label(target)
            else:
                target = storage.join(dest, run.name)
                item["dest"] = _label(target)
                export_checked(run, target, None, f"pilot copy {_label(target)}")
            item["sums_sha256"], item["files"] = _sums_digest(target)
            item.update(verified=True, bytes=_run_bytes(run))
        except Exception as err:  # noqa: BLE001 - each failure is named in the manifest; the other copies go on
            item["problem"] = f"{type(err).__name__}: {err}"
        items.append(item)
    return items, running


def wrap_up(dest: str | Path, *, adapters: list[str] | None = None, registry: str | Path | None = None,
            root: Path | None = None, record_dir: Path | None = None) -> dict[str, Any]:
    """Copy every adapter version, batch and pilot run off the pod to ``dest``; re-check each copy; write the manifest.

    Args:
        dest: a folder (a mounted volume) or an object-storage URL (``s3://bucket/prefix``).
        adapters: the versions to copy (``name@version`` / ``name@latest``); ``None`` copies every version.
        registry: the adapter registry (default ``DOCPILOT_REGISTRY``).
        root: the parent of run folders (default ``runs/``).
        record_dir: where ``wrap-up.json`` (and later ``lease-stop.json``) go (default: a new
            ``runs/<utc>-wrapup-<hex>/``).

    Returns:
        The manifest: ``{dest, started_at, finished_at, items: [...], verified, missing, running, verdict,
        manifest, record_dir}``; ``verified`` is True only when at least one item was copied, every copy
        re-checked where it landed and no batch is still running.
    """
    target_root = storage.as_dest(dest)
    root = root or runs_dir()
    if record_dir is None:
        _, record_dir = new_run_dir("wrapup", root)
    started = utc_now()
    reg = Registry(registry or registry_dir())
    items = _copy_adapters(target_root, reg, adapters)
    run_items, running = _copy_runs(target_root, root)
    items += run_items
    missing = [f"{i['kind']} {i['name']}: {i.get('problem')}" for i in items if not i["verified"]]
    if missing:
        verdict = f"{len(missing)} of {len(items)} copies failed: " + "; ".join(missing)
    elif not items:
        verdict = "nothing to copy (no adapter in the registry, no batch or pilot run): nothing was exported"
    elif running:
        verdict = (f"all {len(items)} copies verified, but batch {', '.join(running)} is still running (copied as "
                   "partial results); stopping the lease would stop it")
    else:
        verdict = f"all {len(items)} copies verified at {_label(target_root)}"
    manifest_dest = storage.join(target_root, f"{record_dir.name}.json")  # <utc>-wrapup-<hex>.json: one per wrap-up
    out = {"dest": _label(target_root), "started_at": started, "finished_at": utc_now(), "items": items,
           "verified": bool(items) and not missing and not running, "missing": missing, "running": running,
           "verdict": verdict, "manifest": _label(manifest_dest), "record_dir": str(record_dir)}
    data = (json.dumps(out, indent=2, sort_keys=True) + "\n").encode()
    write_json_atomic(record_dir / RECORD, out)
    try:  # last: the manifest lands after every copy it lists
        write_mirror(manifest_dest, data)
    except Exception as err:  # noqa: BLE001 - a manifest that cannot be written is itself a failed copy
        out["verified"] = False
        out["missing"].append(f"manifest {_label(manifest_dest)}: {type(err).__name__}: {err}")
        out["verdict"] = f"the manifest could not be written: {err}; " + verdict
        write_json_atomic(record_dir / RECORD, out)
    return out


def main(argv: list[str] | None = None) -> int:
    """``docpilot wrap-up --to DEST [--adapter REF ...] [--registry PATH] [--lots-config F] [--no-stop]``.

    Returns:
        0 when every copy verified (and the stop command, if configured, ran or was not asked for).

    Raises:
        VerificationError: a copy failed its re-check or could not be made (exit 8; names each one).
        EnvironmentCheckError: every copy verified but the stop command failed (exit 6: stop the lease yourself).
        ConfigError: without ``--no-stop``, a stop command whose program is missing or that is one string holding
            spaces (:func:`batch.lease.stop.check_stop_command`), refused before the first copy.
    """
    p = argparse.ArgumentParser(prog="docpilot wrap-up", description="Copy every adapter and run off the pod, "
                                "re-check each copy where it landed, write a manifest, then stop the lease.")
    p.add_argument("--to", required=True, metavar="DEST", help="a folder (mounted volume) or s3://bucket/prefix")
    p.add_argument("--adapter", action="append", metavar="REF",
                   help="copy only this adapter version (name@version; repeatable; default: every version)")
    p.add_argument("--registry", help="adapter registry (default: DOCPILOT_REGISTRY)")
    p.add_argument("--lots-config", default="config/lots.json", help="lots config holding lease.stop_command "
                                                                     "(default %(default)s)")
    p.add_argument("--no-stop", action="store_true", help="do not run the stop command even if everything verified")
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    lease = stop_settings(args.lots_config)  # a bad lots config fails before anything is copied
    if not args.no_stop:  # so does a stop command that could only fail after every copy
        check_stop_command(lease, after="every copy", skip=user_flag("--no-stop"))
    out = wrap_up(args.to, adapters=args.adapter, registry=args.registry)
    for item in out["items"]:
        mark = "ok " if item["verified"] else "FAILED"
        print(f"  {mark} {item['kind']:<13} {item['name']} -> {item.get('dest')}"
              + ("" if item["verified"] else f": {item.get('problem')}"))
    print(f"manifest: {out['manifest']} (also {out['record_dir']}/{RECORD})")
    record_dir = Path(out["record_dir"])
    if args.no_stop:
        decision = stop_the_meter(record_dir, lease, False, f"--no-stop given ({out['verdict']})")
    else:
        decision = stop_the_meter(record_dir, lease, out["verified"], out["verdict"])
    print(f"lease stop: {decision['decision']}: {decision['reason']} (recorded in {record_dir}/lease-stop.json)")
    if out["missing"]:
        raise VerificationError(f"wrap-up to {out['dest']} incomplete, these copies are MISSING or failed their "
                                f"re-check: {'; '.join(out['missing'])}. Fix the cause and run it again (verified copies "
                                "are re-checked, not copied again); the lease was not stopped")
    if decision["decision"] == "failed":
        raise EnvironmentCheckError(f"every copy verified, but the stop command {decision['command']} failed "
                                    f"({decision['exit_code']}): the rental is still running; stop it yourself")
    print(out["verdict"])
    return 0
