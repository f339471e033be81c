"""What differs between the Pythons dsbuild supports (3.10 and up): TOML reading is ``tomllib`` from 3.11, ``tomli``
before."""

from __future__ import annotations

import sys

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

__all__ = ["tomllib"]
