"""Reading documents for pilot, batch and serve: one ``Document`` per input, rejected with a reason.

read.py  one file, one JSONL line or one text field as a document, ids, sha256 of the raw bytes (a folder walked,
         CSV and Parquet rows: ``batch/corpus/``)
text.py  the text rules every reader applies: size, encoding, binary content, visible characters, writable ids
"""
