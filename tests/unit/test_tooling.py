"""The project's own tools agree with the code: ruff (lint and format) and mypy (strict, the package and
tests/typing/api.py), with the versions pinned in pyproject's dev extra."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _tool(name: str) -> str:
    found = shutil.which(name, path=str(Path(sys.executable).parent)) or shutil.which(name)
    if found is None:
        pytest.skip(f"{name} is not installed: pip install -e '.[dev]'")
    return found


def _run(*cmd: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600, check=False)


@pytest.mark.procs
def test_ruff_check_is_clean() -> None:
    """`ruff check .` finds nothing."""
    done = _run(_tool("ruff"), "check", ".", "--output-format", "concise")
    assert done.returncode == 0, done.stdout + done.stderr


def test_ruff_format_is_clean() -> None:
    """`ruff format --check .` would change nothing."""
    done = _run(_tool("ruff"), "format", "--check", ".")
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.procs
@pytest.mark.slow
def test_mypy_strict_is_clean() -> None:
    """mypy --strict accepts the package and the typed usage in tests/typing (the oldest supported Python's view)."""
    done = _run(_tool("mypy"))
    assert done.returncode == 0, done.stdout + done.stderr
