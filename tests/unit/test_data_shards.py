"""Which samples each process trains on in an epoch: the HF Trainer's, whose data loader Accelerate shards
(``SeedableRandomSampler`` cut by ``BatchSampler``, dealt by ``BatchSamplerShard`` with ``even_batches``), held
against Accelerate's own classes on drawn shapes; and the step count the schedule derives from it."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

accelerate_data_loader = pytest.importorskip("accelerate.data_loader", reason="Accelerate is not installed")


def _accelerates(
    samples: int, batch: int, world: int, rank: int, seed: int, epoch: int, drop_last: bool, shuffle: bool
) -> list:
    from torch.utils.data import BatchSampler, SequentialSampler

    sampler: Any = SequentialSampler(range(samples))
    if shuffle:
        sampler = accelerate_data_loader.SeedableRandomSampler(range(samples), data_seed=seed)
        sampler.set_epoch(epoch)
    batches = BatchSampler(sampler, batch, drop_last)
    if world == 1:  # Accelerate does not shard one process's loader
        return list(batches)
    return list(accelerate_data_loader.BatchSamplerShard(batches, world, rank))


@given(
    samples=st.integers(1, 40),
    batch=st.integers(1, 6),
    world=st.integers(1, 5),
    seed=st.integers(0, 2**31),
    epoch=st.integers(0, 3),
    drop_last=st.booleans(),
    shuffle=st.booleans(),
)
@settings(max_examples=300, deadline=None)
@example(samples=3, batch=3, world=2, seed=0, epoch=0, drop_last=False, shuffle=True)  # DPO's UNEVEN: 3 pairs, 2 x 3
@example(samples=5, batch=3, world=2, seed=0, epoch=1, drop_last=True, shuffle=True)  # DistributedSampler: 1 step, HF 0
def test_each_process_trains_on_the_hf_trainers_micro_batches(
    samples: int, batch: int, world: int, seed: int, epoch: int, drop_last: bool, shuffle: bool
) -> None:
    """``Shards`` gives every rank the micro-batches Accelerate gives the HF Trainer's loader on that rank, in order
    (shuffled, or in order as KTO's sequential sampler), and the schedule counts as many (``micro_batches``, what a
    job's step count is made of)."""
    from dsbuild.resolve.schedule import micro_batches
    from dsbuild.session.batches import Shards

    for rank in range(world):
        shards = Shards(samples, batch, world_size=world, rank=rank, seed=seed, drop_last=drop_last, shuffle=shuffle)
        shards.set_epoch(epoch)
        ours = list(shards)
        assert ours == _accelerates(samples, batch, world, rank, seed, epoch, drop_last, shuffle)
        assert len(shards) == len(ours) == micro_batches(samples, world, batch, drop_last=drop_last)


def test_a_training_loader_reads_the_shards_and_an_evaluation_loader_each_sample_in_order() -> None:
    """``Session.fit``'s loader deals the shuffled micro-batches by ``Shards`` (set_epoch reshuffles, as the position
    sets it); ``evaluate``'s reads them in order, dealt the same way."""
    from dsbuild.session.batches import DataPosition, loader

    data = list(range(7))
    train = [loader(data, 2, world_size=2, rank=r, shuffle=True, seed=1, drop_last=False, collate_fn=list)
             for r in range(2)]  # fmt: skip
    first = [list(DataPosition(epoch=0).iterator(t)) for t in train]
    again = [list(DataPosition(epoch=0).iterator(t)) for t in train]
    second = [list(DataPosition(epoch=1).iterator(t)) for t in train]
    assert first == again and first != second
    for epoch in (first, second):
        assert [len(b) for rank in epoch for b in rank] == [2] * 4  # 2 micro-batches each, the 4th filled
        assert set(s for rank in epoch for b in rank for s in b) == set(data)
    evaluation = [list(loader(data, 3, world_size=2, rank=r, shuffle=False, seed=1, drop_last=False, collate_fn=list))
                  for r in range(2)]  # fmt: skip
    assert evaluation == [[[0, 1, 2], [6, 0, 1]], [[3, 4, 5], [2, 3, 4]]]  # the last round filled from the start


@given(samples=st.integers(1, 40), batch=st.integers(1, 6), world=st.integers(1, 5))
@settings(max_examples=300, deadline=None)
def test_an_evaluation_counts_every_sample_once(samples: int, batch: int, world: int) -> None:
    """What ``kept`` counts of each rank's in-order micro-batches is every sample exactly once, the filler of an
    uneven end never (the HF Trainer's evaluation, whose ``gather_for_metrics`` keeps the first ``samples mod
    (batch x world)`` of the last round laid out in rank order)."""
    from dsbuild.session.batches import Shards

    counted = []
    for rank in range(world):
        shards = Shards(samples, batch, world_size=world, rank=rank, shuffle=False)
        for index, micro in enumerate(shards):
            counted += micro[: shards.kept(index, len(micro))]
    assert sorted(counted) == list(range(samples))
