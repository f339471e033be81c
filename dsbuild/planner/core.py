"""``plan()``: every ZeRO stage and offload choice for one model on one cluster, and the fastest that fits."""

from __future__ import annotations

from typing import Any

import attrs

from ..api import Config
from ..errors import InvalidValueError, Problem
from .count import count_params
from .memory import ADDITIONAL_BUFFER_FACTOR, PARAM_BUFFER_SIZE, Device, model_state_bytes, param_buffer_size
from .sizes import gib, parse_count, parse_size

__all__ = ["DEFAULT_NVME_PATH", "DEVICE_NAMES", "SPEED_ORDER", "Plan", "Row", "plan"]

DEFAULT_NVME_PATH = "/local_nvme"
"""Where the recommended NVMe config puts its swap files; replace it with a directory on a local NVMe drive."""


SPEED_ORDER: tuple[tuple[int, Device, Device], ...] = (
    (0, "none", "none"),
    (1, "none", "none"),
    (2, "none", "none"),
    (1, "cpu", "none"),
    (2, "cpu", "none"),
    (3, "none", "none"),
    (3, "cpu", "none"),
    (3, "none", "cpu"),
    (3, "cpu", "cpu"),
    (3, "nvme", "none"),
    (3, "nvme", "cpu"),
    (3, "none", "nvme"),
    (3, "cpu", "nvme"),
    (3, "nvme", "nvme"),
)
"""Every (stage, offload_optimizer, offload_param) row, fastest first.

DeepSpeed's and the HF docs' guidance: stage 0 > 1 > 2 > 2 + CPU offload > 3 >
3 + optimizer offload > 3 + optimizer and parameter offload > NVMe. Within the
same level a lower stage comes first (less communication), optimizer offload
comes before parameter offload (the optimizer moves once per step, parameters
at every forward and backward), and parameters on NVMe come last.
"""


DEVICE_NAMES = {"none": "GPU", "cpu": "CPU", "nvme": "NVMe"}


@attrs.frozen
class Row:
    """One ZeRO stage and offload choice, with the memory its model states need."""

    stage: int
    """ZeRO stage, 0-3."""
    offload_optimizer: Device
    """Where optimizer states live off the GPU: ``"none"``, ``"cpu"`` or ``"nvme"``."""
    offload_param: Device
    """Where 16-bit parameters live off the GPU (stage 3 only): ``"none"``, ``"cpu"`` or ``"nvme"``."""
    gpu_bytes_per_device: int
    """Model states on each GPU."""
    cpu_bytes_per_node: int
    """CPU memory on each node (with DeepSpeed's 1.5x head room; pinned NVMe swap buffers included)."""
    nvme_bytes: int
    """Bytes on the NVMe drive of each node (0 without NVMe offload)."""
    fits: bool
    """Within the GPU and CPU budgets given (a budget not given always fits)."""

    @property
    def label(self) -> str:
        """``"ZeRO-3, optimizer on CPU, parameters on NVMe"``."""
        parts = [f"ZeRO-{self.stage}"]
        if self.offload_optimizer != "none":
            parts.append(f"optimizer on {DEVICE_NAMES[self.offload_optimizer]}")
        if self.offload_param != "none":
            parts.append(f"parameters on {DEVICE_NAMES[self.offload_param]}")
        return ", ".join(parts)


