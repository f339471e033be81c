"""The CPU memory an asynchronous save takes (``training.async_save``): each process copies what it writes of a
checkpoint into CPU memory at the step that saves, and holds the copy until it is written.

What a process writes is DeepSpeed's checkpoint of the trained parameters (a LoRA run's adapters; the frozen base is
not saved): the weights the model computes with, whole in rank 0's model-states file below stage 3 (at stage 3 each
process's partition is in its optimizer file instead), and the optimizer's side (fp32 master weights and the
optimizer's states, no gradients), whole on rank 0 at stage 0 and partitioned over the processes at stages 1-3.
Rank 0 writes the most; a node holds its processes' copies at once.
"""

from __future__ import annotations

from typing import Final

import attrs

from .core import Plan
from .frozen import repicked
from .precision import MIXED_ADAM, Precision
from .sizes import gib

__all__ = ["REFUSAL_HINT", "Staging", "available_memory", "refusal", "size", "staging", "with_staging"]


def size(n: int) -> str:
    """Bytes as people read a copy's size: ``"412 MiB"``, ``"13.50 GiB"``."""
    if n >= 2**30:
        return gib(n)
    return f"{n / 2**20:.0f} MiB" if n >= 2**20 else f"{n / 2**10:.0f} KiB"


@attrs.frozen
class Staging:
    """The staging copy of one ZeRO stage's checkpoint, bytes."""

    per_rank: int
    """On the process that writes the most (rank 0)."""
    per_node: int
    """On a node that holds rank 0 and ``gpus_per_node - 1`` others."""


def staging(
    stage: int, trained: int, world_size: int, gpus_per_node: int = 1, states: Precision = MIXED_ADAM
) -> Staging:
    """The staging copy at ZeRO ``stage`` of ``trained`` parameters over ``world_size`` processes."""
    weights = states.weight_bytes * trained
    in_weights = states.training == "fp32" and stage == 0  # the optimizer's states alone, in the weights' dtype
    optimizer = (states.per_param(stage).optimizer - (0 if in_weights else 4)) * trained
    if stage == 0:
        return Staging(weights + optimizer, weights + optimizer)
    shard = -(-optimizer // world_size)
    whole = weights if stage < 3 else 0
    return Staging(whole + shard, whole + shard * min(gpus_per_node, world_size))


def with_staging(plan: Plan, trained: int) -> Plan:
    """``plan`` with every row's CPU need grown by the staging copy of its stage (``trained`` parameters), held to the
    CPU budget (a row without offload too: the copy is real memory), the pick made again, and a note per stage."""
    world = plan.world_size
    copies = {stage: staging(stage, trained, world, plan.gpus_per_node, plan.precision) for stage in range(4)}
    budget = plan.cpu_memory
    rows = []
    for row in plan.rows:
        cpu = row.cpu_bytes_per_node + copies[row.stage].per_node
        rows.append(attrs.evolve(row, cpu_bytes_per_node=cpu, fits=row.fits and (budget is None or cpu <= budget)))
    per_stage = ", ".join(f"ZeRO-{s} {size(c.per_rank)} per process ({size(c.per_node)} per node)"
                          for s, c in copies.items())  # fmt: skip
    note = (
        f"training.async_save: each process's checkpoint is copied into CPU memory at the step that saves, and the "
        f"CPU column holds that copy: {per_stage}"
    )
    return repicked(plan, rows, note, "the fastest row whose CPU need, with the asynchronous save's copy, fits",
                    "no row fits with the asynchronous save's copy in CPU memory (training.async_save = false saves "
                    "without one)")  # fmt: skip


def available_memory() -> int | None:
    """The CPU memory this machine has available now (Linux's ``MemAvailable``), bytes; ``None`` where unknown."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def refusal(copy: Staging, available: int | None) -> str | None:
    """Why an asynchronous save's copy cannot be held on this node (more than the CPU memory available), or ``None``."""
    if available is None or copy.per_node <= available:
        return None
    return (
        f"each checkpoint is copied into CPU memory before it is written: {size(copy.per_node)} on this node "
        f"({size(copy.per_rank)} on rank 0), and {size(available)} is available"
    )


REFUSAL_HINT: Final = (
    "set training.async_save = false (a synchronous save takes no copy), or spread the optimizer's states over more "
    "processes (a higher ZeRO stage, more nodes)"
)
