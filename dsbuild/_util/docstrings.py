"""Attribute docstrings: the string literal right below a field in a class body, read from the source.

Python keeps no such string at run time, but it is where a config field's one-line documentation
lives (PEP 257's "attribute docstrings", as torchtitan's configs and Sphinx use them). This is the
one reader: the JSON schema's descriptions come from it, and the tests that every field has one.
"""

from __future__ import annotations

import ast
import inspect
import sys
from collections.abc import Mapping
from functools import cache

__all__ = ["attribute_docs", "one_line"]


@cache
def attribute_docs(cls: type) -> Mapping[str, str | None]:
    """Attribute name -> the string literal right after its annotated assignment in ``cls``'s body (``None``: none).

    Empty when the source cannot be read (an application frozen without its ``.py`` files).
    """
    body = _class_body(cls.__module__, cls.__name__)
    out: dict[str, str | None] = {}
    for node, after in zip(body, [*body[1:], None], strict=True):
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            doc = None
            if (
                isinstance(after, ast.Expr)
                and isinstance(after.value, ast.Constant)
                and isinstance(after.value.value, str)
            ):
                doc = after.value.value
            out[node.target.id] = doc
    return out


def one_line(doc: str | None) -> str | None:
    """The first paragraph of a docstring on one line (whitespace runs made one space), or ``None``."""
    if doc is None:
        return None
    paragraph = inspect.cleandoc(doc).split("\n\n", 1)[0]
    return " ".join(paragraph.split()) or None


def _class_body(module: str, name: str) -> list[ast.stmt]:
    tree = _module_tree(module)
    if tree is None:
        return []
    found = next((n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == name), None)
    return found.body if found is not None else []


@cache
def _module_tree(module: str) -> ast.Module | None:
    try:
        return ast.parse(inspect.getsource(sys.modules[module]))
    except (OSError, TypeError, KeyError):
        return None
