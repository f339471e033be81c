"""The typed model of a DeepSpeed config: one frozen attrs class per ds_config section, and the builder.

Data only: nothing here reads files, converts or imports the layers above. ``dsbuild.Config``
(in ``dsbuild.api``) is ``ConfigBase`` plus the methods that do.
"""

from .builder import ConfigBase
from .core import NOT_KEYS, PASSTHROUGH_KEYS, ConfigFields, section_classes
from .fields import AUTO, Auto
from .misc import (
    ActivationCheckpointing,
    Aio,
    Checkpoint,
    CheckpointParallelWrite,
    CheckpointWriter,
    Comet,
    CommsLogger,
    CsvMonitor,
    FlopsProfiler,
    TensorBoard,
    TensorParallel,
    TensorParallelTP,
    Wandb,
)
from .optim import (
    SCHEDULERS,
    AdagradParams,
    AdamParams,
    LambParams,
    LionParams,
    LRRangeTestParams,
    OneCycleParams,
    Optimizer,
    Scheduler,
    WarmupCosineLRParams,
    WarmupDecayLRParams,
    WarmupLRParams,
)
from .precision import BF16, FP16, DataTypes, TorchAutocast
from .zero import OffloadOptimizer, OffloadParam, ZeroOptimization

__all__ = [
    "AUTO",
    "BF16",
    "FP16",
    "NOT_KEYS",
    "PASSTHROUGH_KEYS",
    "SCHEDULERS",
    "ActivationCheckpointing",
    "AdagradParams",
    "AdamParams",
    "Aio",
    "Auto",
    "Checkpoint",
    "CheckpointParallelWrite",
    "CheckpointWriter",
    "Comet",
    "CommsLogger",
    "ConfigBase",
    "ConfigFields",
    "CsvMonitor",
    "DataTypes",
    "FlopsProfiler",
    "LRRangeTestParams",
    "LambParams",
    "LionParams",
    "OffloadOptimizer",
    "OffloadParam",
    "OneCycleParams",
    "Optimizer",
    "Scheduler",
    "TensorBoard",
    "TensorParallel",
    "TensorParallelTP",
    "TorchAutocast",
    "Wandb",
    "WarmupCosineLRParams",
    "WarmupDecayLRParams",
    "WarmupLRParams",
    "ZeroOptimization",
    "section_classes",
]
