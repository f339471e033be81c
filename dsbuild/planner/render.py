"""A plan as people read it (a table) and as programs read it (JSON)."""

from __future__ import annotations

import textwrap
from collections.abc import Iterable
from typing import Any

from .core import Plan, Row
from .sizes import gib

__all__ = ["format_plan_table", "plan_to_json"]


def format_plan_table(plan: Plan) -> str:
    """A fixed-width table of every row (GiB, 2 decimals), the recommended one marked ``*``, notes below."""
    nodes = f"{plan.nodes} node" + ("s" if plan.nodes != 1 else "")
    gpus = f"{plan.gpus_per_node} GPU" + ("s" if plan.gpus_per_node != 1 else "") + " per node"
    largest = f"{count_text(plan.largest_layer_params)}" if plan.largest_layer_params else "unknown"
    budgets = ", ".join(
        (
            f"GPU {gib(plan.gpu_memory)}" if plan.gpu_memory is not None else "GPU not given",
            f"CPU {gib(plan.cpu_memory)} per node" if plan.cpu_memory is not None else "CPU not given",
        )
    )
    lines = [
        f"{count_text(plan.params)} parameters ({plan.source}; largest layer {largest}), {gpus} x {nodes}",
        f"budgets: {budgets}; rows fastest first",
        "",
    ]
    header = ("", "stage", "optimizer", "params", "GPU/device", "CPU/node", "NVMe/node", "fits")
    table = [header]
    for r in plan.rows:
        table.append(
            (
                "*" if r is plan.recommended_row else "",
                str(r.stage),
                r.offload_optimizer,
                r.offload_param,
                gib(r.gpu_bytes_per_device),
                gib(r.cpu_bytes_per_node),
                gib(r.nvme_bytes) if r.nvme_bytes else "-",
                "yes" if r.fits else "no",
            )
        )
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    right = {4, 5, 6}
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


_WIDTH = 100
"""Footer lines wrap here; the table itself is narrower."""


def count_text(n: int) -> str:
    for unit, scale in (("T", 10**12), ("B", 10**9), ("M", 10**6), ("K", 10**3)):
        if n >= scale:
            return f"{n / scale:.2f}{unit}"
    return str(n)


def plan_to_json(plan: Plan) -> dict[str, Any]:
    """The plan as JSON types only: rows as objects, the recommended config as its ds_config dict."""
    rows: list[dict[str, Any]] = [
        {
            "stage": r.stage,
            "offload_optimizer": r.offload_optimizer,
            "offload_param": r.offload_param,
            "gpu_bytes_per_device": r.gpu_bytes_per_device,
            "cpu_bytes_per_node": r.cpu_bytes_per_node,
            "nvme_bytes": r.nvme_bytes,
            "fits": r.fits,
            "recommended": r is plan.recommended_row,
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
