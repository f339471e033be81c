"""Parallelism beyond data parallelism: Ulysses sequence parallelism (``sequence_parallel_size``), as DeepSpeed runs it
for HF models (ALST), and what AutoTP (``tensor_parallel.autotp_size``) changes in the loss.

Each sample's sequence is cut into ``sequence_parallel_size`` shards, one per rank of a sequence-parallel group; in
each attention layer DeepSpeed's ``UlyssesSPAttentionHF`` exchanges shards for heads (all-to-all), so every rank
attends over the whole sequence with a share of the heads. What it takes, and what dsbuild does for it:

- the attention: DeepSpeed registers its wrapper in place of the model's own implementation (sdpa, flash
  attention, flex attention; ``eager`` materializes the whole mask and is refused, with DeepSpeed's reason);
- the process groups: the ``mpu`` that registration returns goes to ``deepspeed.initialize``;
- the data: every rank of a group reads the same micro-batches (one data-parallel replica's), and takes its shard
  of each, labels pre-shifted (``shift_labels``) so no target is lost at a shard's edge; every batch needs
  ``position_ids`` (dsbuild's ``collate`` writes them, padded to a multiple of the degree). DeepSpeed's own
  ``UlyssesSPDataLoaderAdapter`` has each rank read its own and the group take them in turn, which groups the samples
  of micro-batches of more than one row into other optimizer steps than the run without sequence parallelism;
- the loss: each rank's shard loss is its tokens' summed loss over the optimizer step's trained tokens, counted
  over every rank (the HF Trainer's ``num_items_in_batch``), so the step's loss and gradients are those of the same
  samples without sequence parallelism.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

from ..errors import SessionError

__all__ = ["SequenceShards", "loss_scale", "refusal", "register", "unregister", "whole_batch_loss"]


def problems(config: Any, sp: int, world_size: int, attn: str | None = None) -> list[str]:
    """Why a model of HF ``config`` cannot train with degree ``sp`` on ``world_size`` processes, one reason a line
    (none: it can); ``attn``: its attention implementation (default: the config's)."""
    found = []
    if world_size % sp:
        found.append(f"sequence_parallel_size {sp} does not divide the world size {world_size}")
    if config is None or not hasattr(config, "get_text_config"):
        return [
            *found,
            "sequence parallelism needs a Hugging Face transformers model (DeepSpeed's Ulysses wraps its attention)",
        ]
    attn = attn or getattr(config, "_attn_implementation", None)
    if attn in ("eager", "paged|eager"):
        found.append(
            f"the model's attention is {attn!r}, which needs the whole 4D mask: DeepSpeed's Ulysses takes 'sdpa', "
            "a flash attention or 'flex_attention' (set attn_implementation)"
        )
    text = config.get_text_config()
    heads = getattr(text, "num_attention_heads", None)
    if isinstance(heads, int) and heads % sp:
        found.append(f"the model's {heads} attention heads do not divide by sequence_parallel_size {sp}")
    kv = getattr(text, "num_key_value_heads", None) or heads
    if isinstance(kv, int) and kv % sp and sp % kv:  # DeepSpeed's Ulysses splits or repeats the key/value heads
        found.append(
            f"the model's {kv} key/value heads and sequence_parallel_size {sp}: neither divides the other, as "
            "DeepSpeed's Ulysses needs"
        )
    return found


_CORE_ATTENTION: dict[str, Any] = {}
"""transformers' own attention functions DeepSpeed's registration replaced, by implementation name: a later session in
the process wraps the core function again (not DeepSpeed's wrapper of it), or, without sequence parallelism, gets it
back (``unregister``)."""


def register(model: Any, sp: int, micro_batch_size: int, world_size: int) -> Any:
    """DeepSpeed's Ulysses attention in place of the model's, and the process groups (the ``mpu`` for
    ``deepspeed.initialize``); ``SessionError`` naming every reason it cannot. A second session in the process (a
    reference model, another run) takes the groups the first made, of the same degree."""
    found = problems(getattr(model, "config", None), sp, world_size)
    if found:
        raise SessionError("sequence_parallel_size: " + "; ".join(found))
    import deepspeed.runtime.sequence_parallel.parallel_state_sp as mpu
    from deepspeed.runtime.sequence_parallel.ulysses_sp import UlyssesSPAttentionHF
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    implementation = model.config._attn_implementation
    if implementation in _CORE_ATTENTION:
        ALL_ATTENTION_FUNCTIONS[implementation] = _CORE_ATTENTION[implementation]
    else:
        _CORE_ATTENTION[implementation] = ALL_ATTENTION_FUNCTIONS[implementation]

    def register_now() -> Any:
        return UlyssesSPAttentionHF.register_with_transformers(
            model_name_or_path=model,
            core_attn_implementation=implementation,
            sequence_parallel_size=sp,
            micro_batch_size=micro_batch_size,
            seq_length_is_variable=True,
        )

    if mpu._SEQUENCE_PARALLEL_GROUP is None:
        return register_now()
    if mpu.get_sequence_parallel_world_size() != sp:
        raise SessionError(
            f"sequence_parallel_size {sp}: this process already runs sequence parallelism of degree "
            f"{mpu.get_sequence_parallel_world_size()} (one degree per process)"
        )
    initialize = mpu.initialize_sequence_parallel
    mpu.initialize_sequence_parallel = lambda **_: None  # the groups exist: DeepSpeed would refuse to make them again
    try:
        return register_now()
    finally:
        mpu.initialize_sequence_parallel = initialize


def unregister(model: Any) -> None:
    """transformers' own attention back for ``model``'s implementation, where an earlier session of the process
    registered DeepSpeed's Ulysses attention in its place (a session without sequence parallelism)."""
    implementation = getattr(getattr(model, "config", None), "_attn_implementation", None)
    if implementation in _CORE_ATTENTION:
        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

        ALL_ATTENTION_FUNCTIONS[implementation] = _CORE_ATTENTION[implementation]


def group() -> tuple[Any, int, int]:
    """This rank's sequence-parallel group, its rank in it and the group's size (after ``register``)."""
    from deepspeed.utils import groups

    return (
        groups._get_sequence_parallel_group(),
        groups._get_sequence_parallel_rank(),
        groups._get_sequence_parallel_world_size(),
    )


class SequenceShards:
    """A DataLoader's micro-batches as a rank of a sequence-parallel group takes them: every rank of the group reads
    the same micro-batches (one data-parallel replica's, ``Session.data_loader``), and takes its shard of the
    sequence of each, labels pre-shifted (``shift_labels``) so no target is lost at a shard's edge.

    What DeepSpeed's ``UlyssesSPDataLoaderAdapter`` does, with two differences. Its ranks read different micro-batches
    and the group takes them one after another, so a run of micro-batches of more than one row groups its samples
    into optimizer steps otherwise than the run without sequence parallelism: here the group reads one replica's
    micro-batches, and the steps are that run's. And a short micro-batch (an epoch's last) gets rows that train
    nothing up to ``rows``, the batch size DeepSpeed's attention was built for.
    """

    def __init__(self, loader: Any, size: int, rows: int, device: Callable[[], Any]) -> None:
        self.loader = loader
        self.batch_sampler = getattr(loader, "batch_sampler", None)  # the epoch's shuffle (DataPosition sets it)
        self.sampler = getattr(loader, "sampler", None)
        self.size = size
        self.rows = rows
        self.device = device
        """The engine's device, asked when an epoch starts (the engine, and the groups, exist by then)."""
        self.samples = 0
        """The real samples (padding rows not counted) of the micro-batch the shard last given belongs to."""
        self.first = True
        """Whether this rank is its group's first (the one that counts each micro-batch's samples once)."""

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        from . import distributed

        _, sp_rank, size = group()
        assert size == self.size
        if sp_rank != distributed.rank() % size:  # Session.data_loader gives a group's consecutive ranks one replica
            raise SessionError(
                f"sequence parallelism: rank {distributed.rank()} is rank {sp_rank} of its group of {size}, not "
                f"{distributed.rank() % size}: dsbuild needs DeepSpeed's groups of consecutive ranks"
            )
        self.first = sp_rank == 0
        device = self.device()
        for batch in self.loader:
            self.samples, shard = _shard(batch, sp_rank, size, self.rows, device)
            yield shard


def _shard(batch: Any, sp_rank: int, size: int, rows: int, device: Any) -> tuple[int, dict[str, Any]]:
    """This rank's shard of ``batch`` (every rank of the group has the same), and the batch's real samples."""
    import torch
    import torch.nn.functional as F

    if not isinstance(batch, Mapping) or "input_ids" not in batch or "labels" not in batch:
        raise SessionError("sequence parallelism needs batches with input_ids and labels (and position_ids)")
    if "position_ids" not in batch:
        raise SessionError(
            "sequence parallelism needs position_ids in every batch (each token keeps its place in the whole "
            "sequence once it is cut): dsbuild.data.collate writes them"
        )
    samples = int(batch["input_ids"].shape[0])
    if samples > rows:
        raise SessionError(f"a batch of {samples} samples under sequence parallelism built for {rows}")
    length = int(batch["input_ids"].shape[1])
    longest = length + -length % size
    whole: dict[str, Any] = {}
    for key, value in batch.items():
        if isinstance(value, torch.Tensor) and value.dim() >= 2:
            if longest > length:  # padding is never a target, and (after every real token) never attended to
                value = F.pad(value, (0, longest - length), value=-100 if key == "labels" else 0)
            if value.shape[0] < rows:  # rows that train nothing, so the attention sees the rows it was built for
                fill = value[-1:].expand(rows - value.shape[0], *value.shape[1:]).clone()
                if key == "labels":
                    fill.fill_(-100)
                elif key == "attention_mask":
                    fill.fill_(0)
                value = torch.cat([value, fill])
        whole[key] = value
    labels = whole.pop("labels")
    whole["shift_labels"] = F.pad(labels, (0, 1), value=-100)[..., 1:]
    chunk = longest // size
    return samples, {
        key: value[:, chunk * sp_rank : chunk * (sp_rank + 1)].contiguous().to(device)
        if isinstance(value, torch.Tensor) and value.dim() >= 2
        else value
        for key, value in whole.items()
    }


def whole_batch_loss(shard_loss: Any, batch: Any, samples: int) -> tuple[Any, int]:
    """The mean loss of the whole batch a shard belongs to, from every shard's mean and trained tokens (gathered over
    the group), and the samples to weigh it by: the batch's on the group's first rank, none on the others (each
    batch is counted once)."""
    import torch
    import torch.distributed as dist

    sp_group, sp_rank, size = group()
    tokens = int((batch["shift_labels"] != -100).sum())
    mine = torch.tensor([float(shard_loss) * tokens if tokens else 0.0, float(tokens)], dtype=torch.float64)
    gathered = [torch.zeros_like(mine) for _ in range(size)]
    dist.all_gather(gathered, mine.to(shard_loss.device), group=sp_group)
    total = torch.stack([g.cpu() for g in gathered]).sum(0)
    mean = total[0] / total[1] if total[1] > 0 else torch.tensor(0.0, dtype=torch.float64)
    return mean, samples if sp_rank == 0 else 0


def loss_scale(world_size: int, sp: int, tp: int, zero_stage: int, *, average_tokens: bool = True) -> int:
    """What a token-weighted micro-batch loss is multiplied by before DeepSpeed's backward: the processes that
    counted the step's tokens together, over those DeepSpeed averages gradients across (the HF Trainer's
    ``num_processes`` factor). A tensor-parallel group is one data-parallel replica (``num_processes // tp_size``).
    DeepSpeed 0.19.8 reduces a sequence-parallel group's gradients two ways: ZeRO-3 averages them over every rank,
    ZeRO 0-2 sum them over the group and average over the data-parallel ranks (tests/integration/test_run_shapes.py
    holds both to the 1-process run). Without ``average_tokens`` each process counted its own tokens: 1."""
    if not average_tokens:
        return 1
    if tp > 1:
        return world_size // tp
    return world_size if sp == 1 or zero_stage == 3 else world_size // sp


def refusal(model: Any, sp: int, tp: int, average_tokens: bool) -> str | None:
    """Why a Session cannot train ``model`` with these degrees, or ``None``."""
    from .export import is_peft

    if tp > 1 and is_peft(model):
        return (
            "tensor_parallel.autotp_size with LoRA: dsbuild does not split peft's adapters over a tensor-parallel "
            "group; train LoRA with ZeRO instead"
        )
    if sp > 1 and tp > 1:
        return "sequence_parallel_size and tensor_parallel.autotp_size together: dsbuild trains one or the other"
    if sp > 1 and not average_tokens:
        return (
            "training.average_tokens_across_devices = false: sequence parallelism counts a step's trained tokens "
            "over every process (a group's shards are one sample's); leave it true"
        )
    return None
