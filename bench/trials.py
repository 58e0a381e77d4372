"""Trial table for docs/training.md: training runs side by side, chosen on their validation accuracy.

``python -m bench.trials RUN_DIR...`` reads each run folder's ``config.json`` and ``summary.json``
(written by ``docpilot train``) and prints a markdown table: the settings that differ between the
runs, the end-of-run validation accuracy through vLLM (rows, per category), the fitted temperature,
and the wall and CPU time. ``test.csv`` is not read here: it is scored once, for the chosen run only
(``make bench``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

SETTINGS = ("training.max_steps", "training.epochs", "training.batch_size", "training.learning_rate",
            "training.max_seq_tokens", "training.dtype", "lora.rank", "lora.alpha", "lora.dropout", "lora.layers",
            "classify.max_doc_tokens",
            "data.validation_rows", "training.seed")
"""Dotted config keys shown when they differ between the runs."""


def _get(cfg: dict[str, Any], dotted: str) -> Any:
    node: Any = cfg
    for key in dotted.split("."):
        node = node.get(key) if isinstance(node, dict) else None
    return node


def load_trial(run_dir: Path) -> dict[str, Any]:
    """One run folder's settings and results.

    Returns:
        ``{"run", "config", "finished", "accuracy", "rows", "per_category", "temperature", "wall_s",
        "run_wall_s", "cpu_s"}``; results are ``None`` for a run without ``summary.json``.

    Raises:
        FileNotFoundError: no ``config.json`` in ``run_dir``.
    """
    cfg = json.loads((run_dir / "config.json").read_text())["config"]
    summary_path = run_dir / "summary.json"
    s = json.loads(summary_path.read_text()) if summary_path.is_file() else {}
    eng = (s.get("checks") or {}).get("engine") or {}
    if s.get("dtype") and (cfg.get("training") or {}).get("dtype") == "auto":  # the dtype `auto` resolved to
        cfg["training"]["dtype"] = f"auto ({s['dtype']})"
    return {"run": run_dir.name, "config": cfg, "finished": bool(s), "accuracy": eng.get("accuracy"),
            "rows": eng.get("rows"), "per_category": eng.get("per_category"),
            "temperature": (eng.get("calibration") or {}).get("temperature"),
            "wall_s": s.get("wall_s"), "run_wall_s": s.get("run_wall_s"), "cpu_s": s.get("cpu_s")}


def table(trials: list[dict[str, Any]]) -> str:
    """Markdown table of the trials; the best validation accuracy (first on ties) is marked ``chosen``."""
    keys = [k for k in SETTINGS if len({json.dumps(_get(t["config"], k)) for t in trials}) > 1] or ["training.max_steps"]
    done = [t for t in trials if t["accuracy"] is not None]
    best = max(done, key=lambda t: t["accuracy"])["run"] if done else None
    lines = ["| run | " + " | ".join(f"`{k}`" for k in keys) + " | validation accuracy | per category | T | "
             "training wall s | whole run s | CPU s |", "|" + "---|" * (len(keys) + 7)]
    for t in trials:
        acc = "not finished" if t["accuracy"] is None else f"{t['accuracy']:.1%} (n={t['rows']})"
        pc = ", ".join(f"{c} {v['right']}/{v['rows']}" for c, v in (t["per_category"] or {}).items())
        lines.append(f"| {t['run']}{' (chosen)' if t['run'] == best else ''} | "
                     + " | ".join(json.dumps(_get(t["config"], k)) for k in keys)
                     + f" | {acc} | {pc} | {t['temperature'] or ''} | {t['wall_s'] or ''} | {t['run_wall_s'] or ''} | "
                     f"{t['cpu_s'] or ''} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Print the table for the given run folders; exit 2 when one has no ``config.json``."""
    parser = argparse.ArgumentParser(prog="python -m bench.trials", description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path, help="run folders (runs/<utc>-train-<id>)")
    args = parser.parse_args(argv)
    try:
        trials = [load_trial(p) for p in args.runs]
    except FileNotFoundError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(table(trials))
    return 0


if __name__ == "__main__":
    sys.exit(main())
