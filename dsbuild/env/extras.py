"""Optional packages: whether they are installed, and the ``pip install`` that brings them.

``pip install dsbuild`` is the config SDK alone; training needs ``dsbuild[train]`` (torch, DeepSpeed,
transformers, peft, datasets, tqdm, matplotlib) and YAML files need ``dsbuild[yaml]``. Code that needs
them calls ``require`` first, so a missing one is one line naming the exact install, not an ImportError.
"""

from __future__ import annotations

import importlib.util
from typing import Final

from ..errors import MissingDependencyError

__all__ = ["TRAIN", "missing", "require"]

TRAIN: Final = ("torch", "deepspeed", "transformers", "peft")
"""The packages every training path imports (the ``[train]`` extra brings them and the rest)."""


def missing(*modules: str) -> list[str]:
    """The modules of ``modules`` that are not installed (found without importing them)."""
    return [m for m in modules if importlib.util.find_spec(m) is None]


def require(purpose: str, *modules: str, extra: str = "train") -> None:
    """Raise ``MissingDependencyError`` naming ``pip install 'dsbuild[EXTRA]'`` when one of ``modules`` is missing."""
    absent = missing(*(modules or TRAIN))
    if absent:
        raise MissingDependencyError(", ".join(absent), purpose, extra=extra)
