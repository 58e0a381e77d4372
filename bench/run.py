"""``make bench``: run every benchmark in one process and write the results with machine, command and date.

Results go to ``bench/results/<UTC date>-<host>.json`` and ``.md``. Modules run one after the other
(never concurrently) so each has the whole machine; ``--only`` picks some, ``--quick`` shrinks them.
"""

from __future__ import annotations

import argparse
import importlib
import json
import platform
import sys
import time
import traceback
from pathlib import Path

from bench.common import machine
from classify.runs.records import code_revision, utc_now

MODULES = ("baseline", "zeroshot", "adapter", "adapter_merged", "long_documents", "merged_mode", "batch", "serve_load", "host", "injection",
           "injection_adapter", "scale", "scale_s3", "pilot", "slow_clients", "learning_curve")


def main(argv: list[str] | None = None) -> int:
    """Run the benchmarks; a module that fails is reported in the results and makes the exit status 1."""
    parser = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", choices=MODULES, help="run only these modules")
    parser.add_argument("--quick", action="store_true", help="small slices (a smoke test of the benchmarks)")
    parser.add_argument("--out", default="bench/results", help="results folder")
    args = parser.parse_args(argv)
    started = utc_now()
    report = {
        "date": started,
        "command": " ".join([Path(sys.executable).name, "-m", "bench.run", *(argv if argv is not None else sys.argv[1:])]),
        "machine": machine(),
        "code": code_revision(),
        "sections": {},
    }
    failed = False
    for name in args.only or MODULES:
        t0 = time.time()
        try:
            mod = importlib.import_module(f"bench.{name}")
            section = mod.run(quick=args.quick)
        except Exception as err:  # keep the other sections; report this one's error
            failed = True
            section = {"title": name, "figures": {}, "markdown": f"FAILED: {type(err).__name__}: {err}",
                       "error": traceback.format_exc()}
        section["seconds"] = round(time.time() - t0, 1)
        report["sections"][name] = section
        print(f"[bench] {name}: {section['seconds']} s", file=sys.stderr)
    try:  # baseline vs adapter on test.csv, when both ran in this invocation
        from bench.baseline import comparison

        compared = comparison(report["sections"])
    except Exception as err:
        failed, compared = True, {"title": "comparison", "figures": {}, "markdown": f"FAILED: {type(err).__name__}: {err}",
                                  "error": traceback.format_exc(), "seconds": 0}
    if compared:
        report["sections"]["comparison"] = {**compared, "seconds": 0}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = f"{started[:10]}-{platform.node() or 'host'}" + ("-" + "-".join(args.only) if args.only else "") + (
        "-quick" if args.quick else "")
    (out / f"{stem}.json").write_text(json.dumps(report, indent=2, default=str) + "\n")
    m = report["machine"]
    lines = [
        f"# docpilot benchmarks, {started}",
        "",
        f"- machine: {m['cpu']}, {m['cores']} cores, {m['memory_gib']} GiB, {m['platform']}",
        f"- command: `{report['command']}`",
        f"- code: {report['code']['commit']} (dirty: {report['code']['dirty']})",
        f"- packages: {', '.join(f'{k} {v}' for k, v in m['packages'].items() if v)}",
        "",
    ]
    for name, section in report["sections"].items():
        lines += [f"## {section['title']} ({name}, {section['seconds']} s)", "", section["markdown"], ""]
    (out / f"{stem}.md").write_text("\n".join(lines))
    print("\n".join(lines))
    print(f"wrote {out / stem}.json and .md", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
