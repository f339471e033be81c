"""Batches of tensors from samples: ids padded on the right, padding kept out of attention and loss, and
``position_ids`` in every batch (sequence parallelism shards the sequence and needs them)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..job.formats import IGNORE_INDEX

__all__ = ["collate"]


def collate(
    samples: Sequence[Mapping[str, Sequence[int]]],
    pad_token_id: int = 0,
    *,
    padding_free: bool = False,
    pad_to_multiple_of: int = 1,
) -> dict[str, Any]:
    """A batch of tensors: ids padded on the right to the longest sample, padding masked out and left out of the loss.

    Every batch has ``position_ids``: 0..n-1 per sample, or the packed samples' own, and 0 over the padding (as
    TRL's collator). Packed samples get no attention mask: the model reads the restarting positions as sample
    boundaries, which it does only without a mask and without a cache (``use_cache=False``).

    ``padding_free`` (TRL's): the batch as one row, its samples concatenated with restarting positions and the
    first label of each sample ``-100`` (as TRL's collator does), no padding and no attention mask.

    ``pad_to_multiple_of``: the sequence length rounded up to a multiple of it (sequence parallelism cuts each
    sequence into that many shards).
    """
    import torch

    packed = "position_ids" in samples[0]
    if padding_free:
        ids_list: list[int] = []
        label_list: list[int] = []
        position_list: list[int] = []
        for s in samples:
            starts = list(s["position_ids"]) if packed else list(range(len(s["input_ids"])))
            ids_list += s["input_ids"]
            label_list += [IGNORE_INDEX if p == 0 else label for p, label in zip(starts, s["labels"], strict=True)]
            position_list += starts
        extra = -len(ids_list) % pad_to_multiple_of
        ids_list += [pad_token_id] * extra
        label_list += [IGNORE_INDEX] * extra
        position_list += [0] * extra  # TRL's padding value: each padding token a sequence of its own
        return {
            "input_ids": torch.tensor([ids_list], dtype=torch.long),
            "labels": torch.tensor([label_list], dtype=torch.long),
            "position_ids": torch.tensor([position_list], dtype=torch.long),
            "use_cache": False,
        }
    longest = max(len(s["input_ids"]) for s in samples)
    longest += -longest % pad_to_multiple_of
    ids = torch.full((len(samples), longest), pad_token_id, dtype=torch.long)
    labels = torch.full((len(samples), longest), IGNORE_INDEX, dtype=torch.long)
    mask = torch.zeros((len(samples), longest), dtype=torch.long)
    positions = torch.zeros((len(samples), longest), dtype=torch.long)
    for i, s in enumerate(samples):
        n = len(s["input_ids"])
        ids[i, :n] = torch.tensor(s["input_ids"], dtype=torch.long)
        labels[i, :n] = torch.tensor(s["labels"], dtype=torch.long)
        mask[i, :n] = 1
        # The padding's positions are 0, as TRL's collator pads them (masked out, or, packed, each padding token a
        # sequence of its own; none is trained on).
        positions[i, :n] = torch.tensor(s["position_ids"], dtype=torch.long) if packed else torch.arange(n)
    if packed:
        return {"input_ids": ids, "labels": labels, "position_ids": positions, "use_cache": False}
    return {"input_ids": ids, "attention_mask": mask, "labels": labels, "position_ids": positions}
