"""The vLLM engine and what it reads: one builder for every front end, the prompt as token ids, label scoring.

build.py      the offline vLLM engine (``build_engine``, ``Classifier``); serve's async engine shares its arguments
args.py       the model's compute dtype, and the vLLM engine arguments (returned with the environment they need)
prompt.py     the one prompt builder: token ids through the ``tokenizers`` library, windows of long documents
scoring.py    documents to prompts and sampling parameters, first-token log-probabilities to result records
"""
