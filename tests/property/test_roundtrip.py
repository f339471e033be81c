"""Round trips through dict, JSON and TOML lose nothing, and reading never fails with anything but ConfigError."""

from __future__ import annotations

import json
from typing import Any

import tomli_w
from hypothesis import given
from hypothesis import strategies as st
from strategies import configs, ds_like_dicts, json_dicts, json_values, mutated_ds_dicts

from dsbuild import Config, ConfigError
from dsbuild._util.compat import tomllib
from dsbuild.io.convert import to_dict

from_dict = Config.from_dict


def assert_plain_json(value: Any, path: str = "", *, null: bool = False) -> None:
    """Only dict (str keys), list, str, int, float, bool: no tuples, AUTO, enums or subclasses.

    ``null=True`` also lets ``None`` through: a null read inside a table dsbuild carries as written
    (a passthrough section, a torch optimizer's params) is written back, as DeepSpeed would see it.
    """
    kind = type(value)
    if kind is dict:
        for k, v in value.items():
            assert type(k) is str, f"{path}: key {k!r}"
            assert_plain_json(v, f"{path}.{k}" if path else k, null=null)
    elif kind is list:
        for i, v in enumerate(value):
            assert_plain_json(v, f"{path}[{i}]", null=null)
    elif value is None:
        assert null, f"{path}: None"
    else:
        assert kind in (str, int, float, bool), f"{path}: {value!r} is a {kind.__name__}"
        assert kind is not float or value - value == 0, f"{path}: {value!r} is not a JSON number"


@given(configs())
def test_dict_round_trip_is_lossless(config: Config) -> None:
    """What the builder makes, to_dict writes and from_dict reads back equal."""
    assert Config.from_dict(config.to_dict()) == config


@given(configs())
def test_to_dict_writes_only_plain_json_types(config: Config) -> None:
    """The ds_config holds JSON types only, so any JSON/TOML/YAML writer and DeepSpeed take it."""
    assert_plain_json(config.to_dict())


@given(configs())
def test_json_round_trip_is_lossless(config: Config) -> None:
    """json.dumps / json.loads and back give the same config."""
    text = json.dumps(config.to_dict())
    assert Config.from_dict(json.loads(text)) == config


@given(configs())
def test_toml_round_trip_is_lossless(config: Config) -> None:
    """tomli_w.dumps / tomllib.loads and back give the same config (TOML has no null; none is written)."""
    text = tomli_w.dumps(config.to_dict())
    assert Config.from_dict(tomllib.loads(text)) == config


@given(configs())
def test_written_dict_is_a_fixed_point(config: Config) -> None:
    """Writing what was read writes the same dict again (nothing added, nothing renamed twice)."""
    d = to_dict(config)
    assert to_dict(from_dict(d)) == d


def _reads_or_refuses(data: Any, strict: bool) -> None:
    try:
        config = from_dict(data, strict=strict)
    except ConfigError:
        return
    # What was accepted can be written, and reads back the same.
    d = to_dict(config)
    assert_plain_json(d, null=True)
    assert from_dict(d) == config


@given(json_values(finite=False), st.booleans())
def test_any_json_value_reads_or_raises_config_error(data: Any, strict: bool) -> None:
    """from_dict on any JSON value returns a Config or raises ConfigError, never anything else."""
    _reads_or_refuses(data, strict)


@given(st.one_of(json_dicts(finite=False), ds_like_dicts()), st.booleans())
def test_ds_like_dicts_read_or_raise_config_error(data: dict[str, Any], strict: bool) -> None:
    """Dicts of DeepSpeed keys with arbitrary values: a Config or a ConfigError."""
    _reads_or_refuses(data, strict)


@given(mutated_ds_dicts(), st.booleans())
def test_broken_real_configs_read_or_raise_config_error(data: dict[str, Any], strict: bool) -> None:
    """A valid ds_config with a few values replaced by junk: a Config or a ConfigError, deep inside too."""
    _reads_or_refuses(data, strict)


@given(mutated_ds_dicts())
def test_non_strict_read_keeps_what_strict_refuses_only_as_unknown_keys(data: dict[str, Any]) -> None:
    """strict=False fails exactly when strict=True fails for a reason other than unknown keys."""
    try:
        from_dict(data)
        strict_error = None
    except ConfigError as e:
        strict_error = e
    try:
        lenient = from_dict(data, strict=False)
    except ConfigError:
        assert strict_error is not None
        assert any(p.message != "unknown key" for p in strict_error.problems)
        return
    if strict_error is None:
        assert lenient.ignored == {}
    else:
        unknown = {p.path for p in strict_error.problems}
        assert all(p.message == "unknown key" or "deprecated" in p.message for p in strict_error.problems)
        assert set(lenient.ignored) == unknown
