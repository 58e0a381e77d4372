"""The merged-model cache: one adapter merged into its base model once, reused by pilot and batch.

A batch with one adapter runs fastest with the adapter merged into the base weights
(``model.adapter_mode: "merged"``): the engine then has no LoRA slots and no per-token LoRA
cost, and computes the same function (``W' = W + (alpha / r) B A``, Hu et al. 2021, eq. 3).
The merge (:func:`adapters.registry.merge.merge_adapter`, peft ``merge_and_unload``) is done once per
(base model fingerprint, adapter sha256, dtype) into

    <model cache>/merged/<base fingerprint, 16 hex>-<adapter sha256, 16 hex>-<dtype>/

written atomically (a temporary folder renamed into place) under a file lock, so concurrent
builders (a pilot and a batch driver, two drivers) merge once and the others wait and reuse it.
Its ``fingerprint.json`` names the adapter, the base and the sha256 of the merged weights; every
reuse re-hashes the weights and checks the names, like a registry load. A folder that fails the
check (edited, truncated, half-deleted) is logged loudly, moved aside and rebuilt.
"""

from __future__ import annotations

import json
import logging
import shutil
import time
from pathlib import Path
from typing import Any

from filelock import FileLock

from adapters.registry import merge
from classify.errors import AdapterError
from classify.model.model import FINGERPRINT_FILE, ModelRef, weights_fingerprint
from classify.paths import model_cache_dir

log = logging.getLogger(__name__)

MERGED_DIR = "merged"
"""Sub-folder of the model cache holding merged models."""

LOCK_TIMEOUT_S = 1800
"""How long a second builder waits for the first one's merge (a 7B model merges in minutes on a CPU)."""


def merged_folder(base: ModelRef, adapter_sha256: str, dtype: str, cache: Path | None = None) -> Path:
    """Where the merge of ``adapter_sha256`` into ``base`` in ``dtype`` is cached.

    Args:
        base: the resolved base model (its fingerprint must be set: a hub id without local weights cannot be merged).
        adapter_sha256: the adapter's content hash from its registry card.
        dtype: dtype of the merged weights (``bfloat16``, ``float16`` or ``float32``).
        cache: model cache root (default :func:`classify.paths.model_cache_dir`).

    Returns:
        The folder path (it may not exist yet).

    Raises:
        AdapterError: the base model has no fingerprint (not a local folder).
    """
    if not base.fingerprint:
        raise AdapterError(f"base model {base.name!r} has no local weights to merge an adapter into; "
                           "use a local model folder, or set `model.adapter_mode` to \"lora\"")
    short_base = base.fingerprint.removeprefix("sha256:")[:16]
    return (cache or model_cache_dir()) / MERGED_DIR / f"{short_base}-{adapter_sha256[:16]}-{dtype}"


def check_merged(folder: Path, base: ModelRef, adapter_sha256: str, dtype: str) -> tuple[dict[str, Any] | None, str]:
    """Verify a cached merged model like a registry entry: names and a fresh hash of its weights.

    Args:
        folder: the cached folder.
        base: the base model it must have been merged into.
        adapter_sha256: the adapter it must hold.
        dtype: the dtype it must have been saved in.

    Returns:
        ``(card, "")`` when it checks out, else ``(None, reason)``.
    """
    marker = folder / FINGERPRINT_FILE
    if not (folder / "config.json").is_file() or not marker.is_file():
        return None, f"{folder} has no config.json or {FINGERPRINT_FILE}"
    try:
        card = json.loads(marker.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        return None, f"{marker} is unreadable: {err}"
    expected = {"adapter_sha256": adapter_sha256, "base_fingerprint": base.fingerprint, "dtype": dtype}
    wrong = [f"{k} {card.get(k)!r} (expected {v!r})" for k, v in expected.items() if card.get(k) != v]
    if wrong:
        return None, f"{marker} names another merge: {'; '.join(wrong)}"
    try:
        actual = weights_fingerprint(folder)
    except Exception as err:  # noqa: BLE001 - a missing weight file is a failed check, not a crash
        return None, f"{folder}: {err}"
    if actual != card.get("fingerprint"):
        return None, f"weights of {folder} hash to {actual}, its card says {card.get('fingerprint')} (modified since the merge)"
    return card, ""


def merged_model(adapter: Any, base: ModelRef, dtype: str, cache: Path | None = None) -> ModelRef:
    """Return the base model with ``adapter`` merged in, merging it once and verifying every reuse.

    Args:
        adapter: a verified :class:`adapters.registry.registry.ResolvedAdapter` for ``base``.
        base: the resolved base model (:func:`classify.model.model.resolve_model`).
        dtype: dtype of the merged weights; pass the engine's compute dtype
            (:func:`classify.engine.args.compute_dtype`) so the engine reads them without a cast.
        cache: model cache root (default :func:`classify.paths.model_cache_dir`).

    Returns:
        A :class:`ModelRef` whose ``path`` is the merged folder and ``fingerprint`` the sha256 of
        the merged weights; use it as the engine's base model with LoRA off.

    Raises:
        AdapterError: the adapter was trained on another base, the base has no local weights, the
            lock was not obtained within :data:`LOCK_TIMEOUT_S`, or a fresh merge fails its own check.
        EnvironmentCheckError: not enough free disk for the merged weights.
    """
    folder = merged_folder(base, adapter.sha256, dtype, cache)
    folder.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(folder) + ".lock", timeout=LOCK_TIMEOUT_S)
    with lock:
        if folder.exists():
            card, problem = check_merged(folder, base, adapter.sha256, dtype)
            if card is not None:
                log.info("merged model %s + %s: reusing %s (weights re-hashed: %s)", base.name, adapter.ref,
                         folder, card["fingerprint"][:19])
                return _ref(folder, card, adapter.ref)
            stale = folder.with_name(f".{folder.name}-stale-{time.time_ns()}")
            log.warning("!!! merged model cache %s FAILED its check (%s); moving it to %s and merging again",
                        folder, problem, stale.name)
            folder.rename(stale)
            shutil.rmtree(stale, ignore_errors=True)
        started = time.monotonic()
        log.info("merging adapter %s into %s (%s) -> %s", adapter.ref, base.name, dtype, folder)
        merge.merge_adapter(adapter, folder, dtype=dtype, base=base)
        card, problem = check_merged(folder, base, adapter.sha256, dtype)
        if card is None:
            raise AdapterError(f"the merge of {adapter.ref} just written fails its own check: {problem}")
        log.info("merged %s in %.1f s: %s", adapter.ref, time.monotonic() - started, card["fingerprint"][:19])
        return _ref(folder, card, adapter.ref)


def _ref(folder: Path, card: dict[str, Any], adapter_ref: str) -> ModelRef:
    return ModelRef(name=card.get("name") or f"merged {adapter_ref}", path=str(folder.resolve()),
                    fingerprint=card["fingerprint"], source=card.get("source", f"merged {adapter_ref}"))
