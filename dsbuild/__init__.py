"""dsbuild: typed, checked DeepSpeed configs, resolved like the HF Trainer, run by a Session.

``import dsbuild`` never imports torch, deepspeed, transformers or peft: building,
checking, resolving and exporting configs (and reading job files with ``load_job``)
is instant. Only ``Session`` (and ``dsbuild train``) import them, when first used.
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
from .job import Job, load_job
from .planner import Plan, plan
from .presets import presets
from .training import Training
from .validate import Diagnostic

if TYPE_CHECKING:
    from .session import Session, SessionError, StepOutput

__version__ = "0.1.0"

__all__ = [
    "AUTO",
    "Config",
    "ConfigError",
    "ConflictError",
    "Diagnostic",
    "DsbuildError",
    "InvalidValueError",
    "Job",
    "MissingDependencyError",
    "Plan",
    "PresetNotFoundError",
    "Session",
    "SessionError",
    "StepOutput",
    "Training",
    "UnknownKeyError",
    "UnresolvedAutoError",
    "__version__",
    "load_job",
    "plan",
    "presets",
]

_LAZY = {"Session", "SessionError", "StepOutput"}


def __getattr__(name: str) -> Any:
    # The Session needs torch and DeepSpeed: import them only when it is asked for.
    if name in _LAZY:
        from . import session

        return getattr(session, name)
    raise AttributeError(f"module 'dsbuild' has no attribute {name!r}")
