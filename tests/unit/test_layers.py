"""The package's import graph runs one way: no module imports a higher layer (DESIGN.md), none imports in a circle.

Every import statement counts, also those inside functions and under ``TYPE_CHECKING``: a lazy import
upward is still an arrow up. The layers are DESIGN.md's table, with the choices the code made (see
``LAYERS``).
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "dsbuild"

LAYERS: tuple[tuple[str, ...], ...] = (
    # 0: the error tree and stdlib-only helpers
    (
        "dsbuild.errors",
        "dsbuild.suggest",
        "dsbuild.atomic",
        "dsbuild.versions",
        "dsbuild.tested",
        "dsbuild.version",
        "dsbuild.overrides",
        "dsbuild.compat",
        "dsbuild.extras",
        "dsbuild.manifest",
        "dsbuild.history",
        "dsbuild.build_locks",
        "dsbuild.slurm",
        "dsbuild.docstrings",
        "dsbuild.files",
        "dsbuild.features",
    ),
    # 1: the typed model and the builder (data only)
    ("dsbuild.config",),
    # 2: the one converter
    ("dsbuild.convert",),
    # 3: files and presets (presets only locate; io reads)
    ("dsbuild.presets", "dsbuild.io"),
    # 4: the HF fill table, the batch triangle, the training arguments
    ("dsbuild.hf_table", "dsbuild.batch", "dsbuild.training"),
    # 5: resolution, validation and the JSON schema
    ("dsbuild.resolve", "dsbuild.explain", "dsbuild.validate", "dsbuild.schema"),
    # 6: the Config façade
    ("dsbuild.api",),
    # 7: jobs, the hand-offs, the planner (its recommendation is a Config, so it sits above the façade)
    ("dsbuild.job", "dsbuild.interop", "dsbuild.planner"),
    # 8: what imports torch & co. (lazily): the Session, data, the job's model, doctor, DeepSpeed's verdict
    ("dsbuild.session", "dsbuild.data", "dsbuild.model", "dsbuild.doctor", "dsbuild.deepspeed_verdict"),
    # 9: the training run and process launch (no printing)
    ("dsbuild.run", "dsbuild.plot", "dsbuild.launch", "dsbuild.ray_train", "dsbuild.output_dir", "dsbuild.demo"),
    # 10: the command line and the package itself
    ("dsbuild.cli", "dsbuild.__main__", "dsbuild"),
)

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
                if names or any(p.startswith("_") and not p.startswith("__") for p in module_parts if p):
                    crossing.append(f"{module}:{node.lineno}")
    assert not crossing


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
