"""Shared by the tests/unit/test_io_*.py files: the readers that build a Config, a file writer, an error catcher."""

from __future__ import annotations

import functools
from pathlib import Path

import pytest

from dsbuild import Config, ConfigError
from dsbuild.io import config_files as io

# The readers build the class they are given; the public API gives Config.
load, read_json, read_toml, read_yaml = (
    functools.partial(f, cls=Config) for f in (io.load, io.read_json, io.read_toml, io.read_yaml)
)


def _write(path: Path, text: str | bytes) -> Path:
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text, encoding="utf-8")
    return path


def _error(call: object, *args: object, cls: type[ConfigError] = ConfigError) -> ConfigError:
    with pytest.raises(cls) as info:
        call(*args)  # type: ignore[operator]
    return info.value
