"""Adapters: everything that makes or keeps LoRA adapters.

Owns the adapter registry (``<DOCPILOT_REGISTRY>/<name>/<version>/`` with the peft files
and ``card.json``), LoRA training with checkpoints and resume (``make train``), and
merging an adapter into a full model. Shared by the training and serving images.

Rooms, by floor: a module imports its own room, rooms of its floor without a loop, and lower floors.

floor 0
registry/  the registry: cards, resolved versions, engine compatibility, export and import, merge, the merged cache
floor 1
train/     LoRA training: data, the loop, checkpoints, the end-of-run checks, calibration, the scaled recipe
"""
