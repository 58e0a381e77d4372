"""The corpus: where it is, how it is cut into shards, and the shard bytes an actor reads.

plan.py    CorpusPlan, plan_corpus, locate_corpus, read_corpus: the shard plan of a corpus (one reading pass);
           PendingShard: a planned shard read when the pool dispatches it
scan.py    the format readers (JSONL, CSV, Parquet, a folder of files) and their row ranges
ids.py     IdHashBuckets: the duplicate-id check at millions of ids (64-bit hashes bucketed on disk)
shard.py   ShardInput, ShardOutput: a shard's documents in (JSONL bytes or documents), its result bytes out
labels.py  has_labels, iter_labels: the corpus's own labels, for the quality report
"""

from batch import public_face

_PUBLIC = {
    "CorpusPlan": "plan",
    "plan_corpus": "plan",
    "locate_corpus": "plan",
    "read_corpus": "plan",
    "IdHashBuckets": "ids",
    "fold_duplicates": "plan",
    "PendingShard": "plan",
    "ShardInput": "shard",
    "ShardOutput": "shard",
    "has_labels": "labels",
    "iter_labels": "labels",
    "detect_format": "scan",
}
__all__ = sorted(_PUBLIC)
__getattr__ = public_face(__name__, _PUBLIC)
