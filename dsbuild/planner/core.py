"""``plan()``: every ZeRO stage and offload choice for one model on one cluster, and the fastest that fits.

A row fits when its model states plus the activations of one micro-batch fit in the GPU's usable memory (the GPU
less its headroom) and its CPU need fits the node's CPU memory.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

import attrs

from ..api import Config
from ..errors import InvalidValueError, Problem
from .count import Shape, count_lora, count_params
from .memory import (
    ADDITIONAL_BUFFER_FACTOR,
    DEFAULT_HEADROOM,
    PARAM_BUFFER_SIZE,
    Activations,
    Device,
    Headroom,
    activations,
    model_state_bytes,
    param_buffer_size,
)
from .precision import MIXED_ADAM, Precision
from .sizes import MAX_COUNT, count_text, decimal_unit, gib, parse_count, parse_headroom, parse_size

__all__ = [
    "DEFAULT_MICRO_BATCH",
    "DEFAULT_NVME_PATH",
    "DEFAULT_SEQ_LEN",
    "DEVICE_NAMES",
    "SPEED_ORDER",
    "Plan",
    "Row",
    "plan",
]

DEFAULT_NVME_PATH = "/local_nvme"
"""Where the config of an NVMe row puts its swap files when no NVMe directory was given (a placeholder: NVMe rows are
recommended only when one was)."""


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


DEFAULT_SEQ_LEN = 2048
"""Tokens per sequence the activations are planned for when none is given (GPT-3's context length)."""


DEFAULT_MICRO_BATCH = 1
"""Sequences per GPU per forward pass planned for when none is given: the least activation memory."""


@attrs.frozen
class Row:
    """One ZeRO stage and offload choice: its model states, what each GPU needs in all, its CPU and NVMe needs."""

    stage: int
    """ZeRO stage, 0-3."""
    offload_optimizer: Device
    """Where optimizer states live off the GPU: ``"none"``, ``"cpu"`` or ``"nvme"``."""
    offload_param: Device
    """Where 16-bit parameters live off the GPU (stage 3 only): ``"none"``, ``"cpu"`` or ``"nvme"``."""
    gpu_bytes_per_device: int
    """Model states on each GPU (DeepSpeed's estimators' figure)."""
    gpu_total_bytes: int
    """What each GPU needs in all: model states + activations + headroom (``Plan.activations``, ``Plan.headroom_bytes``)."""
    cpu_bytes_per_node: int
    """CPU memory on each node (with DeepSpeed's 1.5x head room; pinned NVMe swap buffers included)."""
    nvme_bytes: int
    """Bytes on the NVMe drive of each node (0 without NVMe offload)."""
    fits: bool
    """``gpu_total_bytes`` within the GPU and, for rows that offload, ``cpu_bytes_per_node`` within the CPU budget (one
    not given always fits). A row without offload is not held to DeepSpeed's cold estimate of the host memory that
    loading the fp32 model in every process takes: transformers loads a checkpoint shard by shard."""
    max_micro_batch: int | None = None
    """The most sequences per GPU per step whose activations fit beside the model states and the headroom (0: not
    even one); ``None`` without a GPU budget or the model's shape."""

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
    shape: Shape | None
    """The model's hidden size, layers, heads and vocabulary; ``None`` when only a count was given."""
    seq_len: int
    """Tokens per sequence the activations are planned for."""
    micro_batch: int
    """Sequences per GPU per forward pass the activations are planned for."""
    gradient_checkpointing: bool
    """Whether the activations are planned with full activation recomputation."""
    flash_attention: bool
    """Whether the attention kernel is taken to keep no ``seq × seq`` scores."""
    activations: Activations | None
    """Activation memory per GPU, by part; ``None`` when the model's shape is unknown (not counted)."""
    headroom: Headroom
    """The rule the headroom follows (a fixed part and a percent of the GPU)."""
    headroom_bytes: int
    """GPU memory kept free on each GPU: the CUDA context, workspaces, buffers and fragmentation."""
    nvme_path: str | None = None
    """The NVMe directory given for NVMe rows; ``None``: no NVMe, so no NVMe row is recommended."""
    precision: Precision = MIXED_ADAM
    """The training precision, model dtype and optimizer the model states are counted for."""

    @property
    def world_size(self) -> int:
        """GPUs in all: ``gpus_per_node × nodes``."""
        return self.gpus_per_node * self.nodes

    @property
    def activation_bytes(self) -> int:
        """Activation bytes per GPU counted in every row (0 when the model's shape is unknown)."""
        return self.activations.total if self.activations is not None else 0

    @property
    def usable_gpu_memory(self) -> int | None:
        """The GPU budget less the headroom (at least 0): what model states and activations may use."""
        return max(0, self.gpu_memory - self.headroom_bytes) if self.gpu_memory is not None else None

    def row(self, stage: int, offload_optimizer: Device = "none", offload_param: Device = "none") -> Row:
        """The row of one stage and offload choice."""
        for r in self.rows:
            if (r.stage, r.offload_optimizer, r.offload_param) == (stage, offload_optimizer, offload_param):
                return r
        raise KeyError((stage, offload_optimizer, offload_param))

    def config_for(self, row: Row) -> Config:
        """The config of any row, built as ``recommended`` is (``Config.zero(...)`` plus offload verbs)."""
        return _config_for(row, self.largest_layer_params, self.world_size, self.nvme_path or DEFAULT_NVME_PATH)


def plan(
    params: int | float | str | None = None,
    model: Any = None,
    largest_layer_params: int | float | str | None = None,
    gpus_per_node: int = 1,
    nodes: int = 1,
    gpu_memory: int | float | str | None = None,
    cpu_memory: int | float | str | None = None,
    *,
    seq_len: int = DEFAULT_SEQ_LEN,
    micro_batch: int = DEFAULT_MICRO_BATCH,
    gradient_checkpointing: bool = True,
    flash_attention: bool = False,
    headroom: str | int | float | None = None,
    nvme_path: str | None = None,
    additional_buffer_factor: float = ADDITIONAL_BUFFER_FACTOR,
    lora: Mapping[str, Any] | None = None,
    sequence_parallel: int = 1,
    reference: bool = False,
    precision: Precision | str = MIXED_ADAM,
) -> Plan:
    """Memory per GPU of every ZeRO stage × offload choice, and the fastest config that fits (docs/planner.md).

    ``params`` (a number or ``"7B"``) or ``model`` (an HF config, ``config.json`` or its folder, or a model; with
    both, ``params`` is the total and ``model`` gives the largest layer and the shape). Budgets are bytes or sizes
    (``"80GiB"``); one not given always fits. Each GPU needs its model states, the activations of one micro-batch of
    ``seq_len`` × ``micro_batch`` (as ``gradient_checkpointing``, ``flash_attention`` and ``sequence_parallel`` change
    them) and the ``headroom``. NVMe rows need ``nvme_path``. ``lora`` (peft ``LoraConfig`` fields, with ``model``):
    the adapters carry the states of training, the frozen base counts once; ``reference``: a frozen copy. The model
    states are those of ``precision``: ``"bf16"`` (the default, with AdamW), ``"fp16"``, ``"fp32"`` or a ``Precision``."""
    _check_arguments(
        gpus_per_node=gpus_per_node, nodes=nodes, seq_len=seq_len, micro_batch=micro_batch,
        gradient_checkpointing=gradient_checkpointing, flash_attention=flash_attention,
        additional_buffer_factor=additional_buffer_factor, reference=reference, params=params, model=model,
    )  # fmt: skip
    size = count_params(model) if model is not None else None
    counted = _counts(params, model, size, lora, largest_layer_params, _precision(precision), reference)
    states = counted.precision
    gpu_budget = parse_size(gpu_memory, "gpu_memory") if gpu_memory is not None else None
    cpu_budget = parse_size(cpu_memory, "cpu_memory") if cpu_memory is not None else None
    rule = Headroom(*parse_headroom(headroom, "headroom")) if headroom is not None else DEFAULT_HEADROOM
    kept, shape = rule.of(gpu_budget), size.shape if size is not None else None
    acts = (
        activations(micro_batch, seq_len, shape.hidden_size, shape.num_layers, num_heads=None if flash_attention
                    else shape.num_heads, checkpointing=gradient_checkpointing, vocab_size=shape.vocab_size,
                    sequence_parallel=sequence_parallel) if shape is not None else None
    )  # fmt: skip
    per_gpu = kept + (acts.total if acts is not None else 0)
    # Activations grow with the micro-batch: what one sequence takes gives the most that fit in each row.
    per_sequence = acts.total // micro_batch if acts is not None else None

    def rows_on(n: int, *, nvme: bool = True) -> list[Row]:
        need = (counted.trained, counted.largest, gpus_per_node, n, float(additional_buffer_factor), per_gpu)
        return [_row(stage, opt, par, *need, gpu_budget, cpu_budget, counted.frozen, states)
                for stage, opt, par in SPEED_ORDER if nvme or "nvme" not in (opt, par)]  # fmt: skip

    rows = tuple(_with_largest_micro_batch(r, gpu_budget, kept, per_sequence) for r in rows_on(nodes))
    chosen = next((r for r in rows if r.fits and (nvme_path is not None or not _on_nvme(r))), None)
    recommended = (
        _config_for(chosen, counted.largest, gpus_per_node * nodes, nvme_path or DEFAULT_NVME_PATH) if chosen else None
    )
    more_nodes = None
    if chosen is None and not any(r.fits and not _on_nvme(r) for r in rows):
        more = (factor * nodes for factor in (2, 4, 8, 16))
        wider = ((n, next((r for r in rows_on(n, nvme=False) if r.fits), None)) for n in more)
        more_nodes = next(((n, found) for n, found in wider if found is not None), None)
    notes = [
        *([_NO_GPU] if gpu_budget is None else []),
        *_notes(acts, rule, kept, gpu_memory, gpu_budget, gradient_checkpointing, flash_attention, sequence_parallel),
        *counted.notes,
        *_budget_notes(rows, cpu_budget, additional_buffer_factor, states),
    ]
    return Plan(
        params=counted.total, largest_layer_params=counted.largest, gpus_per_node=gpus_per_node, nodes=nodes,
        gpu_memory=gpu_budget, cpu_memory=cpu_budget, rows=rows, recommended=recommended, recommended_row=chosen,
        reason=_reason(rows, chosen, gpu_budget, cpu_budget, kept, acts, nvme_path, more_nodes), notes=tuple(notes),
        source=size.source if params is None and size is not None else "given", shape=shape, seq_len=seq_len,
        micro_batch=micro_batch, gradient_checkpointing=gradient_checkpointing, flash_attention=flash_attention,
        activations=acts, headroom=rule, headroom_bytes=kept, nvme_path=nvme_path, precision=states,
    )  # fmt: skip


_ARGUMENTS: Final[dict[str, tuple[Callable[[Any], bool], str]]] = {
    "gpus_per_node": (lambda v: _count_ok(v), "a positive integer up to 1e15"),
    "nodes": (lambda v: _count_ok(v), "a positive integer up to 1e15"),
    "seq_len": (lambda v: _count_ok(v), "a positive integer up to 1e15"),
    "micro_batch": (lambda v: _count_ok(v), "a positive integer up to 1e15"),
    "gradient_checkpointing": (lambda v: isinstance(v, bool), "True or False"),
    "flash_attention": (lambda v: isinstance(v, bool), "True or False"),
    "reference": (lambda v: isinstance(v, bool), "True or False"),
    "additional_buffer_factor": (lambda v: isinstance(v, int | float) and not isinstance(v, bool) and v >= 1,
                                 "a number >= 1"),
}  # fmt: skip
"""``plan``'s arguments that are checked before anything is counted: what each must be."""


def _count_ok(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, int) and 1 <= value <= MAX_COUNT


def _check_arguments(*, params: Any, model: Any, **arguments: Any) -> None:
    """``InvalidValueError`` naming every argument that is not what ``_ARGUMENTS`` says, and a plan of nothing."""
    problems = [
        Problem(name, f"got {value!r}, expected {expected}")
        for name, value in arguments.items()
        for ok, expected in [_ARGUMENTS[name]]
        if not ok(value)
    ]
    if params is None and model is None:
        problems.append(Problem("params", "missing", "give params (e.g. '7B') or model (an HF config or a model)"))
    if problems:
        raise InvalidValueError(problems)


@attrs.frozen
class _Counts:
    """What a plan counts: the parameters in all, frozen and trained, the largest layer, and notes on them."""

    total: int
    frozen: int
    trained: int
    largest: int
    notes: tuple[str, ...]
    precision: Precision = MIXED_ADAM


def _precision(precision: Precision | str) -> Precision:
    """``precision`` as a ``Precision``: one as given, a training precision's name with AdamW."""
    if isinstance(precision, Precision):
        return precision
    named = {"bf16": MIXED_ADAM, "fp16": Precision("fp16"), "fp32": Precision("fp32")}.get(precision)
    if named is not None:
        return named
    raise InvalidValueError(Problem("precision", f"got {precision!r}, expected 'bf16', 'fp16', 'fp32' or a Precision"))


def _counts(
    params: Any,
    model: Any,
    size: Any,
    lora: Mapping[str, Any] | None,
    largest_layer: Any,
    states: Precision = MIXED_ADAM,
    reference: bool = False,
) -> _Counts:
    total = parse_count(params, "params") if params is not None else size.params if size is not None else 0
    if total <= 0:
        raise InvalidValueError(Problem("params", f"got {total!r}, expected a positive count"))
    notes: list[str] = []
    frozen, trained = 0, total  # a LoRA run trains its adapters; its base is frozen
    if lora is not None:
        if model is None:
            raise InvalidValueError(Problem("lora", "a LoRA plan needs the model (its config) to count the adapters"))
        frozen, trained = total, count_lora(model, lora)
        notes.append(
            f"LoRA: {count_text(trained)} trainable adapter parameters carry gradients and optimizer states; the "
            f"{count_text(frozen)} frozen base parameters are counted once, {_weights(states)}"
        )
    if largest_layer is not None:
        largest = parse_count(largest_layer, "largest_layer_params")
    elif size is not None:
        largest = size.largest_layer_params
    else:
        largest = 0
        notes.append(
            "largest layer unknown (taken as 0): ZeRO-3 rows leave out the layer gathered on each GPU "
            "(4 bytes per parameter of the largest layer); pass largest_layer_params (usually vocab × hidden) "
            "or the model's config"
        )
    counted = _Counts(total, frozen, trained, largest, tuple(notes), states)
    return _with_reference(counted, reference, lora is not None, states)


def _weights(states: Precision) -> str:
    """``"in 16 bits"``: how frozen weights are counted."""
    return f"in {states.weight_bytes * 8} bits"


def _with_reference(counted: _Counts, reference: bool, lora: bool, states: Precision) -> _Counts:
    """The counts with a reference model: a second copy of the weights, frozen (as trained, no gradients or optimizer
    states: whole on each GPU below stage 3, where ``for_inference`` makes it stage 0; partitioned or offloaded at
    stage 3), or nothing more for a LoRA policy."""
    if not reference:
        return counted
    if lora:
        note = "reference model: the LoRA policy with its adapters disabled, no second copy of the weights"
        return attrs.evolve(counted, notes=(*counted.notes, note))
    note = (
        f"reference model: a second copy of the {count_text(counted.total)} weights {_weights(states)}, frozen (no "
        "gradients or optimizer states): whole on each GPU below stage 3 (Config.for_inference makes it stage 0), "
        "partitioned at stage 3, offloaded with the parameters"
    )
    return attrs.evolve(counted, frozen=counted.frozen + counted.total, notes=(*counted.notes, note))


_NO_GPU: Final = (
    "NO GPU MEMORY GIVEN: every row counts as fitting the GPU, so the pick is only the fastest choice "
    "(pass gpu_memory / --gpu-memory to plan for your GPUs)"
)


def _budget_notes(rows: Sequence[Row], cpu_budget: int | None, factor: float, states: Precision) -> list[str]:
    """What the figures assume of the budgets and of DeepSpeed's estimators."""
    notes = []
    cold = [r for r in rows if not _offloads(r) and cpu_budget is not None and r.cpu_bytes_per_node > cpu_budget]
    if cold:
        notes.append(
            f"DeepSpeed's estimator counts {gib(max(r.cpu_bytes_per_node for r in cold))} of CPU memory per node for "
            "rows without offload (every process loading the fp32 model first, cold); transformers loads a "
            "checkpoint shard by shard, so those rows are not held to it"
        )
    notes += [
        states.describe(),
        f"CPU figures carry DeepSpeed's {factor:g}x head room; NVMe rows include the pinned "
        "swap buffers at DeepSpeed's defaults (a smaller sub_group_size shrinks the optimizer's)",
    ]
    if cpu_budget is None:
        notes.append("no CPU budget given: every row's CPU need counts as fitting (pass cpu_memory to check it)")
    return notes


def _notes(
    acts: Activations | None,
    rule: Headroom,
    kept: int,
    gpu_memory: object,
    gpu_budget: int | None,
    checkpointing: bool,
    flash_attention: bool,
    sequence_parallel: int = 1,
) -> list[str]:
    """What the GPU figures count, and what they assume."""
    notes: list[str] = []
    if acts is None:
        notes.append(
            "activations are NOT counted: with a bare parameter count the model's shape is unknown; "
            "give the model's config to count them"
        )
    else:
        recompute = (
            "full recomputation (HF gradient_checkpointing): each layer keeps its 16-bit input, one layer "
            "is rebuilt at a time"
            if checkpointing
            else "no recomputation: every layer keeps its activations"
        )
        scores = (
            "no stored attention scores (a fused kernel such as FlashAttention)"
            if flash_attention
            else "attention scores stored (5·a·s²·b per layer; a fused kernel such as FlashAttention keeps none)"
        )
        notes.append(
            "activations: Korthikanti et al. 2022, 16-bit, s·b·h·(34 + 5·a·s/h) bytes per layer, "
            f"{recompute}; {scores}; plus the fp32 logits 4·s·b·V; "
            + (
                f"each GPU holds 1/{sequence_parallel} of every sequence (Ulysses sequence parallelism)"
                if sequence_parallel > 1
                else "no sequence parallelism"
            )
            + "; no tensor parallelism"
        )
    fragmentation = f"{rule.percent:g}% of the GPU" if rule.percent else ""
    notes.append(
        f"headroom {gib(kept)} per GPU ({rule.describe()}): the CUDA context, cuBLAS and NCCL workspaces, "
        "DeepSpeed's communication buckets, the caching allocator's fragmentation"
        + (f"; the {fragmentation} part needs gpu_memory" if gpu_budget is None and fragmentation else "")
    )
    if gpu_budget is not None and decimal_unit(gpu_memory):
        notes.append(
            f"gpu_memory {gpu_memory!r} is read as {gpu_budget:,} bytes ({gib(gpu_budget)}): GB are 10**9 bytes. "
            "A GPU sold as '80GB' has about 80 GiB: nvidia-smi shows MiB (81920MiB on an A100 80GB); "
            "give that figure or '80GiB'"
        )
    return notes


def _row(
    stage: int,
    opt: Device,
    par: Device,
    params: int,
    largest: int,
    gpus_per_node: int,
    nodes: int,
    factor: float,
    per_gpu: int,
    gpu_budget: int | None,
    cpu_budget: int | None,
    frozen: int = 0,
    states: Precision = MIXED_ADAM,
) -> Row:
    gpu, cpu, nvme = model_state_bytes(stage, opt, par, params, largest, gpus_per_node, nodes, factor, states)
    if frozen:  # a LoRA base or a reference model: its weights only, partitioned (or offloaded) at stage 3
        base = states.weight_bytes * frozen
        if stage < 3:
            gpu += base
        elif par == "none":
            gpu += base // (gpus_per_node * nodes)
        elif par == "cpu":
            cpu += int(base / nodes * factor)
        else:
            nvme += base // nodes
    total = gpu + per_gpu
    offloads = opt != "none" or par != "none"
    fits = (gpu_budget is None or total <= gpu_budget) and (cpu_budget is None or not offloads or cpu <= cpu_budget)
    return Row(
        stage,
        opt,
        par,
        gpu_bytes_per_device=gpu,
        gpu_total_bytes=total,
        cpu_bytes_per_node=cpu,
        nvme_bytes=nvme,
        fits=fits,
    )


def _with_largest_micro_batch(row: Row, gpu_budget: int | None, kept: int, per_sequence: int | None) -> Row:
    if gpu_budget is None or not per_sequence:
        return row
    room = gpu_budget - kept - row.gpu_bytes_per_device
    return attrs.evolve(row, max_micro_batch=max(room // per_sequence, 0))


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


def _on_nvme(row: Row) -> bool:
    return "nvme" in (row.offload_optimizer, row.offload_param)


def _offloads(row: Row) -> bool:
    return row.offload_optimizer != "none" or row.offload_param != "none"


def _reason(
    rows: tuple[Row, ...],
    chosen: Row | None,
    gpu: int | None,
    cpu: int | None,
    kept: int,
    acts: Activations | None,
    nvme_path: str | None = None,
    more_nodes: tuple[int, Row] | None = None,
) -> str:
    usable = (
        f"{gib(max(0, gpu - kept))} usable per GPU ({gib(gpu)} less {gib(kept)} headroom)" if gpu is not None else ""
    )
    budget = " and ".join(
        part for part in (usable, f"{gib(cpu)} CPU memory per node" if cpu is not None else "") if part
    )
    unknown = "; activations not counted (give the model's config)" if acts is None else ""
    if chosen is not None:
        text = f"{chosen.label} is the fastest choice" + (f" that fits in {budget}" if budget else "")
        if gpu is None:
            text += " (no GPU memory given: pass gpu_memory, --gpu-memory, to know whether it fits)"
        if cpu is None and chosen.cpu_bytes_per_node:
            text += f"; it needs {gib(chosen.cpu_bytes_per_node)} CPU memory per node"
        return text + unknown
    options = []
    nvme_fits = next((r for r in rows if r.fits and _on_nvme(r)), None)
    if nvme_fits is not None and nvme_path is None:
        options.append(f"{nvme_fits.label} fits: give a directory on a local NVMe drive (nvme_path, --nvme PATH)")
    if more_nodes is not None:
        options.append(f"{more_nodes[1].label} fits on {more_nodes[0]} nodes")
    options.append("train LoRA adapters: the frozen base needs only its 16-bit weights (plan the job's model)")
    if nvme_fits is not None or more_nodes is not None:
        return "nothing fits without NVMe on these nodes: " + "; or ".join(options) + unknown
    gpu_fits = [r for r in rows if gpu is None or r.gpu_total_bytes <= gpu]
    if gpu is not None and kept >= gpu:
        return f"nothing fits: the headroom, {gib(kept)}, takes all of the {gib(gpu)} per GPU; give a smaller headroom"
    if not gpu_fits:
        least = min(rows, key=lambda r: (r.gpu_total_bytes, r.cpu_bytes_per_node))
        need = least.gpu_total_bytes - kept
        smaller = ""
        if acts is not None:
            smaller = "gradient checkpointing, " if not acts.layer_inputs else ""
            smaller += f"shorter sequences or a smaller micro-batch (activations {gib(acts.total)}), "
        return (
            f"nothing fits in {usable}: the smallest need is {gib(need)} ({least.label}); add GPUs or nodes, "
            f"{smaller}train LoRA adapters, or split the model (tensor/pipeline parallel){unknown}"
        )
    least = min(gpu_fits, key=lambda r: (r.cpu_bytes_per_node, r.gpu_total_bytes))
    within = f" of the choices that fit {usable}," if gpu is not None else ""
    return (
        f"nothing fits in {gib(cpu or 0)} CPU memory per node:{within} the smallest CPU need is "
        f"{gib(least.cpu_bytes_per_node)} ({least.label}); add CPU memory or nodes{unknown}"
    )
