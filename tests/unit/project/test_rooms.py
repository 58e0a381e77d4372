"""The shape of the five packages (``classify``, ``batch``, ``adapters``, ``serve``, ``docpilot``): rooms on
floors, no import circle between modules nor between rooms, nothing imported upward, every room's map names its
files, no core module serving one outside package, function-level imports of project modules only where they buy
something.

Every import counts: the ones inside functions and under ``TYPE_CHECKING``, relative ones, and import strings
(``importlib.import_module("pkg.mod")``, ``"pkg.mod:func"`` as in ``DETACHABLE``): a circle hidden in a function
is still a circle a reader must hold in mind. The tree is parsed once per test process (:class:`_Tree`); each
check is proven on a planted violation in a scratch tree.
"""

from __future__ import annotations

import ast
import functools
import importlib.util
import re
from collections.abc import Collection
from pathlib import Path
from typing import NamedTuple

import pytest

ROOT = Path(importlib.util.find_spec("batch").submodule_search_locations[0]).parent
PACKAGES = ("classify", "batch", "adapters", "serve", "docpilot")

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
        "runfiles": 0, "layout": 0, "rows": 0,  # the run-folder contract
        "corpus": 1, "plan": 1,  # the corpus and its shard plan; the lot plan and the lots file
        "pool": 2, "report": 2, "lease": 2,  # the Ray pool; the quality report; the lease clock and its stop
        "run": 3,  # a batch run: driver, attempt, merge, export
        "lot": 4, "pilot": 4,  # the end of a lot (status, wrap-up); the pilot, a 12-document run of the batch
    },
    "adapters": {"registry": 0, "train": 1},  # the registry (export, import, merge); LoRA training above it
    # serve: a stack of single-module rooms, from the settings and the error shape up to the app and its command
    "serve": {
        "adapters": 0, "engine": 0, "errors": 0, "metrics": 0, "schemas": 0, "settings": 0,
        "admission": 1, "body": 1, "guard": 1,  # documents in flight, the body off the loop, the token from the headers
        "conn": 2, "state": 2,  # the connection guard; the app's state
        "deps": 3,  # the dependencies the routes take
        "routes_adapters": 4, "routes_classify": 4, "routes_health": 4, "routes_metrics": 4,
        "app": 5,  # the factory and its lifespan
        "cli": 6,  # ``docpilot serve``
    },
    "docpilot": {"logs": 0, "detach": 1, "cli": 2, "__main__": 3},  # logging once, the detacher, the command, -m
}
"""Each package's rooms and their floors: a module may import its own room and rooms on lower floors only. A room
is a folder or a single module (``batch/layout.py``; every room of ``adapters``, ``serve`` and ``docpilot`` today)."""

UPPER = {"classify": {"batch", "adapters", "serve", "docpilot"}, "adapters": {"batch", "serve", "docpilot"},
         "serve": {"batch", "docpilot"}, "batch": {"serve", "docpilot"}}
"""What each package must not import in any form (function-level imports and import strings included): the
shared core is below everything, training below the batch and the server, the front door above all."""

HEAVY = {"torch", "vllm", "ray", "pyarrow", "transformers", "peft", "matplotlib", "scipy", "numpy", "fastapi",
         "uvicorn", "fsspec", "datasets", "accelerate", "pandas"}
"""Libraries worth a function-level import: a runtime (vLLM, Ray, torch and what pulls them) or over ~0.15 s to import."""

KNOWN_ARROWS_TODAY: set[str] = set()
"""Module arrows the floor and circle checks still let through: each must still exist, so the list only shrinks."""

MAPLESS_TODAY: set[str] = set()
"""Packages whose ``__init__`` does not list its rooms by floor yet (each must still miss one, so the list only shrinks)."""


@functools.cache
def _parse(path: Path) -> tuple[str, ast.Module]:
    """A file's text and syntax tree, read once per test process."""
    source = path.read_text(encoding="utf-8")
    return source, ast.parse(source, filename=str(path))


