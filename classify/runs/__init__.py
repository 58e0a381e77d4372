"""Run folders and what is written there, the same for pilot, batch, serve and training.

records.py     new run folders, atomic writes, JSONL, provenance, signals as ``Interrupted``; ``read_results``
files.py       sha256 of files and folders, folders that appear whole
storage.py     where copies go: a local folder or an object-storage URL through fsspec; URLs shown without credentials
export.py      export copies with ``SHA256SUMS`` and their re-check
accounting.py  every input id exactly once, accepted or rejected
gate.py        the pilot gate: a recorded pilot outcome per base model, adapter, mode and config
disk.py        a full disk told apart once (one word list, one free-space reader), the disk check before writing
detached.py    detach.json / exit.json of a detached run, process identity, the DetachPlan a command hands the front door
plots.py       matplotlib's Agg backend, one size and resolution
"""
