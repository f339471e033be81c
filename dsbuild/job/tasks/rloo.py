"""``task = "rloo"``: GRPO's prompts, completions and rewards, trained on as TRL's ``RLOOTrainer``: GRPO's tables
with ``[rloo]`` (``RLOOSpec``) for ``[grpo]``; its reference is built by default (``beta`` 0.05)."""

from __future__ import annotations

from .grpo import prompt_task

__all__ = ["TASK"]

TASK = prompt_task("rloo", "RLOO", "RLOOConfig")