class _Import(NamedTuple):
    name: str  # the dotted name imported: ``from a.b import c`` names ``a.b.c`` (resolved to a module later)
    line: int
    end: int
    statement: bool  # an ``import`` statement (not ``import_module("...")`` nor an import string)
    in_function: bool
    at_import_time: bool  # runs when the module is imported: not in a function, not under ``TYPE_CHECKING``


def _type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _import_call(node: ast.AST) -> str | None:
    """The module an ``importlib.import_module("a.b")`` / ``__import__("a.b")`` call names, if a string."""
    if not (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)):
        return None
    func = node.func
    name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
    return node.args[0].value if name in ("import_module", "__import__") else None


IMPORT_STRING = re.compile(r"([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+):[A-Za-z_]\w*")
"""``"pkg.mod:func"``: a function named for a later import (``COMMANDS``, ``DETACHABLE``)."""


class _Tree:
    """The Python modules of ``packages`` under ``root`` (name -> path), each parsed once, and what they import."""

    def __init__(self, root: Path, packages: tuple[str, ...]):
        self.root = root
        self.modules = {self._name(p): p for pkg in packages for p in sorted((root / pkg).rglob("*.py"))}
        self._imports: dict[str, tuple[_Import, ...]] = {}
        self._loads: dict[str, frozenset[str]] = {}

    def _name(self, path: Path) -> str:
        parts = list(path.relative_to(self.root).with_suffix("").parts)
        return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)

    def source(self, module: str) -> str:
        return _parse(self.modules[module])[0]

    def tree(self, module: str) -> ast.Module:
        return _parse(self.modules[module])[1]

    def resolve(self, name: str) -> str | None:
        """The longest prefix of ``name`` that is a module here (``a.b.c`` -> ``a.b`` when ``c`` is a name in it)."""
        parts = name.split(".")
        return next((m for cut in range(len(parts), 0, -1) if (m := ".".join(parts[:cut])) in self.modules), None)

    def _absolute(self, node: ast.ImportFrom, module: str) -> str:
        """The absolute module of a ``from`` import, relative ones (``from ..run import merge``) included."""
        if node.level == 0:
            return node.module or ""
        base = module.split(".")
        if self.modules[module].name != "__init__.py":
            base = base[:-1]
        base = base[: len(base) - node.level + 1]
        return ".".join([*base, *([node.module] if node.module else [])])

    def imports(self, module: str) -> tuple[_Import, ...]:
        """Every import in ``module``: statements, ``import_module`` strings and ``"pkg.mod:func"`` strings."""
        if module not in self._imports:
            self._imports[module] = self._read_imports(module)
        return self._imports[module]

    def _read_imports(self, module: str) -> tuple[_Import, ...]:
        out: list[_Import] = []

        def visit(node: ast.AST, in_function: bool, runs: bool) -> None:
            if isinstance(node, ast.Import):
                out.extend(_Import(a.name, node.lineno, node.end_lineno, True, in_function, runs) for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = self._absolute(node, module)
                out.extend(_Import(f"{base}.{a.name}" if a.name != "*" else base, node.lineno, node.end_lineno,
                                   True, in_function, runs) for a in node.names)
            elif (named := _import_call(node)) is not None:
                out.append(_Import(named, node.lineno, node.end_lineno, False, in_function, runs))
            elif isinstance(node, ast.Constant) and isinstance(node.value, str) and IMPORT_STRING.fullmatch(node.value):
                out.append(_Import(node.value.partition(":")[0], node.lineno, node.end_lineno, False, in_function, False))
            if isinstance(node, ast.If) and _type_checking(node.test):
                for child in node.body:
                    visit(child, in_function, False)
                for child in node.orelse:
                    visit(child, in_function, runs)
                return
            inner = isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            for child in ast.iter_child_nodes(node):
                visit(child, in_function or inner, runs and not inner)

        visit(self.tree(module), False, True)
        return tuple(out)

    def targets(self, module: str) -> set[str]:
        """The modules here that ``module`` imports, in any form."""
        return {t for i in self.imports(module) if (t := self.resolve(i.name)) and t != module}

    def graph(self, package: str, known: Collection[str] = ()) -> dict[str, set[str]]:
        """Module arrows inside ``package`` (arrows named ``"a -> b"`` in ``known`` left out)."""
        return {m: {t for t in self.targets(m) if t.split(".")[0] == package and f"{m} -> {t}" not in known}
                for m in self.modules if m.split(".")[0] == package}

    def loads(self, module: str) -> frozenset[str]:
        """What importing ``module`` loads: the modules here, and the top-level names of every import run on the
        way (``import a.b.c`` runs ``a`` and ``a.b`` first)."""
        if module in self._loads:
            return self._loads[module]
        seen, todo, names = {module}, [module], set()
        while todo:
            current = todo.pop()
            for i in self.imports(current):
                if not i.at_import_time:
                    continue
                names.add(i.name.split(".")[0])
                if target := self.resolve(i.name):
                    parts = target.split(".")
                    for new in {".".join(parts[:cut]) for cut in range(1, len(parts) + 1)} & self.modules.keys() - seen:
                        seen.add(new)
                        todo.append(new)
        self._loads[module] = frozenset(names | seen)
        return self._loads[module]

    def function_imports(self, packages: tuple[str, ...]) -> list[tuple[str, _Import, str]]:
        """``(module, import, target)`` for every function-level import statement of a module here."""
        return [(m, i, t) for m in self.modules if m.split(".")[0] in packages for i in self.imports(m)
                if i.statement and i.in_function and (t := self.resolve(i.name)) and t != m]

    def unexplained(self, packages: tuple[str, ...]) -> set[str]:
        """``"module -> target"`` for each function-level import that loads no heavy library, sits in no import
        cycle (the target, loaded, would not load the module back) and says nothing (``# lazy: <reason>``)."""
        out = set()
        for module, imp, target in self.function_imports(packages):
            lines = self.source(module).splitlines()[imp.line - 1: imp.end]
            said = any(re.search(r"#\s*lazy:\s*\S", line) for line in lines)
            loaded = self.loads(target)
            if not (said or loaded & HEAVY or module in loaded):
                out.add(f"{module} -> {target}")
        return out


TREE = _Tree(ROOT, (*PACKAGES, "bench"))
MODULES = {m: p for m, p in TREE.modules.items() if m.split(".")[0] in PACKAGES}
ALL = TREE.modules


def _room(module: str) -> str:
    return module.split(".")[1] if "." in module else ""


def _room_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The arrows between rooms that the module arrows make (a room's own arrows left out)."""
    rooms: dict[str, set[str]] = {}
    for m, targets in graph.items():
        rooms.setdefault(_room(m), set()).update(_room(t) for t in targets if _room(t) != _room(m))
    return {r: targets - {""} for r, targets in rooms.items() if r}


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one node (Tarjan's algorithm)."""
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


def _upward(graph: dict[str, set[str]], floors: dict[str, int]) -> list[str]:
    return sorted(f"{m} -> {t}" for m, targets in graph.items() if _room(m)
                  for t in targets if _room(t) and floors[_room(t)] > floors[_room(m)])


KNOWN_LAZY_TODAY: set[str] = set()
"""``"module -> target"``: function-level imports that load nothing heavy, sit in no cycle and give no reason yet
(each must still be one, so the list only shrinks)."""


def _unnamed_in_map(tree: _Tree, package: str, rooms: set[str]) -> list[str]:
    """The rooms a package's ``__init__`` map does not list as ``name.py`` or ``name/`` at the start of a line."""
    package_map = tree.source(package)
    return sorted(r for r in rooms if not re.search(rf"^{re.escape(r)}(\.py|/)\s", package_map, re.M))


@pytest.mark.parametrize("package", PACKAGES)
def test_every_room_has_a_floor_and_the_package_map_names_it(package):
    rooms = {_room(m) for m in MODULES if m.split(".")[0] == package and _room(m)}
    assert rooms == set(FLOORS[package])
    unnamed = _unnamed_in_map(TREE, package, rooms)
    if package in MAPLESS_TODAY:
        assert unnamed, f"{package}/__init__.py names every room: take it off MAPLESS_TODAY"
    else:
        assert unnamed == []


@pytest.mark.parametrize("package", PACKAGES)
def test_no_import_circle_between_modules_or_rooms(package):
    graph = TREE.graph(package, KNOWN_ARROWS_TODAY)
    assert _circles(graph) == []
    assert _circles(_room_graph(graph)) == []  # two rooms on one floor importing each other are a circle too


@pytest.mark.parametrize("package", PACKAGES)
def test_no_room_imports_a_higher_floor(package):
    assert _upward(TREE.graph(package, KNOWN_ARROWS_TODAY), FLOORS[package]) == []


def test_each_arrow_let_through_still_exists():
    arrows = [a.split(" -> ") for a in sorted(KNOWN_ARROWS_TODAY)]
    assert [f"{m} -> {t}" for m, t in arrows if m not in MODULES or t not in TREE.targets(m)] == []


def test_the_circle_check_sees_a_circle():
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def _scratch(root: Path, files: dict[str, str]) -> _Tree:
    """A scratch tree: ``files`` (path -> source) written under ``root``, read as the package ``pkg``."""
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return _Tree(root, ("pkg",))


def test_a_relative_import_is_seen_and_resolved(tmp_path):
    tree = _scratch(tmp_path, {"pkg/__init__.py": "from . import high\n", "pkg/low/__init__.py": "",
                               "pkg/low/a.py": "from ..high import b\nfrom .c import x\n", "pkg/low/c.py": "x = 1\n",
                               "pkg/high/__init__.py": "", "pkg/high/b.py": ""})
    graph = tree.graph("pkg")
    assert graph["pkg.low.a"] == {"pkg.high.b", "pkg.low.c"} and graph["pkg"] == {"pkg.high"}
    assert _upward(graph, {"low": 0, "high": 1}) == ["pkg.low.a -> pkg.high.b"]


def test_a_loop_between_two_rooms_on_one_floor_is_a_circle(tmp_path):
    tree = _scratch(tmp_path, {"pkg/one/a.py": "import pkg.two.b\n", "pkg/one/d.py": "", "pkg/two/b.py": "",
                               "pkg/two/c.py": "def f():\n    from pkg.one import d\n"})
    graph = tree.graph("pkg")
    assert _circles(graph) == [] and _upward(graph, {"one": 1, "two": 1}) == []  # no module circle, no floor broken
    assert _circles(_room_graph(graph)) == [["one", "two"]]


def test_an_upward_import_by_import_module_or_import_string_is_seen(tmp_path):
    tree = _scratch(tmp_path, {"pkg/low/a.py": 'import importlib\n\ndef f():\n    return importlib.import_module("pkg.high.b")\n',
                               "pkg/low/c.py": 'TARGETS = {"x": "pkg.high.d:main"}\n',
                               "pkg/high/b.py": "", "pkg/high/d.py": "def main():\n    pass\n"})
    assert _upward(tree.graph("pkg"), {"low": 0, "high": 1}) == ["pkg.low.a -> pkg.high.b", "pkg.low.c -> pkg.high.d"]


def test_an_unexplained_function_level_import_is_seen(tmp_path):
    tree = _scratch(tmp_path, {
        "pkg/a.py": "def f():\n    from pkg import plain, heavy, back, said  # noqa\n    import pkg.plain\n",
        "pkg/plain.py": "import json\n", "pkg/heavy.py": "from pkg import deeper\n", "pkg/deeper.py": "import torch\n",
        "pkg/back.py": "import pkg.a\n", "pkg/said.py": "",
        "pkg/b.py": "def f():\n    from pkg import said  # lazy: read once, at exit\n    from pkg import (\n"
                    "        plain,\n    )  # lazy: keeps the command's start fast\n"})
    assert tree.unexplained(("pkg",)) == {"pkg.a -> pkg.plain", "pkg.a -> pkg.said"}


def test_the_linter_refuses_relative_imports():
    import tomllib

    lint = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["ruff"]["lint"]
    assert "TID252" in lint["select"] and lint["flake8-tidy-imports"]["ban-relative-imports"] == "all"


def test_function_level_imports_of_project_modules_buy_something():
    """Each one loads a heavy library (``HEAVY``), sits in a real cycle, or says why: ``# lazy: <reason>``."""
    found = TREE.unexplained(PACKAGES)
    assert sorted(found - KNOWN_LAZY_TODAY) == []
    assert sorted(KNOWN_LAZY_TODAY - found) == []  # explained, moved or gone: take it off the list


def _rooms_with_folders() -> list[Path]:
    return [ROOT / pkg / r for pkg in FLOORS for r in FLOORS[pkg] if (ROOT / pkg / r).is_dir()]


@pytest.mark.parametrize("room", _rooms_with_folders(), ids=lambda p: f"{p.parent.name}.{p.name}")
def test_each_room_map_names_every_file_and_holds_nothing_else(room):
    """A room's ``__init__`` is its map: a docstring naming each of its files, and no code (no public face)."""
    init = room / "__init__.py"
    tree = _parse(init)[1]
    doc = ast.get_docstring(tree) or ""
    files = sorted(p.name for p in room.glob("*.py") if p.name != "__init__.py")
    assert [f for f in files if not re.search(rf"^{re.escape(f)}\s", doc, re.M)] == []
    assert len(tree.body) == 1, f"{init}: a map only (docstring), no code"


def test_no_core_module_serves_only_one_outside_package():
    """A ``classify`` module imported by exactly one other package and by nothing in ``classify`` belongs there
    (a command the front door names by its ``"pkg.mod:main"`` string is not an import: it serves the front door)."""
    users: dict[str, set[str]] = {m: set() for m in MODULES if m.split(".")[0] == "classify" and _room(m)}
    for name in TREE.modules:
        for target in {TREE.resolve(i.name) for i in TREE.imports(name) if i.statement} - {name}:
            if target in users:
                users[target].add(name.split(".")[0])
    single = sorted(f"{m}: {sorted(u)}" for m, u in users.items()
                    if len(u) == 1 and "classify" not in u and TREE.modules[m].name != "__init__.py")
    assert single == []


def _packages_named(tree: _Tree, module: str) -> set[str]:
    """Top-level package names a module imports in any form, or names in a string as ``"pkg.mod:func"``."""
    out = {i.name.split(".")[0] for i in tree.imports(module)}
    for node in ast.walk(tree.tree(module)):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            out |= {m.group(1) for m in re.finditer(r"\b(\w+)(?:\.\w+)+:\w+\b", node.value)}
    return out


@pytest.mark.parametrize("package", sorted(UPPER))
def test_no_package_imports_upward(package):
    offenders = {m: sorted(_packages_named(TREE, m) & UPPER[package]) for m in MODULES if m.split(".")[0] == package}
    assert {k: v for k, v in offenders.items() if v} == {}


def test_the_detector_sees_an_import_string_and_a_function_level_import(tmp_path):
    tree = _scratch(tmp_path, {"pkg/probe.py": 'COMMANDS = {"x": ("batch.run.driver:main", "help")}\n'
                                               'def f():\n    import serve.app\n    importlib.import_module("adapters.cli")\n'})
    assert {"batch", "serve", "adapters"} <= _packages_named(tree, "pkg.probe")


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
    for node in _parse(path)[1].body:
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
             for node in ast.walk(_parse(p)[1])
             if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "basicConfig"]
    assert len(calls) == 1 and calls[0].startswith("docpilot/logs.py:"), calls
