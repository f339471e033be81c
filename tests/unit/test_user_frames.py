"""What the terminal shows of user code that failed: the frames in the user's own files (not dsbuild's, the standard
library's or an installed package's), the innermost exception of the chain, a comprehension's repeated line once."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest

from dsbuild._util.frames import full_traceback, user_frames

MODULE = """\
def outer(values):
    return [inner(v) for v in values]


def inner(v):
    return {"a": 1}[v]


def deep(n):
    return deep(n - 1) if n else inner("b")
"""


def _module(tmp_path: Path) -> ModuleType:
    path = tmp_path / "user_mod.py"
    path.write_text(MODULE, encoding="utf-8")
    spec = importlib.util.spec_from_file_location("user_mod", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _wrapped(call: object) -> BaseException:
    """What ``call`` raised, wrapped as dsbuild wraps it: a library frame (json's) in between, then an error raised
    from it."""
    try:
        try:
            json.loads("1", parse_int=call)  # type: ignore[arg-type]
        except KeyError as e:
            raise RuntimeError(f"the function raised KeyError: {e}") from e
    except RuntimeError as e:
        return e
    raise AssertionError("nothing raised")


def test_the_users_frames_of_the_cause_outermost_first(tmp_path: Path) -> None:
    """The frames in the user's module, in order, each with its code, not json's; the comprehension's
    frame (the same line) once; the exception left out when the error already says it."""
    module = _module(tmp_path)
    error = _wrapped(lambda _: module.outer(["b"]))
    shown = [line for line in user_frames(error) if "user_mod.py" in line]
    assert shown == [
        f"{tmp_path / 'user_mod.py'}:2 in outer: return [inner(v) for v in values]",
        f'{tmp_path / "user_mod.py"}:6 in inner: return {{"a": 1}}[v]',
    ]
    assert not any("json/" in line for line in user_frames(error))  # the library's frames, not the call of it here
    assert user_frames(error)[-1].startswith(str(tmp_path / "user_mod.py"))  # "KeyError: 'b'" is in the error's text


def test_a_deep_recursion_shows_its_innermost_frames_and_says_how_many_are_in_the_log(tmp_path: Path) -> None:
    """33 frames of the user's (this test's, deep's 31, inner's): the innermost 6, a line saying 27 more are in the
    log, the exception."""
    module = _module(tmp_path)
    with pytest.raises(KeyError) as raised:
        module.deep(30)
    shown = user_frames(raised.value)
    assert shown[0] == "(27 frames before these are in the log)"
    assert shown[-2].endswith('in inner: return {"a": 1}[v]') and shown[-1] == "KeyError: 'b'"
    assert len(shown) == 8


def test_no_frames_when_none_is_the_users() -> None:
    """An error raised inside the standard library: none of its frames is shown; the whole traceback has them."""
    try:
        json.loads("{")
    except ValueError as e:
        assert [line for line in user_frames(e) if "json/" in line] == []
        assert "JSONDecodeError" in full_traceback(e)
    assert sys.modules["json"]
