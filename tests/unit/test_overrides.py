"""``--set KEY=VALUE``: values are TOML (a bare word the shell leaves unquoted is a string); anything else is
refused with TOML's error, never silently turned into text or cut at a line break."""

from __future__ import annotations

import pytest

from dsbuild._util.overrides import parse_set
from dsbuild.errors import ConfigError


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("training.learning_rate=2e-5", ("training.learning_rate", 2e-5)),
        ("training.bf16=true", ("training.bf16", True)),
        ("training.output_dir=out/run1", ("training.output_dir", "out/run1")),
        ('data.path="a b.jsonl"', ("data.path", "a b.jsonl")),
        ("launch.device_mapping=[0, 1]", ("launch.device_mapping", [0, 1])),
        ("strategy.config.zero_optimization={stage = 3}", ("strategy.config.zero_optimization", {"stage": 3})),
    ],
)
def test_values_are_toml_or_bare_words(text: str, expected: tuple[str, object]) -> None:
    """TOML values keep their type; a bare word is the string it reads as."""
    assert parse_set(text) == expected


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("a=[1,2", "--set a='[1,2': not a TOML value (Unclosed array"),
        ("a=hello world", "--set a='hello world': not a TOML value"),
        ("a=list(range(0,2)) + [1]", "not a TOML value"),
        ("a=1\nb=2", "--set a=...: the value holds a line break or control character"),
        ("a=" + "[" * 3000 + "]" * 3000, "--set a=...: the value is nested too deep to read"),
        ("a=" + "(" * 3000, "--set a='((((("),
        ("training.", "expected KEY=VALUE"),
    ],
)
def test_values_that_are_not_toml_are_refused(text: str, message: str) -> None:
    """A value that is neither TOML nor a bare word, or spans lines, is a ConfigError saying why."""
    with pytest.raises(ConfigError) as e:
        parse_set(text)
    assert message in str(e.value)
