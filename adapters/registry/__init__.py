"""The adapter registry and what moves adapters in and out of it. Imports nothing from training.

registry.py      ``Registry``: publish, list, resolve and verify versions under ``<DOCPILOT_REGISTRY>/<name>/<version>/``
resolved.py      ``name@version`` parsing, vLLM's int id, ``ResolvedAdapter``: one resolved version
card.py          the adapter card (``card.json``): its model, file names and the adapter's content hash
compat.py        can the engine apply this adapter? vLLM's LoRA rules, checked before vLLM sees it
transfer.py      ``docpilot adapters export`` / ``import``: one version off the machine and back
export_copy.py   export copies: staging with ``SHA256SUMS``, tar archives, reading a copy back and its re-check
merge.py         an adapter merged into its base model (a full model folder with its fingerprint)
merged_cache.py  the merged-model cache: one adapter merged once, reused by pilot and batch
cli.py           ``docpilot adapters``: list, show, verify, merge, export and import
"""
