"""The batch-size rule: DeepSpeed's batch triangle checked before launch (``dsbuild.resolve.batch``)."""

from __future__ import annotations

from collections.abc import Iterator

from ..config import AUTO, ConfigFields
from ..resolve.batch import Triangle, TriangleProblem, degrees, derive
from .facts import Diagnostic, Facts, rule

__all__ = ["batch_triangle"]


@rule("batch-size")
def batch(f: Facts) -> Iterator[Diagnostic]:
    """Batch sizes: neither ``train_batch_size`` nor the micro batch set (DeepSpeed asserts; a warning only for the
    HF Trainer before resolution), or a batch triangle
    that does not divide at the given world size (also: no world size fits it at all)."""
    c = f.config
    train, micro, accum = c.train_batch_size, c.train_micro_batch_size_per_gpu, c.gradient_accumulation_steps
    if train is None and micro is None:
        message = (
            "neither train_batch_size nor train_micro_batch_size_per_gpu is set: DeepSpeed stops with an AssertionError"
        )
        hint = 'set train_micro_batch_size_per_gpu (.batch(micro=...)), or "auto" for resolve() / the HF Trainer'
        # For the HF Trainer the training arguments may still be written in; DeepSpeed itself needs one.
        yield (
            f.warning("train_micro_batch_size_per_gpu", message, hint)
            if f.target == "hf" and not f.resolved
            else f.error("train_micro_batch_size_per_gpu", message, hint)
        )
        return
    if train is AUTO or micro is AUTO or accum is AUTO:
        return
    train = train if isinstance(train, int) else None
    micro = micro if isinstance(micro, int) else None
    accum = accum if isinstance(accum, int) else None
    if f.world_size is None:
        yield from _batch_without_world(f, train, micro, accum)
        return
    for key, size in zip(("sequence_parallel_size", "tensor_parallel.autotp_size"), degrees(c), strict=True):
        if f.world_size % size:
            yield f.error(
                key,
                f"{size} does not divide the world size {f.world_size}",
                "use a degree that divides the number of processes",
            )
            return
    found = derive(train, micro, accum, f.world_size // degrees(c)[0])
    if isinstance(found, TriangleProblem):
        yield f.error("train_batch_size", found.message, found.hint)


def _batch_without_world(f: Facts, train: int | None, micro: int | None, accum: int | None) -> Iterator[Diagnostic]:
    if train is None:
        return
    per_rank = (micro or 1) * (accum or 1)
    if (micro is not None or accum is not None) and train % per_rank:
        given = [
            (k, v) for k, v in (("train_micro_batch_size_per_gpu", micro), ("gradient_accumulation_steps", accum)) if v
        ]
        product = " x ".join(f"{k} {v}" for k, v in given) + (f" = {per_rank}" if len(given) > 1 else "")
        yield f.error(
            "train_batch_size",
            f"{train} is not a multiple of {product}, so no world size fits",
            f"use a multiple of {per_rank}, or leave train_batch_size out and let DeepSpeed derive it",
        )


def batch_triangle(config: ConfigFields, world_size: int) -> tuple[int, int, int] | None:
    """``(train_batch_size, micro, accumulation)`` as DeepSpeed derives them at ``world_size`` processes.

    ``None`` when they cannot be derived: a batch key is ``"auto"``, none is set, or they do not divide (``validate``
    says which). ``sequence_parallel_size`` and ``tensor_parallel.autotp_size`` divide the world size first, as
    DeepSpeed does.
    """
    keys = (config.train_batch_size, config.train_micro_batch_size_per_gpu, config.gradient_accumulation_steps)
    if AUTO in keys or AUTO is config.sequence_parallel_size:
        return None
    sp = degrees(config)[0]
    if world_size % sp:
        return None
    train, micro, accum = (k if isinstance(k, int) else None for k in keys)
    found = derive(train, micro, accum, world_size // sp)
    return (found.train_batch_size, found.micro, found.accumulation) if isinstance(found, Triangle) else None
