"""Adapters: everything that makes or keeps LoRA adapters.

Owns the adapter registry (``<DOCPILOT_REGISTRY>/<name>/<version>/`` with the peft files
and ``card.json``), LoRA training with checkpoints and resume (``make train``), and
merging an adapter into a full model. Shared by the training and serving images.
"""
