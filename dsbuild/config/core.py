"""The top level of a ds_config: its keys and sections, typed (data only: no builder, no I/O)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from ..errors import InvalidValueError, Problem
from . import fields as f
from .features import (
    Autotuning,
    Compile,
    DataEfficiency,
    ExpertParallel,
    HybridEngine,
    Pipeline,
    Timers,
    WeightQuantization,
)
from .fields import Auto
from .misc import (
    ActivationCheckpointing,
    Aio,
    Checkpoint,
    Comet,
    CommsLogger,
    CsvMonitor,
    FlopsProfiler,
    TensorBoard,
    TensorParallel,
    Wandb,
)
from .optim import Optimizer, Scheduler
from .precision import BF16, FP16, DataTypes, TorchAutocast
from .zero import ZeroOptimization

__all__ = [
    "NOT_KEYS",
    "PASSTHROUGH_KEYS",
    "PASSTHROUGH_SCHEMAS",
    "STRICT_SECTIONS",
    "ConfigFields",
    "in_strict_section",
    "section_classes",
    "takes_null",
]

PASSTHROUGH_KEYS: Mapping[str, str] = {
    "datastates_ckpt": "DataStates asynchronous checkpointing (an open table DeepSpeed hands on as written)",
    "expert_parallel": "AutoEP expert parallelism (an explicit null means something there)",
}
"""Top-level sections DeepSpeed reads that dsbuild carries in ``Config.extra`` exactly as written."""

PASSTHROUGH_SCHEMAS: Mapping[str, type] = {"expert_parallel": ExpertParallel}
"""The declaration each carried section's keys and values are checked against (none for an open table)."""

STRICT_SECTIONS: tuple[str, ...] = (
    "fp16", "bf16", "zero_optimization", "tensorboard", "csv_monitor", "wandb", "comet", "tensor_parallel",
    "comms_logger", "compile", "hybrid_engine", "weight_quantization", "timers.throughput",
)  # fmt: skip
"""Sections DeepSpeed reads with a pydantic model: no other keys allowed, and ``null`` only where a field is
optional. The other sections it reads by hand, where a ``null`` reads as the key's default."""


def strict_section(path: str) -> str | None:
    """The one of the ``STRICT_SECTIONS`` the dotted key ``path`` lies in, or ``None``."""
    return next((s for s in STRICT_SECTIONS if path.startswith(f"{s}.")), None)


def in_strict_section(path: str) -> bool:
    """Whether the dotted key ``path`` lies in one of the ``STRICT_SECTIONS``."""
    return strict_section(path) is not None


def takes_null(spec: f.Spec, path: str) -> bool:
    """Whether DeepSpeed reads a ``null`` of a field of the section at ``path`` as its default (``Spec.null``, else
    by how it reads the section: a pydantic model refuses it, a section read by hand takes it; a whole section must
    be a table)."""
    if spec.null is not None:
        return spec.null
    return spec.kind != "section" and not (path in STRICT_SECTIONS or in_strict_section(path))


NOT_KEYS = frozenset({"extra", "ignored", "coerced", "source", "provenance"})
"""``ConfigFields`` attributes that are not ds_config keys."""


