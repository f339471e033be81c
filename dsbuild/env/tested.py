"""The versions dsbuild was tested with, and the combinations known to break (``dsbuild doctor`` reads them).

``TESTED`` is the training stack of the lock (``constraints.txt``, made by ``tools/lock.sh``), ``OLDEST`` the lower
bounds of ``pyproject.toml``'s ``[train]`` extra, run against the fast suite by ``tools/check_oldest.sh``; a test
holds both against those files, so they cannot drift. ``KNOWN_BAD`` is what ``tools/check_newest.py`` and the
oldest-set run found broken, each with the fix (docs/compatibility.md has the table).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final, Literal

import attrs

from .versions import version_tuple

__all__ = ["KNOWN_BAD", "OLDEST", "STACK", "TESTED", "KnownBad", "known_bad", "release_verdict"]

STACK: Final = ("torch", "deepspeed", "transformers", "peft", "datasets", "accelerate")
"""The training stack whose versions matter to what dsbuild promises."""

TESTED: Final[Mapping[str, str]] = {
    "torch": "2.13.0",
    "deepspeed": "0.19.8",
    "transformers": "5.24.0",
    "peft": "0.21.2",
    "datasets": "5.2.0",
    "accelerate": "1.15.0",
}
"""The lock's versions: the whole suite passed with exactly these."""

OLDEST: Final[Mapping[str, str]] = {
    "torch": "2.13",
    "deepspeed": "0.19.8",
    "transformers": "5.20",
    "peft": "0.20",
    "datasets": "4.0",
    "accelerate": "1.10",
}
"""``pyproject.toml``'s lower bounds: the oldest versions the fast suite passed with."""


@attrs.frozen
class KnownBad:
    """A version range of one package that breaks, alone or beside a range of another."""

    package: str
    """The package whose installed version is looked at."""
    since: str | None
    """First broken release (``None``: every release before ``until``)."""
    until: str | None
    """First good release again (``None``: not fixed yet)."""
    what: str
    """What breaks, in one line."""
    fix: str
    """What to do: the exact ``pip install`` or the code change."""
    severity: Literal["fail", "warn"] = "fail"
    """``"fail"``: dsbuild itself breaks; ``"warn"``: only a pattern in the user's own code does."""
    with_package: str | None = None
    """Broken only beside this package ..."""
    with_since: str | None = None
    """... from this release of it on."""

    def matches(self, versions: Mapping[str, str | None]) -> bool:
        """The installed ``versions`` fall in this row's ranges."""
        if not _within(versions.get(self.package), self.since, self.until):
            return False
        return self.with_package is None or _within(versions.get(self.with_package), self.with_since, None)


def _within(version: str | None, since: str | None, until: str | None) -> bool:
    if version is None:
        return False
    v = version_tuple(version)
    return (since is None or v >= version_tuple(since)) and (until is None or v < version_tuple(until))


KNOWN_BAD: Final[tuple[KnownBad, ...]] = (
    KnownBad(
        "transformers",
        "5.24",
        None,
        "building a model inside your own deepspeed.zero.Init fails (TypeError: Signature mismatch ... "
        "tensor_pynew): the model imports torch._dynamo while zero.Init has patched torch's tensor constructors",
        "call dsbuild.session.ready_for_zero_init(config) before deepspeed.zero.Init (Session does it itself)",
        severity="warn",
    ),
)
"""Combinations found broken (tools/check_newest.py, tools/check_oldest.sh), newest first."""


def known_bad(versions: Mapping[str, str | None]) -> list[KnownBad]:
    """The rows of ``KNOWN_BAD`` that the installed ``versions`` (package -> version or ``None``) fall in."""
    return [row for row in KNOWN_BAD if row.matches(versions)]


def release_verdict(package: str, version: str) -> Literal["tested", "untested", "too old"]:
    """Where ``version`` of ``package`` stands: the lock's release, another one, or below the oldest tested."""
    if version_tuple(version) < version_tuple(OLDEST[package]):
        return "too old"
    if version_tuple(version) == version_tuple(TESTED[package]):
        return "tested"
    return "untested"
