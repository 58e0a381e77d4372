"""The lot plan: ``docpilot plan``'s order summary and per-card memory fit.

plan.py  build_plan, memory_plan, order_summary, lease_end
lots.py  LotsConfig, load_lots, job_shape, gpu_spec: the lots file and the job it sizes
"""
