"""DeepSpeed's batch triangle: ``train_batch_size = micro × accumulation × data-parallel size``.

One place for the arithmetic of ``_set_batch_related_parameters`` (``deepspeed/runtime/config.py``):
any two sizes give the third; one alone is completed with DeepSpeed's default accumulation of 1;
a size derived by floor division must divide evenly (DeepSpeed asserts the product). ``validate``
reports its problems and ``resolve`` writes its sizes (with how each was derived).
"""

from __future__ import annotations

from typing import Any

import attrs

__all__ = ["Derived", "Triangle", "TriangleProblem", "degrees", "derive"]


def degrees(config: Any) -> tuple[int, int]:
    """``(sequence_parallel_size, tensor_parallel.autotp_size)`` of a config, 1 where unset, ``"auto"`` or below 2.

    The batch triangle counts data-parallel ranks as the world size over the first only: DeepSpeed 0.19.8 checks
    ``train_batch_size`` against every process with AutoTP (a tensor-parallel group's ranks, which read the same
    batches, counted as if each read its own), and the HF Trainer fills it so."""
    sp = getattr(config, "sequence_parallel_size", None)
    tp = getattr(getattr(config, "tensor_parallel", None), "autotp_size", None)
    return (sp if type(sp) is int and sp > 1 else 1, tp if type(tp) is int and tp > 1 else 1)


@attrs.frozen
class Derived:
    """A size the triangle worked out: which key, its value, and how (``micro 4 × accumulation 1 × world size 2``)."""

    key: str
    value: int
    how: str


@attrs.frozen
class Triangle:
    """The three sizes DeepSpeed trains with, and the ones it derived (in the order it derives them)."""

    train_batch_size: int
    micro: int
    accumulation: int
    derived: tuple[Derived, ...] = ()
    default_accumulation: bool = False
    """``gradient_accumulation_steps`` was not set and took DeepSpeed's default of 1."""


@attrs.frozen
class TriangleProblem:
    """Why the sizes do not fit together: a message about ``train_batch_size`` and what to do."""

    message: str
    hint: str


def derive(
    train: int | None, micro: int | None, accum: int | None, dp: int, world_text: str | None = None
) -> Triangle | TriangleProblem | None:
    """The batch sizes DeepSpeed trains with at data-parallel size ``dp``, or why they do not fit.

    ``world_text`` names ``dp`` in messages (default ``world size DP``). ``None`` when neither
    ``train_batch_size`` nor the micro batch is given (DeepSpeed then stops on an assert; the caller
    says so in its own terms).
    """
    world = world_text or f"world size {dp}"
    if train is None and micro is None:
        return None
    if train is not None and micro is not None and accum is not None:
        if train != micro * accum * dp:
            return TriangleProblem(
                f"{train} != train_micro_batch_size_per_gpu {micro} x gradient_accumulation_steps {accum} x {world}"
                f" = {micro * accum * dp}",
                f"set train_batch_size {micro * accum * dp}, or leave it out and let DeepSpeed derive it",
            )
        return Triangle(train, micro, accum)
    if train is None:
        assert micro is not None
        default = accum is None
        accum = 1 if accum is None else accum
        total = Derived("train_batch_size", micro * accum * dp, f"micro {micro} × accumulation {accum} × {world}")
        return Triangle(total.value, micro, accum, (total,), default_accumulation=default)
    # DeepSpeed derives the missing size with floor division, then asserts the product.
    if micro is not None:
        given, name, unit_text = micro, "train_micro_batch_size_per_gpu", f"micro {micro} × {world}"
    else:
        given, name, unit_text = accum or 1, "gradient_accumulation_steps", f"accumulation {accum or 1} × {world}"
    unit = given * dp
    if train % unit:  # also train < unit: DeepSpeed would derive a size of 0
        what = f"{name} {given} x {world} = {unit}" if micro is not None or accum is not None else world
        return TriangleProblem(
            f"{train} is not a multiple of {what}",
            f"use a multiple of {unit}, or set train_micro_batch_size_per_gpu and gradient_accumulation_steps instead",
        )
    how = f"train_batch_size {train} / ({unit_text})"
    if micro is not None:
        return Triangle(train, micro, train // unit, (Derived("gradient_accumulation_steps", train // unit, how),))
    return Triangle(
        train,
        train // unit,
        accum or 1,
        (Derived("train_micro_batch_size_per_gpu", train // unit, how),),
        default_accumulation=accum is None,
    )
