"""Dotted keys over nested tables (``training.learning_rate``, ``zero_optimization.offload_optimizer.device``): the
one walker every reader of a path into a dict uses."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..errors import ConfigError, Problem

__all__ = ["get", "put", "sets"]


def _parts(key: str) -> list[str]:
    """The keys of a dotted path; a list index (``betas[0]``) names the list it is in."""
    return [part.partition("[")[0] for part in key.split(".") if part]


def get(table: Mapping[str, Any], key: str, default: Any = None) -> Any:
    """The value at ``key``; ``default`` where a table on the way, or the key itself, is absent."""
    node: Any = table
    for part in _parts(key):
        if not isinstance(node, Mapping) or part not in node:
            return default
        node = node[part]
    return node


def sets(table: Mapping[str, Any], key: str) -> bool:
    """Whether ``table`` sets ``key``, or a value above it (a value that is not a table stands for all below it)."""
    node: Any = table
    parts = _parts(key)
    for part in parts:
        if not isinstance(node, Mapping):
            return True
        if part not in node:
            return False
        node = node[part]
    return bool(parts)


def put(table: dict[str, Any], key: str, value: Any) -> None:
    """``table[a][b][c] = value`` for ``key`` ``"a.b.c"``, making (or replacing) tables on the way."""
    parts = key.split(".")
    if not all(parts):
        raise ConfigError(Problem(key, "expected a dotted key such as training.learning_rate"))
    node = table
    for part in parts[:-1]:
        child = node.get(part)
        if not isinstance(child, dict):
            child = node[part] = {}
        node = child
    node[parts[-1]] = value
