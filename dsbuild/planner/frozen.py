"""Models a run keeps beside the policy without training them, on a DeepSpeed inference engine each
(``Config.for_inference``): a GRPO or RLOO job's reward models (``[rewards] models``). Their weights only, in the
dtype the policy computes in; no gradients, no optimizer. At ZeRO stage 0 each process holds a whole copy; at stage 3
the copy is partitioned over the processes, and with ``offload`` it sits in CPU memory between uses (each process its
partition, a node its processes'). Unless a stage is given, they run at 3 beside a policy at 3 and at 0 beside one at
0-2 (``for_inference``'s rule).
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from .core import Plan, Row
from .sizes import count_text

__all__ = ["repicked", "with_frozen_models"]


def with_frozen_models(plan: Plan, params: Sequence[int], stage: int | None = None, offload: bool = False) -> Plan:
    """``plan`` with every row's GPU (or, offloaded, CPU) need grown by frozen models of ``params`` parameters each,
    at ``stage`` (``None``: 3 beside a policy at 3, else 0), held to the budgets, the pick made again, and a note."""
    if not params:
        return plan
    weights = sum(params) * plan.precision.weight_bytes
    world, per_node = plan.world_size, min(plan.gpus_per_node, plan.world_size)
    rows = []
    for row in plan.rows:
        at = stage if stage is not None else (3 if row.stage == 3 else 0)
        each = weights if at == 0 else -(-weights // world)
        gpu, cpu = (0, each * per_node) if offload and at == 3 else (each, 0)
        rows.append(_grown(row, gpu, cpu, plan))
    where = (
        f"ZeRO stage {stage}"
        if stage is not None
        else "ZeRO-3 beside a policy at stage 3, ZeRO-0 (a whole copy on each GPU) beside one at 0-2"
    )
    note = (
        f"reward models: {len(params)} of {count_text(sum(params))} parameters in all, frozen (their weights only, "
        f"{plan.precision.weight_bytes} bytes each), on an inference engine at {where}"
        + (", in CPU memory between uses" if offload else "")
    )
    fastest = "the fastest row that fits with the reward models"
    return repicked(plan, rows, note, fastest, "no row fits with the reward models")


def _grown(row: Row, gpu: int, cpu: int, plan: Plan) -> Row:
    """``row`` with ``gpu`` more bytes on each GPU and ``cpu`` more on each node, held to the plan's budgets."""
    total, cpu_total = row.gpu_total_bytes + gpu, row.cpu_bytes_per_node + cpu
    fits = (
        row.fits
        and (plan.gpu_memory is None or total <= plan.gpu_memory)
        and (plan.cpu_memory is None or cpu == 0 or cpu_total <= plan.cpu_memory)
    )
    return attrs.evolve(row, gpu_bytes_per_device=row.gpu_bytes_per_device + gpu, gpu_total_bytes=total,
                        cpu_bytes_per_node=cpu_total, fits=fits)  # fmt: skip


def repicked(plan: Plan, rows: Sequence[Row], note: str, fastest: str, none_fits: str) -> Plan:
    """``plan`` with ``rows`` (each's need grown), the fastest row that fits picked again (off NVMe unless the plan has
    an NVMe path), and ``note`` added; a new pick's reason is ``"LABEL: fastest"``, no pick's ``none_fits``."""
    on_nvme = ["nvme" in (r.offload_optimizer, r.offload_param) for r in rows]
    chosen = next(
        (r for r, n in zip(rows, on_nvme, strict=True) if r.fits and (plan.nvme_path is not None or not n)), None
    )
    recommended = plan.config_for(chosen) if chosen is not None else None
    reason = plan.reason
    if chosen is None or plan.recommended_row is None or chosen.label != plan.recommended_row.label:
        reason = f"{chosen.label}: {fastest}" if chosen is not None else none_fits
    return attrs.evolve(plan, rows=tuple(rows), recommended=recommended, recommended_row=chosen, reason=reason,
                        notes=(*plan.notes, note))  # fmt: skip
