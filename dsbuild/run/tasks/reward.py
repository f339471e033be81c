"""``task = "reward"``: a reward model trained on preference pairs as TRL's ``RewardTrainer`` trains it: the job's
model built as an ``AutoModelForSequenceClassification`` with one label (from ``[model.config]`` or a causal model's
weights, the score head new), the pairs tokenized whole (``data.preference.load_reward_data``), the Bradley–Terry
loss and TRL's metrics (``dsbuild.rl.reward``) with ``[reward]``'s options. The saved model loads with
``AutoModelForSequenceClassification`` and is what a GRPO job's ``[rewards] models`` scores with."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ...job import Job

if TYPE_CHECKING:
    from . import Parts

__all__ = ["TASK"]


class Reward:
    def check(self, job: Job) -> None:
        """Nothing more than every job's checks (the pairs are checked with the data)."""

    def model(self, job: Job, pad: int) -> dict[str, Any]:
        """TRL's reward model: ``AutoModelForSequenceClassification`` with ``num_labels=1``, its config's pad id the
        tokenizer's ``pad`` (where it reads the score) set once it is built, before a ``--resume`` compares the
        model's fingerprint with a checkpoint's. Not a keyword of the build, as TRL: that would also make ``pad``
        the embedding's ``padding_idx``, whose row gets no gradient from a pad token inside a text (TRL's row does)."""
        return {"model_class": "AutoModelForSequenceClassification", "model_kwargs": {"num_labels": 1},
                "config": {"pad_token_id": pad}}  # fmt: skip

    def collate(self, job: Job, pad: int, default: Callable[[list[Any]], Any]) -> Callable[[list[Any]], Any]:
        """TRL's ``[chosen rows; rejected rows]``, right-padded, with the pairs' margins."""
        from ...data.preference import collate_scored_pairs

        return functools.partial(collate_scored_pairs, pad_token_id=pad)

    def parts(self, job: Job, ready: Any, say: Callable[[str], None]) -> Parts:
        """The reward loss, dropout off with ``disable_dropout``."""
        from ...rl.reward import reward_loss_fn
        from ...session.reference import disable_dropout
        from . import Parts

        assert job.reward is not None
        if job.reward.disable_dropout:
            disable_dropout(ready.session.model)
        return Parts(ready, ready.train, reward_loss_fn(job.reward, ready.session), None)


TASK = Reward()
