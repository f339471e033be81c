"""The tasks a job trains (``task``), as a job file states them: one module each, each making a ``JobTask`` (its
tables, the data it reads, its checks, what ``validate`` and ``dsbuild plan`` need of it), looked up by name in
``JOB_TASKS``. The job reader, ``Job.validate`` and ``dsbuild plan`` never name a task.

Adding a task: a module here and one line in ``JOB_TASKS``; its run is ``dsbuild.run.tasks``'s module of the same
name, found by it (docs/architecture.md walks it).
"""

from __future__ import annotations

from typing import Final

from . import dpo, grpo, kto, reward, rloo, sft
from .base import TABLE_SPECS, JobTask, Reading, claims

__all__ = ["JOB_TASKS", "TABLE_SPECS", "TASKS", "JobTask", "Reading", "claims", "task_tables"]

JOB_TASKS: Final[dict[str, JobTask]] = {
    t.name: t for t in (sft.TASK, dpo.TASK, grpo.TASK, reward.TASK, rloo.TASK, kto.TASK)
}
"""Each task by the name a job's ``task`` gives; the first is the default."""

TASKS: Final = tuple(JOB_TASKS)
"""What a job trains (``task``): ``"sft"`` (the default: a causal LM on its data, as TRL's SFTTrainer), ``"dpo"``
(preference pairs, as TRL's DPOTrainer), ``"grpo"`` (prompts, completions sampled and rewarded, as TRL's
GRPOTrainer), ``"reward"`` (a reward model on preference pairs, as TRL's RewardTrainer), ``"rloo"`` (GRPO's
prompts, completions and rewards, trained on as TRL's RLOOTrainer) or ``"kto"`` (completions labelled desirable or
not, as TRL's KTOTrainer)."""


def task_tables() -> dict[str, tuple[str, ...]]:
    """The tables each task of ``JOB_TASKS`` adds to a job, read only for that task."""
    return {name: task.tables for name, task in JOB_TASKS.items() if task.tables}
