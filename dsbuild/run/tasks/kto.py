"""``task = "kto"``: completions labelled desirable or not, as TRL 1.16's ``KTOTrainer`` prepares and scores them
(``data.unpaired``), against a frozen reference built beside the policy (``[reference]``), with ``[kto]``'s loss
(``dsbuild.rl.kto``). The micro-batches are the records in order, each a chunk whose completions its KL pairs
rotate (TRL's ``train_sampling_strategy = "sequential"``), dealt to the processes in turn as Accelerate deals them
(``session.batches.Shards``, unshuffled: the last round filled with the first chunks)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import attrs

from ...job import Job

if TYPE_CHECKING:
    from . import Parts

__all__ = ["TASK"]


class KTO:
    def check(self, job: Job) -> None:
        """Nothing more than every job's checks (the records are checked with the data)."""

    def model(self, job: Job, pad: int) -> dict[str, Any]:
        """A causal LM, as the job's ``[model]`` says."""
        return {}

    def collate(self, job: Job, pad: int, default: Callable[[list[Any]], Any]) -> Callable[[list[Any]], Any]:
        """TRL's rows of ``prompt + completion`` and of ``prompt + KL completion``, each cut to ``[kto] max_length``."""
        from ...data.unpaired import collate_unpaired

        assert job.kto is not None
        return functools.partial(collate_unpaired, pad_token_id=pad, max_length=job.kto.max_length)

    def parts(self, job: Job, ready: Any, say: Callable[[str], None]) -> Parts:
        """KTO's ``loss_fn``, its reference built beside the policy (with ``precompute`` every record scored by it
        first, then dropped: the records carry its log-probs), and the records in sequential micro-batches."""
        from torch.utils.data import DataLoader

        from ...rl.kto import kto_loss_fn, precompute_reference
        from ...session.batches import Shards
        from . import Parts

        assert job.reference is not None and job.kto is not None
        session = ready.session
        reference = session.reference(
            job.reference.path, offload=job.reference.offload, disable_dropout=job.kto.disable_dropout
        )
        if job.reference.precompute:
            say(f"scoring {len(ready.train)} records under the reference (reference.precompute)")
            size = job.kto.precompute_ref_batch_size or session.micro_batch_size
            scored = [precompute_reference(reference, samples, ready.collate_fn, size) if samples is not None else None
                      for samples in (ready.train, ready.evaluation)]  # fmt: skip
            ready, reference = attrs.evolve(ready, train=scored[0], evaluation=scored[1]), None
        batches = Shards(len(ready.train), session.micro_batch_size, world_size=session.world_size, rank=session.rank,
                         shuffle=False)  # fmt: skip
        loader = DataLoader(ready.train, batch_sampler=batches, collate_fn=ready.collate_fn)
        return Parts(ready, loader, kto_loss_fn(session, reference, job.kto), None)


TASK = KTO()
