"""The tested set is what the project's own environment holds: constraints.txt (tools/lock.sh) locks every package,
and the README's first command installs exactly those versions."""

from __future__ import annotations

import importlib.metadata
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LOCK = ROOT / "constraints.txt"


def locked() -> dict[str, str]:
    pins = {}
    for line in LOCK.read_text().splitlines():
        match = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)", line.split("#", 1)[0].strip())
        if match:
            pins[match.group(1)] = match.group(2)
    return pins


def test_the_lock_pins_the_whole_training_stack_and_torch_without_a_build_label() -> None:
    """The lock holds every package of dsbuild[train,dev], torch as a plain release (CPU wheel here, CUDA elsewhere)."""
    pins = locked()
    for name in ("torch", "deepspeed", "transformers", "peft", "datasets", "accelerate", "attrs", "pytest"):
        assert name in pins, name
    assert "+" not in pins["torch"]
    assert not [name for name in pins if name.startswith("nvidia-")]  # the CPU build's dependencies, not CUDA's
    assert "tools/lock.sh" in LOCK.read_text()  # the command that regenerates it, at its top


@pytest.mark.skipif(
    Path(sys.prefix).resolve() != (ROOT / ".venv").resolve(), reason="runs in the project's own .venv (quick start)"
)
def test_the_project_environment_is_the_lock() -> None:
    """Every locked package is installed in .venv at its locked version (torch's build label aside)."""
    wrong = {}
    for name, version in locked().items():
        try:
            have = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            have = "missing"
        if have.split("+", 1)[0] != version:
            wrong[name] = f"{have} (locked {version})"
    assert not wrong, wrong
