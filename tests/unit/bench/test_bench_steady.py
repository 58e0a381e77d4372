"""bench.common.steady_rate: the steady window runs from every actor's first shard to the last shard.

Split by tier: this file holds the unit tests; the others of the same subject are in ``tests/process/test_bench_steady_ceiling.py``.
"""

from __future__ import annotations

import os

import pytest

from bench.common import steady_rate


def _shard(run, index: int, docs: int, at_s: float) -> None:
    path = run / "shards" / f"{index // 1000:03d}" / f"{index:06d}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join('{"id": "d"}\n' for _ in range(docs)))
    ns = int((1_000_000 + at_s) * 1e9)
    os.utime(path, ns=(ns, ns))


def test_the_window_leaves_out_engine_starts_and_the_pool_shut_down(tmp_path):
    # 2 actors: first shards back at 40 s and 41 s (engine starts before), then one 6-doc shard every 2 s each
    _shard(tmp_path, 0, 6, 40.0)
    _shard(tmp_path, 1, 6, 41.0)
    for k in range(10):
        _shard(tmp_path, 2 + 2 * k, 6, 43.0 + 2 * k)
        _shard(tmp_path, 3 + 2 * k, 6, 44.0 + 2 * k)
    got = steady_rate(tmp_path, actors=2)
    # window 41 s -> 62 s; 20 shards x 6 docs after it, less half a shard per actor (6 docs)
    assert got["steady_window_s"] == pytest.approx(21.0)
    assert got["steady_docs"] == pytest.approx(114.0)
    assert got["docs_per_s_steady"] == pytest.approx(114 / 21, abs=1e-3)
    assert got["shards"] == 22 and got["mean_shard_docs"] == 6.0


def test_too_few_shards_for_a_window_is_an_error(tmp_path):
    _shard(tmp_path, 0, 3, 1.0)
    _shard(tmp_path, 1, 3, 2.0)
    with pytest.raises(ValueError, match="2 shard files"):
        steady_rate(tmp_path, actors=2)
