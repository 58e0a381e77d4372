"""The vLLM engine and what it reads: one builder for every front end, the prompt as token ids, label scoring.

build.py      the offline vLLM engine (``build_engine``, ``Classifier``); serve's async engine shares its arguments
args.py       the device and dtype, and the vLLM engine arguments (returned with the environment they need)
prompt.py     the one prompt builder: token ids through the ``tokenizers`` library, windows of long documents
scoring.py    documents to prompts and sampling parameters, first-token log-probabilities to result records
model.py      base-model provisioning: the local model cache and weight fingerprints
model_cli.py  ``docpilot model``: provision the configured base model
shape.py      a decoder-only model's shape and its LoRA parameter count
memory.py     memory estimates of engines and training, tensor-parallel choice
machine.py    what this machine has (cards, driver) and the install profile; runs without the venv
python_gate.py  the refusal of a Python the pinned wheels do not serve; run by path on any Python 3, first
"""
