"""A plan as people read it (a table) and as programs read it (JSON)."""

from __future__ import annotations

import textwrap
from collections.abc import Iterable
from typing import Any

import attrs

from .core import Plan, Row
from .sizes import GiB, count_text, gib

__all__ = ["format_plan_table", "plan_to_json"]


def format_plan_table(plan: Plan) -> str:
    """A fixed-width table of every row in GiB, the recommended one marked ``*``; the assumptions above, notes below.

    Each row reads: model states + activations + headroom = what each GPU needs, against the GPU's memory.
    """
    nodes = f"{plan.nodes} node" + ("s" if plan.nodes != 1 else "")
    gpus = f"{plan.gpus_per_node} GPU" + ("s" if plan.gpus_per_node != 1 else "") + " per node"
    largest = f"{count_text(plan.largest_layer_params)}" if plan.largest_layer_params else "unknown"
    lines = [f"{count_text(plan.params)} parameters ({plan.source}; largest layer {largest}), {gpus} x {nodes}"]
    for line in (_precision_line(plan), _gpu_line(plan), _activation_line(plan)):
        lines.append(textwrap.fill(line, width=_WIDTH, subsequent_indent="  ", break_on_hyphens=False))
    cpu = f"CPU {gib(plan.cpu_memory)} per node" if plan.cpu_memory is not None else "CPU not given"
    lines += [f"{cpu}; sizes in GiB per GPU (CPU and NVMe per node); rows fastest first", ""]
    header = (
        "", "stage", "optimizer", "params", "states", "+activations", "+headroom", "=GPU", "CPU", "NVMe", "fits",
        "max micro",
    )  # fmt: skip
    table = [header]
    acts, kept = _number(plan.activation_bytes), _number(plan.headroom_bytes)
    for r in plan.rows:
        table.append(
            (
                "*" if r is plan.recommended_row else "",
                str(r.stage),
                r.offload_optimizer,
                r.offload_param,
                _number(r.gpu_bytes_per_device),
                acts if plan.activations is not None else "?",
                kept,
                _number(r.gpu_total_bytes),
                _number(r.cpu_bytes_per_node),
                _number(r.nvme_bytes) if r.nvme_bytes else "-",
                "yes" if r.fits else "no",
                str(r.max_micro_batch) if r.max_micro_batch is not None else "-",
            )
        )
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    right = {*range(4, 10), 11}
    for row in table:
        cells = [
            cell.rjust(w) if i in right else cell.ljust(w) for i, (cell, w) in enumerate(zip(row, widths, strict=True))
        ]
        lines.append("  ".join(cells).rstrip())
    lines.append("")
    verdict = ("recommended (*): " if plan.recommended_row else "no recommendation: ") + plan.reason
    lines.append(textwrap.fill(verdict, width=_WIDTH, subsequent_indent="  ", break_on_hyphens=False))
    lines.append("notes:")
    for note in plan.notes:
        lines.append(
            textwrap.fill(note, width=_WIDTH, initial_indent="  - ", subsequent_indent="    ", break_on_hyphens=False)
        )
    return "\n".join(lines)


def _precision_line(plan: Plan) -> str:
    """``model states: bf16 mixed precision, AdamW; bytes per parameter: weights 2, gradients 2, optimizer 16``;
    where the optimizer's side differs by stage (fp32), each stage's."""
    p = plan.precision
    by_stage = {stage: p.per_param(stage).optimizer for stage in (0, 1, 3)}
    others = "".join(f"; stage {stage}: {n}" for stage, n in sorted(by_stage.items(), reverse=True) if n != by_stage[1])
    first = p.per_param(1)
    return (
        f"model states: {p.label}; bytes per parameter: weights "
        f"{first.weights}, gradients {first.gradients}, optimizer {first.optimizer}"
        + (f" (stages 1-2 and offload{others})" if others else "")
    )


