"""``task = "dpo"``: preference pairs, as TRL's ``DPOTrainer``: ``[reference]`` and ``[dpo]`` (``DPOSpec``)."""

from __future__ import annotations

from typing import Any

from .base import JobTask

__all__ = ["PAIR_DATA_KEYS", "TASK"]

PAIR_DATA_KEYS = frozenset({"path", "eval_path", "format", "chat_template"})
"""The ``[data]`` keys a DPO, reward or KTO job reads (the lengths are its own table's, as TRL's configs)."""


def shapes(job: Any) -> dict[str, Any]:
    """A micro-batch is its pairs' chosen and rejected rows, each up to ``[dpo] max_length`` tokens, beside a
    reference unless it is precomputed."""
    return {"seq_len": job.dpo.max_length or job.data.max_length, "reference": not job.reference.precompute,
            "micro_batch": 2 * job.training.per_device_train_batch_size}  # fmt: skip


TASK = JobTask(
    "dpo", label="DPO", config="DPOConfig", tables=("reference", "dpo"), format="preference", records="pairs",
    fields="prompt / chosen / rejected", records_are="pairs are", data_keys=PAIR_DATA_KEYS,
    length="[dpo] max_length and truncation_mode", reader="preference:load_job_pairs", shapes=shapes,
)  # fmt: skip
