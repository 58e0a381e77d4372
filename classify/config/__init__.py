"""The one config file and its sections: frozen pydantic models, errors that name the field.

base.py      the frozen base class and the validation-message formatter
sections.py  the sections every command shares: ``model``, ``classify``, ``pilot`` and the classification digest
engine.py    the ``engine`` section: vLLM engine sizing, ``auto`` fields chosen per device
batch.py     the ``corpus`` and ``batch`` sections: ``BatchConfig``, the batch's view of the file
training.py  the ``train`` section (``data``, ``lora``, ``training``, ...): ``TrainConfig``, training's view of the file
file.py      one file for every command: shared sections at the top, one section per command (the views)
"""
