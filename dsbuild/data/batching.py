"""Batches of tensors from samples: ids padded on the right, padding kept out of attention and loss."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..job.formats import IGNORE_INDEX

__all__ = ["collate"]


def collate(samples: Sequence[Mapping[str, Sequence[int]]], pad_token_id: int = 0) -> dict[str, Any]:
    """A batch of tensors: ids padded on the right to the longest sample, padding masked out and left out of the loss.

    Packed samples (with ``position_ids``) get no attention mask: the model reads the restarting positions as
    sample boundaries, which it does only without a mask and without a cache (``use_cache=False``); the padding
    is a sequence of its own.
    """
    import torch

    longest = max(len(s["input_ids"]) for s in samples)
    ids = torch.full((len(samples), longest), pad_token_id, dtype=torch.long)
    labels = torch.full((len(samples), longest), IGNORE_INDEX, dtype=torch.long)
    packed = "position_ids" in samples[0]
    mask = torch.zeros((len(samples), longest), dtype=torch.long)
    positions = torch.zeros((len(samples), longest), dtype=torch.long)
    for i, s in enumerate(samples):
        n = len(s["input_ids"])
        ids[i, :n] = torch.tensor(s["input_ids"], dtype=torch.long)
        labels[i, :n] = torch.tensor(s["labels"], dtype=torch.long)
        mask[i, :n] = 1
        if packed:
            positions[i, :n] = torch.tensor(s["position_ids"], dtype=torch.long)
            positions[i, n:] = torch.arange(longest - n)
    if packed:
        return {"input_ids": ids, "labels": labels, "position_ids": positions, "use_cache": False}
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}
