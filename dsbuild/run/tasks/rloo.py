"""``task = "rloo"``: GRPO's prompts, completions (the policy's ``generate``, or the job's rollout function) and reward
models and functions (``run.tasks.grpo``), trained on as TRL 1.16's ``RLOOTrainer`` does (``dsbuild.rl.rollouts.
RLOOSteps``: the KL penalty on each reward, the leave-one-out baseline, the clipped sequence ratio), with a reference
beside the policy when ``[rloo] beta`` > 0 (RLOOConfig's default, 0.05)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...job import Job
from .grpo import GRPO

if TYPE_CHECKING:
    from ...job.rl import GRPOSpec, RLOOSpec
    from ...rl.rollouts import GRPOSteps

__all__ = ["TASK"]


class RLOO(GRPO):
    def spec(self, job: Job) -> GRPOSpec | RLOOSpec | None:
        """``[rloo]``."""
        return job.rloo

    def steps(self) -> type[GRPOSteps]:
        """``RLOOSteps``: RLOO's advantages and loss on GRPO's generation batches."""
        from ...rl.rollouts import RLOOSteps

        return RLOOSteps


TASK = RLOO()
