"""The rooms stay readable in one sitting: no function in dsbuild/ over 80 lines, no class over 300, and the
loop, the planner and the launch command within the sizes docs/architecture.md promises a newcomer."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "dsbuild"
LIMITS = {ast.FunctionDef: 80, ast.AsyncFunctionDef: 80, ast.ClassDef: 300}
NAMED = {("session/session.py", "fit"): 60, ("planner/core.py", "plan"): 80, ("cli/train.py", "_train"): 40}
"""Functions with a tighter bound: the loop as one reads it, the planner's entry, dsbuild train's handler."""


def _definitions() -> list[tuple[str, ast.AST]]:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        found += [(path.relative_to(PACKAGE).as_posix(), node) for node in ast.walk(tree) if type(node) in LIMITS]
    return found


def _lines(node: ast.AST) -> int:
    assert isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.end_lineno is not None
    return node.end_lineno - node.lineno + 1


def test_no_function_over_80_lines_and_no_class_over_300() -> None:
    """A room a newcomer can read: every function and class within its limit (docstrings and comments count)."""
    over = [
        f"{where}:{node.lineno} {node.name} ({_lines(node)} lines, limit {LIMITS[type(node)]})"  # type: ignore[attr-defined]
        for where, node in _definitions()
        if _lines(node) > LIMITS[type(node)]
    ]
    assert over == []


def test_the_loop_the_planner_and_the_launch_command_keep_their_sizes() -> None:
    """Session.fit reads as the loop (≤ 60 lines), plan ≤ 80, dsbuild train's handler parses, calls, prints (≤ 40)."""
    sizes = {
        (where, node.name): _lines(node)  # type: ignore[attr-defined]
        for where, node in _definitions()
        if (where, getattr(node, "name", None)) in NAMED
    }
    assert set(sizes) == set(NAMED)
    assert {key: size for key, size in sizes.items() if size > NAMED[key]} == {}
