"""The package's import graph runs one way: no module imports a higher layer (DESIGN.md), none imports in a circle.

Every import statement counts, also those inside functions and under ``TYPE_CHECKING``: a lazy import
upward is still an arrow up. The layers are the table of ``docs/architecture.md`` (DESIGN.md's, with the choices the
code made), read from there so the doc and the test cannot drift.
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "dsbuild"

ARCHITECTURE = PACKAGE.parent / "docs" / "architecture.md"


def _layers() -> tuple[tuple[str, ...], ...]:
    """The floors of ``docs/architecture.md``'s table, lowest first: the one copy of the layer table."""
    floors: list[tuple[str, ...]] = []
    for line in ARCHITECTURE.read_text(encoding="utf-8").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[0].isdigit():
            assert int(cells[0]) == len(floors), f"floors are numbered in order: {line}"
            rooms = re.findall(r"`([\w.]+)/?`", cells[1])
            floors.append(tuple(r if r == "dsbuild" else f"dsbuild.{r}" for r in rooms))
    assert floors, f"no layer table in {ARCHITECTURE}"
    return tuple(floors)


LAYERS = _layers()
PRIVATE_FOLDER = "_util"
"""The one private folder: private to the package, not to a module."""


HEAVY = ("torch", "deepspeed", "transformers", "peft", "datasets", "matplotlib", "ray")


def _modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


MODULES = _modules()


def layer_of(module: str) -> int:
    """The layer of a module: the most specific prefix listed in ``LAYERS``."""
    best: tuple[int, int] | None = None
    for level, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            if module == prefix or module.startswith(prefix + "."):
                if best is None or len(prefix) > best[1]:
                    best = (level, len(prefix))
    assert best is not None, f"{module} is in no layer: add it to LAYERS"
    return best[0]


def imports(module: str) -> Iterator[tuple[str, int]]:
    """Every dsbuild module ``module`` imports, with the line (``from . import x`` is the module ``x``)."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                target = ".".join([*base, node.module] if node.module else base)
            elif node.module and node.module.split(".")[0] == "dsbuild":
                target = node.module
            else:
                continue
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                yield (sub if sub in MODULES else target), node.lineno
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "dsbuild":
                    yield alias.name, node.lineno


PUBLIC_FACE = {"__init__.py", "__main__.py", "api.py", "errors.py", "interop.py", "version.py", "py.typed"}


def test_the_package_root_is_the_public_face_and_the_rooms() -> None:
    """``ls dsbuild`` shows the public modules and one folder per room of the table, nothing else."""
    rooms = {m.split(".")[1] for floor in LAYERS for m in floor if m.count(".") == 1}
    for entry in PACKAGE.iterdir():
        if entry.name == "__pycache__":
            continue
        if entry.is_dir():
            assert entry.name in rooms, f"dsbuild/{entry.name}/ is no room of docs/architecture.md"
        else:
            assert entry.name in PUBLIC_FACE, f"dsbuild/{entry.name} belongs in a room's folder"


def test_every_module_is_in_a_layer() -> None:
    """A new module is placed in the layer table before it lands."""
    for module in MODULES:
        layer_of(module)


@pytest.mark.parametrize("module", sorted(MODULES))
def test_no_import_goes_up_a_layer(module: str) -> None:
    """A lower layer never imports a higher one, not even inside a function."""
    mine = layer_of(module)
    up = [f"line {line}: {target}" for target, line in imports(module) if layer_of(target) > mine]
    assert not up, f"{module} (layer {mine}) imports upward: {up}"


def test_the_import_graph_has_no_cycle() -> None:
    """No module reaches itself through its imports (a package's __init__ re-exporting its modules is no edge back)."""
    graph = {m: {t for t, _ in imports(m) if t != m and not m.startswith(t + ".")} for m in MODULES}
    state: dict[str, int] = {}
    path: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        path.append(node)
        for child in sorted(graph.get(node, ())):
            if state.get(child) == 1:
                raise AssertionError("import cycle: " + " -> ".join([*path[path.index(child) :], child]))
            if child not in state:
                visit(child)
        path.pop()
        state[node] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module)


def test_no_private_name_crosses_a_module() -> None:
    """A leading underscore ends at the module: nothing imports ``_name`` from another dsbuild module."""
    crossing = []
    for module, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith("dsbuild")):
                names = [a.name for a in node.names if a.name.startswith("_") and not a.name.startswith("__")]
                module_parts = (node.module or "").split(".")
                private_parts = [p for p in module_parts if p.startswith("_") and not p.startswith("__")]
                if names or any(p != PRIVATE_FOLDER for p in private_parts):
                    crossing.append(f"{module}:{node.lineno}")
    assert not crossing


@pytest.mark.procs
def test_the_config_layers_import_nothing_heavy() -> None:
    """Every module below the Session imports none of torch, deepspeed, transformers, peft, datasets, matplotlib."""
    light = sorted(m for m in MODULES if layer_of(m) < layer_of("dsbuild.session") and m != "dsbuild.__main__")
    script = (
        f"import importlib, json, sys\nfor m in {light!r}:\n    importlib.import_module(m)\n"
        f"print(json.dumps(sorted({{m.split('.')[0] for m in sys.modules}} & set({HEAVY!r}))))"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1]) == []


def test_the_walks_of_one_change_name_what_is_there() -> None:
    """docs/architecture.md's two walks (a job key, a Session capability) name files that exist and classes and
    tables (`LaunchSpec`, `READERS`) that dsbuild defines: a rename that breaks the walk fails here."""
    walks = ARCHITECTURE.read_text(encoding="utf-8").split("## Making one change", 1)[1]
    paths = set(re.findall(r"`((?:dsbuild|tests|docs)/[\w/.]+)`", walks))
    assert len(paths) >= 12
    root = PACKAGE.parent
    assert sorted(p for p in paths if not (root / p).exists()) == []
    sources = "\n".join(p.read_text(encoding="utf-8") for p in PACKAGE.rglob("*.py"))
    names = set(re.findall(r"`([A-Z][A-Za-z]+)`", walks))
    assert sorted(n for n in names if not re.search(rf"^(class {n}\b|{n}\b.*=)", sources, re.M)) == []
