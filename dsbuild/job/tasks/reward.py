"""``task = "reward"``: a reward model on preference pairs, as TRL's ``RewardTrainer``: ``[reward]``
(``RewardSpec``)."""

from __future__ import annotations

from typing import Any

from .base import JobTask
from .dpo import PAIR_DATA_KEYS

__all__ = ["TASK"]


def shapes(job: Any) -> dict[str, Any]:
    """A micro-batch is its pairs' chosen and rejected rows, each up to ``[reward] max_length`` tokens, through a
    scorer (the model as ``AutoModelForSequenceClassification``: a score head for the LM head)."""
    return {"seq_len": job.reward.max_length or job.data.max_length,
            "micro_batch": 2 * job.training.per_device_train_batch_size, "scorer": True}  # fmt: skip


TASK = JobTask(
    "reward", label="reward", config="RewardConfig", tables=("reward",), format="preference", records="pairs",
    fields="prompt / chosen / rejected", records_are="pairs are", data_keys=PAIR_DATA_KEYS,
    length="[reward] max_length", reader="preference:load_job_reward_pairs", shapes=shapes,
)  # fmt: skip
