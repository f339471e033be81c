"""Any bytes in a config file give a ``Config`` or a ``ConfigError``, quickly: never a crash, a hang or a blow-up."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import yaml  # noqa: F401
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from strategies import file_bytes

from dsbuild import Config, ConfigError

BOUND_S = 5.0
"""Seconds one file may take to read, generous for a shared machine (a real one takes milliseconds)."""


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fuzz")


def _load_within_bound(path: Path, raw: bytes, strict: bool) -> None:
    path.write_bytes(raw)
    start = time.monotonic()
    try:
        config = Config.load(path, strict=strict)
    except ConfigError as e:
        assert str(path) in str(e) or e.source is not None, f"the error names no file: {e}"
    else:
        assert isinstance(config, Config)
    elapsed = time.monotonic() - start
    assert elapsed < BOUND_S, f"reading took {elapsed:.1f} s"


@pytest.mark.parametrize("suffix", [".json", ".toml", ".yaml"])
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data(), strict=st.booleans())
def test_any_bytes_give_a_config_or_a_config_error_in_bounded_time(
    folder: Path, suffix: str, data: st.DataObject, strict: bool
) -> None:
    """A file of any bytes, in any of the formats, reads as a Config or a ConfigError naming a file, within a bound."""
    raw = data.draw(file_bytes(suffix), label="bytes")
    _load_within_bound(folder / f"doc{suffix}", raw, strict)
