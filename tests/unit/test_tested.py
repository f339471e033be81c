"""dsbuild.env.tested, the table doctor reads, holds the lock's versions and pyproject.toml's lower bounds, so it cannot
drift from what was tested."""

from __future__ import annotations

import re
from pathlib import Path

from dsbuild._util.compat import tomllib
from dsbuild.env.tested import KNOWN_BAD, OLDEST, STACK, TESTED, known_bad, release_verdict

ROOT = Path(__file__).resolve().parents[2]


def test_tested_is_the_lock() -> None:
    """TESTED lists the training stack at the versions constraints.txt locks."""
    text = (ROOT / "constraints.txt").read_text()
    locked = dict(re.findall(r"^([a-z0-9_.-]+)==(\S+)$", text, flags=re.M))
    assert {name: locked[name] for name in STACK} == dict(TESTED)


def test_oldest_is_pyprojects_lower_bounds() -> None:
    """OLDEST lists the [train] extra's lower bounds of the training stack (accelerate's from [dev])."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    requirements = project["optional-dependencies"]["train"] + project["optional-dependencies"]["dev"]
    bounds = dict(re.findall(r"^([a-z0-9_.-]+)>=([0-9.]+)", "\n".join(requirements), flags=re.M))
    assert {name: bounds[name] for name in STACK} == dict(OLDEST)


def test_verdicts() -> None:
    """The lock's release is tested, a later one untested, one below the oldest tested too old."""
    assert release_verdict("torch", "2.13.0+cpu") == "tested"
    assert release_verdict("transformers", "99.0") == "untested"
    assert release_verdict("deepspeed", "0.1.0") == "too old"


def test_known_bad_rows_match_their_ranges() -> None:
    """A row matches inside its range only; every row says what breaks and how to fix it."""
    row = KNOWN_BAD[0]
    assert known_bad({row.package: row.since}) == [row]
    assert known_bad({row.package: "0.0.1"}) == []
    assert known_bad({}) == []
    assert all(r.what and r.fix and r.package in STACK for r in KNOWN_BAD)
