"""Monitoring, profiling, checkpointing, I/O and parallelism sections."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from . import fields as f
from .fields import Auto

__all__ = [
    "ActivationCheckpointing",
    "Aio",
    "Checkpoint",
    "CheckpointParallelWrite",
    "CheckpointWriter",
    "Comet",
    "CommsLogger",
    "CsvMonitor",
    "FlopsProfiler",
    "TensorBoard",
    "TensorParallel",
    "TensorParallelTP",
    "Wandb",
]


@f.section_class
class ActivationCheckpointing:
    """``activation_checkpointing``: DeepSpeed's activation checkpointing (``deepspeed.checkpointing``)."""

    partition_activations: bool | Auto | None = f.bool_()
    """Partition checkpointed activations across model-parallel ranks; default false."""
    number_checkpoints: int | Auto | None = f.int_(ge=0)
    """Checkpoints kept in contiguous memory; default none."""
    contiguous_memory_optimization: bool | Auto | None = f.bool_()
    """Copy checkpoints into one contiguous buffer; default false."""
    cpu_checkpointing: bool | Auto | None = f.bool_()
    """Offload partitioned checkpoints to CPU; default false."""
    synchronize_checkpoint_boundary: bool | Auto | None = f.bool_()
    """Synchronize the device at each checkpoint boundary; default false."""
    profile: bool | Auto | None = f.bool_()
    """Log the forward/backward time of each checkpoint; default false."""


@f.section_class
class TensorBoard:
    """``tensorboard``: DeepSpeed's TensorBoard monitor."""

    enabled: bool | Auto | None = f.bool_()
    """Write training metrics to TensorBoard; default false."""
    output_path: str | Auto | None = f.str_()
    """Directory of the event files; default the launch directory."""
    job_name: str | Auto | None = f.str_()
    """Sub-directory name of this run; default ``"DeepSpeedJobName"``."""


@f.section_class
class CsvMonitor:
    """``csv_monitor``: DeepSpeed's CSV monitor (one CSV file per metric)."""

    enabled: bool | Auto | None = f.bool_()
    """Write training metrics to CSV files; default false."""
    output_path: str | Auto | None = f.str_()
    """Directory of the CSV files; default the launch directory."""
    job_name: str | Auto | None = f.str_()
    """Sub-directory name of this run; default ``"DeepSpeedJobName"``."""


@f.section_class
class Wandb:
    """``wandb``: DeepSpeed's Weights & Biases monitor."""

    enabled: bool | Auto | None = f.bool_()
    """Log training metrics to W&B; default false."""
    group: str | Auto | None = f.str_(null=True)
    """W&B group name; default none."""
    team: str | Auto | None = f.str_(null=True)
    """W&B team (entity); default none."""
    project: str | Auto | None = f.str_()
    """W&B project; default ``"deepspeed"``."""


@f.section_class
class Comet:
    """``comet``: DeepSpeed's Comet monitor."""

    enabled: bool | Auto | None = f.bool_()
    """Log training metrics to Comet; default false."""
    samples_log_interval: int | Auto | None = f.int_(ge=0)
    """Log every this many samples; default 100."""
    project: str | Auto | None = f.str_(null=True)
    """Comet project; default from the Comet config or ``COMET_PROJECT_NAME``."""
    workspace: str | Auto | None = f.str_(null=True)
    """Comet workspace; default from the Comet config or ``COMET_WORKSPACE``."""
    api_key: str | Auto | None = f.str_(null=True)
    """Comet API key; default from the Comet config or ``COMET_API_KEY``."""
    experiment_name: str | Auto | None = f.str_(null=True)
    """Name of the Comet experiment; default generated."""
    experiment_key: str | Auto | None = f.str_(null=True)
    """Key (32-50 alphanumerics) of an experiment to continue; default none."""
    online: bool | Auto | None = f.bool_(null=True)
    """Log to the Comet server (else offline); default true."""
    mode: str | Auto | None = f.choice("get", "create", "get_or_create", null=True)
    """``"get"``, ``"create"`` or ``"get_or_create"`` an experiment; default ``"get_or_create"``."""


@f.section_class
class FlopsProfiler:
    """``flops_profiler``: profile FLOPs, latency and parameters of one step."""

    enabled: bool | Auto | None = f.bool_(null=False)
    """Run the flops profiler (also turns on ``wall_clock_breakdown``); default false."""
    recompute_fwd_factor: float | Auto | None = f.float_(ge=0)
    """Extra forward passes from activation recomputation (1.0 with full checkpointing); default 0."""
    profile_step: int | Auto | None = f.int_(ge=0)
    """Global step at which to profile; default 1."""
    module_depth: int | Auto | None = f.int_()
    """Depth of the per-module profile (-1: all); default -1."""
    top_modules: int | Auto | None = f.int_(ge=0)
    """Top modules shown in the aggregated profile; default 1."""
    detailed: bool | Auto | None = f.bool_()
    """Print the detailed per-module profile; default true."""
    output_file: str | Auto | None = f.str_()
    """File for the profile; default stdout."""


