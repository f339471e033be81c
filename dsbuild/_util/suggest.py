""" "Did you mean ...?" for misspelt names."""

from __future__ import annotations

from collections.abc import Iterable


def closest(name: str, choices: Iterable[str]) -> str | None:
    """The choice closest to ``name`` (case-insensitive), or ``None`` when nothing is close."""
    import difflib  # only when a name is misspelt

    options = list(choices)
    lowered = {c.lower(): c for c in options}
    if name.lower() in lowered:
        return lowered[name.lower()]
    match = difflib.get_close_matches(name.lower(), list(lowered), n=1, cutoff=0.7)
    return lowered[match[0]] if match else None


def did_you_mean(name: str, choices: Iterable[str]) -> str | None:
    """``"did you mean 'x'?"`` or ``None``."""
    match = closest(name, choices)
    return f"did you mean {match!r}?" if match is not None and match != name else None
