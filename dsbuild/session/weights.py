"""The policy's full weights streamed out one bucket at a time: ``full_parameters(session)`` and a ``WeightSink``.

An RL loop that generates with another engine (vLLM, SGLang, a second process) hands it the policy's weights after
each optimizer step. Under ZeRO-3 no rank holds a whole weight, so every project does the same three moves: gather,
hand off, re-partition — per parameter (OpenRLHF's ``_broadcast_to_vllm``, TRL's ``_move_model_to_vllm``) or per
bucket (ROLL). ``full_parameters`` is that walk: the parameters in the model's order, grouped into buckets of at most
``bucket_mb`` (one tensor larger than a bucket is a bucket alone), each bucket gathered (``GatheredParameters``), its
tensors yielded, then re-partitioned before the next is gathered, so at most one bucket is whole at a time.

Names are HF's ``state_dict`` names of the plain model. Under LoRA with ``merge_lora=True`` (the default, what an
inference engine loads) each adapted layer's base weight and adapters are gathered together and the merged weight
``W + ΔW`` (peft's own ``get_delta_weight``) is yielded under the base name; the adapters themselves are not
yielded. ``merge_lora=False`` yields peft's names as they are (``base_model.model.…lora_A.default.weight``).

A yielded tensor is the gathered one (or the merge computed from it): valid until the next item; ``clone()`` what is
kept. The walk is collective under ZeRO-3: every rank iterates to the end, in step; a rank that stops early leaves
the others waiting in the next gather.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any, Protocol

import torch

from ..errors import InvalidValueError, Problem, SessionError
from .export import is_peft
from .offload import refuse_inside

__all__ = ["WeightSink", "full_parameters", "stream_to"]

PEFT_PREFIX = "base_model.model."
"""What peft puts before the wrapped model's names."""


class WeightSink(Protocol):
    """Where ``stream_to`` hands each weight: an inference engine's loader, a broadcast to another process group, a
    file. Called once per weight, in the model's order, with a tensor valid only during the call."""

    def __call__(self, name: str, tensor: torch.Tensor) -> None: ...


class HasEngine(Protocol):
    @property
    def engine(self) -> Any: ...


Unit = tuple[str, list[torch.nn.Parameter], Callable[[], torch.Tensor]]
"""One yielded weight: its HF name, the parameters that make it (gathered together), how to compute it once they are
whole."""


def full_parameters(session: HasEngine, bucket_mb: float = 1024, merge_lora: bool = True) -> Iterator[tuple[str, Any]]:
    """``(HF name, full tensor)`` for every weight of the session's model, at most one bucket of ``bucket_mb``
    gathered at a time, LoRA merged per layer (module docstring). A collective iterator under ZeRO-3: every rank
    walks it to the end. ``AutoTP`` is refused (each rank holds a slice that ``GatheredParameters`` does not join), and
    so is a walk inside ``offloaded()`` with ``lp_params`` away."""
    refuse_inside(session, "full_parameters")
    if isinstance(bucket_mb, bool) or not isinstance(bucket_mb, int | float) or not bucket_mb > 0:
        raise InvalidValueError([Problem("bucket_mb", f"got {bucket_mb!r}, expected a positive number of megabytes")])
    engine = session.engine
    if engine.autotp_size() > 1:
        raise SessionError(
            "full_parameters under tensor parallelism: each rank holds a slice of the linear layers that a gather "
            "does not join; save with session.save_model() instead"
        )
    model = engine.module
    units = list(_units(model, merge_lora=merge_lora and is_peft(model)))
    partitioned = bool(engine.zero_optimization_partition_weights())
    for bucket in _buckets(units, int(bucket_mb * 2**20)):
        params = list({id(p): p for _, ps, _ in bucket for p in ps}.values())
        with _gathered(params, partitioned), torch.no_grad():
            for name, _, value in bucket:
                yield name, value()


def stream_to(session: HasEngine, sink: WeightSink, bucket_mb: float = 1024, merge_lora: bool = True) -> int:
    """Every weight of ``full_parameters`` handed to ``sink``; returns how many. Collective as the walk is."""
    count = 0
    for name, tensor in full_parameters(session, bucket_mb=bucket_mb, merge_lora=merge_lora):
        sink(name, tensor)
        count += 1
    return count


def _units(model: Any, *, merge_lora: bool) -> Iterator[Unit]:
    """The weights to yield, in the model's parameter order: a LoRA layer's merged weight once, at its base weight's
    place (its adapters skipped); every other parameter as it is, under its HF name."""
    merged: dict[str, Any] = {}
    if merge_lora:
        merged = {f"{name}.base_layer.weight": m for name, m in model.named_modules() if _is_lora_layer(m)}
    for name, param in model.named_parameters():
        if merge_lora and (".lora_" in name or ".original_module." in name):
            continue  # the adapters go into the merge; modules_to_save's trained copy replaces the original
        layer = merged.get(name)
        if layer is not None:
            yield _hf_name(name), _layer_params(layer), _merge(layer)
        else:
            yield (_hf_name(name) if merge_lora else name), [param], param.detach


def _is_lora_layer(module: Any) -> bool:
    return hasattr(module, "get_delta_weight") and hasattr(module, "base_layer") and bool(module.active_adapters)


def _layer_params(layer: Any) -> list[torch.nn.Parameter]:
    return [layer.base_layer.weight, *(p for n, p in layer.named_parameters() if ".lora_" in f".{n}")]


def _merge(layer: Any) -> Callable[[], torch.Tensor]:
    """The layer's merged weight, as peft's ``merge`` computes it, without changing the layer."""

    def value() -> torch.Tensor:
        weight: torch.Tensor = layer.base_layer.weight.detach().clone()
        for adapter in layer.active_adapters:
            if adapter in layer.lora_A:
                weight += layer.get_delta_weight(adapter).to(weight.dtype)
        return weight

    return value


def _hf_name(name: str) -> str:
    """peft's name of a weight of the wrapped model → the plain model's ``state_dict`` name."""
    name = name.removeprefix(PEFT_PREFIX).replace(".base_layer.", ".")
    head, sep, tail = name.partition(".modules_to_save.")
    return head + "." + tail.split(".", 1)[1] if sep else name


def _buckets(units: list[Unit], limit: int) -> Iterator[list[Unit]]:
    """``units`` in order, grouped while their full sizes (``ds_numel`` under ZeRO-3) fit in ``limit`` bytes."""
    bucket: list[Unit] = []
    size = 0
    for unit in units:
        nbytes = sum(getattr(p, "ds_numel", p.numel()) * p.element_size() for p in unit[1])
        if bucket and size + nbytes > limit:
            yield bucket
            bucket, size = [], 0
        bucket.append(unit)
        size += nbytes
    if bucket:
        yield bucket


def _gathered(params: list[torch.nn.Parameter], partitioned: bool) -> contextlib.AbstractContextManager[Any]:
    if not partitioned:
        return contextlib.nullcontext()
    import deepspeed

    gather: contextlib.AbstractContextManager[Any] = deepspeed.zero.GatheredParameters(params)
    return gather
