"""bench.common.steady_rate: the steady window runs from every actor's first shard to the last shard.

Split by tier: this file holds the process tests; the others of the same subject are in ``tests/unit/bench/test_bench_steady.py``.
"""

from __future__ import annotations

import os

import pytest


def test_the_actor_layout_ceiling_runs_one_bound_process_per_group():
    # the merged bench's ceiling: one product per actor's cores at once (bench.merged_mode.actor_core_groups)
    from bench.common import matmul_gflops_groups
    from bench.merged_mode import actor_core_groups

    cores = sorted(os.sched_getaffinity(0))
    groups = actor_core_groups()
    if len(cores) < 2:
        assert groups is None  # fewer cores than actors: one process with torch's threads
    else:  # two disjoint, non-empty groups of this process's cores (on 2 cores: a core each)
        assert len(groups) == 2 and all(groups) and not set(groups[0]) & set(groups[1])
        assert set(groups[0] + groups[1]) <= set(cores)
        assert len(cores) != 2 or groups == [[cores[0]], [cores[1]]]
    rate = matmul_gflops_groups("float32", [[c] for c in cores], n=256, seconds=0.2, trials=1)
    assert 0 < rate < 1e6
    with pytest.raises(ValueError, match="non-empty core groups"):
        matmul_gflops_groups("float32", [[]])
    with pytest.raises(ValueError, match="disjoint and within this process's CPUs"):
        matmul_gflops_groups("float32", [[cores[0]], [cores[0]]])
    with pytest.raises(ValueError, match="disjoint and within this process's CPUs"):
        matmul_gflops_groups("float32", [[max(cores) + 1]])
    with pytest.raises(ValueError, match="seconds > 0, trials >= 1"):
        matmul_gflops_groups("bf16", [[cores[0]]])
    # a process that fails (here: 4 TB of matrix) is an error naming its cores, at once, not a wait
    with pytest.raises(RuntimeError, match=rf"failed: cores \[{cores[0]}\]: RuntimeError: .*allocate"):
        matmul_gflops_groups("float32", [[cores[0]]], n=10**6, seconds=0.2, trials=1)