@f.section_class
class CheckpointWriter:
    """``checkpoint.writer``: how checkpoint files are written."""

    type: str | Auto | None = f.choice("FAST", "PYTHON", "MOCK", any_case=True)
    """Writer implementation, ``"FAST"``, ``"PYTHON"`` or ``"MOCK"``; default ``"FAST"``."""
    io_buffer_size: int | Auto | None = f.int_(gt=0)
    """I/O buffer size in bytes of the fast writer; default 64 MiB."""
    io_buffer_double: bool | Auto | None = f.bool_()
    """Double-buffer the fast writer's I/O; default true."""
    io_multiplier: int | Auto | None = f.int_(gt=0)
    """I/O multiplier of the fast writer; default 1."""
    show_statistics: bool | Auto | None = f.bool_()
    """Print I/O statistics of the writer; default false."""
    data_parallel: str | Auto | None = f.choice("REPLICA", "SOCKET", "MACHINE", any_case=True)
    """Unit of data-parallel writing, ``"REPLICA"``, ``"SOCKET"`` or ``"MACHINE"``; default none (rank 0 writes)."""
    decoupled: bool | Auto | None = f.bool_()
    """Write checkpoints decoupled from training; default false."""


@f.section_class
class CheckpointParallelWrite:
    """``checkpoint.parallel_write``: parallel checkpoint writing for pipeline parallelism."""

    pipeline_stage: bool | Auto | None = f.bool_(null=False)
    """Each pipeline stage writes its own part; default false."""


@f.section_class
class Checkpoint:
    """``checkpoint``: checkpoint saving and loading."""

    tag_validation: str | Auto | None = f.choice("Warn", "Ignore", "Fail", any_case=True, null=False)
    """Check that all ranks save the same tag: ``"Warn"``, ``"Ignore"`` or ``"Fail"``; default ``"Warn"``."""
    load_universal: bool | Auto | None = f.bool_()
    """Load a universal checkpoint (any parallelism); default false."""
    use_node_local_storage: bool | Auto | None = f.bool_()
    """Each node writes to its own local storage; default false."""
    checkpoint_serialization: bool | Auto | None = f.bool_()
    """Use torch's serialization format for checkpoints; default true."""
    parallel_write: CheckpointParallelWrite | None = f.section(CheckpointParallelWrite)
    """Parallel writing for pipeline parallelism; default off."""
    writer: CheckpointWriter | None = f.section(CheckpointWriter)
    """Checkpoint writer settings; default the standard writer."""


@f.section_class
class Aio:
    """``aio``: asynchronous I/O for NVMe offload (ZeRO-Infinity)."""

    block_size: int | Auto | None = f.int_(gt=0)
    """I/O block size in bytes; default 1048576."""
    queue_depth: int | Auto | None = f.int_(gt=0)
    """I/O queue depth; default 8."""
    intra_op_parallelism: int | Auto | None = f.int_(gt=0)
    """Threads per I/O operation; default 1."""
    single_submit: bool | Auto | None = f.bool_()
    """Submit requests one at a time instead of in batches; default false."""
    overlap_events: bool | Auto | None = f.bool_()
    """Overlap submission and completion of requests; default true."""
    use_gds: bool | Auto | None = f.bool_()
    """Use NVIDIA GPUDirect Storage (CUDA only); default false."""


@f.section_class
class TensorParallelTP:
    """``tensor_parallel.tp``: the tensor-parallel group."""

    tp_size: int | Auto | None = f.int_(ge=1)
    """Tensor-parallel degree; default 1."""
    tp_grain_size: int | Auto | None = f.int_(ge=1)
    """Granularity of MLP/lm_head partitions; default 1."""


@f.section_class
class TensorParallel:
    """``tensor_parallel``: automatic tensor parallelism (AutoTP) for training."""

    autotp_size: int | Auto | None = f.int_(ge=0)
    """AutoTP degree for training (0: off); default 0."""
    tp_overlap_comm: bool | Auto | None = f.bool_()
    """Overlap tensor-parallel communication with compute; default false."""
    vocab_parallel_lm_head: bool | Auto | None = f.bool_(null=True)
    """Partition the lm_head over the vocabulary; default chosen by DeepSpeed."""
    vocab_parallel_ce_backend: str | Auto | None = f.choice("torch", "liger")
    """Cross-entropy backend for a vocab-parallel head; default ``"torch"``."""
    tp: TensorParallelTP | None = f.section(TensorParallelTP)
    """The tensor-parallel group (legacy name ``tensor_parallel``); default tp_size 1."""
    partition_config: Mapping[str, Any] | None = f.mapping(null=True)
    """Custom AutoTP layer partitioning rules (``layer_specs``), passed as written; default none."""
    preset_model: str | Auto | None = f.str_(null=True)
    """Built-in AutoTP preset, e.g. ``"llama"``, ``"qwen2"``; default none."""
    keep_module_on_host: bool | Auto | None = f.bool_()
    """Keep loaded checkpoint tensors on the host; default false."""
    replace_with_kernel_inject: bool | Auto | None = f.bool_()
    """Inject inference kernels (legacy name ``kernel_inject``); default false."""


@f.section_class
class CommsLogger:
    """``comms_logger``: log communication operations."""

    enabled: bool | Auto | None = f.bool_()
    """Log communication ops; default false."""
    prof_all: bool | Auto | None = f.bool_()
    """Profile all ops (else only ``prof_ops``); default true."""
    prof_ops: tuple[str, ...] | None = f.strs()
    """Ops to profile, e.g. ``["all_reduce"]``; default none."""
    verbose: bool | Auto | None = f.bool_()
    """Print every op as it happens; default false."""
    debug: bool | Auto | None = f.bool_()
    """Add the caller to each op's log; default false."""
