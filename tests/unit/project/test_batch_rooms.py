"""The shape of ``batch/``: rooms on floors, no import circle, nothing imported upward, public faces only.

Every import counts, also the ones inside functions and under ``TYPE_CHECKING`` (a circle hidden in a
function is still a circle a reader must hold in mind).
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import re
from pathlib import Path

import pytest

BATCH = Path(importlib.util.find_spec("batch").submodule_search_locations[0])
ROOT = BATCH.parent

FLOORS = {
    "config": 0, "runfiles": 0, "layout": 0, "rows": 0,  # the user's config sections and the run-folder contract
    "corpus": 1, "plan": 1,  # the corpus and its shard plan; the lot plan and the lots file
    "pool": 2, "report": 2,  # the Ray pool; the quality report
    "run": 3,  # a batch run: driver, attempt, merge, export, status, lease, detach, wrap-up
    "pilot": 4,  # the pilot: a 12-document run of the batch
}
"""Each room of ``batch/`` and its floor: a module may import its own room and rooms on lower floors only."""


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in sorted(BATCH.rglob("*.py"))}


def _room(module: str) -> str:
    return module.split(".")[1] if "." in module else ""


def _batch_imports(path: Path) -> set[str]:
    """The ``batch`` modules a file imports (``from batch.x import y`` names ``batch.x.y`` when that is a module)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and node.module.split(".")[0] == "batch":
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                out.add(full if full in MODULES else node.module)
        elif isinstance(node, ast.Import):
            out |= {alias.name for alias in node.names if alias.name.split(".")[0] == "batch"}
    return out


def _graph() -> dict[str, set[str]]:
    return {m: {t for t in _batch_imports(p) if t in MODULES and t != m} for m, p in MODULES.items()}


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_every_room_has_a_floor_and_the_package_map_names_it():
    rooms = {_room(m) for m in MODULES if _room(m)}
    assert rooms == set(FLOORS)
    package_map = (BATCH / "__init__.py").read_text(encoding="utf-8")
    assert all(re.search(rf"^{room}(\.py|/)\s", package_map, re.M) for room in FLOORS)


def test_no_import_circle_in_batch():
    assert _circles(_graph()) == []


def test_the_circle_check_sees_a_circle():
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_room_imports_a_higher_floor():
    upward = sorted(f"{m} -> {t}" for m, targets in _graph().items() if _room(m)
                    for t in targets if _room(t) and FLOORS[_room(t)] > FLOORS[_room(m)])
    assert upward == []


@pytest.mark.parametrize("room", sorted(r for r in FLOORS if (BATCH / r).is_dir()))
def test_each_room_names_its_public_face(room):
    package = importlib.import_module(f"batch.{room}")
    assert package.__all__ and package.__doc__
    for name in package.__all__:
        assert getattr(package, name).__module__.startswith(f"batch.{room}."), name
    with pytest.raises(AttributeError, match="has no attribute"):
        package.no_such_name  # noqa: B018


def test_no_private_batch_module_and_bench_docs_name_public_modules_only():
    assert [m for m in MODULES if any(part.startswith("_") and part != "__init__" for part in m.split("."))] == []
    named = set()
    for path in [*ROOT.joinpath("bench").rglob("*.py"), *ROOT.joinpath("docs").rglob("*.md"), ROOT / "README.md"]:
        named |= {(path.name, m) for m in re.findall(r"\bbatch(?:\.\w+)+", path.read_text(encoding="utf-8"))}
    private = sorted((f, m) for f, m in named if any(p.startswith("_") for p in m.split(".")))
    assert private == []


def test_every_batch_name_in_code_bench_and_docs_resolves():
    """A dotted name ``batch.room.module.name`` in a docstring, comment, import string or doc still exists."""
    files = [p for d in ("batch", "classify", "adapters", "serve", "docpilot", "bench") for p in ROOT.joinpath(d).rglob("*.py")]
    files += [*ROOT.joinpath("docs").rglob("*.md"), ROOT / "README.md", ROOT / "Makefile"]
    unknown = sorted((str(path.relative_to(ROOT)), m) for path in files
                     for m in set(re.findall(r"\bbatch(?:\.\w+)+", path.read_text(encoding="utf-8")))
                     if m.split(".")[1] in FLOORS and not _resolves(m))
    assert unknown == []


def _top_level_names(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            for target in (node.targets if isinstance(node, ast.Assign) else [node.target]):
                names |= {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return names


def _resolves(dotted: str) -> bool:
    """Whether ``batch.room.module[.name[.attr]]`` names a module of ``batch/`` and (if given) a name it defines."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        module = ".".join(parts[:cut])
        if module in MODULES:
            rest = parts[cut:]
            return not rest or rest[0] in _top_level_names(MODULES[module])
    return False


def test_the_name_check_sees_a_moved_name():
    assert _resolves("batch.run.merge.check_export") and _resolves("batch.pool")
    assert not _resolves("batch.run.merge.no_such_function") and not _resolves("batch.run.no_such_module")
