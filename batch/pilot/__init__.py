"""The pilot: a 12-document batch with one planned reject and a recorded decision.

run.py       run_pilot, PilotHooks: ``docpilot pilot`` through the batch's own run (batch.run.attempt)
inputs.py    the pilot set and its labels
decision.py  build_summary, decide: the summary and the decision (proceed, fix the environment, revisit)
measure.py   measure_pool: the memory and throughput the pilot measured, beside the plan's estimate
"""

_PUBLIC = {
    "run_pilot": "run",
    "PilotHooks": "run",
    "PilotOutcome": "run",
    "read_pilot_set": "inputs",
    "build_summary": "decision",
    "decide": "decision",
    "measure_pool": "measure",
}
__all__ = sorted(_PUBLIC)


def __getattr__(name: str):
    """Import a public name on first use (PEP 562), so that importing one module of this room
    does not import the others (the pool's imports start Ray's, the run's start vLLM's)."""
    if name not in _PUBLIC:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f"{__name__}.{_PUBLIC[name]}"), name)
