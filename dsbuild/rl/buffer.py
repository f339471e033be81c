"""A GRPO generation batch kept for the optimizer steps it feeds (TRL's ``_buffered_inputs``), and its state as JSON.

TRL generates once per ``steps_per_generation × num_iterations`` micro-steps: the generation batch (this process's
``per_device × steps_per_generation`` completions, padded together) is cut into ``steps_per_generation`` micro-batches
and each is trained on ``num_iterations`` times, the old policy's log-probs computed once, when it was generated. A
checkpoint inside those steps keeps the batch (``Generation.state``, in the process's position: verified with the
checkpoint's other files, never pickled), so a resumed run trains on what the uninterrupted one would: the batch cannot
be made again, the policy that generated it and scored its old log-probs having stepped since.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from typing import Any

import attrs
import torch

__all__ = ["Generation", "decode_tensor", "encode_tensor"]

_DTYPES = {"int64": torch.int64, "float32": torch.float32}
"""The tensor types a generation batch holds, by name: what a saved state may say."""


def encode_tensor(tensor: torch.Tensor) -> dict[str, Any]:
    """``tensor`` as JSON: its type, shape and bytes (base64)."""
    name = str(tensor.dtype).removeprefix("torch.")
    if name not in _DTYPES:
        raise TypeError(f"a generation batch holds {', '.join(_DTYPES)} tensors, not {name}")
    data = tensor.detach().cpu().contiguous().numpy().tobytes()
    return {"dtype": name, "shape": list(tensor.shape), "data": base64.b64encode(data).decode("ascii")}


def decode_tensor(value: Any) -> torch.Tensor:
    """The tensor ``encode_tensor`` wrote; ``ValueError`` for anything else (a checkpoint is untrusted input)."""
    if not isinstance(value, Mapping) or value.get("dtype") not in _DTYPES:
        raise ValueError(f"not a saved tensor: {str(value)[:80]}")
    shape = value.get("shape")
    if not isinstance(shape, list) or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in shape):
        raise ValueError(f"a saved tensor's shape: {shape!r}")
    dtype = _DTYPES[value["dtype"]]
    raw = base64.b64decode(str(value.get("data", "")), validate=True)
    count = 1
    for n in shape:
        count *= n
    if len(raw) != count * torch.tensor([], dtype=dtype).element_size():
        raise ValueError(f"a saved tensor of shape {shape} has {len(raw)} bytes")
    if count == 0:
        return torch.zeros(shape, dtype=dtype)
    return torch.frombuffer(bytearray(raw), dtype=dtype).reshape(shape).clone()


@attrs.define
class Generation:
    """This process's generation batch: its tensors (rows in the order the micro-batches take them), the completion
    tokens of the whole batch over every process (``num_items_in_batch``) and the rows of one micro-batch."""

    tensors: dict[str, torch.Tensor]
    num_items: float
    rows: int

    def micro_batch(self, index: int) -> dict[str, Any]:
        """The ``index``-th micro-batch of the batch (TRL's ``split_tensor_dict``)."""
        rows = slice(index * self.rows, (index + 1) * self.rows)
        return {**{name: t[rows] for name, t in self.tensors.items()}, "num_items_in_batch": self.num_items}

    def state(self, world_size: int) -> dict[str, Any]:
        """The batch as JSON, with the world size it was cut for."""
        tensors = {name: encode_tensor(t) for name, t in self.tensors.items()}
        return {"tensors": tensors, "num_items": self.num_items, "rows": self.rows, "world_size": world_size}

    @classmethod
    def of_state(cls, state: Any, world_size: int, rows: int) -> Generation | None:
        """The batch ``state`` holds, or ``None`` when it holds none for this run (saved at another world size or
        micro-batch size: its rows are another process's share). ``ValueError`` when it is damaged."""
        if not isinstance(state, Mapping) or state.get("world_size") != world_size or state.get("rows") != rows:
            return None
        tensors = state.get("tensors")
        if not isinstance(tensors, Mapping) or not all(isinstance(name, str) for name in tensors):
            raise ValueError("a saved generation batch without its tensors")
        num_items = state.get("num_items")
        if not isinstance(num_items, (int, float)) or isinstance(num_items, bool):
            raise ValueError(f"a saved generation batch's num_items: {num_items!r}")
        return cls({name: decode_tensor(t) for name, t in tensors.items()}, float(num_items), rows)
