"""Shared classification core of docpilot.

Owns what the pilot (``batch/``), the Ray batch (``batch/``), the HTTP server
(``serve/``) and LoRA training (``adapters/``) all need: the config schema,
document reading, the one prompt builder, label scoring, the vLLM engine
wrapper, the result record, run records, the doctor and the exception
hierarchy. Nothing heavy (torch, vLLM, transformers) is imported at import time.
"""

__all__ = ["__version__"]
__version__ = "0.1.0"
