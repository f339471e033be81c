"""What DeepSpeed knows, written down once: optimizer and scheduler names, strict sections, stage-3-only keys.

The facts the rules compare a config against, from DeepSpeed 0.19's sources (``deepspeed/runtime/config.py``,
``runtime/zero/config.py``, ``runtime/engine.py``) and torch's ``optim`` package. Nothing here imports them:
``tests/unit/test_validate.py`` checks these lists against the installed packages.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

__all__ = [
    "CPU_OPTIMIZERS",
    "DEEPSPEED_OPTIMIZERS",
    "DISPLAY_NAMES",
    "FUSED",
    "ONE_BIT_OPTIMIZERS",
    "REMOVALS_SINCE",
    "REMOVED_ZERO_KEYS",
    "REQUIRED_PARAMS",
    "SCHEDULERS_IN_CODE",
    "STAGE3_ONLY",
    "TORCH_OPTIMIZERS",
    "TORCH_SCHEDULERS",
    "WARMUP_STEPS_POSITIVE_SINCE",
    "ZERO_TESTED_OPTIMIZERS",
]

DEEPSPEED_OPTIMIZERS: Final = ("adagrad", "adam", "adamw", "lamb", "muadam", "muadamw", "musgd", "lion", "muon")
"""Optimizer names DeepSpeed builds itself (any case): ``DEEPSPEED_OPTIMIZERS`` in ``deepspeed/runtime/config.py``."""

DISPLAY_NAMES: Final = ("Adam", "AdamW", "Adagrad", "Lamb", "Lion", "Muon", "MuAdam", "MuAdamW", "MuSGD")

TORCH_OPTIMIZERS: Final = (
    "ASGD", "Adadelta", "Adafactor", "Adagrad", "Adam", "AdamW", "Adamax", "LBFGS", "Muon",
    "NAdam", "RAdam", "RMSprop", "Rprop", "SGD", "SparseAdam",
)  # fmt: skip
"""``torch.optim`` optimizer classes (torch 2.13); DeepSpeed looks any other name up there, case-sensitively."""

TORCH_SCHEDULERS: Final = (
    "ChainedScheduler", "ConstantLR", "CosineAnnealingLR", "CosineAnnealingWarmRestarts", "CyclicLR",
    "ExponentialLR", "LambdaLR", "LinearLR", "MultiStepLR", "MultiplicativeLR", "OneCycleLR",
    "PolynomialLR", "ReduceLROnPlateau", "SequentialLR", "StepLR",
)  # fmt: skip
"""``torch.optim.lr_scheduler`` classes DeepSpeed falls back to for a scheduler name it does not have."""

ONE_BIT_OPTIMIZERS: Final = {"onebitadam": "OneBitAdam", "onebitlamb": "OneBitLamb", "zerooneadam": "ZeroOneAdam"}

ZERO_TESTED_OPTIMIZERS: Final = ("adam", "adamw", "adagrad", "lion", "muon")
"""Names whose optimizer class is in DeepSpeed's ``ZERO_SUPPORTED_OPTIMIZERS`` (FusedAdam, CPU Adam, torch
Adam/AdamW/Adagrad, CPU Adagrad, Fused/CPU Lion, Muon); anything else needs ``zero_allow_untested_optimizer``."""

CPU_OPTIMIZERS: Final = ("adam", "adamw", "adagrad", "lion")
"""Names DeepSpeed runs with its own CPU optimizer when optimizer states are offloaded."""

REMOVALS_SINCE: Final = (0, 19, 8)
"""First DeepSpeed checked to refuse the removed sections and 1-bit optimizers (issue deepspeedai/DeepSpeed#8489)."""

WARMUP_STEPS_POSITIVE_SINCE: Final = (0, 19, 6)
"""DeepSpeed refuses ``warmup_num_steps: 0`` from here on (older versions clamped it)."""

REMOVED_ZERO_KEYS: Final = ("mics_shard_size", "mics_hierarchical_params_gather", "zeropp_loco_param")

STAGE3_ONLY: Final = (
    "sub_group_size", "stage3_prefetch_bucket_size", "stage3_param_persistence_threshold",
    "stage3_model_persistence_threshold", "stage3_max_live_parameters", "stage3_max_reuse_distance",
    "stage3_gather_16bit_weights_on_model_save", "stage3_module_granularity_threshold",
    "stage3_use_all_reduce_for_fetch_params", "stage3_allgather_sequential", "zero_hpz_partition_size",
    "zero_quantized_weights", "zero_quantized_nontrainable_weights", "zero_quantized_gradients",
    "save_muon_momentum_buffer_in_memory",
)  # fmt: skip
"""``zero_optimization`` keys only the stage-3 optimizer reads (DeepSpeed ignores them below stage 3)."""

FUSED: Final = {"adam": "FusedAdam", "adamw": "FusedAdam", "lamb": "FusedLamb"}
"""DeepSpeed's fused GPU optimizer class for a name (without offload)."""

REQUIRED_PARAMS: Final[Mapping[str, tuple[str, ...]]] = {
    "WarmupDecayLR": ("total_num_steps",), "WarmupCosineLR": ("total_num_steps",),
    "OneCycle": ("cycle_min_lr", "cycle_max_lr"),
    # torch.optim.lr_scheduler (torch 2.13; tests/unit/test_validate.py checks them against the installed torch)
    "CosineAnnealingLR": ("T_max",), "CosineAnnealingWarmRestarts": ("T_0",), "CyclicLR": ("base_lr", "max_lr"),
    "ExponentialLR": ("gamma",), "MultiStepLR": ("milestones",), "OneCycleLR": ("max_lr",), "StepLR": ("step_size",),
}  # fmt: skip
"""Params a scheduler cannot do without (its constructor has no default for them): DeepSpeed's and torch's."""

SCHEDULERS_IN_CODE: Final[Mapping[str, str]] = {
    "ChainedScheduler": "schedulers", "LambdaLR": "lr_lambda", "MultiplicativeLR": "lr_lambda",
    "SequentialLR": "schedulers",
}  # fmt: skip
"""torch schedulers whose required argument is a Python object (schedulers, a function): no config file can
hold one."""
