"""The venv is what its lock says, and the locks pin everything docpilot's install brings (cheap: no index).

``tests/slow/test_profile_locks.py`` resolves each lock with pip's resolver for every Python it claims; these
tests read only what is installed here and the lock files (requirements/lock.py).
"""

from __future__ import annotations

import importlib.util
import sys
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[3]
_spec = importlib.util.spec_from_file_location("docpilot_locks", ROOT / "requirements" / "lock.py")
locks = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(locks)


def _installed_profile() -> str:
    from classify.machine.probe import installed_profile

    rec = installed_profile()
    if rec is None:
        pytest.skip(f"this venv ({sys.prefix}) was not made by `make setup`: it has no lock to equal")
    return rec["profile"]


def test_the_fresh_venv_equals_its_lock():
    # `make setup` installs every step with -c requirements/<profile>.lock: pip freeze must be the lock exactly
    lock = ROOT / "requirements" / f"{_installed_profile()}.lock"
    assert locks.compare(lock) == [], f"the venv differs from {lock.name} (rebuild it on purpose: requirements/README.md)"


def _closure(roots: list[str], skip: set[str]) -> set[str]:
    """Every distribution that installing ``roots`` brings, read from the installed metadata (markers and extras);
    ``skip``: names not followed (the wheels ``make setup`` uninstalls)."""
    seen: set[tuple[str, frozenset[str]]] = set()
    todo = [Requirement(r) for r in roots]
    while todo:
        req = todo.pop()
        key = (canonicalize_name(req.name), frozenset(req.extras))
        if key[0] in skip or key in seen or (req.marker is not None and not req.marker.evaluate({"extra": ""})):
            continue
        seen.add(key)
        extras = req.extras | {""}
        for line in metadata.requires(req.name) or []:
            sub = Requirement(line)
            if sub.marker is None or any(sub.marker.evaluate({"extra": e}) for e in extras):
                sub.marker = None
                todo.append(sub)
    return {name for name, _ in seen}


def test_every_distribution_the_install_brings_is_pinned():
    # a new dependency of docpilot (or of one of its dependencies) cannot slip into a fresh venv unpinned
    profile = _installed_profile()
    pinned = locks.pins_for(ROOT / "requirements" / f"{profile}.lock")
    brought = _closure([*locks.project_requirements(), *locks.PROFILE_ROOTS[profile]], skip=locks.REMOVED[profile])
    assert sorted(brought - set(pinned)) == []


@pytest.mark.parametrize("lock", ["cpu.lock", "cuda.lock"])
@pytest.mark.parametrize("python", locks.CLAIMED["python"])
def test_each_lock_pins_every_direct_requirement_within_its_range(lock, python):
    # pyproject's ranges and the lock agree for every Python the lock claims (the full resolution is slow-tier)
    pins = locks.pins_for(ROOT / "requirements" / lock, locks.marker_env(python))
    wrong = []
    for line in locks.project_requirements():
        req = Requirement(line)
        version = pins.get(canonicalize_name(req.name))
        if version is None or not req.specifier.contains(version, prereleases=True):
            wrong.append(f"{req}: lock has {version}")
    assert wrong == []


def test_a_lock_line_that_is_not_one_exact_pin_is_refused(tmp_path):
    bad = tmp_path / "x.lock"
    bad.write_text("# ok\nrequests==2.34.2\npeft>=0.17\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"x.lock:3: 'peft>=0.17' is not one exact pin"):
        locks.parse_lock(bad)


def test_a_marker_line_holds_only_for_the_python_it_names(tmp_path):
    lock = tmp_path / "y.lock"
    lock.write_text('setuptools==80.10.2 ; python_version >= "3.12"\npeft==0.21.2\n', encoding="utf-8")
    assert locks.pins_for(lock, locks.marker_env("3.12")) == {"setuptools": "80.10.2", "peft": "0.21.2"}
    assert locks.pins_for(lock, locks.marker_env("3.11")) == {"peft": "0.21.2"}
