"""The lot plan: ``docpilot plan``'s order summary and per-card memory fit.

plan.py  build_plan, memory_plan, order_summary, lease_end
lots.py  LotsConfig, load_lots, job_shape, gpu_spec: the lots file and the job it sizes
"""

_PUBLIC = {
    "build_plan": "plan",
    "memory_plan": "plan",
    "order_summary": "plan",
    "lease_end": "plan",
    "LotsConfig": "lots",
    "load_lots": "lots",
    "job_shape": "lots",
    "gpu_spec": "lots",
    "JobShape": "lots",
}
__all__ = sorted(_PUBLIC)


def __getattr__(name: str):
    """Import a public name on first use (PEP 562), so that importing one module of this room
    does not import the others (the pool's imports start Ray's, the run's start vLLM's)."""
    if name not in _PUBLIC:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f"{__name__}.{_PUBLIC[name]}"), name)
