"""Shared classification core of docpilot: what the pilot and the batch (``batch/``), the HTTP server
(``serve/``) and LoRA training (``adapters/``) all need. Nothing heavy (torch, vLLM, transformers) is imported
at import time.

Rooms, by floor: a module imports its own room, rooms of its floor without a loop, and lower floors (``tests/unit/project/test_rooms.py``
checks it, that there is no import circle, and that every module here serves more than one outside package).

floor 0
machine/        what the machine has (the probe ``make setup`` runs before any venv) and the device torch computes on
errors.py       the one exception hierarchy, mapped once to CLI exit codes and HTTP statuses
records.py      ``Document`` and ``Result``: the one result record pilot, batch and serve emit
usercommand.py  the user's own command form in every hint (``make`` variables or CLI flags)
floor 1
paths.py        where docpilot keeps its state (``DOCPILOT_*`` variables)
config/         the config file and its sections (classify, model, engine, ...)
floor 2
runs/           run folders and what is written there: records, files, storage, export, accounting, the gate, plots
floor 3
documents/      reading documents and the text rules every reader applies
model/          the base model and what fits: the model cache, its shape, memory estimates, tensor parallel
floor 4
engine/         the vLLM engine: its arguments, the prompt as token ids, scoring
"""

__all__ = ["__version__"]
__version__ = "0.1.0"
