"""dsbuild: typed, checked DeepSpeed configs, resolved like the HF Trainer, run by a Session.

``import dsbuild`` never imports torch, deepspeed, transformers or peft: building,
checking, resolving and exporting configs is instant. Only ``Session`` (and
``dsbuild train``) import them, when used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .config import AUTO, Config
from .errors import (
    ConfigError,
    ConflictError,
    DsbuildError,
    InvalidValueError,
    MissingDependencyError,
    PresetNotFoundError,
    UnknownKeyError,
    UnresolvedAutoError,
)
from .presets import presets
from .validate import Diagnostic

__version__ = "0.1.0"

__all__ = [
    "AUTO",
    "Config",
    "ConfigError",
    "ConflictError",
    "Diagnostic",
    "DsbuildError",
    "InvalidValueError",
    "MissingDependencyError",
    "PresetNotFoundError",
    "UnknownKeyError",
    "UnresolvedAutoError",
    "__version__",
    "presets",
]
