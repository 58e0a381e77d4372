"""The shape of ``classify/`` (the shared core) and ``batch/``: rooms on floors, no import circle, nothing
imported upward, every room's map names its files, no core module serving one outside package.

Every import counts, also the ones inside functions and under ``TYPE_CHECKING`` (a circle hidden in a
function is still a circle a reader must hold in mind).
"""

from __future__ import annotations

import ast
import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(importlib.util.find_spec("batch").submodule_search_locations[0]).parent

FLOORS: dict[str, dict[str, int]] = {
    "classify": {
        "machine": 0,  # what the machine has (the setup probe) and the device torch computes on
        "errors": 0, "records": 0, "usercommand": 0,  # the exception ladder, the result record, the user's command form
        "paths": 1, "config": 1,  # where state lives; the config file and its sections
        "runs": 2,  # run folders: records, files, storage, export, accounting, the gate, detach records, plots
        "documents": 3, "model": 3,  # reading documents; the base model, its shape and what fits
        "engine": 4,  # the vLLM engine, its prompt and scoring
    },
    "batch": {
        "config": 0, "runfiles": 0, "layout": 0, "rows": 0,  # the user's config sections and the run-folder contract
        "corpus": 1, "plan": 1,  # the corpus and its shard plan; the lot plan and the lots file
        "pool": 2, "report": 2, "lease": 2,  # the Ray pool; the quality report; the lease clock and its stop
        "run": 3,  # a batch run: driver, attempt, merge, export
        "lot": 4, "pilot": 4,  # the end of a lot (status, wrap-up); the pilot, a 12-document run of the batch
    },
    "adapters": {"registry": 0, "train": 1},  # the registry (export, import, merge); LoRA training above it
}
"""Each package's rooms and their floors: a module may import its own room and rooms on lower floors only."""

UPPER = {"classify": {"batch", "adapters", "serve", "docpilot"}, "adapters": {"batch", "serve", "docpilot"},
         "serve": {"batch", "docpilot"}, "batch": {"serve", "docpilot"}}
"""What each package must not import in any form (function-level imports and import strings included): the
shared core is below everything, training below the batch and the server, the front door above all."""


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for pkg in FLOORS for p in sorted((ROOT / pkg).rglob("*.py"))}
ALL = {_module_name(p): p for pkg in (*FLOORS, "adapters", "serve", "docpilot", "bench")
       for p in sorted((ROOT / pkg).rglob("*.py"))}


def _room(module: str) -> str:
    return module.split(".")[1] if "." in module else ""


def _imports(path: Path, known: dict[str, Path]) -> set[str]:
    """The project modules a file imports (``from a.b import c`` names ``a.b.c`` when that is a module)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                out.add(full if full in known else node.module)
        elif isinstance(node, ast.Import):
            out |= {alias.name for alias in node.names}
    return {m for m in out if m in known}


def _graph(package: str) -> dict[str, set[str]]:
    return {m: {t for t in _imports(p, MODULES) if t.split(".")[0] == package and t != m}
            for m, p in MODULES.items() if m.split(".")[0] == package}


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


@pytest.mark.parametrize("package", sorted(FLOORS))
def test_every_room_has_a_floor_and_the_package_map_names_it(package):
    rooms = {_room(m) for m in MODULES if m.split(".")[0] == package and _room(m)}
    assert rooms == set(FLOORS[package])
    package_map = (ROOT / package / "__init__.py").read_text(encoding="utf-8")
    assert [r for r in FLOORS[package] if not re.search(rf"^{r}(\.py|/)\s", package_map, re.M)] == []


@pytest.mark.parametrize("package", sorted(FLOORS))
def test_no_import_circle(package):
    assert _circles(_graph(package)) == []


def test_the_circle_check_sees_a_circle():
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


@pytest.mark.parametrize("package", sorted(FLOORS))
def test_no_room_imports_a_higher_floor(package):
    floors = FLOORS[package]
    upward = sorted(f"{m} -> {t}" for m, targets in _graph(package).items() if _room(m)
                    for t in targets if _room(t) and floors[_room(t)] > floors[_room(m)])
    assert upward == []


def _rooms_with_folders() -> list[Path]:
    return [ROOT / pkg / r for pkg in FLOORS for r in FLOORS[pkg] if (ROOT / pkg / r).is_dir()]


@pytest.mark.parametrize("room", _rooms_with_folders(), ids=lambda p: f"{p.parent.name}.{p.name}")
def test_each_room_map_names_every_file_and_holds_nothing_else(room):
    """A room's ``__init__`` is its map: a docstring naming each of its files, and no code (no public face)."""
    init = room / "__init__.py"
    tree = ast.parse(init.read_text(encoding="utf-8"))
    doc = ast.get_docstring(tree) or ""
    files = sorted(p.name for p in room.glob("*.py") if p.name != "__init__.py")
    assert [f for f in files if not re.search(rf"^{re.escape(f)}\s", doc, re.M)] == []
    assert len(tree.body) == 1, f"{init}: a map only (docstring), no code"


