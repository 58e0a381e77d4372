"""The adapter registry shared by the training and serving images.

Layout (``DOCPILOT_REGISTRY``, default ``<state>/registry``)::

    <root>/<name>/<version>/adapter_config.json        peft files (immutable once published)
    <root>/<name>/<version>/adapter_model.safetensors
    <root>/<name>/<version>/loss_curve.png ...         any other published file (hashed too)
    <root>/<name>/<version>/card.json                  the card (see :data:`CARD_FILE`)

``card.json`` holds the base model (name + fingerprint), the sha256 of every other file,
the adapter's content hash, the training config, metrics, code revision, creation time
and the pilot status. Versions are positive integers; a version is published by writing
a temporary folder and renaming it into place, and an existing version is never replaced.
Every :meth:`Registry.resolve` re-hashes the files and, when asked, checks the base-model
fingerprint, so a flipped byte or a wrong base model is refused before vLLM loads it. Given the
engine's settings, publish and resolve also refuse an adapter the engine's LoRA support cannot
apply (:func:`adapters.registry.compat.check_engine_compat`), since vLLM refuses it only inside the engine.

Example:
    >>> reg = Registry()  # doctest: +SKIP
    >>> adapter = reg.resolve("topics@latest", base_fingerprint=model.fingerprint)  # doctest: +SKIP
    >>> classifier.classify(docs, adapter=adapter.handle())  # doctest: +SKIP
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any, Literal

from filelock import FileLock

from adapters.registry.card import (
    ADAPTER_CONFIG_FILE,
    ADAPTER_WEIGHTS_FILE,
    CARD_FILE,
    CARD_SCHEMA,
    PILOT_STATUSES,
    REQUIRED_FILES,
    AdapterCard,
    CardPilot,
    content_sha256,
    parse_card,
)
from adapters.registry.compat import check_engine_compat
from adapters.registry.resolved import NAME_RE, ResolvedAdapter, lora_int_id, parse_ref
from classify.errors import AdapterError, AdapterIntegrityError, AdapterNotFound
from classify.paths import registry_dir
from classify.runs.export import compare_sha256
from classify.runs.files import atomic_dir, tree_sha256
from classify.runs.records import code_revision, package_versions, utc_now, write_json_atomic

__all__ = [  # the card and reference helpers live in adapters.registry.card and adapters.registry.resolved; importable from here too
    "ADAPTER_CONFIG_FILE", "ADAPTER_WEIGHTS_FILE", "CARD_FILE", "CARD_SCHEMA", "NAME_RE", "PILOT_STATUSES",
    "REQUIRED_FILES", "AdapterCard", "CardPilot", "Registry", "ResolvedAdapter", "content_sha256", "lora_int_id",
    "parse_card", "parse_ref",
]

def _adapter_files(folder: Path) -> dict[str, str]:
    """sha256 of every regular file under ``folder`` except the card and hidden files."""
    return tree_sha256(folder, skip={CARD_FILE})


class Registry:
    """A folder of named, versioned, hash-verified LoRA adapters.

    Args:
        root: registry folder (default :func:`classify.paths.registry_dir`, ``DOCPILOT_REGISTRY``).
            It is created on the first publish.
    """

    def __init__(self, root: Path | str | None = None):
        self.root = Path(root) if root is not None else registry_dir()

    def __repr__(self) -> str:
        return f"Registry({str(self.root)!r})"

    # ---- reading -------------------------------------------------------------------------------

    def versions(self, name: str) -> list[int]:
        """Published versions of ``name``, ascending (empty when unknown)."""
        folder = self.root / name
        if not folder.is_dir():
            return []
        return sorted(int(p.name) for p in folder.iterdir() if p.name.isdigit() and (p / CARD_FILE).is_file())

    def names(self) -> list[str]:
        """Adapter names with at least one published version, sorted."""
        if not self.root.is_dir():
            return []
        return sorted(p.name for p in self.root.iterdir() if NAME_RE.match(p.name) and self.versions(p.name))

    def next_version(self, name: str) -> int:
        """The version a new publish of ``name`` should take (1 for a new name)."""
        parse_ref(name)
        found = self.versions(name)
        return found[-1] + 1 if found else 1

    def _load(self, name: str, version: int) -> ResolvedAdapter:
        path = self.root / name / str(version)
        try:
            card = json.loads((path / CARD_FILE).read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise AdapterNotFound(f"adapter {name}@{version} not found in registry {self.root}") from None
        except (OSError, json.JSONDecodeError) as err:
            raise AdapterIntegrityError(f"adapter {name}@{version}: {CARD_FILE} is unreadable: {err}") from None
        info = parse_card(card, f"adapter {name}@{version}: {CARD_FILE}")
        return ResolvedAdapter(name, version, path, card, info.sha256, info)

    def _locate(self, ref: str) -> tuple[str, int]:
        name, version = parse_ref(ref)
        found = self.versions(name)
        if not found:
            known = ", ".join(self.names()) or "none"
            raise AdapterNotFound(f"adapter {name!r} not found in registry {self.root} (known adapters: {known})")
        if version is None:
            return name, found[-1]
        if version not in found:
            raise AdapterNotFound(
                f"adapter {name}@{version} not found in registry {self.root} (published versions: {found})"
            )
        return name, version

    def show(self, ref: str) -> ResolvedAdapter:
        """Read one version's card without re-hashing its files (for listings; loads use :meth:`resolve`).

        Raises:
            AdapterNotFound: unknown name or version.
        """
        return self._load(*self._locate(ref))

    def list(self) -> list[ResolvedAdapter]:
        """Every published version whose card reads, by name then version (see :meth:`scan` for the others).
        Cards are read, files are not re-hashed."""
        return self.scan()[0]

    def scan(self) -> tuple[list[ResolvedAdapter], list[str]]:
        """Every published version, by name then version, and why any of them could not be read.

        One unreadable or malformed ``card.json`` does not hide the other versions: it is named in the
        second list instead (the :class:`AdapterError` message).

        Returns:
            ``(adapters, problems)``.
        """
        adapters: list[ResolvedAdapter] = []
        problems: list[str] = []
        for name in self.names():
            for version in self.versions(name):
                try:
                    adapters.append(self._load(name, version))
                except AdapterError as err:
                    problems.append(str(err))
        return adapters, problems

    def resolve(self, ref: str, base_fingerprint: str | None = None, engine: Any = None,
                base_model_path: str | Path | None = None) -> ResolvedAdapter:
        """Find an adapter version and verify it before anything loads it.

        Args:
            ref: ``name@version``, ``name@latest`` or ``name`` (= latest).
            base_fingerprint: the engine's base-model fingerprint (``ModelRef.fingerprint``); when
                given, the card's base-model fingerprint must equal it.
            engine: the engine section (:class:`classify.config.sections.EngineConfig`) the adapter will run
                under; when given, the adapter must be one its LoRA support can apply.
            base_model_path: the engine's base model folder (``ModelRef.path``), for the module and
                shape checks of :func:`adapters.registry.compat.check_engine_compat` (with ``engine``).

        Returns:
            The verified :class:`ResolvedAdapter`.

        Raises:
            AdapterError: malformed ``ref``.
            AdapterNotFound: unknown name or version.
            AdapterIntegrityError: a file is missing, unlisted or differs from its card sha256, or
                the base-model fingerprint does not match.
            AdapterIncompatible: ``engine`` is given and cannot apply the adapter (rank over
                ``max_lora_rank``, DoRA, ``modules_to_save``, ...; the message names each).
        """
        adapter = self.show(ref)
        problems = self.check(adapter)
        if problems:
            raise AdapterIntegrityError(
                f"adapter {adapter.ref} failed verification and was not loaded: {'; '.join(problems)}"
            )
        if base_fingerprint is not None and adapter.base_fingerprint != base_fingerprint:
            base_name = adapter.card.get("base_model", {}).get("name", "?")
            raise AdapterIntegrityError(
                f"adapter {adapter.ref} was trained on base model {base_name} ({adapter.base_fingerprint or 'no fingerprint'}) "
                f"but the engine's base model has fingerprint {base_fingerprint}; "
                "use an adapter trained on this base model or load its base model"
            )
        if engine is not None:
            check_engine_compat(adapter.path, engine, base_model_path, label=adapter.ref)
        return adapter

    def check(self, adapter: ResolvedAdapter) -> list[str]:
        """Re-hash an adapter's files against its card.

        Returns:
            Problems found (empty = intact): missing, unlisted or changed files, a wrong content hash.
        """
        listed: dict[str, str] = adapter.card.get("files") or {}
        if not listed:
            return [f"{CARD_FILE} lists no files"]
        problems = compare_sha256(listed, _adapter_files(adapter.path), CARD_FILE, listed_as="card")
        if not problems and content_sha256(listed) != adapter.sha256:
            problems.append(f"content sha256 {content_sha256(listed)[:12]}... != card {adapter.sha256[:12]}...")
        return problems

    # ---- writing -------------------------------------------------------------------------------

    def publish(self, src_dir: Path | str, name: str, version: int | str, card_fields: dict[str, Any], *,
                engine: Any = None, base_model_path: str | Path | None = None) -> ResolvedAdapter:
        """Copy a saved peft adapter into the registry as ``name@version`` (atomic, immutable).

        The files are copied into a temporary folder next to the target, hashed, the card is
        written, and the folder is renamed into place; a concurrent or repeated publish of the
        same version fails at the rename and leaves the published one untouched.

        Args:
            src_dir: folder holding ``adapter_config.json`` and ``adapter_model.safetensors``
                (plus any extra files to keep, e.g. ``loss_curve.png``; hidden files are skipped).
            name: adapter name (lower case, digits, ``.``, ``_``, ``-``).
            version: positive integer (see :meth:`next_version`).
            card_fields: card content; must hold ``base_model: {"name": ..., "fingerprint": ...}``;
                usually also ``training``, ``metrics`` and ``loss_curve``. ``files``, ``sha256``,
                ``name``, ``version``, ``created``, ``code_revision`` and ``pilot`` are set here.
            engine: the engine section the adapter must run under (``max_lora_rank``...); default the
                ``engine`` section of ``card_fields["training"]["config"]`` when there is one, else
                the engine checks are skipped.
            base_model_path: the base model folder, for the module and shape checks.

        Returns:
            The published, verified adapter.

        Raises:
            AdapterError: bad name/version, missing peft files, missing base-model fingerprint,
                or the version already exists (versions are immutable).
            AdapterIncompatible: the engine cannot apply the adapter (nothing is published).
        """
        src = Path(src_dir)
        name, _ = parse_ref(name)
        _, ver = parse_ref(f"{name}@{version}")
        if ver is None:
            raise AdapterError(f"publish needs an explicit version, got {version!r}")
        missing = [f for f in REQUIRED_FILES if not (src / f).is_file()]
        if missing:
            raise AdapterError(f"cannot publish {src}: missing peft file(s) {missing} (save with peft's save_pretrained)")
        if engine is None:
            engine = ((card_fields.get("training") or {}).get("config") or {}).get("engine")
        if engine is not None:
            check_engine_compat(src, engine, base_model_path, label=f"{name}@{ver}")
        base = card_fields.get("base_model")
        if not isinstance(base, dict) or not base.get("fingerprint") or not base.get("name"):
            raise AdapterError(
                "card_fields `base_model` must be {'name': ..., 'fingerprint': ...} "
                f"(the base model the adapter was trained on), got {base!r}"
            )
        ref = f"{name}@{ver}"
        target = self.root / name / str(ver)
        if target.exists():
            raise AdapterError(f"adapter {ref} already exists in {self.root}; versions are immutable, publish a new version")
        try:
            with atomic_dir(target, suffix=".tmp", mode=0o755) as staged:  # renamed into place whole
                tmp = staged.path
                for path in sorted(src.rglob("*")):
                    rel = path.relative_to(src)
                    if path.is_file() and rel.as_posix() != CARD_FILE and not any(p.startswith(".") for p in rel.parts):
                        (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
                        shutil.copy2(path, tmp / rel)
                files = _adapter_files(tmp)
                card = {
                    **card_fields,
                    "schema": CARD_SCHEMA,
                    "name": name,
                    "version": ver,
                    "ref": ref,
                    "files": files,
                    "sha256": content_sha256(files),
                    "created": utc_now(),
                    "code_revision": card_fields.get("code_revision") or code_revision(),
                    "packages": card_fields.get("packages") or package_versions(("docpilot", "torch", "transformers", "peft")),
                    "pilot": {"status": "not-run", "run_id": None, "at": None, "history": []},
                }
                write_json_atomic(tmp / CARD_FILE, parse_card(card, f"adapter {ref}: {CARD_FILE}").to_json())
        except FileExistsError:  # the rename lost a race: another publish of this version won
            raise AdapterError(
                f"adapter {ref} already exists in {self.root}; versions are immutable, publish a new version"
            ) from None
        return self.resolve(ref)

    def set_pilot_status(self, ref: str, status: Literal["passed", "failed"], run_id: str) -> ResolvedAdapter:
        """Record a pilot outcome in the card (atomic rewrite of ``card.json`` only; files stay immutable).

        Args:
            ref: ``name@version`` (``latest`` is resolved first).
            status: ``passed`` or ``failed``.
            run_id: the pilot's run folder name.

        Returns:
            The adapter with its updated card.

        Raises:
            AdapterError: ``status`` is not allowed.
            AdapterNotFound: unknown adapter.
        """
        if status not in PILOT_STATUSES:
            raise AdapterError(f"pilot `status` must be one of {list(PILOT_STATUSES)}, got {status!r}")
        name, version = self._locate(ref)
        with FileLock(str(self.root / name / f".{version}.lock"), timeout=30):
            adapter = self._load(name, version)
            at = utc_now()
            history = [*adapter.info.pilot.history, {"status": status, "run_id": run_id, "at": at}]
            pilot = CardPilot(status=status, run_id=run_id, at=at, history=history)
            write_json_atomic(adapter.path / CARD_FILE, {**adapter.card, "pilot": pilot.model_dump(mode="json")})
        return self._load(name, version)
