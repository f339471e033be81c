"""``task = "dpo"``: preference pairs as TRL's ``DPOTrainer`` prepares and scores them, against a frozen reference
built beside the policy (``[reference]``), with ``[dpo]``'s loss (``dsbuild.rl.dpo``)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import attrs

from ...job import Job

if TYPE_CHECKING:
    from . import Parts

__all__ = ["TASK"]


class DPO:
    def check(self, job: Job) -> None:
        """Nothing more than every job's checks (the pairs are checked with the data)."""

    def model(self, job: Job, pad: int) -> dict[str, Any]:
        """A causal LM, as the job's ``[model]`` says."""
        return {}

    def collate(self, job: Job, pad: int, default: Callable[[list[Any]], Any]) -> Callable[[list[Any]], Any]:
        """TRL's ``[chosen rows; rejected rows]``, each cut to ``[dpo] max_length`` as ``truncation_mode`` says."""
        from ...data.preference import collate_pairs

        assert job.dpo is not None
        return functools.partial(collate_pairs, pad_token_id=pad, max_length=job.dpo.max_length,
                                 truncation_mode=job.dpo.truncation_mode)  # fmt: skip

    def parts(self, job: Job, ready: Any, say: Callable[[str], None]) -> Parts:
        """DPO's ``loss_fn``, its reference built beside the policy (``[reference]``); with ``precompute`` every pair
        scored by the reference first (then the pairs carry their reference log-probs and no reference is kept)."""
        from ...rl.dpo import dpo_loss_fn, precompute_reference
        from . import Parts

        assert job.reference is not None and job.dpo is not None
        session = ready.session
        reference = session.reference(
            job.reference.path, offload=job.reference.offload, disable_dropout=job.dpo.disable_dropout
        )
        if not job.reference.precompute:
            return Parts(ready, ready.train, dpo_loss_fn(session, reference, job.dpo), None)
        say(f"scoring {len(ready.train)} pairs under the reference (reference.precompute)")
        size = job.dpo.precompute_ref_batch_size or session.infer_batch_size
        train = precompute_reference(reference, ready.train, ready.collate_fn, size, job.dpo)
        evaluation = (
            precompute_reference(reference, ready.evaluation, ready.collate_fn, size, job.dpo)
            if ready.evaluation is not None else None
        )  # fmt: skip
        del reference
        ready = attrs.evolve(ready, train=train, evaluation=evaluation)
        return Parts(ready, ready.train, dpo_loss_fn(session, None, job.dpo), None)


TASK = DPO()
