"""The shape of the code, checked: no import cycles, no oversized module.

Read statically (``ast``), so the checks cost milliseconds and import nothing.
"""

from __future__ import annotations

import ast
import functools
import os
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MAX_LINES = 400


@functools.cache
def _product_files() -> dict[str, Path]:
    """Module name -> file, for every module of the package (tests and bench excluded).
    The walk never enters those folders nor a hidden one: the project's ``.venv`` is
    inside the package's folder, tens of thousands of files (~1.5 s of CPU a walk)."""
    modules = {}
    for folder, subfolders, files in os.walk(ROOT):
        here = Path(folder)
        if here == ROOT:
            subfolders[:] = [d for d in subfolders if d not in {"tests", "bench", "build"}]
        subfolders[:] = sorted(d for d in subfolders if not d.startswith(".")
                               and d != "__pycache__")
        for file in sorted(f for f in files if f.endswith(".py")):
            path = here / file
            name = ".".join(("trouper", *path.relative_to(ROOT).with_suffix("").parts))
            modules[name.removesuffix(".__init__")] = path
    return dict(sorted(modules.items()))


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The package's modules ``name`` imports, at run time or for type checking alike."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = package.split(".")
            if node.level:
                base = base[: len(base) - node.level + 1]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            for alias in node.names:
                child = f"{target}.{alias.name}"
                found.add(child if child in modules else target)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return {module for module in found if module in modules and module != name}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for other in graph[node]:
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for node in graph:
        if node not in index:
            visit(node)
    return cycles


def test_no_module_imports_one_that_imports_it_back():
    modules = _product_files()
    graph = {name: _imports(name, path, modules) for name, path in modules.items()}
    assert _cycles(graph) == []


def test_the_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]



def test_no_product_module_passes_400_lines():
    sizes = {name: len(path.read_text().splitlines())
             for name, path in _product_files().items()}
    assert {name: n for name, n in sizes.items() if n > MAX_LINES} == {}


def test_thespian_is_imported_only_in_the_actor_layer():
    layer = {name for name in _product_files()
             if name.startswith("trouper.actors")
             or name in ("trouper.client.actor_system", "trouper.supervisor")}
    importers = set()
    for name, path in _product_files().items():
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([alias.name for alias in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            if any(n.split(".")[0] == "thespian" for n in names):
                importers.add(name)
    assert importers and importers <= layer, sorted(importers - layer)


def test_import_trouper_starts_no_actor_machinery():
    import subprocess
    import sys

    probe = ("import sys, trouper; from trouper import AgentState, RestartPolicy, "
             "SessionConfig; print(sorted({m.split('.')[0] for m in sys.modules} & "
             "{'thespian', 'litellm'}))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         check=True, timeout=60)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_only_the_controller_writes_a_session_log():
    """One writer per session log: of the actors, only the Controller (or its stand-in
    incarnation) opens the store to append; the others reach the log through it."""
    writers = set()
    for name, path in _product_files().items():
        if not name.startswith("trouper.actors."):
            continue
        tree = ast.parse(path.read_text())
        calls = {getattr(node.func, "attr", getattr(node.func, "id", ""))
                 for node in ast.walk(tree) if isinstance(node, ast.Call)}
        if {"append", "open_store"} <= calls:
            writers.add(name)
    assert writers == {"trouper.actors.controller"}


def test_every_package_folder_is_installed():
    """A folder of modules missing from pyproject.toml's ``packages`` works in an editable
    install and is absent from a built one (``trouper.cluster`` and
    ``trouper.workspace_diff`` were)."""
    import tomllib

    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"][
        "packages"])
    folders = {name.rpartition(".")[0] for name, path in _product_files().items()
               if path.name != "__init__.py"} | {
        name for name, path in _product_files().items() if path.name == "__init__.py"}
    folders.discard("")
    assert folders - listed == set()
    missing_init = {name for name in folders
                    if not (ROOT / Path(*name.split(".")[1:]) / "__init__.py").exists()}
    assert missing_init == set()