def _gpu_line(plan: Plan) -> str:
    """``GPU 80.00 GiB less headroom 10.00 GiB (2.00 GiB + 10% of the GPU) = 70.00 GiB usable``."""
    if plan.gpu_memory is None:
        return f"GPU not given (headroom {gib(plan.headroom_bytes)}: {plan.headroom.describe()})"
    return (
        f"GPU {gib(plan.gpu_memory)} less headroom {gib(plan.headroom_bytes)} ({plan.headroom.describe()}) "
        f"= {gib(plan.usable_gpu_memory or 0)} usable"
    )


def _activation_line(plan: Plan) -> str:
    """The activations by part, and what they assume."""
    if plan.activations is None or plan.shape is None:
        return "activations not counted: the model's shape is unknown (give its config)"
    a, shape = plan.activations, plan.shape
    parts = [f"{shape.num_layers} layer inputs {_number(a.layer_inputs)}"] if a.layer_inputs else []
    parts.append(
        f"one layer recomputed {_number(a.layers)}"
        if plan.gradient_checkpointing
        else f"{shape.num_layers} layers {_number(a.layers)}"
    )
    parts.append(f"fp32 logits {_number(a.logits)}")
    recompute = "gradient checkpointing" if plan.gradient_checkpointing else "no gradient checkpointing"
    attention = ", FlashAttention" if plan.flash_attention else ""
    return (
        f"activations {gib(a.total)} = {' + '.join(parts)} "
        f"(seq {plan.seq_len} x micro-batch {plan.micro_batch}, {recompute}{attention}; "
        f"hidden {shape.hidden_size}, {shape.num_heads} heads, vocab {shape.vocab_size})"
    )


def _number(n: int) -> str:
    """Bytes as GiB, 2 decimals, no unit (the table's header says GiB)."""
    return f"{n / GiB:.2f}"


_WIDTH = 100
"""Footer lines wrap here; the table itself is narrower."""


def plan_to_json(plan: Plan) -> dict[str, Any]:
    """The plan as JSON types only: rows as objects, the recommended config as its ds_config dict."""
    rows: list[dict[str, Any]] = [
        {
            "stage": r.stage,
            "offload_optimizer": r.offload_optimizer,
            "offload_param": r.offload_param,
            "gpu_bytes_per_device": r.gpu_bytes_per_device,
            "gpu_total_bytes": r.gpu_total_bytes,
            "cpu_bytes_per_node": r.cpu_bytes_per_node,
            "nvme_bytes": r.nvme_bytes,
            "fits": r.fits,
            "max_micro_batch": r.max_micro_batch,
            "recommended": r is plan.recommended_row,
            "bytes_per_param": attrs.asdict(plan.precision.per_param(r.stage, r.offload_optimizer, r.offload_param)),
        }
        for r in plan.rows
    ]
    return {
        "params": plan.params,
        "largest_layer_params": plan.largest_layer_params,
        "source": plan.source,
        "gpus_per_node": plan.gpus_per_node,
        "nodes": plan.nodes,
        "gpu_memory": plan.gpu_memory,
        "cpu_memory": plan.cpu_memory,
        "headroom": attrs.asdict(plan.headroom),
        "headroom_bytes": plan.headroom_bytes,
        "usable_gpu_memory": plan.usable_gpu_memory,
        "seq_len": plan.seq_len,
        "micro_batch": plan.micro_batch,
        "gradient_checkpointing": plan.gradient_checkpointing,
        "flash_attention": plan.flash_attention,
        "precision": {
            **attrs.asdict(plan.precision),
            "optimizer_states": plan.precision.optimizer_states,
            "weight_bytes": plan.precision.weight_bytes,
        },
        "shape": attrs.asdict(plan.shape) if plan.shape is not None else None,
        "activations": (
            {**attrs.asdict(plan.activations), "total": plan.activations.total}
            if plan.activations is not None
            else None
        ),
        "rows": rows,
        "recommended": plan.recommended.to_dict() if plan.recommended is not None else None,
        "recommended_row": _index(plan.rows, plan.recommended_row),
        "reason": plan.reason,
        "notes": list(plan.notes),
    }


def _index(rows: Iterable[Row], row: Row | None) -> int | None:
    for i, r in enumerate(rows):
        if r is row:
            return i
    return None