@attrs.frozen
class Plan:
    """Memory needs of every ZeRO stage and offload choice for one model on one cluster, and the pick."""

    params: int
    """Total model parameters."""
    largest_layer_params: int
    """Parameters of the largest layer (ZeRO-3 gathers one at a time); 0 when unknown."""
    gpus_per_node: int
    """GPUs on each node."""
    nodes: int
    """Nodes."""
    gpu_memory: int | None
    """GPU memory budget per device, bytes; ``None``: not given."""
    cpu_memory: int | None
    """CPU memory budget per node, bytes; ``None``: not given."""
    rows: tuple[Row, ...]
    """Every stage and offload choice, fastest first (``SPEED_ORDER``)."""
    recommended: Config | None
    """The config of the fastest row that fits, built with the builder; ``None`` when nothing fits."""
    recommended_row: Row | None
    """The row ``recommended`` was built from."""
    reason: str
    """Why this row was recommended, or why none was."""
    notes: tuple[str, ...]
    """What the figures include and leave out."""
    source: str
    """Where the parameter count came from."""
    nvme_path: str = DEFAULT_NVME_PATH
    """The NVMe directory configs of NVMe rows use."""

    @property
    def world_size(self) -> int:
        """GPUs in all: ``gpus_per_node × nodes``."""
        return self.gpus_per_node * self.nodes

    def row(self, stage: int, offload_optimizer: Device = "none", offload_param: Device = "none") -> Row:
        """The row of one stage and offload choice."""
        for r in self.rows:
            if (r.stage, r.offload_optimizer, r.offload_param) == (stage, offload_optimizer, offload_param):
                return r
        raise KeyError((stage, offload_optimizer, offload_param))

    def config_for(self, row: Row) -> Config:
        """The config of any row, built as ``recommended`` is (``Config.zero(...)`` plus offload verbs)."""
        return _config_for(row, self.largest_layer_params, self.world_size, self.nvme_path)


