"""Packaged TOML presets: the common ZeRO setups, by name.

A wheel carries them as ``dsbuild/presets/*.toml`` (hatchling's
``force-include``); a source checkout or editable install reads the
top-level ``presets/`` directory instead. This module only locates them (and
reads their one-line descriptions); ``dsbuild.io.config_files`` reads one like any other
config file (``Config.preset(name)``).
"""

from __future__ import annotations

import functools
from pathlib import Path

from .._util.suggest import did_you_mean
from ..errors import ConfigError, PresetNotFoundError, Problem

__all__ = ["PRESET_SUFFIX", "preset_names", "preset_path", "presets", "presets_dir"]

PRESET_SUFFIX = ".toml"


@functools.cache
def presets_dir() -> Path | None:
    """The directory holding the preset files, or ``None`` when neither location has one."""
    import importlib.resources  # when presets are first needed: `import dsbuild` stays light

    packaged = importlib.resources.files("dsbuild") / "presets"
    # Only a real directory will do: the readers take paths (a zipped install is not supported).
    if isinstance(packaged, Path) and packaged.is_dir():
        return packaged
    checkout = Path(__file__).resolve().parents[2] / "presets"
    return checkout if checkout.is_dir() else None


def preset_names() -> list[str]:
    """The preset names, sorted."""
    directory = presets_dir()
    if directory is None:
        return []
    return sorted(p.stem for p in directory.glob(f"*{PRESET_SUFFIX}") if p.is_file())


def presets() -> dict[str, str]:
    """Preset names (sorted) with their one-line descriptions."""
    return {name: _description(name) for name in preset_names()}


def preset_path(name: str) -> Path:
    """The file of preset ``name``; ``PresetNotFoundError`` (with "did you mean") when there is none."""
    names = preset_names()
    if name not in names:
        if not names:
            raise PresetNotFoundError(Problem("", f"no preset {name!r}", "no presets are installed"))
        suggestion = did_you_mean(name, names)
        listing = f"presets: {', '.join(names)}"
        raise PresetNotFoundError(
            Problem("", f"no preset {name!r}", f"{suggestion} {listing}" if suggestion else listing)
        )
    directory = presets_dir()
    assert directory is not None  # names is not empty
    return directory / f"{name}{PRESET_SUFFIX}"


def _description(name: str) -> str:
    """A preset's ``description``, read without following ``extends`` or converting."""
    path = preset_path(name)
    from .._util.compat import tomllib

    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        raise ConfigError(f"unreadable preset: {e}", source=str(path)) from None
    description = data.get("description")
    if not isinstance(description, str):
        raise ConfigError(
            Problem("description", "missing: every preset needs a one-line description"), source=str(path)
        )
    return description
