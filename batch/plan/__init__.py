"""The lot plan: ``docpilot plan``'s order summary and per-card memory fit.

plan.py  build_plan, memory_plan, order_summary, lease_end
lots.py  LotsConfig, load_lots, job_shape, gpu_spec: the lots file and the job it sizes
"""

from batch import public_face

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
__getattr__ = public_face(__name__, _PUBLIC)