def plan(
    params: int | float | str | None = None,
    model: Any = None,
    largest_layer_params: int | float | str | None = None,
    gpus_per_node: int = 1,
    nodes: int = 1,
    gpu_memory: int | float | str | None = None,
    cpu_memory: int | float | str | None = None,
    *,
    nvme_path: str = DEFAULT_NVME_PATH,
    additional_buffer_factor: float = ADDITIONAL_BUFFER_FACTOR,
) -> Plan:
    """Model-state memory of every ZeRO stage × offload choice, and the fastest config that fits.

    Give ``params`` (a number or ``"7B"``) or ``model``: an HF config (object,
    dict, ``config.json`` or its directory) or a model object. With both,
    ``params`` is the total and ``model`` still gives the largest layer.
    Budgets are bytes or sizes such as ``"80GiB"``; one not given always fits.
    """
    problems: list[Problem] = []
    for name, value in (("gpus_per_node", gpus_per_node), ("nodes", nodes)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            problems.append(Problem(name, f"got {value!r}, expected a positive integer"))
    if not isinstance(additional_buffer_factor, int | float) or additional_buffer_factor < 1:
        problems.append(
            Problem("additional_buffer_factor", f"got {additional_buffer_factor!r}, expected a number >= 1")
        )
    if params is None and model is None:
        problems.append(Problem("params", "missing", "give params (e.g. '7B') or model (an HF config or a model)"))
    if problems:
        raise InvalidValueError(problems)

    size = count_params(model) if model is not None else None
    total = parse_count(params, "params") if params is not None else size.params if size is not None else 0
    if total <= 0:
        raise InvalidValueError(Problem("params", f"got {total!r}, expected a positive count"))
    notes: list[str] = []
    if largest_layer_params is not None:
        largest = parse_count(largest_layer_params, "largest_layer_params")
    elif size is not None:
        largest = size.largest_layer_params
    else:
        largest = 0
        notes.append(
            "largest layer unknown (taken as 0): ZeRO-3 rows leave out the layer gathered on each GPU "
            "(4 bytes per parameter of the largest layer); pass largest_layer_params (usually vocab × hidden) "
            "or the model's config"
        )
    gpu_budget = parse_size(gpu_memory, "gpu_memory") if gpu_memory is not None else None
    cpu_budget = parse_size(cpu_memory, "cpu_memory") if cpu_memory is not None else None
    source = size.source if params is None and size is not None else "given"

    factor = float(additional_buffer_factor)
    rows = tuple(
        _row(stage, opt, par, total, largest, gpus_per_node, nodes, factor, gpu_budget, cpu_budget)
        for stage, opt, par in SPEED_ORDER
    )
    chosen = next((r for r in rows if r.fits), None)
    recommended = _config_for(chosen, largest, gpus_per_node * nodes, nvme_path) if chosen else None

    notes[:0] = [
        "activations are not included: add them (they grow with micro-batch size × sequence length, "
        "activation checkpointing shrinks them; estimate_activation_bytes gives an approximate figure), "
        "plus temporary buffers and the CUDA context",
        "model states of mixed-precision training with Adam: 2 bytes/param 16-bit weights, 2 bytes 16-bit "
        "gradients, 16 bytes fp32 gradients + master weights + Adam moments; stage 3 with zero.Init",
        f"CPU figures carry DeepSpeed's {additional_buffer_factor:g}x head room; NVMe rows include the pinned "
        "swap buffers at DeepSpeed's defaults (a smaller sub_group_size shrinks the optimizer's)",
    ]
    if cpu_budget is None:
        notes.append("no CPU budget given: every row's CPU need counts as fitting (pass cpu_memory to check it)")
    return Plan(
        params=total,
        largest_layer_params=largest,
        gpus_per_node=gpus_per_node,
        nodes=nodes,
        gpu_memory=gpu_budget,
        cpu_memory=cpu_budget,
        rows=rows,
        recommended=recommended,
        recommended_row=chosen,
        reason=_reason(rows, chosen, gpu_budget, cpu_budget),
        notes=tuple(notes),
        source=source,
        nvme_path=nvme_path,
    )


def _row(
    stage: int,
    opt: Device,
    par: Device,
    params: int,
    largest: int,
    gpus_per_node: int,
    nodes: int,
    factor: float,
    gpu_budget: int | None,
    cpu_budget: int | None,
) -> Row:
    gpu, cpu, nvme = model_state_bytes(stage, opt, par, params, largest, gpus_per_node, nodes, factor)
    fits = (gpu_budget is None or gpu <= gpu_budget) and (cpu_budget is None or cpu <= cpu_budget)
    return Row(stage, opt, par, gpu, cpu, nvme, fits)


def _config_for(row: Row, largest: int, world_size: int, nvme_path: str) -> Config:
    """The row as a config, built with the builder verbs."""
    cfg = Config.zero(row.stage)
    opt, par = row.offload_optimizer, row.offload_param
    if "nvme" in (opt, par):
        buffer_size = param_buffer_size(largest, world_size)
        cfg = cfg.offload_nvme(
            nvme_path,
            optimizer=opt == "nvme",
            params=par == "nvme",
            buffer_size=buffer_size if par == "nvme" and buffer_size != PARAM_BUFFER_SIZE else None,
        )
    if "cpu" in (opt, par):
        cfg = cfg.offload_cpu(optimizer=opt == "cpu", params=par == "cpu")
    if row.stage == 3:
        cfg = cfg.zero_options(stage3_gather_16bit_weights_on_model_save=True)
    return cfg


def _reason(rows: tuple[Row, ...], chosen: Row | None, gpu: int | None, cpu: int | None) -> str:
    budget = " and ".join(
        part
        for part in (
            f"{gib(gpu)} per GPU" if gpu is not None else "",
            f"{gib(cpu)} CPU memory per node" if cpu is not None else "",
        )
        if part
    )
    if chosen is not None:
        text = f"{chosen.label} is the fastest choice" + (f" that fits in {budget}" if budget else "")
        if cpu is None and chosen.cpu_bytes_per_node:
            text += f"; it needs {gib(chosen.cpu_bytes_per_node)} CPU memory per node"
        return text
    gpu_fits = [r for r in rows if gpu is None or r.gpu_bytes_per_device <= gpu]
    if not gpu_fits:
        least = min(rows, key=lambda r: (r.gpu_bytes_per_device, r.cpu_bytes_per_node))
        return (
            f"nothing fits in {gib(gpu or 0)} per GPU: the smallest need is {gib(least.gpu_bytes_per_device)} "
            f"({least.label}); add GPUs or nodes, or split the model (tensor/pipeline parallel)"
        )
    least = min(gpu_fits, key=lambda r: (r.cpu_bytes_per_node, r.gpu_bytes_per_device))
    within = f" of the choices that fit {gib(gpu)} per GPU," if gpu is not None else ""
    return (
        f"nothing fits in {gib(cpu or 0)} CPU memory per node:{within} the smallest CPU need is "
        f"{gib(least.cpu_bytes_per_node)} ({least.label}); add CPU memory or nodes"
    )
