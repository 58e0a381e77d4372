"""Helpers shared by the benchmarks: the BBC test articles, the machine's matmul rate, model FLOPs."""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from batch.corpus.tabular import iter_csv
from classify.records import Document

ROOT = Path(__file__).resolve().parent.parent
"""The checkout's root (``bench/..``)."""


def bbc_dir() -> Path:
    """The BBC News data folder the benchmarks read (the demo set; the product knows no data set).

    Returns:
        ``DOCPILOT_BBC_DIR`` when set (resolved); else ``../shared/data/bbc-news`` from the current
        directory when it holds ``test.csv``, else the same beside the checkout (``<root>/../shared/...``).
        The folder is not checked to exist when ``DOCPILOT_BBC_DIR`` names it.
    """
    value = os.environ.get("DOCPILOT_BBC_DIR")
    if value:
        return Path(value).expanduser().resolve()
    here = (Path.cwd().parent / "shared" / "data" / "bbc-news").resolve()
    return here if (here / "test.csv").is_file() else (ROOT.parent / "shared" / "data" / "bbc-news").resolve()


def bbc_test(n: int | None = None) -> tuple[list[Document], dict[str, str]]:
    """The first ``n`` (default all 334) BBC test articles as documents, and their labels by id."""
    path = bbc_dir() / "test.csv"
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: set DOCPILOT_BBC_DIR to the bbc-news folder")
    pairs = list(iter_csv(path, 10_000_000, id_column=None, id_prefix="bbc-test"))[:n]
    return [d for d, _ in pairs], {d.id: row["category"] for d, row in pairs}


def merged_registry_adapter(model_cfg: Any) -> tuple[Any, Any]:
    """The registry adapter ``DOCPILOT_BENCH_ADAPTER`` (default ``bbc-news@latest``) merged into its base, once.

    Args:
        model_cfg: the config's model section (base model, dtype, ``max_model_len``).

    Returns:
        ``(adapter, merged model config)``: the verified registry entry, and a ``ModelConfig`` naming the merged
        float32 folder under the state dir (``merged/<name>-<version>-float32``, made on the first call).

    Raises:
        AdapterNotFound, AdapterIncompatible: no such adapter, or one trained on another base model.
    """
    from adapters.registry.merge import merge_adapter
    from adapters.registry.registry import Registry
    from classify.config.sections import ModelConfig
    from classify.model.model import resolve_model
    from classify.paths import state_dir

    base = resolve_model(model_cfg)
    adapter = Registry().resolve(os.environ.get("DOCPILOT_BENCH_ADAPTER", "bbc-news@latest"),
                                 base_fingerprint=base.fingerprint)
    out = state_dir() / "merged" / f"{adapter.name}-{adapter.version}-float32"
    if not out.exists():
        merge_adapter(adapter, out, dtype="float32")
    return adapter, ModelConfig(base_model=str(out), dtype=model_cfg.dtype, max_model_len=model_cfg.max_model_len)


def accuracy(results: list[Any], labels: dict[str, str]) -> float:
    """Share (0-1) of ``results`` whose ``category`` equals ``labels[id]``.

    Raises:
        ZeroDivisionError: ``results`` is empty.
    """
    return sum(r.category == labels[r.id] for r in results) / len(results)


def wrong_ids(results: list[Any], labels: dict[str, str]) -> list[str]:
    """Sorted ids of the ``results`` whose ``category`` is not ``labels[id]`` (for paired tests across sections)."""
    return sorted(r.id for r in results if r.category != labels[r.id])


def per_category_accuracy(results: list[Any], labels: dict[str, str], categories: tuple[str, ...]) -> dict[str, float | None]:
    """Accuracy (0-1, 4 decimals) on the articles of each labelled category; ``None`` for a category with none."""
    out: dict[str, float | None] = {}
    for cat in categories:
        mine = [r for r in results if labels[r.id] == cat]
        out[cat] = round(sum(r.category == cat for r in mine) / len(mine), 4) if mine else None
    return out


