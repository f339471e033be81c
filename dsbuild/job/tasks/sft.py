"""``task = "sft"`` (the default): a causal LM on its data, as TRL's ``SFTTrainer``; no tables of its own, every
``[data]`` format no other task claims."""

from __future__ import annotations

from .base import JobTask

__all__ = ["TASK"]

TASK = JobTask("sft", label="SFT", config="SFTConfig")
