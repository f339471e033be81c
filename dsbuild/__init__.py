"""dsbuild: typed, checked DeepSpeed configs, resolved like the HF Trainer, run by a Session.

``import dsbuild`` never imports torch, deepspeed, transformers or peft: building,
checking, resolving and exporting configs (and reading job files with ``load_job``)
is instant. Only ``Session`` (and ``dsbuild train``) import them, when first used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

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
from .version import VERSION

if TYPE_CHECKING:
    from .api import Config
    from .config import AUTO
    from .io.presets import presets
    from .job import Job, load_job
    from .planner import Plan, plan
    from .resolve.training import Training
    from .run.checks import validate_job
    from .session import Session, SessionError, StepOutput
    from .validate import Diagnostic

__version__ = VERSION

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
    "validate_job",
]

_LAZY = {
    "Config": "api",
    "AUTO": "config",
    "Session": "session",
    "SessionError": "session",
    "StepOutput": "session",
    "Job": "job",
    "load_job": "job",
    "Plan": "planner",
    "plan": "planner",
    "Training": "resolve.training",
    "Diagnostic": "validate",
    "validate_job": "run.checks",
    "presets": "io.presets",
}
"""Names imported on first use: the Session needs torch and DeepSpeed, and the rest keeps
``import dsbuild`` + building a config well under a tenth of ``import deepspeed``; even ``Config`` waits for its
first use, so a command that builds no config (``dsbuild presets``) does not create the ~30 section classes."""


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'dsbuild' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})  # the lazy names too, for editors and dir()
