"""Helpers shared by the benchmarks: the BBC test articles, the machine's matmul rate, model FLOPs."""

from __future__ import annotations

import os
import platform
import time
from pathlib import Path
from typing import Any

from classify.paths import bbc_dir
from classify.records import Document
from classify.tabular import iter_csv


def bbc_test(n: int | None = None) -> tuple[list[Document], dict[str, str]]:
    """The first ``n`` (default all 334) BBC test articles as documents, and their labels by id."""
    path = bbc_dir() / "test.csv"
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: set DOCPILOT_BBC_DIR to the bbc-news folder")
    pairs = list(iter_csv(path, 10_000_000, id_column=None, id_prefix="bbc-test"))[:n]
    return [d for d, _ in pairs], {d.id: row["category"] for d, row in pairs}


def accuracy(results: list[Any], labels: dict[str, str]) -> float:
    """Share (0-1) of ``results`` whose ``category`` equals ``labels[id]``.

    Raises:
        ZeroDivisionError: ``results`` is empty.
    """
    return sum(r.category == labels[r.id] for r in results) / len(results)


def per_category_accuracy(results: list[Any], labels: dict[str, str], categories: tuple[str, ...]) -> dict[str, float | None]:
    """Accuracy (0-1, 4 decimals) on the articles of each labelled category; ``None`` for a category with none."""
    out: dict[str, float | None] = {}
    for cat in categories:
        mine = [r for r in results if labels[r.id] == cat]
        out[cat] = round(sum(r.category == cat for r in mine) / len(mine), 4) if mine else None
    return out


def matmul_gflops(dtype_name: str, n: int = 2048, repeats: int = 3) -> float:
    """Measured rate of an ``n x n`` matrix product on this CPU in GFLOP/s (``2 n^3`` flops per product)."""
    import torch

    dtype = getattr(torch, dtype_name)
    a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
    a @ b
    started = time.perf_counter()
    for _ in range(repeats):
        a @ b
    return 2 * n**3 * repeats / (time.perf_counter() - started) / 1e9


def forward_gflop_per_token(n_params: int) -> float:
    """Forward-pass cost per token, ``2 N`` FLOPs for ``N`` non-embedding-dominated parameters.

    Source: Kaplan et al. 2020, "Scaling Laws for Neural Language Models", sec. 2.1 (C_forward ~ 2N);
    attention's context term is left out (small at these prompt lengths for a 135M model).
    """
    return 2 * n_params / 1e9


def machine() -> dict[str, Any]:
    """What the benchmark ran on: CPU model, cores, memory, OS, Python and key package versions."""
    from classify.runrecords import package_versions

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
