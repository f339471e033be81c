"""dsbuild's folder in the user's cache (``$XDG_CACHE_HOME/dsbuild``, else ``~/.cache/dsbuild``): answers that
describe the machine or the installed libraries, never a run, so deleting it loses nothing but the time to ask again."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["user_cache"]


def user_cache(name: str) -> Path:
    """The folder of one kind of remembered answer (``"cpuinfo"``, ``"model-config"``); not made here."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "dsbuild" / name
