"""Versions of installed packages, read from their metadata (the package itself is never imported)."""

from __future__ import annotations

import functools
import importlib.metadata
import re

__all__ = ["installed", "installed_tuple", "version_tuple"]


def version_tuple(version: str) -> tuple[int, ...]:
    """``"0.19.8+cpu"`` -> ``(0, 19, 8)``: the leading numeric release parts."""
    parts: list[int] = []
    for piece in version.split("+")[0].split("."):
        match = re.match(r"\d+", piece)
        if match is None:
            break
        parts.append(int(match.group()))
        if match.group() != piece:
            break
    return tuple(parts)


@functools.cache
def installed(distribution: str) -> str | None:
    """The installed version of ``distribution`` (``"deepspeed"``), or ``None`` when it is not installed.

    Read once per process: reading package metadata costs far more than checking a config.
    """
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def installed_tuple(distribution: str) -> tuple[int, ...] | None:
    """``installed(distribution)`` as numbers, or ``None`` when it is not installed."""
    text = installed(distribution)
    return version_tuple(text) if text is not None else None
