"""``docpilot adapters``: list, show, verify, merge, export and import adapters in the registry.

Example:
    $ docpilot adapters list
    $ docpilot adapters show topics@latest
    $ docpilot adapters verify topics@1 --config config/docpilot.json
    $ docpilot adapters merge topics@1 --out merged/topics-1
    $ docpilot adapters export topics@1 s3://team-bucket/adapters/topics-1
    $ docpilot adapters import s3://team-bucket/adapters/topics-1 --registry /srv/registry
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from adapters.registry.merge import merge_adapter
from adapters.registry.registry import Registry
from adapters.registry.transfer import export_adapter, import_adapter
from classify.config.sections import PilotConfig, load_config
from classify.errors import AdapterIntegrityError
from classify.model.model import resolve_model
from classify.runs.storage import as_dest


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="docpilot adapters", description="adapter registry: list, show, verify, merge, export, import")
    parser.add_argument("--registry", type=Path, help="registry folder (default DOCPILOT_REGISTRY or .docpilot/registry)")
    sub = parser.add_subparsers(dest="action", required=True)
    ls = sub.add_parser("list", help="every published version")
    ls.add_argument("--json", action="store_true", help="print JSON instead of a table")
    show = sub.add_parser("show", help="one version's card")
    show.add_argument("ref", help="name@version, name@latest or name")
    verify = sub.add_parser("verify", help="re-hash the files, check the base-model fingerprint and that the "
                                           "config's engine can apply the adapter (LoRA rank, features, modules)")
    verify.add_argument("ref")
    verify.add_argument("--config", type=Path, default=Path("config/docpilot.json"),
                        help="config whose base model and engine section (max_lora_rank) the adapter must "
                             "match (default config/docpilot.json)")
    merge = sub.add_parser("merge", help="write base + adapter as one full model (peft merge)")
    merge.add_argument("ref")
    merge.add_argument("--out", type=Path, required=True, help="new folder for the merged model")
    merge.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    export = sub.add_parser("export", help="copy one version (files, card, SHA256SUMS) to a folder or archive, "
                                           "local or s3://, gs://...; the copy is read back and re-checked")
    export.add_argument("ref", help="name@version or name@latest")
    export.add_argument("dest", help="folder, or .tar/.tar.gz/.tgz archive; a local path or an fsspec URL")
    imp = sub.add_parser("import", help="verify an export (every hash, the base model) and add it to the registry "
                                        "atomically; the same version with the same content is a no-op")
    imp.add_argument("src", help="the export: folder or archive, local path or fsspec URL")
    base = imp.add_mutually_exclusive_group()
    base.add_argument("--config", type=Path, default=Path("config/docpilot.json"),
                      help="config whose base model (fingerprint) and engine the adapter must match "
                           "(default config/docpilot.json)")
    base.add_argument("--base-fingerprint", help="this side's base-model fingerprint, instead of resolving --config's model")
    return parser


def _table(adapters: list[Any], root: Path, unreadable: int = 0) -> str:
    rows = [("REF", "CREATED", "BASE MODEL", "PILOT", "FINAL LOSS", "SHA256")]
    for a in adapters:
        pilot = a.card.get("pilot") or {}
        rows.append((a.ref, str(a.card.get("created", "")), str(a.card.get("base_model", {}).get("name", "")),
                     f"{pilot.get('status', '?')}" + (f" ({pilot['run_id']})" if pilot.get("run_id") else ""),
                     str(a.card.get("metrics", {}).get("final_loss", "")), a.sha256[:12]))
    if len(rows) == 1:
        return f"no readable adapters in {root} ({unreadable} unreadable, named on stderr)" if unreadable else f"no adapters in {root}"
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows)


def main(argv: list[str] | None = None) -> int:
    """Run ``docpilot adapters ACTION ...``.

    Returns:
        0 on success. Errors (:class:`classify.errors.AdapterError` and subclasses) are mapped to
        exit codes by ``docpilot.cli``.
    """
    args = _parser().parse_args(argv)
    reg = Registry(args.registry)
    if args.action == "list":
        adapters, problems = reg.scan()
        print(json.dumps([a.summary() for a in adapters], indent=2) if args.json else _table(adapters, reg.root, len(problems)))
        for problem in problems:  # the readable versions are listed all the same
            print(f"error [{AdapterIntegrityError.kind}]: {problem}", file=sys.stderr)
        if problems:
            return AdapterIntegrityError.exit_code
    elif args.action == "show":
        print(json.dumps(reg.show(args.ref).card, indent=2, sort_keys=True))
    elif args.action == "verify":
        cfg = load_config(PilotConfig, args.config)
        model = resolve_model(cfg.model)
        adapter = reg.resolve(args.ref, base_fingerprint=model.fingerprint, engine=cfg.engine, base_model_path=model.path)
        print(f"ok: {adapter.ref} sha256 {adapter.sha256}: {len(adapter.card['files'])} files verified, "
              f"base model {model.name} {model.fingerprint}, engine can apply it (max_lora_rank {cfg.engine.max_lora_rank})")
    elif args.action == "export":
        out = export_adapter(reg, args.ref, as_dest(args.dest))
        print(f"{'exported' if out['written'] else 'already exported (re-checked, unchanged)'}: {out['ref']} "
              f"sha256 {out['sha256']} -> {out['dest']} ({out['files']} files, {out['bytes']} bytes; "
              "read back and every hash re-checked)")
    elif args.action == "import":
        kwargs: dict = {"base_fingerprint": args.base_fingerprint}
        if args.base_fingerprint is None:
            cfg = load_config(PilotConfig, args.config)
            model = resolve_model(cfg.model)
            kwargs = {"base_fingerprint": model.fingerprint, "engine": cfg.engine, "base_model_path": model.path}
        adapter, created = import_adapter(as_dest(args.src), reg, **kwargs)
        print(f"{'imported' if created else 'already in the registry (same content, nothing written)'}: "
              f"{adapter.ref} sha256 {adapter.sha256} into {reg.root} ({len(adapter.card['files'])} files verified, "
              f"base model {adapter.base_fingerprint}); pilot status here: "
              f"{(adapter.card.get('pilot') or {}).get('status')} (run `make pilot ADAPTER={adapter.ref}`)")
    else:
        merged = merge_adapter(reg.resolve(args.ref), args.out, args.dtype)
        print(f"merged {merged['adapter']} into {merged['path']} (fingerprint {merged['fingerprint']})")
    return 0
