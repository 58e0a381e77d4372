"""The one config file (config/docpilot.json): shared sections seen alike by every command, per-command views, migration.

Table-driven where it can be; messages checked exactly (peft's ``tests/test_config.py`` habit).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from classify.config.batch import BatchConfig, load_batch_config, results_config_sha256
from classify.config.file import file_data
from classify.config.sections import PilotConfig, classification_sha256, config_sha256, load_config
from classify.config.training import TrainConfig
from classify.errors import ConfigError
from serve.app import load_server_config
from serve.settings import load_settings

ROOT = Path(__file__).resolve().parents[4]
SHIPPED = ROOT / "config" / "docpilot.json"
TOKEN = "tok-" + "0123456789abcdef" * 2  # a usable token (serve refuses a repeated character)


def _write(tmp_path: Path, data: dict, name: str = "docpilot.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


def _all_views(path: Path):
    """What pilot, batch, train and serve each read from ``path``."""
    return {
        "pilot": load_config(PilotConfig, path),
        "batch": load_batch_config(path),
        "train": load_config(TrainConfig, path),
        "serve": load_server_config(load_settings(api_token=TOKEN, config_path=path)),
    }


def test_a_shared_section_edit_is_seen_by_pilot_batch_train_and_serve_alike(tmp_path):
    data = json.loads(SHIPPED.read_text())
    before = _all_views(SHIPPED)
    data["classify"]["categories"] = ["business", "politics", "science", "sport"]
    data["classify"]["max_doc_tokens"] = 200
    data["model"]["max_model_len"] = 2048
    views = _all_views(_write(tmp_path, data))
    for name, cfg in views.items():
        assert cfg.classify.categories == ("business", "politics", "science", "sport"), name
        assert cfg.classify.max_doc_tokens == 200 and cfg.model.max_model_len == 2048, name
        assert cfg.engine == before[name].engine, name
    hashes = {name: classification_sha256(cfg.model, cfg.classify) for name, cfg in views.items()}
    assert len(set(hashes.values())) == 1  # one pilot-gate config key for every command
    old = {classification_sha256(cfg.model, cfg.classify) for cfg in before.values()}
    assert len(old) == 1 and old != set(hashes.values())


def test_category_descriptions_reach_every_command_and_a_changed_one_is_a_new_pilot_gate_key(tmp_path):
    """``classify.descriptions`` (issue 56): read alike by pilot, batch, train and serve, part of the gate key when set."""
    data = json.loads(SHIPPED.read_text())
    plain = {classification_sha256(c.model, c.classify) for c in _all_views(SHIPPED).values()}
    data["classify"]["descriptions"] = {"sport": "games, athletes and results"}
    described = _all_views(_write(tmp_path, data))
    keys = {classification_sha256(c.model, c.classify) for c in described.values()}
    assert all(c.classify.descriptions == {"sport": "games, athletes and results"} for c in described.values())
    assert len(keys) == 1 and keys != plain
    data["classify"]["descriptions"] = {"sport": "games, athletes, results and transfers"}
    changed = {classification_sha256(c.model, c.classify) for c in _all_views(_write(tmp_path, data)).values()}
    assert len(changed) == 1 and changed != keys and changed != plain
    for empty in ({}, None):  # no descriptions: the key of a config without the field (pilots made before it stay valid)
        data["classify"]["descriptions"] = empty
        assert {classification_sha256(c.model, c.classify) for c in _all_views(_write(tmp_path, data)).values()} == plain


@pytest.mark.parametrize(
    ("descriptions", "message"),
    [
        ({"movies": "films"}, r"`classify` `descriptions` must describe categories of `categories`, got \['movies'\]"),
        ({"sport": "games\nand results"}, r"`classify.descriptions` `sport` must be one non-empty line of at most 200 characters, got .games\\nand results."),
        ({"sport": "x" * 201}, r"must be one non-empty line of at most 200 characters"),
    ],
)
def test_a_bad_category_description_is_refused_naming_it(tmp_path, descriptions, message):
    data = json.loads(SHIPPED.read_text())
    data["classify"]["descriptions"] = descriptions
    with pytest.raises(ConfigError, match=message):
        load_config(PilotConfig, _write(tmp_path, data))


def test_each_command_reads_its_own_section():
    views = _all_views(SHIPPED)
    data = json.loads(SHIPPED.read_text())
    assert views["pilot"].thresholds.model_dump() == data["pilot"]["thresholds"]
    assert views["batch"].batch.cpu_actors == data["batch"]["cpu_actors"]
    assert views["batch"].corpus.id_prefix == data["corpus"]["id_prefix"]
    assert views["train"].lora.rank == data["train"]["lora"]["rank"]
    assert views["train"].training.max_steps == data["train"]["training"]["max_steps"]


def test_old_per_command_files_are_refused_with_the_migration_message(tmp_path):
    """A flat per-command file (the old pilot.json/train.json, or a view's dump) is a ConfigError saying what to move."""
    one = {"pilot": load_config(PilotConfig, SHIPPED), "train": load_config(TrainConfig, SHIPPED)}
    own = {"pilot": "`thresholds`, `seed`", "train": "`data`, `lora`, `training`, `smoke`, `checks`, `output`"}
    for name, cls in (("pilot", PilotConfig), ("train", TrainConfig)):
        old = _write(tmp_path, one[name].model_dump(mode="json"), f"{name}.json")
        with pytest.raises(ConfigError) as err:
            load_config(cls, old)
        assert str(err.value) == (
            f"{old} is an old per-command config ({own[name]} at the top level, with its own `model`, `engine` and "
            "`classify`). It is no longer read: the shared sections would have to be kept equal by hand in every "
            "command's file, or the pilot gate refuses the batch and the server. Move to one config/docpilot.json: "
            f"keep `model`, `engine` and `classify` at the top, put {own[name]} under `{name}` (see docs/config.md).")
        again = load_config(cls, _write(tmp_path, file_data(one[name]), f"{name}-one.json"))  # the layout it names
        assert again == one[name] and config_sha256(again) == config_sha256(one[name])
    with pytest.raises(ConfigError, match="put `thresholds`, `seed` under `pilot`"):
        load_config(PilotConfig, _write(tmp_path, {"thresholds": {"min_accuracy": 0.5}}, "p.json"))
    old_batch = {k: v for k, v in json.loads(SHIPPED.read_text()).items() if k not in ("pilot", "train")}
    assert load_batch_config(_write(tmp_path, old_batch, "batch.json")) == load_batch_config(SHIPPED)
    # the old batch.json layout is a valid one-file config as it is, and a batch view's file_data is that layout
    assert load_batch_config(_write(tmp_path, file_data(load_batch_config(SHIPPED)), "b.json")) == load_batch_config(SHIPPED)


@pytest.mark.parametrize(
    ("cls", "data", "message"),
    [
        (PilotConfig, {"pilot": {"thresholds": {"min_accuracy": 1.5}}},
         r"`pilot.thresholds.min_accuracy` must be less than or equal to 1, got 1.5"),
        (TrainConfig, {"train": {"lora": {"rank": 0}}}, r"`train.lora.rank` must be greater than or equal to 1, got 0"),
        (PilotConfig, {"pilot": {"seeed": 1}}, r"`pilot.seeed` is not a known field"),
        (BatchConfig, {"batch": {"cpu_actor": 2}}, r"`batch.cpu_actor` is not a known field"),
        (PilotConfig, {"classify": {"max_doc_tokens": 1}}, r"`classify.max_doc_tokens` must be greater than or equal to 8, got 1"),
        (BatchConfig, {"clasify": {}}, r"`clasify` is not a known section \(allowed: model, engine, classify, pilot, corpus, "
                                       r"batch, train; see docs/config.md\)"),
        (PilotConfig, {"pilot": {}, "thresholds": {}}, r"`thresholds` must be inside `pilot`, not at the top level"),
        # a one-file config (it has `corpus`) with a stray top-level `seed` is not taken for an old pilot.json
        (PilotConfig, {"corpus": {}, "seed": 1}, r"`seed` must be inside `pilot`, not at the top level \(`corpus` given too\)"),
        (TrainConfig, {"train": 3}, r"`train` must be an object with data, lora, training, smoke, checks, output, got int"),
        # a model validator's own message: named once, its value shown once (no "`(root)`", no second ", got dict")
        (TrainConfig, {"train": {"lora": {"rank": 32}}}, r"`lora.rank` must be <= engine.max_lora_rank \(16\), got 32$"),
        (TrainConfig, {"train": {"training": {"max_steps": 5, "epochs": 1}}},
         r"`train.training` exactly one of `max_steps` and `epochs` must be set, got max_steps=5, epochs=1$"),
        # strict numbers: `true` is not 1 epoch, "2" is not 2 (pydantic's lax mode would take both)
        (TrainConfig, {"train": {"training": {"max_steps": None, "epochs": True}}},
         r"`train.training.epochs` must be a number, got true$"),
        (TrainConfig, {"train": {"training": {"max_steps": "400", "epochs": None}}},
         r"`train.training.max_steps` must be a number, got \"400\" \(a string: write 400 without quotes\)$"),
    ],
)
def test_errors_name_the_field_as_written_in_the_file(tmp_path, cls, data, message):
    path = _write(tmp_path, data)
    with pytest.raises(ConfigError, match=rf"{path}: {message}"):
        load_config(cls, path)


def test_overrides_apply_to_the_view_and_a_missing_old_file_points_at_the_new_one(tmp_path):
    cfg = load_config(PilotConfig, SHIPPED, {"thresholds.min_accuracy": 0.5, "model.base_model": "/m"})
    assert cfg.thresholds.min_accuracy == 0.5 and cfg.model.base_model == "/m"
    batch = load_batch_config(SHIPPED, {"corpus.path": "/data/c.jsonl"})
    assert batch.corpus.path == "/data/c.jsonl" and results_config_sha256(batch) == results_config_sha256(load_batch_config(SHIPPED))
    with pytest.raises(ConfigError, match=r"config file .*pilot.json does not exist \(docpilot now reads one "
                                          r"config/docpilot.json for every command; see docs/config.md\)"):
        load_config(PilotConfig, tmp_path / "pilot.json")


@pytest.mark.parametrize("data", [{"batch": None}, {"batch": [1]}, [{"batch": {}}]])
def test_an_override_into_a_section_that_is_not_an_object_is_a_config_error(tmp_path, data):
    path = _write(tmp_path, data)  # e.g. `docpilot batch --cpu-actors 2` with "batch": null in the file
    with pytest.raises(ConfigError, match=rf"{path}: `(batch|\(root\))` must be a valid dictionary"):
        load_batch_config(path, {"batch.cpu_actors": 2})


def test_a_bad_command_line_value_is_blamed_on_the_command_line_not_the_file(tmp_path):
    shipped = Path(__file__).resolve().parents[4] / "config" / "docpilot.json"
    with pytest.raises(ConfigError, match=r"`batch\.cpu_actors` must be greater than or equal to 1, got 0 "
                                           r"\(that value came from the command line, not from .*docpilot\.json\)"):
        load_batch_config(shipped, {"batch.cpu_actors": 0})
    data = json.loads(shipped.read_text())
    data["batch"]["shard_docs"] = 0
    (tmp_path / "bad.json").write_text(json.dumps(data))
    with pytest.raises(ConfigError) as err:  # the file's own bad value: no blame on a flag that is fine
        load_batch_config(tmp_path / "bad.json", {"batch.cpu_actors": 2})
    assert "`batch.shard_docs`" in str(err.value) and "command line" not in str(err.value)


def test_a_folder_given_as_the_config_file_is_named_as_a_folder(tmp_path):
    with pytest.raises(ConfigError, match=r"config file .* is a folder; give the JSON file"):
        load_config(PilotConfig, tmp_path)


@pytest.mark.parametrize("cls", [PilotConfig, BatchConfig, TrainConfig])
def test_every_command_refuses_max_doc_tokens_that_leave_no_room_in_a_prompt(tmp_path, cls):
    data = json.loads(SHIPPED.read_text())
    data["classify"]["max_doc_tokens"] = data["model"]["max_model_len"]
    with pytest.raises(ConfigError) as err:
        load_config(cls, _write(tmp_path, data))
    assert str(err.value) == (
        f"{tmp_path / 'docpilot.json'}: `classify.max_doc_tokens` must be below `model.max_model_len` (1024): a prompt "
        "holds the instructions, the categories and the answer besides the document's tokens, so every document "
        "longer than that would be rejected once the engine runs; lower it or raise `model.max_model_len`, got 1024")
    data["classify"]["max_doc_tokens"] = data["model"]["max_model_len"] - 1  # the template's own length is the engine's to check
    assert load_config(cls, _write(tmp_path, data)).classify.max_doc_tokens == 1023


@pytest.mark.parametrize(("section", "field", "value"), [("batch", "cpu_actors", True), ("classify", "max_doc_tokens", False),
                                                         ("engine", "gpu_memory_utilization", True)])
def test_a_boolean_for_a_number_is_refused_not_read_as_one(tmp_path, section, field, value):
    data = json.loads(SHIPPED.read_text())
    data[section][field] = value
    with pytest.raises(ConfigError, match=rf"`{section}.{field}` must be a number, got {json.dumps(value)}$"):
        load_batch_config(_write(tmp_path, data))


@pytest.mark.parametrize(("section", "field", "value"), [("batch", "shard_docs", "10"), ("classify", "max_doc_tokens", "256"),
                                                         ("engine", "gpu_memory_utilization", "0.9")])
def test_a_string_for_a_number_is_refused_not_converted(tmp_path, section, field, value):
    data = json.loads(SHIPPED.read_text())
    data[section][field] = value
    with pytest.raises(ConfigError, match=rf"`{section}.{field}` must be a number, got \"{value}\" \(a string: write "
                                          rf"{value} without quotes\)$"):
        load_batch_config(_write(tmp_path, data))


LOTS = ROOT / "config" / "lots.json"


@pytest.mark.parametrize(("file", "keys", "value", "says"), [
    ("lots", ("gpus", "H100", "usd_per_lot", "7"), "400", '`gpus.H100.usd_per_lot` must hold numbers, got "400" at 7 '
                                                          "(a string: write 400 without quotes)"),
    ("lots", ("gpus", "H100", "usd_per_lot", "7"), float("inf"), "`gpus.H100.usd_per_lot.7` must be a finite number, got Infinity"),
    ("lots", ("gpus", "H100", "usd_per_lot", "7"), float("nan"), "`gpus.H100.usd_per_lot.7` must be a finite number, got NaN"),
    ("lots", ("gpus", "H100", "card_memory_gib"), float("inf"), "`gpus.H100.card_memory_gib` must be a finite number, got Infinity"),
    ("train", ("train", "lora", "alpha"), float("inf"), "`train.lora.alpha` must be a finite number, got Infinity"),
    ("train", ("train", "training", "weight_decay"), float("inf"), "`train.training.weight_decay` must be a finite number, got Infinity"),
    ("train", ("train", "training", "max_grad_norm"), float("nan"), "`train.training.max_grad_norm` must be a finite number, got NaN"),
    ("batch", ("engine", "gpu_memory_utilization"), float("nan"), "`engine.gpu_memory_utilization` must be a finite number, got NaN"),
])
def test_one_numeric_rule_for_every_config_file(tmp_path, file, keys, value, says):
    """A number in any config file is a finite JSON number: not a string, not Infinity or NaN (which Python's JSON
    reader takes), in a table of numbers (``usd_per_lot``) as in a single field."""
    from batch.plan.lots import load_lots

    data = json.loads((LOTS if file == "lots" else SHIPPED).read_text())
    *parents, last = keys
    node = data
    for key in parents:
        node = node[key]
    node[last] = value
    path = _write(tmp_path, data, "lots.json" if file == "lots" else "docpilot.json")  # json writes Infinity, NaN
    load = {"lots": load_lots, "train": lambda p: load_config(TrainConfig, p), "batch": load_batch_config}[file]
    with pytest.raises(ConfigError) as err:
        load(path)
    assert says in str(err.value)
