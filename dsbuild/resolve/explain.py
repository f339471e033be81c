"""Where each value of a config came from: ``explain()`` after ``resolve``, and the table ``dsbuild explain`` prints."""

from __future__ import annotations

import json
from typing import Any

import attrs

from ..config import ConfigBase
from ..config.walk import leaves
from ..io.convert import to_dict

__all__ = ["Explanation", "explain", "render_explanation"]


@attrs.frozen
class Explanation:
    """One key of a config: its value as written and where it came from."""

    path: str
    """Dotted key path, e.g. ``optimizer.params.lr``."""
    value: Any
    """The value as the ds_config holds it (``"auto"`` for ``AUTO``, lists for pairs)."""
    origin: str
    """``"set by the user"``, ``"preset zero3"``, ``"training argument learning_rate"``, ``"batch triangle: ..."``."""
    removed: bool = False
    """The key is not in the config: a rule removed it (``removed_by_for_inference``); ``value`` is the one it had."""

    def __str__(self) -> str:
        if self.removed:
            return f"{self.path} removed  ({self.origin})"
        return f"{self.path} = {json.dumps(self.value)}  ({self.origin})"


def explain(config: ConfigBase) -> list[Explanation]:
    """Every key ``to_dict`` writes, in its order, with where its value came from.

    Keys ``resolve`` filled carry their recorded provenance; the others come from
    ``config.source`` (``"preset zero3"``, ``"file ds.json"``) or were set by the user.
    """
    default = config.source or "set by the user"
    provenance = config.provenance
    return [Explanation(path, value, provenance.get(path, default)) for path, value in leaves(to_dict(config))]


def render_explanation(explanations: list[Explanation]) -> str:
    """Aligned lines ``path  value  origin``, one per key (what ``dsbuild explain`` prints); a removed key's value
    reads ``(removed)``."""
    rows = [(e.path, "(removed)" if e.removed else json.dumps(e.value), e.origin) for e in explanations]
    if not rows:
        return ""
    path_width = max(len(r[0]) for r in rows)
    value_width = max(len(r[1]) for r in rows)
    return "\n".join(f"{p.ljust(path_width)}  {v.ljust(value_width)}  {o}" for p, v, o in rows)
