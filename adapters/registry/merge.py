"""Merge a published LoRA adapter into its base model (for engines without LoRA support).

``docpilot adapters merge name@version --out DIR`` writes a full Hugging Face model folder
(peft ``merge_and_unload``: W' = W + (alpha / r) B A, Hu et al. 2021, eq. 3) with its own
``fingerprint.json``, so :func:`classify.model.model.resolve_model` accepts it as a base model.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from adapters.registry.registry import ResolvedAdapter
from classify.config.sections import ModelConfig
from classify.errors import AdapterError
from classify.model.model import (
    FINGERPRINT_FILE,
    TOKENIZER_FILES,
    ModelRef,
    resolve_model,
    weights_fingerprint,
)
from classify.runs.disk import check_disk
from classify.runs.files import atomic_dir
from classify.runs.records import utc_now


def merge_adapter(adapter: ResolvedAdapter, out_dir: Path, dtype: str = "bfloat16", base: ModelRef | None = None) -> dict[str, Any]:
    """Write base model + adapter as one dense model folder, atomically.

    The sum ``W + (alpha / r) B A`` is taken in float32 and only then cast to ``dtype``, so a
    bfloat16 result is the float32 merge rounded once (a small ``B A`` added in bfloat16 would be
    rounded away against ``W``).

    Args:
        adapter: a verified adapter (from :meth:`adapters.registry.registry.Registry.resolve`).
        out_dir: destination folder; must not exist.
        dtype: dtype of the saved weights (``bfloat16``, ``float16`` or ``float32``).
        base: the adapter's base model, already resolved (default: resolve the card's ``base_model.name``).

    Returns:
        ``{"path", "fingerprint", "adapter", "base_fingerprint"}`` (also written to ``fingerprint.json``).

    Raises:
        AdapterError: ``out_dir`` exists, or the base model found is not the one the adapter was trained on.
        EnvironmentCheckError: not enough free disk for the merged weights.
    """
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    out_dir = Path(out_dir)
    if out_dir.exists():
        raise AdapterError(f"merge output {out_dir} already exists; choose a new folder")
    base_name = base.name if base is not None else adapter.card.get("base_model", {}).get("name", "")
    base = base or resolve_model(ModelConfig(base_model=base_name, dtype=dtype))
    if base.fingerprint != adapter.base_fingerprint:
        raise AdapterError(
            f"adapter {adapter.ref} was trained on {adapter.base_fingerprint} but base model {base_name!r} "
            f"resolves to {base.fingerprint}; cannot merge"
        )
    weights = sum(p.stat().st_size for p in Path(base.path).glob("*.safetensors"))
    weights = weights * 2 if dtype == "float32" else weights  # the cache keeps bf16; float32 doubles it
    check_disk(out_dir.parent, {"merged_model": weights, "total": weights})
    with atomic_dir(out_dir) as staged:
        tmp = staged.path
        model = AutoModelForCausalLM.from_pretrained(base.path, dtype=torch.float32)
        merged = PeftModel.from_pretrained(model, str(adapter.path)).merge_and_unload()
        merged.to(getattr(torch, dtype)).save_pretrained(tmp, safe_serialization=True)
        for name in TOKENIZER_FILES:
            if (Path(base.path) / name).is_file():
                shutil.copy2(Path(base.path) / name, tmp / name)
        info = {
            "name": f"{base_name}+{adapter.ref}",
            "fingerprint": weights_fingerprint(tmp),
            "source": f"peft merge_and_unload of {adapter.ref} (sha256 {adapter.sha256}) into {base.fingerprint}",
            "adapter": adapter.ref,
            "adapter_sha256": adapter.sha256,
            "base_fingerprint": base.fingerprint,
            "dtype": dtype,
            "created": utc_now(),
        }
        (tmp / FINGERPRINT_FILE).write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")
    return {"path": str(out_dir), **{k: info[k] for k in ("fingerprint", "adapter", "base_fingerprint")}}
