"""Static validation: diagnostics with dotted key paths, before anything is launched.

``validate()`` returns every problem found as a ``Diagnostic``; ``check()``
raises one ``ConfigError`` that lists every error.
"""

from __future__ import annotations

from typing import Literal

import attrs

from .config import Config
from .errors import ConfigError, Problem

__all__ = ["Diagnostic", "check", "validate"]

Severity = Literal["error", "warning"]


@attrs.frozen
class Diagnostic:
    """One finding about a config."""

    path: str
    """Dotted key path, e.g. ``zero_optimization.offload_param``."""
    severity: Severity
    """``"error"`` (DeepSpeed refuses it or it will not train as meant) or ``"warning"``."""
    message: str
    """What is wrong."""
    hint: str | None = None
    """What to do about it."""

    def __str__(self) -> str:
        text = f"{self.path}: {self.message}" if self.path else self.message
        return f"{text} ({self.hint})" if self.hint else text


def validate(config: Config, *, world_size: int | None = None, target: str = "deepspeed") -> list[Diagnostic]:
    """Every problem of ``config`` (errors first, then warnings)."""
    from .convert import REMOVED_KEYS

    found: list[Diagnostic] = []
    for path, _value in config.ignored.items():
        found.append(Diagnostic(path, "warning", "unknown key, ignored by DeepSpeed", "remove it or fix its spelling"))
    for key in config.extra:
        if key in REMOVED_KEYS:
            found.append(Diagnostic(key, "error", "removed from DeepSpeed 0.19", REMOVED_KEYS[key]))
    return sorted(found, key=lambda d: d.severity != "error")


def check(config: Config, *, world_size: int | None = None, target: str = "deepspeed") -> None:
    """Raise one ``ConfigError`` listing every error of ``config``."""
    errors = [d for d in validate(config, world_size=world_size, target=target) if d.severity == "error"]
    if errors:
        raise ConfigError([Problem(d.path, d.message, d.hint) for d in errors])
