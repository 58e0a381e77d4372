"""Reading documents for pilot, batch and serve: one ``Document`` per input, rejected with a reason.

read.py  folders and JSONL (CSV and Parquet: ``batch/corpus/tabular.py``), ids, sha256 of the raw bytes
text.py  the text rules every reader applies: size, encoding, binary content, visible characters, writable ids
"""
