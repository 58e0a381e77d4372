"""The pilot: a 12-document batch with one planned reject and a recorded decision.

run.py       run_pilot, PilotHooks: ``docpilot pilot`` through the batch's own run (batch.run.attempt)
inputs.py    the pilot set and its labels
decision.py  build_summary, decide: the summary and the decision (proceed, fix the environment, revisit)
measure.py   measure_pool: the memory and throughput the pilot measured, beside the plan's estimate
"""

from batch import public_face

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
__getattr__ = public_face(__name__, _PUBLIC)