def _is_mapping(_inst: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if not isinstance(value, Mapping):
        raise InvalidValueError(Problem(attribute.name, f"got {f.describe(value)}, expected a table"))


@f.section_class
class ConfigFields:
    """The fields of a DeepSpeed config (the ds_config dict), typed; ``None`` fields are unset and not written.

    Attributes are the ds_config keys, except the three whose key is also a
    builder verb: ``fp16_config``, ``bf16_config`` and ``optimizer_config`` hold
    the ``fp16``, ``bf16`` and ``optimizer`` sections (the constructor takes
    ``fp16=``, ``bf16=``, ``optimizer=``). ``ConfigBase`` adds the builder verbs,
    and ``dsbuild.Config`` the methods that read, write, check and resolve.
    """

    train_batch_size: int | Auto | None = f.int_(gt=0)
    """Global batch size per optimizer step: micro x accumulation x world size (HF ``"auto"``); derived when unset."""
    train_micro_batch_size_per_gpu: int | Auto | None = f.int_(gt=0, null=False)
    """Samples per device per forward/backward (HF ``"auto"``: ``per_device_train_batch_size``); derived when unset."""
    gradient_accumulation_steps: int | Auto | None = f.int_(gt=0)
    """Micro-batches accumulated per optimizer step (HF ``"auto"``); default 1 or derived."""
    fp16_config: FP16 | None = attrs.field(default=None, alias="fp16", **f.section_options(FP16))
    """fp16 mixed precision with loss scaling; default off."""
    bf16_config: BF16 | None = attrs.field(default=None, alias="bf16", **f.section_options(BF16))
    """bf16 mixed precision (legacy key ``bfloat16``); default off."""
    optimizer_config: Optimizer | None = attrs.field(default=None, alias="optimizer", **f.section_options(Optimizer))
    """Optimizer DeepSpeed builds; default none (pass your own to ``deepspeed.initialize``)."""
    scheduler: Scheduler | None = f.section(Scheduler)
    """Learning-rate scheduler DeepSpeed builds; default none."""
    zero_optimization: ZeroOptimization | None = f.section(ZeroOptimization)
    """ZeRO settings; default stage 0 (plain data parallel)."""
    gradient_clipping: float | Auto | None = f.float_(ge=0)
    """Clip gradients to this global norm (HF ``"auto"``: ``max_grad_norm``); 0 is off; default 1.0."""
    communication_data_type: str | Auto | None = f.choice("fp32", "fp16", "bf16", any_case=True)
    """dtype of gradient communication: ``"fp32"``, ``"fp16"`` or ``"bf16"``; default the training precision."""
    seq_parallel_communication_data_type: str | Auto | None = f.choice("fp32", "fp16", "bf16", any_case=True)
    """dtype of sequence-parallel communication; default ``"fp32"``."""
    prescale_gradients: bool | Auto | None = f.bool_()
    """Divide gradients by the world size before all-reduce instead of after; default false."""
    gradient_predivide_factor: float | Auto | None = f.float_(gt=0)
    """Divide gradients by this factor before all-reduce, the rest after; default 1.0."""
    gradient_allreduce_op: str | Auto | None = f.choice("mean", "sum", any_case=True, null=False)
    """Gradient reduction, ``"mean"`` or ``"sum"`` (``"sum"`` not at stage 3); default ``"mean"``."""
    steps_per_print: int | Auto | None = f.int_(gt=0)
    """Log progress every this many steps; default none (never)."""
    wall_clock_breakdown: bool | Auto | None = f.bool_(null=False)
    """Time forward, backward and step separately; default false."""
    memory_breakdown: bool | Auto | None = f.bool_()
    """Log memory use at points of the step; default false."""
    dump_state: bool | Auto | None = f.bool_()
    """Print the engine state after initialization; default false."""
    disable_allgather: bool | Auto | None = f.bool_()
    """Disable the all-gather of updated parameters (legacy); default false."""
    disable_python_gc: bool | Auto | None = f.bool_()
    """Disable Python's automatic garbage collection during training; default false."""
    dataloader_drop_last: bool | Auto | None = f.bool_()
    """Drop the last incomplete batch of DeepSpeed's data loader; default false."""
    managed_gradient_accumulation: bool | Auto | None = f.bool_()
    """Let the engine manage gradient accumulation boundaries; default true."""
    vocabulary_size: int | Auto | None = f.int_(gt=0)
    """Vocabulary size, only for a tensor-core alignment warning; default none."""
    sequence_parallel_size: int | Auto | None = f.int_(gt=0, null=False)
    """Ulysses sequence-parallel degree (divides the data-parallel world size); default 1."""
    data_parallel_size: int | Auto | None = f.int_(gt=0)
    """Data-parallel degree; with ``sequence_parallel_size``, ``deepspeed.initialize`` builds a (data, sequence) mesh; default derived."""
    use_data_before_expert_parallelism: bool | Auto | None = f.bool_()
    """Order process groups data-parallel first for MoE; default false."""
    zero_allow_untested_optimizer: bool | Auto | None = f.bool_()
    """Allow an optimizer DeepSpeed has not tested with ZeRO (a client or torch optimizer); default false."""
    zero_force_ds_cpu_optimizer: bool | Auto | None = f.bool_()
    """With optimizer offload, insist on DeepSpeed's CPU optimizer; default true."""
    log_level: str | Auto | None = f.choice("debug", "info", "warning", "error", "critical", any_case=True)
    """Level of DeepSpeed's logger (``"debug"``, ``"info"``, ``"warning"``, ``"error"``, ``"critical"``); default unchanged."""
    activation_checkpointing: ActivationCheckpointing | None = f.section(ActivationCheckpointing)
    """DeepSpeed activation checkpointing; default off."""
    tensorboard: TensorBoard | None = f.section(TensorBoard)
    """TensorBoard monitor; default off."""
    csv_monitor: CsvMonitor | None = f.section(CsvMonitor)
    """CSV monitor; default off."""
    wandb: Wandb | None = f.section(Wandb)
    """Weights & Biases monitor; default off."""
    comet: Comet | None = f.section(Comet)
    """Comet monitor; default off."""
    flops_profiler: FlopsProfiler | None = f.section(FlopsProfiler)
    """FLOPs profiler; default off."""
    checkpoint: Checkpoint | None = f.section(Checkpoint)
    """Checkpoint saving and loading; default DeepSpeed's."""
    data_types: DataTypes | None = f.section(DataTypes)
    """dtypes of gradient accumulation, parameters, buffers; default the training precision."""
    torch_autocast: TorchAutocast | None = f.section(TorchAutocast)
    """torch.autocast for the forward pass; default off."""
    aio: Aio | None = f.section(Aio)
    """Asynchronous I/O for NVMe offload; default DeepSpeed's."""
    tensor_parallel: TensorParallel | None = f.section(TensorParallel)
    """Automatic tensor parallelism for training; default off."""
    comms_logger: CommsLogger | None = f.section(CommsLogger)
    """Communication logger; default off."""
    compile: Compile | None = f.section(Compile)
    """DeepCompile (``engine.compile()``); default off."""
    pipeline: Pipeline | None = f.section(Pipeline)
    """Pipeline-parallel engine settings; default DeepSpeed's."""
    autotuning: Autotuning | None = f.section(Autotuning)
    """DeepSpeed's autotuner; default off."""
    data_efficiency: DataEfficiency | None = f.section(DataEfficiency)
    """Curriculum learning, dynamic batching and random-LTD; default off."""
    hybrid_engine: HybridEngine | None = f.section(HybridEngine)
    """The RLHF hybrid engine; default off."""
    weight_quantization: WeightQuantization | None = f.section(WeightQuantization)
    """Quantized weights; default off."""
    timers: Timers | None = f.section(Timers)
    """The engine's timers; default the throughput timer, synchronized."""
    extra: Mapping[str, Any] = attrs.field(factory=dict, validator=_is_mapping, hash=False)
    """Sections carried as written (``PASSTHROUGH_KEYS``), and removed ones so nothing is lost (validate reports them)."""
    ignored: Mapping[str, Any] = attrs.field(factory=dict, eq=False, repr=False, hash=False)
    """Keys DeepSpeed ignores, kept by ``from_dict(strict=False)`` so ``validate()`` reports them; never written."""
    coerced: Mapping[str, Any] = attrs.field(factory=dict, eq=False, repr=False, hash=False)
    """Dotted key -> a file's value read as another type (``"3"`` as 3), for ``validate()`` to mention; never written."""
    source: str | None = attrs.field(default=None, eq=False, repr=False)
    """Where the values came from, for ``explain()``: ``"preset zero3"``, ``"file ds.json"``; ``None`` when built in code."""
    provenance: Mapping[str, str] = attrs.field(factory=dict, eq=False, repr=False, hash=False)
    """Dotted key -> where ``resolve()`` got its value (``"training argument learning_rate"``, ``"batch triangle"``, ...)."""


def section_classes() -> dict[str, type]:
    """Every section class by the dotted path it sits at (for docs and tests)."""
    out: dict[str, type] = {}

    def walk(cls: type[Any], path: str) -> None:
        out[path] = cls
        for a in attrs.fields(cls):
            spec = a.metadata.get("dsbuild")
            if spec is not None and spec.kind == "section" and spec.section is not None:
                key = f.key_of(a)  # the ds key: "fp16", not the attribute "fp16_config"
                walk(spec.section, f"{path}.{key}" if path else key)

    walk(ConfigFields, "")
    return out
