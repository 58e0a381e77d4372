"""LoRA training: ``docpilot train`` from the data file to a published adapter (above the registry).

train.py        ``docpilot train`` / ``make train``: the run, its stages, resume, checks and publish
data.py         training data: every row read and checked before training, split, tokenized, batched
loop.py         the optimisation loop: model setup, the answer-only loss, checkpoints and resume
checkpoint.py   atomic checkpoints (LoRA weights, optimizer, scheduler, RNG, loss history) and the run's inputs
validate.py     end-of-run checks: the loss fell, checkpoints exist, validation rows in the inference format
recipe.py       the ``scaled`` recipe: a step budget that fits the row count, early stopping, the final fit
calibration.py  score calibration: expected calibration error, temperature scaling, a reliability diagram
support.py      around a run: the disk plan, write failures told from bugs, the loss curve, the support note
"""
