"""``task = "kto"``: completions labelled desirable or not, as TRL's ``KTOTrainer``: ``[reference]`` and ``[kto]``
(``KTOSpec``)."""

from __future__ import annotations

from typing import Any

from .base import JobTask, Reading
from .dpo import PAIR_DATA_KEYS

__all__ = ["TASK"]


def checks(reading: Reading) -> None:
    """The KL estimate needs two records a micro-batch."""
    kto, training = reading.tables.get("kto"), reading.training
    if kto is not None and kto.loss_type == "kto" and training is not None and training.per_device_train_batch_size < 2:
        reading.c.problem("training.per_device_train_batch_size", f"got {training.per_device_train_batch_size}: "
                          "KTO's KL estimate pairs each prompt with another completion of its micro-batch (TRL refuses 1)",
                          'set 2 or more, or kto.loss_type = "apo_zero_unpaired" (no KL)')  # fmt: skip


def shapes(job: Any) -> dict[str, Any]:
    """Rows up to ``[kto] max_length`` tokens, beside a reference (its mismatched KL rows are a forward without
    gradients) unless it is precomputed."""
    return {"seq_len": job.kto.max_length or job.data.max_length, "reference": not job.reference.precompute}


TASK = JobTask(
    "kto", label="KTO", config="KTOConfig", tables=("reference", "kto"), format="unpaired",
    records="labelled completions", fields="prompt / completion / label", records_are="unpaired data is",
    data_keys=PAIR_DATA_KEYS, length="[kto] max_length", reader="unpaired:load_kto_data", checks=checks,
    shapes=shapes,
)  # fmt: skip
