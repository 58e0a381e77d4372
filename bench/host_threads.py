"""The host side of one actor (``bench.host``) beside another commit's, at 1, 2, ... tokenizer threads and cores.

For each thread count ``t`` (up to this machine's cores), each tree runs ``python -m bench.host`` in a child
pinned to ``t`` cores (``os.sched_setaffinity``) with ``RAYON_NUM_THREADS=t`` (the ``tokenizers`` batch pool);
the trees alternate within each ``t``, so both see the same machine state. The other commit is checked out
in a temporary ``git worktree`` and run by this venv's Python (its own packages first on ``sys.path``).

Run: ``python -m bench.host_threads --beside <commit> [--this <commit>] [--threads 1 2 8 16] [--quick]``;
the table goes to stdout and ``--out <stem>`` writes ``<stem>.md`` and ``<stem>.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


@contextmanager
def checkout(rev: str | None):
    """A worktree of ``rev`` (``None``: this tree as it is)."""
    if rev is None:
        yield ROOT
        return
    with tempfile.TemporaryDirectory(prefix="host-threads-") as tmp:
        path = Path(tmp) / "tree"
        subprocess.run(["git", "worktree", "add", "--detach", "-q", str(path), rev], cwd=ROOT, check=True)
        try:
            yield path
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(path)], cwd=ROOT, check=False)


def host_figures(tree: Path, threads: int, quick: bool) -> dict[str, Any]:
    """``bench.host``'s figures from ``tree`` on ``threads`` cores and tokenizer threads."""
    cores = sorted(os.sched_getaffinity(0))[:threads]
    from bench.common import bbc_dir
    from classify.paths import model_cache_dir

    env = {**os.environ, "RAYON_NUM_THREADS": str(threads), "TOKENIZERS_PARALLELISM": "true",
           "PYTHONPATH": str(tree), "DOCPILOT_BBC_DIR": str(bbc_dir()),
           "DOCPILOT_MODEL_CACHE": str(model_cache_dir())}
    cmd = [sys.executable, "-m", "bench.host", *(["--quick"] if quick else [])]
    out = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True, check=True,
                         preexec_fn=lambda: os.sched_setaffinity(0, cores))
    figures, _ = json.JSONDecoder().raw_decode(out.stdout)
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--beside", required=True, help="the commit to compare with (for example main's)")
    parser.add_argument("--this", default=None, help="the commit measured (default: this tree as it is)")
    parser.add_argument("--threads", type=int, nargs="*", default=None)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", default=None, help="write <OUT>.md and <OUT>.json")
    args = parser.parse_args(argv)
    n_cores = len(os.sched_getaffinity(0))
    threads = [t for t in (args.threads or [1, 2, 4, 8, 16]) if t <= n_cores] or [1]
    rows = []
    with ExitStack() as stack:
        trees = {"this": stack.enter_context(checkout(args.this)), "beside": stack.enter_context(checkout(args.beside))}
        for t in threads:
            for name, tree in trees.items():
                figures = host_figures(tree, t, args.quick)
                for r in figures["rows"]:
                    rows.append({"threads": t, "tree": name, "corpus": r["corpus"], "docs": r["docs"],
                                 "host_docs_per_s": r["host_docs_per_s"],
                                 "prompt_ids_docs_per_s": r["prompt_ids_docs_per_s"]})
    this_rev = args.this or subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                                           text=True).stdout.strip() + " (tree)"
    lines = [f"# Host side of one actor: {this_rev} beside {args.beside}", "",
             f"Machine: {platform.node()}, {n_cores} cores ({platform.processor() or platform.machine()}); "
             f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; command: `python -m bench.host_threads "
             f"{' '.join(argv if argv is not None else sys.argv[1:])}`.", "",
             "Each cell: `python -m bench.host` pinned to that many cores with `RAYON_NUM_THREADS` equal to it; "
             "host = everything but the forward pass (parse, prompt ids, records, shard bytes).", "",
             "| corpus | threads = cores | host docs/s this | host docs/s beside | this / beside | per core this | "
             "prompt ids docs/s this | beside |", "|---|---|---|---|---|---|---|---|"]
    for t in threads:
        for corpus in dict.fromkeys(r["corpus"] for r in rows):
            a = next(r for r in rows if r["threads"] == t and r["tree"] == "this" and r["corpus"] == corpus)
            b = next(r for r in rows if r["threads"] == t and r["tree"] == "beside" and r["corpus"] == corpus)
            lines.append(f"| {corpus} | {t} | {a['host_docs_per_s']:,} | {b['host_docs_per_s']:,} | "
                         f"{a['host_docs_per_s'] / b['host_docs_per_s']:.2f}x | {a['host_docs_per_s'] // t:,} | "
                         f"{a['prompt_ids_docs_per_s']:,} | {b['prompt_ids_docs_per_s']:,} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        Path(f"{args.out}.md").write_text(text, encoding="utf-8")
        Path(f"{args.out}.json").write_text(json.dumps({"threads": threads, "rows": rows}, indent=2), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
