"""The base model and what fits: its files in the model cache, its shape, the memory engines and training need.

model.py      base-model provisioning: the local model cache and weight fingerprints
model_cli.py  ``docpilot model``: provision the configured base model
shape.py      a decoder-only model's shape and its LoRA parameter count
memory.py     memory estimates of engines and training, tensor-parallel choice
"""
