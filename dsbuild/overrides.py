"""``--set KEY=VALUE``: a dotted key and a value in TOML syntax, applied to a table (a job, or a config file's)."""

from __future__ import annotations

from typing import Any

from .compat import tomllib
from .errors import ConfigError, Problem

__all__ = ["parse_set", "set_dotted"]


def parse_set(text: str) -> tuple[str, Any]:
    """``--set`` text ``section.key=value`` as ``(dotted key, value)``; the value is TOML (a bare word is a string)."""
    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep or not key or not all(part.strip() for part in key.split(".")):
        raise ConfigError(f"--set {text!r}: expected KEY=VALUE, e.g. training.learning_rate=2e-5")
    try:
        value: Any = tomllib.loads(f"v = {raw.strip()}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw.strip()
    return key, value


def set_dotted(data: dict[str, Any], key: str, value: Any) -> None:
    """``data[a][b][c] = value`` for ``key`` ``"a.b.c"``, making (or replacing) tables on the way."""
    parts = key.split(".")
    if not all(parts):
        raise ConfigError(Problem(key, "expected a dotted key such as training.learning_rate"))
    node = data
    for part in parts[:-1]:
        child = node.get(part)
        if not isinstance(child, dict):
            child = node[part] = {}
        node = child
    node[parts[-1]] = value
