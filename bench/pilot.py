"""``make pilot``'s wall time: ``docpilot pilot`` on ``data/pilot/`` as a fresh process, after set-up.

Set-up (``.venv``, the provisioned base model) is done before; what is timed is the command the
README runs first, end to end: doctor, the batch pipeline over 12 documents (Ray start, one engine
actor, shards, merge, export and re-check) and the decision. The pilot's own record of its stages
is read back from its ``summary.json`` (engine start to first shard, classify, merge).

A second tree (``DOCPILOT_BENCH_BASELINE_SRC``: a checkout of another revision, e.g. ``git archive main``)
is timed the same way in the same run, so the two figures share machine and load.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def time_pilot(src: Path, label: str) -> dict[str, Any]:
    """Run ``python -m docpilot pilot`` from ``src`` (its code on ``PYTHONPATH``) in fresh state folders.

    Args:
        src: the source tree to run (this checkout, or a baseline revision's).
        label: names the run in the results.

    Returns:
        ``{label, wall_s, exit_code, decision, stage_reached, run_dir, stages}``; ``stages`` holds the
        pilot's own timings when its summary has them.

    Raises:
        RuntimeError: the pilot wrote no run folder (its output tail is in the message).
    """
    with tempfile.TemporaryDirectory(prefix="bench-pilot-") as tmp:
        env = {**os.environ, "PYTHONPATH": str(src), "DOCPILOT_HOME": f"{tmp}/home", "DOCPILOT_RUNS": f"{tmp}/runs",
               "DOCPILOT_EXPORTS": f"{tmp}/exports", "DOCPILOT_REGISTRY": f"{tmp}/registry"}
        env.setdefault("DOCPILOT_MODEL_CACHE", str(ROOT / ".docpilot" / "models"))
        t0 = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "docpilot", "pilot", "--config", "config/docpilot.json"], cwd=src,
                              env=env, capture_output=True, text=True, timeout=1200)
        wall = time.perf_counter() - t0
        runs = sorted(Path(tmp, "runs").glob("*-pilot-*/summary.json"))
        if not runs:
            raise RuntimeError(f"{label}: no pilot run folder (exit {proc.returncode}): {proc.stdout[-1500:]}{proc.stderr[-1500:]}")
        summary = json.loads(runs[-1].read_text())
        decision_file = runs[-1].parent / "decision.json"
        decision = json.loads(decision_file.read_text())["decision"] if decision_file.is_file() else None
    attempt = summary.get("this_attempt") or {}
    measured = summary.get("measured") or {}
    return {"label": label, "wall_s": round(wall, 1), "exit_code": proc.returncode,
            "decision": decision,
            "stage_reached": summary.get("stage_reached"), "accuracy": summary.get("accuracy"),
            "stages": {"first_shard_s": attempt.get("first_shard_s"), "pool_wall_s": attempt.get("pool_wall_s"),
                       "merge_s": attempt.get("merge_s"), "classify_s": measured.get("classify_s"),
                       "peak_gib": measured.get("peak_gib")}}


def run(quick: bool = False) -> dict[str, Any]:
    """The bench section: this tree's pilot wall time, beside the baseline tree's when one is given.

    Args:
        quick: unused (the pilot is 12 documents either way).

    Returns:
        ``{title, figures, markdown}`` as :mod:`bench.run` expects.
    """
    rows = [time_pilot(ROOT, "this tree (pilot = 12-document batch run)")]
    baseline = os.environ.get("DOCPILOT_BENCH_BASELINE_SRC")
    if baseline:
        rows.append(time_pilot(Path(baseline), f"baseline {baseline} (in-process pilot)"))
    lines = ["| run | wall s | exit | decision | stage | engine start to first shard s | classify s | merge s | peak GiB |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        st = r["stages"]
        lines.append(f"| {r['label']} | {r['wall_s']} | {r['exit_code']} | {r['decision']} | {r['stage_reached']} | "
                     f"{round(st['first_shard_s'], 1) if st['first_shard_s'] is not None else '-'} | {st['classify_s'] or '-'} | "
                     f"{st['merge_s'] if st['merge_s'] is not None else '-'} | {st['peak_gib'] or '-'} |")
    figures: dict[str, Any] = {"runs": rows}
    if len(rows) == 2 and rows[1]["wall_s"]:
        figures["ratio_this_over_baseline"] = round(rows[0]["wall_s"] / rows[1]["wall_s"], 2)
        lines += ["", f"Wall time ratio this / baseline: {figures['ratio_this_over_baseline']}"]
    else:
        lines += ["", "Baseline not run in this invocation (set DOCPILOT_BENCH_BASELINE_SRC); main's in-process pilot "
                      "took about 2.5 min on the 2-core dev VM (issue #24)."]
    return {"title": "make pilot wall time after set-up", "figures": figures, "markdown": "\n".join(lines)}
