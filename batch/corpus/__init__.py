"""The corpus: where it is, how it is cut into shards, and the shard bytes an actor reads.

plan.py    CorpusPlan, plan_corpus, locate_corpus, read_corpus: the shard plan of a corpus (one reading pass);
           PendingShard: a planned shard read when the pool dispatches it
scan.py    the format readers (JSONL, CSV, Parquet, a folder of files) and their row ranges
tabular.py CSV and Parquet rows: streamed reading, header and column checks, row offsets
ids.py     IdHashBuckets: the duplicate-id check at millions of ids (64-bit hashes bucketed on disk)
shard.py   ShardInput, ShardOutput: a shard's documents in (JSONL bytes or documents), its result bytes out
source.py  StoreObject: a corpus file in object storage read like a local one
labels.py  has_labels, iter_labels: the corpus's own labels, for the quality report
"""
