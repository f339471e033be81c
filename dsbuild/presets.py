"""Packaged TOML presets (placeholder until the preset loader lands)."""

from __future__ import annotations


def presets() -> dict[str, str]:
    """Preset names with their one-line descriptions."""
    return {}
