"""Walking a config: every ``AUTO`` it holds, and every leaf of a ds_config dict."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, Final

import attrs

from .core import NOT_KEYS
from .fields import AUTO, key_of

__all__ = ["DEEPSPEED_AUTOS", "auto_paths", "leaves"]

DEEPSPEED_AUTOS: Final = frozenset(
    {
        "data_types.keep_in_fp32_modules",
        "zero_optimization.zenflow.select_strategy",
        "zero_optimization.zenflow.select_interval",
        "zero_optimization.zenflow.update_interval",
        "pipeline.stages",
    }
)
"""Keys whose ``"auto"`` DeepSpeed itself understands (it picks the modules, the interval, the stages): kept as
written, never reported."""


def auto_paths(obj: Any, prefix: str = "") -> list[str]:
    """The dotted path of every ``AUTO`` in a config or section, in field order (a pair holding one counts).

    Typed sections are looked into, and so are a torch optimizer's or scheduler's params; the
    long-tail sections carried as written (``Config.extra``) are not. ``DEEPSPEED_AUTOS`` are left out.
    """
    found: list[str] = []
    for a in attrs.fields(type(obj)):
        value = getattr(obj, a.name)
        if value is None or a.name in NOT_KEYS:
            continue
        path = f"{prefix}.{key_of(a)}" if prefix else key_of(a)
        spec = a.metadata.get("dsbuild")
        if value is AUTO or (isinstance(value, tuple) and AUTO in value):
            if path not in DEEPSPEED_AUTOS:
                found.append(path)
        elif attrs.has(type(value)):
            found.extend(auto_paths(value, path))
        elif spec is None and isinstance(value, Mapping):  # optimizer / scheduler params of a torch class
            found.extend(f"{path}.{key}" for key, item in value.items() if item is AUTO)
    return found


def leaves(data: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    """``(dotted path, value)`` of every leaf of a ds_config dict, in its order (an empty table is a leaf)."""
    for key, value in data.items():
        path = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            yield from leaves(value, f"{path}.")
        else:
            yield path, value
