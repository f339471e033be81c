"""Packing: several short samples in one sequence of at most ``max_length`` tokens, none of them split.

Samples are placed best-fit decreasing (the longest first, each into the fullest sequence it still fits), so
the sequences come out nearly full and no token is lost. Inside a sequence each sample keeps its own positions
(``position_ids`` restart at 0), and the first label of each sample is ``-100``: it would otherwise be
predicted from the end of the sample before it.

Models whose attention mask comes from transformers' masking utilities (Llama, Mistral, Qwen, Gemma and most
current decoders), and flash attention, read the restarting positions as sample boundaries: no token attends
to another sample (``collate`` leaves the attention mask out and turns the cache off so that they do). Other
models see the samples plainly concatenated, with restarting positions.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence
from typing import Any

from ..job.formats import IGNORE_INDEX

__all__ = ["pack", "pack_columns"]


def _bins(lengths: Sequence[int], max_length: int) -> list[list[int]]:
    """Indices of the samples in each sequence, best-fit decreasing."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    bins: list[list[int]] = []
    room: list[tuple[int, int]] = []  # (space left, bin), sorted: the fullest bin that fits is the first >= length
    for i in order:
        at = bisect.bisect_left(room, (lengths[i], -1))
        if at == len(room):
            bins.append([i])
            space, b = max_length - lengths[i], len(bins) - 1
        else:
            space, b = room.pop(at)
            bins[b].append(i)
            space -= lengths[i]
        if space > 0:
            bisect.insort(room, (space, b))
    return bins


def pack_columns(batch: Mapping[str, Sequence[Sequence[int]]], max_length: int) -> dict[str, list[list[int]]]:
    """Packed ``input_ids``, ``labels`` and ``position_ids`` of a batch of samples (each at most ``max_length``)."""
    ids_in, labels_in = batch["input_ids"], batch["labels"]
    out: dict[str, list[list[int]]] = {"input_ids": [], "labels": [], "position_ids": []}
    for members in _bins([len(ids) for ids in ids_in], max_length):
        ids: list[int] = []
        labels: list[int] = []
        positions: list[int] = []
        for i in members:
            ids += ids_in[i]
            labels += [IGNORE_INDEX, *labels_in[i][1:]]
            positions += range(len(ids_in[i]))
        out["input_ids"].append(ids)
        out["labels"].append(labels)
        out["position_ids"].append(positions)
    return out


def pack(samples: Sequence[Mapping[str, Sequence[int]]], max_length: int) -> list[dict[str, list[int]]]:
    """Samples (``input_ids`` and ``labels``, each at most ``max_length``) packed into sequences of at most
    ``max_length`` tokens, with ``position_ids``; see the module docstring."""
    columns = pack_columns(
        {"input_ids": [s["input_ids"] for s in samples], "labels": [s["labels"] for s in samples]}, max_length
    )
    names = list(columns)
    rows: Any = zip(*columns.values(), strict=True)
    return [dict(zip(names, row, strict=True)) for row in rows]
