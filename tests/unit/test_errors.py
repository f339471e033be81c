"""The exception tree, its messages, and "did you mean"."""

from __future__ import annotations

import pytest

from dsbuild import (
    ConfigError,
    ConflictError,
    DsbuildError,
    InvalidValueError,
    MissingDependencyError,
    PresetNotFoundError,
    UnknownKeyError,
    UnresolvedAutoError,
)
from dsbuild._util.suggest import closest, did_you_mean
from dsbuild.errors import Problem


def test_error_tree() -> None:
    """ConfigError is a ValueError (for code that catches that) and every specific error is a ConfigError."""
    assert issubclass(ConfigError, DsbuildError) and issubclass(ConfigError, ValueError)
    for cls in (UnknownKeyError, InvalidValueError, ConflictError, UnresolvedAutoError, PresetNotFoundError):
        assert issubclass(cls, ConfigError)
    assert issubclass(PresetNotFoundError, LookupError)
    assert issubclass(MissingDependencyError, ImportError) and issubclass(MissingDependencyError, DsbuildError)


def test_problem_text() -> None:
    """A problem reads "path: message (hint)"; the path and hint are left out when empty."""
    assert (
        str(Problem("zero_optimization.stage", "got 4, expected 0-3")) == "zero_optimization.stage: got 4, expected 0-3"
    )
    assert str(Problem("", "not a table")) == "not a table"
    assert str(Problem("gradient_clipp1ng", "unknown key", "did you mean 'gradient_clipping'?")) == (
        "gradient_clipp1ng: unknown key (did you mean 'gradient_clipping'?)"
    )


@pytest.mark.parametrize(
    ("path", "prefix", "expected"),
    [
        ("device", "zero_optimization.offload_optimizer", "zero_optimization.offload_optimizer.device"),
        ("[0].size", "packages", "packages[0].size"),
        ("", "fp16", "fp16"),
        ("stage", "", "stage"),
    ],
)
def test_problem_prefixed_builds_the_dotted_path(path: str, prefix: str, expected: str) -> None:
    """Paths grow as errors bubble up: keys join with dots, list indexes without."""
    assert Problem(path, "m").prefixed(prefix).path == expected


def test_one_problem_message() -> None:
    """One problem is the whole message."""
    e = InvalidValueError(Problem("fp16.enabled", "got 'yes', expected true or false"))
    assert str(e) == "fp16.enabled: got 'yes', expected true or false"
    assert e.problems == (Problem("fp16.enabled", "got 'yes', expected true or false"),)


def test_several_problems_one_per_line() -> None:
    """Several problems are counted, then listed one per line."""
    e = ConfigError([Problem("a", "unknown key", "did you mean 'b'?"), Problem("c.d", "got 1, expected true or false")])
    assert str(e) == ("2 problems:\n  a: unknown key (did you mean 'b'?)\n  c.d: got 1, expected true or false")


def test_message_from_a_string_and_a_source() -> None:
    """A plain string is one problem without a path; the source file leads the message."""
    assert str(ConfigError("no config given")) == "no config given"
    e = UnknownKeyError([Problem("x", "unknown key"), Problem("y", "unknown key")], source="ds.json")
    assert str(e) == "ds.json: 2 problems:\n  x: unknown key\n  y: unknown key"
    assert str(InvalidValueError(Problem("x", "bad")).with_source("a.toml")) == "a.toml: x: bad"


def test_prefixed_and_with_source_keep_the_class() -> None:
    """Re-raising under a prefix or a file name keeps the specific error class."""
    e = UnknownKeyError(Problem("overlap_com", "unknown key"))
    moved = e.prefixed("zero_optimization")
    assert type(moved) is UnknownKeyError
    assert str(moved) == "zero_optimization.overlap_com: unknown key"
    assert type(e.with_source("ds.json")) is UnknownKeyError


def test_missing_dependency_names_the_install_command() -> None:
    """A missing optional package says which pip install fixes it."""
    assert (
        str(MissingDependencyError("pyyaml", "Reading YAML"))
        == "Reading YAML needs the 'pyyaml' package: pip install pyyaml"
    )
    e = MissingDependencyError("deepspeed", "Session", extra="train")
    assert str(e) == "Session needs the 'deepspeed' package: pip install 'dsbuild[train]'"
    assert e.package == "deepspeed"


def test_did_you_mean() -> None:
    """Close names are suggested (case-insensitively, in their real spelling); far ones and exact ones are not."""
    names = ["gradient_clipping", "gradient_accumulation_steps", "zero_optimization"]
    assert did_you_mean("gradient_clipp1ng", names) == "did you mean 'gradient_clipping'?"
    assert did_you_mean("Zero_Optimization", names) == "did you mean 'zero_optimization'?"
    assert did_you_mean("zero_optimization", names) is None
    assert did_you_mean("cuda_visible_devices", names) is None
    assert closest("GRADIENT_CLIPPING", names) == "gradient_clipping"
    assert closest("x", []) is None