def test_no_core_module_serves_only_one_outside_package():
    """A ``classify`` module imported by exactly one other package and by nothing in ``classify`` belongs there."""
    users: dict[str, set[str]] = {m: set() for m in MODULES if m.split(".")[0] == "classify" and _room(m)}
    for name, path in ALL.items():
        for target in _imports(path, ALL):
            if target in users and target != name:
                users[target].add(name.split(".")[0])
    single = sorted(f"{m}: {sorted(u)}" for m, u in users.items()
                    if len(u) == 1 and "classify" not in u and not m.endswith("__init__") and m.count(".") >= 1
                    and (ROOT / (m.replace(".", "/") + ".py")).is_file())
    assert single == []


def _packages_named(path: Path) -> set[str]:
    """Top-level package names a module imports, or names in an import string ``"pkg.mod:func"``."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.add(node.module.split(".")[0])
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            out |= {m.group(1) for m in re.finditer(r"\b(\w+)(?:\.\w+)+:\w+\b", node.value)}
    return out


@pytest.mark.parametrize("package", sorted(UPPER))
def test_no_package_imports_upward(package):
    offenders = {str(p.relative_to(ROOT)): sorted(_packages_named(p) & UPPER[package])
                 for p in sorted((ROOT / package).rglob("*.py"))}
    assert {k: v for k, v in offenders.items() if v} == {}


def test_the_detector_sees_an_import_string_and_a_function_level_import(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text('COMMANDS = {"x": ("batch.run.driver:main", "help")}\ndef f():\n    import serve.app\n')
    assert {"batch", "serve"} <= _packages_named(probe)


def test_the_engine_keeps_out_of_the_tokenizers_internals():
    """One tokenizer, the library's: no tokenizer JSON read, no BPE model called, outside the private copy's setup."""
    source = (ROOT / "classify/engine/prompt.py").read_text(encoding="utf-8")
    tree = ast.parse(source)
    copy = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "_fast_copy")
    inside = set(range(copy.lineno, copy.end_lineno + 1))
    hits = [i for i, line in enumerate(source.splitlines(), 1)
            if re.search(r"_resize_cache|to_str\(\)|model\.tokenize|pre_tokenizer", line) and i not in inside
            and not line.lstrip().startswith(("#", '"', "*", "``"))]
    assert hits == []
    for path in (ROOT / "classify/engine").glob("*.py"):
        if path.name != "prompt.py":
            assert not re.search(r"_resize_cache|model\.tokenize\(", path.read_text(encoding="utf-8")), path


def test_no_private_batch_module_and_bench_docs_name_public_modules_only():
    assert [m for m in MODULES if m.startswith("batch.")
            and any(part.startswith("_") and part != "__init__" for part in m.split("."))] == []
    named = set()
    for path in [*ROOT.joinpath("bench").rglob("*.py"), *ROOT.joinpath("docs").rglob("*.md"), ROOT / "README.md"]:
        named |= {(path.name, m) for m in re.findall(r"\bbatch(?:\.\w+)+", path.read_text(encoding="utf-8"))}
    private = sorted((f, m) for f, m in named if any(p.startswith("_") for p in m.split(".")))
    assert private == []


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
    """Whether ``pkg.room.module[.name[.attr]]`` names a project module and (if given) a name it defines."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        module = ".".join(parts[:cut])
        if module in ALL:
            rest = parts[cut:]
            return not rest or rest[0] in _top_level_names(ALL[module])
    return False


def test_the_name_check_sees_a_moved_name():
    assert _resolves("batch.run.export.check_export") and _resolves("batch.pool") and _resolves("classify.engine.prompt")
    assert not _resolves("batch.run.merge.no_such_function") and not _resolves("batch.run.no_such_module")
    assert not _resolves("classify.prompt.PromptBuilder")


@pytest.mark.parametrize("package", sorted(FLOORS))
def test_every_dotted_name_in_code_bench_and_docs_resolves(package):
    """A dotted name ``pkg.room.module.name`` in a docstring, comment, import string or doc still exists."""
    files = [p for d in ("batch", "classify", "adapters", "serve", "docpilot", "bench") for p in ROOT.joinpath(d).rglob("*.py")]
    files += [*ROOT.joinpath("docs").rglob("*.md"), ROOT / "README.md", ROOT / "Makefile"]
    unknown = sorted((str(path.relative_to(ROOT)), m) for path in files
                     for m in set(re.findall(rf"(?<![\w.]){package}(?:\.[A-Za-z_]\w*)+", path.read_text(encoding="utf-8")))
                     if m.split(".")[1] in FLOORS[package] and not _resolves(m))
    assert unknown == []


def test_logging_is_set_up_once_at_the_front_door():
    """One ``logging.basicConfig`` in the product, in ``docpilot/logs.py``: packages below only name their loggers."""
    calls = [f"{p.relative_to(ROOT)}:{node.lineno}" for pkg in ("classify", "adapters", "serve", "batch", "docpilot")
             for p in sorted((ROOT / pkg).rglob("*.py"))
             for node in ast.walk(ast.parse(p.read_text(encoding="utf-8")))
             if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "basicConfig"]
    assert len(calls) == 1 and calls[0].startswith("docpilot/logs.py:"), calls
