"""A batch run folder made by hand (a planned corpus, shard files as the batch writes them), for the off-pod and
export-owner tests."""

from __future__ import annotations

from pathlib import Path

CATEGORIES = ["business", "tech"]


def shard_run_folder(tmp_path: Path) -> tuple[Path, object]:
    """A run folder with a manifest of 6 shards (5 docs each) and the files of shards 0..3."""
    from batch import layout as mf
    from batch.corpus.plan import plan_corpus
    from batch.runfiles import MANIFEST_VERSION, Manifest
    from classify.config.batch import CorpusConfig
    from classify.records import Result
    from tests.support.corpora import numbered_texts, write_texts

    corpus = tmp_path / "c.jsonl"
    write_texts(corpus, numbered_texts(30))
    plan = plan_corpus(CorpusConfig(path=str(corpus)), 5, 1 << 62, None, 200_000)
    manifest = Manifest(manifest_version=MANIFEST_VERSION, batch_id="b", created_at="now", corpus=plan.describe(),
                        corpus_fingerprint=plan.fingerprint, config={"classify": {"categories": CATEGORIES}}, config_sha256="c", model={},
                        model_fingerprint="m", shards=plan.shards, attempts=[])
    run_dir = tmp_path / "runs" / "b"
    run_dir.mkdir(parents=True)
    mf.write_manifest(run_dir, manifest)
    for shard in plan.shards[:4]:
        docs = plan.read_shard(shard, 200_000)
        mf.write_shard(run_dir, shard.index, [Result(id=d.id, status="accepted", category="business", score=0.9)
                                              for d in docs])
    return run_dir, manifest