def matmul_gflops(dtype_name: str, n: int = 2048, repeats: int = 3, trials: int = 5) -> float:
    """Measured rate of an ``n x n`` matrix product on this CPU in GFLOP/s (``2 n^3`` flops per product).

    The best of ``trials`` timings of ``repeats`` products each (torch's default threads): a ceiling
    is the machine's best, and one short timing on a shared CPU varies by 10% or more.
    """
    import torch

    dtype = getattr(torch, dtype_name)
    a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
    a @ b
    best = 0.0
    for _ in range(trials):
        started = time.perf_counter()
        for _ in range(repeats):
            a @ b
        best = max(best, 2 * n**3 * repeats / (time.perf_counter() - started) / 1e9)
    return best


def _group_rate(dtype_name: str, cores: list[int], n: int, seconds: float, start: Any, out: Any) -> None:
    """One process of :func:`matmul_gflops_groups`: bound to ``cores``, one torch thread per core; puts
    ``("ok", GFLOP/s)`` or ``("error", message)`` on ``out``."""
    try:
        import torch

        os.sched_setaffinity(0, set(cores))
        torch.set_num_threads(len(cores))
        dtype = getattr(torch, dtype_name)
        a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
        a @ b
        start.wait(timeout=300)
        count, started = 0, time.perf_counter()
        while time.perf_counter() - started < seconds:
            a @ b
            count += 1
        out.put(("ok", 2 * n**3 * count / (time.perf_counter() - started) / 1e9))
    except BaseException as err:  # noqa: BLE001 - any failure goes back to the parent, which raises it
        start.abort()  # the other processes stop waiting
        out.put(("error", f"cores {cores}: {type(err).__name__}: {err}"))


def matmul_gflops_groups(dtype_name: str, groups: list[list[int]], n: int = 2048, seconds: float = 2.0,
                         trials: int = 3) -> float:
    """Summed rate (GFLOP/s) of ``n x n`` products running at once, one process per core group.

    This is the ceiling of engines that compute side by side, each bound to its own cores (the batch's
    CPU engine actors, :func:`batch.pool.placement.cpu_core_groups`): each process is bound to its group,
    runs ``len(group)`` torch threads and repeats the product for ``seconds`` after a common start;
    the rates are summed (``2 n^3`` FLOPs per product). One process with torch's default threads
    (:func:`matmul_gflops`) can understate it: on a 2-core AVX512-BF16/AMX Xeon its bf16 product ran at
    0.7-1.8 TFLOP/s where two single-thread processes, one per core, ran at 1.3-1.95 together
    (2026-12-01, the same minutes).

    Args:
        dtype_name: ``float32`` or ``bfloat16``.
        groups: one list of CPU ids per process: disjoint, non-empty, each id one this process may use
            (``os.sched_getaffinity(0)``).
        n: matrix side.
        seconds: timed window per trial, per process (> 0).
        trials: the best summed rate of this many windows is returned (>= 1; a shared host varies by 10% or more).

    Returns:
        The best summed rate over ``trials``, GFLOP/s.

    Raises:
        ValueError: a bad argument (named in the message).
        RuntimeError: a measuring process failed (its error in the message) or gave no answer within
            ``seconds`` + 300 s.
    """
    import multiprocessing as mp
    import queue

    allowed = os.sched_getaffinity(0)
    flat = [c for g in groups or [] for c in g]
    if not groups or not all(groups) or not all(type(c) is int for c in flat):
        raise ValueError(f"matmul_gflops_groups needs non-empty core groups of CPU ids (ints), got {groups!r}")
    if len(set(flat)) != len(flat) or not set(flat) <= allowed:
        raise ValueError(f"core groups {groups!r} must be disjoint and within this process's CPUs {sorted(allowed)}")
    if dtype_name not in ("float32", "bfloat16", "float16") or seconds <= 0 or trials < 1 or n < 1:
        raise ValueError(f"matmul_gflops_groups: dtype_name float32/bfloat16/float16, seconds > 0, trials >= 1, "
                         f"n >= 1; got {dtype_name!r}, {seconds}, {trials}, {n}")
    ctx = mp.get_context("spawn")  # a fresh torch per process: no inherited thread pool
    best = 0.0
    for _ in range(trials):
        start, out = ctx.Barrier(len(groups)), ctx.Queue()
        procs = [ctx.Process(target=_group_rate, args=(dtype_name, g, n, seconds, start, out)) for g in groups]
        for p in procs:
            p.start()
        answers: list[tuple[str, Any]] = []
        deadline = time.monotonic() + seconds + 300
        try:
            while len(answers) < len(procs):
                try:
                    answers.append(out.get(timeout=1))
                except queue.Empty:
                    crashed = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
                    if crashed or time.monotonic() > deadline:
                        raise RuntimeError(
                            f"matmul_gflops_groups: no answer from the processes of {groups!r} "
                            + (f"(exit codes {crashed}: see their error above)" if crashed
                               else f"within {seconds + 300:.0f} s")) from None
        finally:
            for p in procs:
                p.join(timeout=10)
                if p.is_alive():
                    p.kill()
        errors = [value for kind, value in answers if kind == "error"]
        if errors:
            raise RuntimeError(f"matmul_gflops_groups failed: {'; '.join(errors)}")
        best = max(best, sum(value for _, value in answers))
    return best


