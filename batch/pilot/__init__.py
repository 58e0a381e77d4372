"""The pilot: a 12-document batch with one planned reject and a recorded decision.

run.py       run_pilot, PilotHooks: ``docpilot pilot`` through the batch's own run (batch.run.attempt)
inputs.py    the pilot set and its labels
decision.py  build_summary, decide: the summary and the decision (proceed, fix the environment, revisit)
doctor.py    ``docpilot doctor``: interpreter, torch, devices, vLLM, Ray, disk and memory, before the pilot
measure.py   measure_pool: the memory and throughput the pilot measured, beside the plan's estimate
"""
