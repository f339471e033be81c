"""The functions a job names (``"module:function"``: GRPO's reward functions, a rollout function), found and imported.

A job file that names a function runs that code: the module is imported (from the job file's folder first, then the
Python path) when the job is checked before launch and again in every process of the run. Data files and checkpoints
never run code; a job file's functions are the one exception, and only where the job says so (docs/jobs.md).
Stdlib only.
"""

from __future__ import annotations

import importlib
import inspect
import re
import sys
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Final

from ..errors import ConfigError, Problem

__all__ = [
    "FUNCTION_REF",
    "REWARD_KEY",
    "REWARD_KEYWORDS",
    "function_ref_problem",
    "load_function",
    "reward_signature_problem",
]

FUNCTION_REF: Final = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*$")
"""``module:function``: a dotted module path, a colon, a function name."""

REWARD_KEY: Final = "rewards.functions"
"""The dotted key of a job's reward functions: a function loaded under it (``rewards.functions[0]``) is a reward
function, and its signature is checked."""

REWARD_KEYWORDS: Final = ("prompts", "completions", "completion_ids", "trainer_state", "log_extra", "log_metric")
"""The keyword arguments TRL 1.16's ``GRPOTrainer`` calls every reward function with, beside the records' other
fields (``_calculate_rewards``)."""


def reward_signature_problem(function: Callable[..., Any], columns: Sequence[str] | None = None) -> str | None:
    """Why TRL's call ``function(prompts=..., completions=..., completion_ids=..., trainer_state=..., log_extra=...,
    log_metric=..., **columns)`` would fail on ``function``'s signature, or ``None``. With ``columns`` unknown (before
    the records are read) a required argument beyond TRL's is taken for a field of the records; a function without a
    signature Python can read (a builtin) is not judged."""
    try:
        parameters = list(inspect.signature(function).parameters.values())
    except (TypeError, ValueError):
        return None
    given = [*REWARD_KEYWORDS, *(columns or ())]
    kinds = inspect.Parameter
    by_keyword = {p.name for p in parameters if p.kind in (kinds.POSITIONAL_OR_KEYWORD, kinds.KEYWORD_ONLY)}
    if not any(p.kind is kinds.VAR_KEYWORD for p in parameters):
        refused = [name for name in given if name not in by_keyword]
        if refused:
            return f"does not take TRL's keyword argument{'s' if len(refused) > 1 else ''} {', '.join(refused)}"
    required = [
        p.name
        for p in parameters
        if p.default is kinds.empty and p.kind not in (kinds.VAR_POSITIONAL, kinds.VAR_KEYWORD)
        and (p.kind is kinds.POSITIONAL_ONLY or (columns is not None and p.name not in given))
    ]  # fmt: skip
    if required:
        what = "by position only" if any(p.kind is kinds.POSITIONAL_ONLY for p in parameters) else "(no such field)"
        return f"needs {', '.join(required)}, which TRL does not pass {what}"
    return None


def function_ref_problem(path: str, value: Any) -> Problem | None:
    """What is wrong with ``value`` as a ``"module:function"`` reference at ``path``, or ``None``."""
    if isinstance(value, str) and FUNCTION_REF.match(value):
        return None
    shown = repr(value) if isinstance(value, str) else type(value).__name__
    return Problem(
        path, f"got {shown}, expected 'module:function'", "e.g. 'my_rewards:length' (my_rewards.py beside the job)"
    )


def _forget_another(module_name: str, folder: Path) -> None:
    """Where ``folder`` holds the module (``NAME.py`` or a package) and this process imported a module of that name
    from elsewhere (another job's folder), that one is forgotten, so the job gets its own file's functions."""
    top = module_name.split(".")[0]
    if not ((folder / f"{top}.py").is_file() or (folder / top / "__init__.py").is_file()):
        return
    where = getattr(sys.modules.get(top), "__file__", None)
    if where is not None and not Path(where).resolve().is_relative_to(folder.resolve()):
        for loaded in [n for n in sys.modules if n == top or n.startswith(f"{top}.")]:
            del sys.modules[loaded]
        importlib.invalidate_caches()


def load_function(ref: str, *, base_dir: Path | None, key: str, source: str | None = None) -> Callable[..., Any]:
    """The function ``ref`` (``"module:function"``) names, its module imported with ``base_dir`` (the job file's
    folder) first on the path. ``ConfigError`` at ``key`` (checks failed: exit 1) when the module cannot be imported,
    has no such name, or the name is not callable; the import's own error is in the message, in one line. A reward
    function (``key`` under ``rewards.functions``) whose signature refuses TRL's keyword arguments is named too
    (``reward_signature_problem``); ``async def`` is fine."""
    problem = function_ref_problem(key, ref)
    if problem is not None:
        raise ConfigError(problem, source=source, checks=True)
    module_name, name = ref.split(":")
    folder = str(base_dir) if base_dir is not None else None
    if folder is not None:
        if folder in sys.path:
            sys.path.remove(folder)
        sys.path.insert(0, folder)
        _forget_another(module_name, Path(folder))
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
    if key.startswith(f"{REWARD_KEY}[") and (why := reward_signature_problem(function)) is not None:
        hint = (
            "TRL calls f(prompts=, completions=, completion_ids=, trainer_state=, log_extra=, log_metric=, **fields): "
            "add **kwargs"
        )
        raise ConfigError(Problem(key, f"{ref} {why}", hint), source=source, checks=True)
    return function  # type: ignore[no-any-return]