def steady_rate(run_dir: Path, actors: int) -> dict[str, Any]:
    """Steady-state docs/s of a finished batch, from the completion times of its shard files.

    The window opens when every actor has returned a shard (the ``actors``-th shard file written) and
    closes at the last one, so it leaves out the engine starts before and the pool's shut-down after
    (actor and engine stop, about 15 s here, which ``pool_wall_s`` includes). Documents: those of the
    shards completed inside the window, less half a mean shard per actor (each actor was part-way
    through a shard when the window opened).

    Args:
        run_dir: the batch's run folder (``shards/<NNN>/<NNNNNN>.jsonl``, one line per document).
        actors: engine actors of the attempt.

    Returns:
        ``{"docs_per_s_steady", "steady_window_s", "steady_docs", "shards", "mean_shard_docs"}``
        (docs/s, seconds, documents, shard files, documents).

    Raises:
        ValueError: fewer than ``actors + 1`` shard files (no window to measure).
    """
    done = sorted((f.stat().st_mtime_ns, sum(1 for _ in f.open("rb"))) for f in Path(run_dir).glob("shards/*/*.jsonl"))
    if len(done) <= actors:
        raise ValueError(f"{run_dir}: {len(done)} shard files, need more than {actors} for a steady window")
    mean = sum(n for _, n in done) / len(done)
    window_s = (done[-1][0] - done[actors - 1][0]) / 1e9
    docs = sum(n for _, n in done[actors:]) - actors * mean / 2
    return {"docs_per_s_steady": round(docs / max(window_s, 1e-9), 3), "steady_window_s": round(window_s, 1),
            "steady_docs": round(docs, 1), "shards": len(done), "mean_shard_docs": round(mean, 1)}


def forward_gflop_per_token(n_params: int) -> float:
    """Forward-pass cost per token, ``2 N`` FLOPs for ``N`` non-embedding-dominated parameters.

    Source: Kaplan et al. 2020, "Scaling Laws for Neural Language Models", sec. 2.1 (C_forward ~ 2N);
    attention's context term is left out (small at these prompt lengths for a 135M model).
    """
    return 2 * n_params / 1e9


def machine() -> dict[str, Any]:
    """What the benchmark ran on: CPU model, cores, memory, OS, Python and key package versions."""
    from classify.runs.records import package_versions

    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
        mem = next(int(x.split()[1]) * 1024 for x in Path("/proc/meminfo").read_text().splitlines() if x.startswith("MemTotal"))
    except (OSError, StopIteration):
        mem = 0
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory_gib": round(mem / 2**30, 1),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "packages": package_versions(),
        "load_average_at_start": os.getloadavg(),
    }


def run_alone(run: Callable[[bool], dict[str, Any]], doc: str) -> None:
    """``python -m bench.<module> [--quick]``: run one benchmark module alone and print its figures and table.

    Args:
        run: the module's ``run(quick)``, returning ``{"figures": ..., "markdown": ...}``.
        doc: the module's docstring (its first line is the command's description).
    """
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    out = run(parser.parse_args().quick)
    print(json.dumps(out["figures"], indent=2))
    print(out["markdown"])

