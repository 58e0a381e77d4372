"""The lot plan: ``docpilot plan``'s order summary and per-card memory fit.

plan.py  build_plan, memory_plan, order_summary
lots.py  LotsConfig, LeaseSection, load_lots, job_shape, gpu_spec: the lots file (its lease section too) and the
         job it sizes; the lease clock and stop that read it are ``batch/lease/``
"""
