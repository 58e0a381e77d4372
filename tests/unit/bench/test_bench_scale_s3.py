"""bench.scale_s3: the ratios s3/local per size, and a size whose run was stopped left out of them."""

from bench.scale_s3 import markdown, summarise


def _row(size: str, store: str, docs_per_s: float, rss: float, r: int = 0) -> dict:
    return {"size": size, "store": store, "round": r, "docs": 10_000, "corpus_bytes": 4_700_000,
            "docs_per_s": docs_per_s, "wall_s": round(10_000 / docs_per_s, 1), "peak_rss_gib": rss,
            "resume_start_s": 1.0, "range_gets": 0 if store == "local" else 100, "range_get_s": 0.01}


def test_the_ratio_of_each_size_is_of_the_means_of_its_runs():
    rows = [_row("10k", "local", 100, 0.5), _row("10k", "s3", 50, 0.6), _row("10k", "s3", 70, 0.6, 1),
            _row("10k", "local", 140, 0.5, 1)]
    (one,) = summarise(rows)
    assert (one["local_docs_per_s"], one["s3_docs_per_s"], one["ratio_docs_per_s"]) == (120, 60, 0.5)
    assert one["ratio_peak_rss_gib"] == 1.2 and one["ratio_resume_start_s"] == 1.0


def test_a_size_with_a_stopped_run_is_shown_but_not_compared():
    stopped = {"size": "1m", "store": "s3", "round": 0, "docs": 1_000_000, "timed_out_after_s": 1500.0,
               "range_gets": 700, "range_get_s": 0.02}
    rows = [_row("10k", "local", 100, 0.5), _row("10k", "s3", 50, 0.6), _row("1m", "local", 900, 0.7), stopped]
    assert [s["size"] for s in summarise(rows)] == ["10k"]
    text = markdown(rows, summarise(rows), 1)
    assert "| 1m | s3 | 0 | 1,000,000 | stopped after 1500 s" in text and "| 10k | 10,000 | 100 / 50 | 0.5 |" in text
