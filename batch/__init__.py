"""Batch: the corpus, the Ray pool, a run and its files, the pilot, reports and the lot plan.

Rooms, by floor: a module imports its own room and lower floors only (``tests/unit/project/test_batch_rooms.py``
checks it, and that there is no import circle); each sub-package's ``__init__`` names its public face.

floor 0
config.py    BatchConfig, RunConfig, CorpusConfig: the user-facing ``corpus`` and ``batch`` config sections
runfiles.py  Manifest, Shard, ProgressFile: ``manifest.json`` (and its shard plan) and ``progress.json`` as pydantic models
layout.py    the run folder: file names (manifest.json, progress.json, shards/, results.*) and their readers
rows.py      result rows as Arrow tables: the results schema, the one columnar reader and row matcher
floor 1
corpus/      the corpus plan, format readers, shard bytes, duplicate ids, labels
plan/        ``docpilot plan``: the lot order summary, per-card memory fit and the lots file (lease end)
floor 2
pool/        the Ray pool: engine actors and the shard scheduler
report/      the quality report of a labelled run
floor 3
run/         ``docpilot batch``: driver, attempt, manifest, merge, export, status, lease, submit, detach, wrap-up
floor 4
pilot/       ``docpilot pilot``: a 12-document batch and its decision

``make pilot`` (:mod:`batch.pilot.run`) proves the path on 12 documents; ``make batch`` runs the
full corpus over Ray engine actors, resumable by manifest; ``make plan`` sizes the lots.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


def public_face(package: str, public: dict[str, str]) -> Callable[[str], Any]:
    """A sub-package's module ``__getattr__`` (PEP 562) that imports a public name on first use.

    Importing one module of a room then does not import the others (the pool's imports start Ray's,
    the run's start vLLM's).

    Args:
        package: the sub-package's ``__name__`` (``batch.run``).
        public: public name -> the module of the room that defines it (``{"run_batch": "driver"}``).

    Returns:
        ``__getattr__(name)``: the name from its module.

    Raises:
        AttributeError (from the returned function): ``name`` is not in ``public``.
    """

    def __getattr__(name: str) -> Any:
        if name not in public:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(f"{package}.{public[name]}"), name)

    return __getattr__

