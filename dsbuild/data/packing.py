"""Packing: several samples in one sequence of at most ``max_length`` tokens, with TRL's three strategies
(``data.packing_strategy``) and TRL's order, so a packed dataset is TRL's ``pack_dataset``'s row for row:

- ``"bfd"`` (the default): best-fit decreasing, the longest sample first, each into the bin with the least room
  that still takes it (of several with the same room, the one that got it first); a sample longer than
  ``max_length`` is cut to it. No sample is split across sequences.
- ``"bfd_split"``: the same, with an overlong sample split into pieces of ``max_length`` (the last one shorter)
  that are placed like samples: no token is lost.
- ``"wrapped"``: the samples concatenated and cut every ``max_length`` tokens, boundaries ignored.

With ``"bfd"`` and ``"bfd_split"`` each sample (or piece) keeps its own positions (``position_ids`` restart at 0)
and its first label is ``-100``: it would otherwise be predicted from the end of the sample before it (TRL's
collator does the same at each restart). ``"wrapped"`` sequences are one text each: positions run 0..n-1 and
labels are kept, as in TRL.

Models whose attention mask comes from transformers' masking utilities (Llama, Mistral, Qwen, Gemma and most
current decoders), and flash attention, read the restarting positions as sample boundaries: no token attends
to another sample (``collate`` leaves the attention mask out and turns the cache off so that they do). Other
models see the samples plainly concatenated, with restarting positions.
"""

from __future__ import annotations

import bisect
from collections import defaultdict, deque
from collections.abc import Mapping, Sequence
from typing import Any

from ..job.formats import IGNORE_INDEX

__all__ = ["pack", "pack_columns"]


def _bins(lengths: Sequence[int], max_length: int) -> list[list[int]]:
    """Indices of the samples in each sequence, best-fit decreasing, in TRL's order (``trl.data_utils._pack_bfd``):
    the samples by length, longest first (stable); of the bins whose room fits, the one with the least room, and of
    several with that room the one that got it first; bins in the order they were opened."""
    order = sorted((i for i in range(len(lengths)) if lengths[i] > 0), key=lambda i: -lengths[i])
    bins: list[list[int]] = []
    rooms: list[int] = []  # the sizes of room some bin has, sorted
    by_room: defaultdict[int, deque[int]] = defaultdict(deque)  # room -> bins with it, in the order they got it
    for i in order:
        length = lengths[i]
        at = bisect.bisect_left(rooms, length)
        if at < len(rooms):
            room = rooms[at]
            b = by_room[room].popleft()
            if not by_room[room]:
                rooms.pop(at)
        else:
            room, b = max_length, len(bins)
            bins.append([])
        bins[b].append(i)
        room -= length
        if room > 0:
            if not by_room[room]:
                bisect.insort(rooms, room)
            by_room[room].append(b)
    return bins


def _pieces(ids: Sequence[Sequence[int]], labels: Sequence[Sequence[int]], max_length: int, split: bool) -> tuple[list[Sequence[int]], list[Sequence[int]]]:  # fmt: skip
    """Samples cut to ``max_length`` (``split``: overlong ones split into pieces instead)."""
    if not split:
        return [x[:max_length] for x in ids], [x[:max_length] for x in labels]
    out_ids: list[Sequence[int]] = []
    out_labels: list[Sequence[int]] = []
    for sample_ids, sample_labels in zip(ids, labels, strict=True):
        for start in range(0, len(sample_ids), max_length):
            out_ids.append(sample_ids[start : start + max_length])
            out_labels.append(sample_labels[start : start + max_length])
    return out_ids, out_labels


def pack_columns(
    batch: Mapping[str, Sequence[Sequence[int]]], max_length: int, strategy: str = "bfd"
) -> dict[str, list[list[int]]]:
    """Packed ``input_ids``, ``labels`` and ``position_ids`` of a batch of samples; see the module docstring."""
    out: dict[str, list[list[int]]] = {"input_ids": [], "labels": [], "position_ids": []}
    if strategy == "wrapped":
        flat_ids = [x for sample in batch["input_ids"] for x in sample]
        flat_labels = [x for sample in batch["labels"] for x in sample]
        for start in range(0, len(flat_ids), max_length):
            row = flat_ids[start : start + max_length]
            out["input_ids"].append(row)
            out["labels"].append(flat_labels[start : start + max_length])
            out["position_ids"].append(list(range(len(row))))
        return out
    ids_in, labels_in = _pieces(batch["input_ids"], batch["labels"], max_length, strategy == "bfd_split")
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


def pack(
    samples: Sequence[Mapping[str, Sequence[int]]], max_length: int, strategy: str = "bfd"
) -> list[dict[str, list[int]]]:
    """Samples (``input_ids`` and ``labels``) packed into sequences of at most ``max_length`` tokens, with
    ``position_ids``; see the module docstring."""
    columns = pack_columns(
        {"input_ids": [s["input_ids"] for s in samples], "labels": [s["labels"] for s in samples]},
        max_length,
        strategy,
    )
    names = list(columns)
    rows: Any = zip(*columns.values(), strict=True)
    return [dict(zip(names, row, strict=True)) for row in rows]
