"""The functions a job names (``"module:function"``: GRPO's reward functions, a rollout function), found and imported.

A job file that names a function runs that code: the module is imported (from the job file's folder first, then the
Python path) when the job is checked before launch and again in every process of the run. Data files and checkpoints
never run code; a job file's functions are the one exception, and only where the job says so (docs/jobs.md).
Stdlib only.
"""

from __future__ import annotations

import importlib
import re
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

from ..errors import ConfigError, Problem

__all__ = ["FUNCTION_REF", "function_ref_problem", "load_function"]

FUNCTION_REF: Final = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*$")
"""``module:function``: a dotted module path, a colon, a function name."""


def function_ref_problem(path: str, value: Any) -> Problem | None:
    """What is wrong with ``value`` as a ``"module:function"`` reference at ``path``, or ``None``."""
    if isinstance(value, str) and FUNCTION_REF.match(value):
        return None
    shown = repr(value) if isinstance(value, str) else type(value).__name__
    return Problem(
        path, f"got {shown}, expected 'module:function'", "e.g. 'my_rewards:length' (my_rewards.py beside the job)"
    )


def load_function(ref: str, *, base_dir: Path | None, key: str, source: str | None = None) -> Callable[..., Any]:
    """The function ``ref`` (``"module:function"``) names, its module imported with ``base_dir`` (the job file's
    folder) first on the path. ``ConfigError`` at ``key`` (checks failed: exit 1) when the module cannot be imported,
    has no such name, or the name is not callable; the import's own error is in the message, in one line."""
    problem = function_ref_problem(key, ref)
    if problem is not None:
        raise ConfigError(problem, source=source, checks=True)
    module_name, name = ref.split(":")
    folder = str(base_dir) if base_dir is not None else None
    if folder is not None and folder not in sys.path:
        sys.path.insert(0, folder)
    try:
        module = importlib.import_module(module_name)
    except Exception as e:
        frames = traceback.extract_tb(e.__traceback__) if e.__traceback__ else []
        at = f" ({Path(frames[-1].filename).name}:{frames[-1].lineno})" if frames else ""
        where = f" (looked in {folder} and the Python path)" if isinstance(e, ModuleNotFoundError) else at
        message = f"importing {module_name!r} failed: {type(e).__name__}: {e}{where}"
        raise ConfigError(Problem(key, message), source=source, checks=True) from None
    function = getattr(module, name, None)
    if function is None:
        names = sorted(
            n
            for n, v in vars(module).items()
            if callable(v) and not n.startswith("_") and getattr(v, "__module__", None) == module.__name__
        )
        hint = f"it defines {', '.join(names[:8])}" if names else None
        raise ConfigError(Problem(key, f"{module_name!r} has no {name!r}", hint), source=source, checks=True)
    if not callable(function):
        message = f"{ref} is {type(function).__name__}, not a function"
        raise ConfigError(Problem(key, message), source=source, checks=True)
    return function  # type: ignore[no-any-return]
