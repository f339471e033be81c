"""Reward functions of examples/job_grpo.toml, called as TRL's GRPOTrainer calls them.

Each gets the prompts and completions of a batch (one prompt per completion), the completions' token ids, and the
records' other fields by name (here ``target``), and returns one number per completion (``None``: not scored).
"""

from __future__ import annotations

from typing import Any


def length(completions: list[str], target: list[int], **_: Any) -> list[float]:
    """1 when a completion is ``target`` characters long, less the further it is from it."""
    return [-abs(len(c) - t) / t for c, t in zip(completions, target, strict=True)]


def no_spaces(completions: list[str], **_: Any) -> list[float]:
    """The share of a completion's characters that are not spaces."""
    return [sum(ch != " " for ch in c) / max(len(c), 1) for c in completions]
