"""``optimizer`` and ``scheduler``: a type name plus typed params per type."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from . import fields as f
from .fields import Auto

__all__ = [
    "OPTIMIZER_PARAMS",
    "SCHEDULERS",
    "SCHEDULER_PARAMS",
    "AdagradParams",
    "AdamParams",
    "LRRangeTestParams",
    "LambParams",
    "LionParams",
    "MuonParams",
    "OneCycleParams",
    "Optimizer",
    "OptimizerParams",
    "Scheduler",
    "SchedulerParams",
    "WarmupCosineLRParams",
    "WarmupDecayLRParams",
    "WarmupLRParams",
    "optimizer_params_class",
    "scheduler_params_class",
]


@f.section_class
class AdamParams:
    """``optimizer.params`` for ``Adam`` and ``AdamW`` (FusedAdam, CPU Adam, or torch's Adam)."""

    lr: float | Auto | None = f.float_(ge=0)
    """Learning rate (HF ``"auto"``: ``learning_rate``); default 1e-3."""
    betas: tuple[float, float] | Auto | None = f.pair(ge=0, lt=1)
    """Coefficients of the running averages, written as a list (HF ``"auto"``: ``[adam_beta1, adam_beta2]``); default [0.9, 0.999]."""
    eps: float | Auto | None = f.float_(ge=0)
    """Term added to the denominator (HF ``"auto"``: ``adam_epsilon``); default 1e-8."""
    weight_decay: float | Auto | None = f.float_(ge=0)
    """Weight decay (HF ``"auto"``: ``weight_decay``); default 0."""
    bias_correction: bool | Auto | None = f.bool_()
    """Apply Adam's bias correction; default true."""
    amsgrad: bool | Auto | None = f.bool_()
    """Use the AMSGrad variant (torch's Adam only: ``torch_adam = true``); default false."""
    torch_adam: bool | Auto | None = f.bool_()
    """Use ``torch.optim.Adam``/``AdamW`` instead of DeepSpeed's fused or CPU Adam; default false."""
    adam_w_mode: bool | Auto | None = f.bool_()
    """Decoupled weight decay (AdamW) for type ``Adam``; type ``AdamW`` always uses it; default true."""
    fp32_optimizer_states: bool | Auto | None = f.bool_()
    """Keep CPU Adam's optimizer states in fp32; default true."""


@f.section_class
class LambParams:
    """``optimizer.params`` for ``Lamb`` (FusedLamb)."""

    lr: float | Auto | None = f.float_(ge=0)
    """Learning rate (HF ``"auto"``: ``learning_rate``); default 1e-3."""
    bias_correction: bool | Auto | None = f.bool_()
    """Apply bias correction; default true."""
    betas: tuple[float, float] | Auto | None = f.pair(ge=0, lt=1)
    """Coefficients of the running averages (HF ``"auto"``: ``[adam_beta1, adam_beta2]``); default [0.9, 0.999]."""
    eps: float | Auto | None = f.float_(ge=0)
    """Term added to the denominator (HF ``"auto"``: ``adam_epsilon``); default 1e-8."""
    eps_inside_sqrt: bool | Auto | None = f.bool_()
    """Add ``eps`` inside the square root; default false."""
    weight_decay: float | Auto | None = f.float_(ge=0)
    """Weight decay (HF ``"auto"``: ``weight_decay``); default 0."""
    max_grad_norm: float | Auto | None = f.float_(ge=0)
    """LAMB's own gradient-norm clip inside the optimizer; default 0 (off)."""
    max_coeff: float | Auto | None = f.float_()
    """Upper bound of the LAMB trust ratio; default 10.0."""
    min_coeff: float | Auto | None = f.float_()
    """Lower bound of the LAMB trust ratio; default 0.01."""
    amsgrad: bool | Auto | None = f.bool_()
    """Not supported by FusedLamb (kept for completeness); default false."""


@f.section_class
class LionParams:
    """``optimizer.params`` for ``Lion`` (FusedLion or CPU Lion)."""

    lr: float | Auto | None = f.float_(ge=0)
    """Learning rate (HF ``"auto"``: ``learning_rate``); default 1e-3."""
    betas: tuple[float, float] | Auto | None = f.pair(ge=0, lt=1)
    """Coefficients of the update and running average (HF ``"auto"``: ``[adam_beta1, adam_beta2]``); default [0.9, 0.999]."""
    weight_decay: float | Auto | None = f.float_(ge=0)
    """Weight decay (HF ``"auto"``: ``weight_decay``); default 0."""


@f.section_class
class AdagradParams:
    """``optimizer.params`` for ``Adagrad`` (CPU Adagrad)."""

    lr: float | Auto | None = f.float_(ge=0)
    """Learning rate (HF ``"auto"``: ``learning_rate``); default 1e-2."""
    eps: float | Auto | None = f.float_(ge=0)
    """Term added to the denominator (HF ``"auto"``: ``adam_epsilon``); default 1e-10."""
    weight_decay: float | Auto | None = f.float_(ge=0)
    """Weight decay (HF ``"auto"``: ``weight_decay``); default 0."""
    amsgrad: bool | Auto | None = f.bool_()
    """Accepted for API symmetry; default false."""
    fp32_optimizer_states: bool | Auto | None = f.bool_()
    """Keep optimizer states in fp32; default true."""


@f.section_class
class MuonParams:
    """``optimizer.params`` for ``Muon`` (DeepSpeed's MuonWithAuxAdam): Muon on the hidden 2-D weights, an auxiliary
    Adam on the rest (embeddings, heads, biases, norms); each half takes the shared value unless its own is set."""

    lr: float | Auto | None = f.float_(ge=0)
    """Learning rate of both halves (HF ``"auto"``: ``learning_rate``)."""
    muon_lr: float | Auto | None = f.float_(ge=0)
    """Learning rate of the Muon half; default ``lr``."""
    adam_lr: float | Auto | None = f.float_(ge=0)
    """Learning rate of the Adam half; default ``lr``."""
    momentum: float | Auto | None = f.float_(ge=0, lt=1)
    """Muon's momentum (beta); default 0.95."""
    ns_method: str | Auto | None = f.str_()
    """How Muon orthogonalizes: ``"gram"`` (Gram Newton-Schulz, the default); any other name: the standard quintic Newton-Schulz."""
    betas: tuple[float, float] | Auto | None = f.pair(ge=0, lt=1)
    """The Adam half's running-average coefficients (HF ``"auto"``: ``[adam_beta1, adam_beta2]``)."""
    eps: float | Auto | None = f.float_(ge=0)
    """The Adam half's denominator term (HF ``"auto"``: ``adam_epsilon``)."""
    weight_decay: float | Auto | None = f.float_(ge=0)
    """Weight decay of both halves (HF ``"auto"``: ``weight_decay``); default 0."""
    adam_w_mode: bool | Auto | None = f.bool_()
    """Decoupled weight decay in the Adam half; default true."""
    per_head_muon: bool | Auto | None = f.bool_()
    """Orthogonalize each attention head's slice of the projections separately (head counts from the model's config); default false."""


OptimizerParams = AdamParams | LambParams | LionParams | AdagradParams | MuonParams | Mapping[str, Any]

OPTIMIZER_PARAMS: dict[str, type] = {
    "adam": AdamParams,
    "adamw": AdamParams,
    "lamb": LambParams,
    "lion": LionParams,
    "adagrad": AdagradParams,
    "muon": MuonParams,
}


def optimizer_params_class(type_name: str) -> type | None:
    """The typed params class for a DeepSpeed optimizer name (any case), or ``None`` for others."""
    return OPTIMIZER_PARAMS.get(type_name.lower())


@f.section_class
class Optimizer:
    """``optimizer``: DeepSpeed builds it when set; leave unset to pass your own optimizer."""

    type: str = attrs.field(validator=attrs.validators.instance_of(str))
    """``Adam``, ``AdamW``, ``Lamb``, ``Lion``, ``Adagrad``, ``Muon`` (DeepSpeed's own, any case), or a ``torch.optim`` class name."""
    params: OptimizerParams | None = None
    """Keyword arguments of the optimizer: typed for DeepSpeed's own, a table for torch optimizers."""
    legacy_fusion: bool | Auto | None = f.bool_()
    """Use the legacy fused fp16 optimizer path; default false."""


@f.section_class
class WarmupLRParams:
    """``scheduler.params`` for ``WarmupLR``: warm up, then hold."""

    warmup_min_lr: float | Auto | None = f.float_(ge=0)
    """Learning rate at the start of warmup (HF ``"auto"``: 0); default 0."""
    warmup_max_lr: float | Auto | None = f.float_(ge=0)
    """Learning rate at the end of warmup (HF ``"auto"``: ``learning_rate``); default 1e-3."""
    warmup_num_steps: int | Auto | None = f.int_(ge=0)
    """Warmup steps (HF ``"auto"``: ``warmup_steps`` or ``ceil(total x warmup_ratio)``, at least 1); default 1000."""
    warmup_type: str | Auto | None = f.choice("log", "linear")
    """Shape of the warmup, ``"log"`` or ``"linear"``; default ``"log"``."""
    last_batch_iteration: int | Auto | None = f.int_()
    """Index of the last batch when resuming; default -1."""


@f.section_class
class WarmupDecayLRParams:
    """``scheduler.params`` for ``WarmupDecayLR``: warm up, then decay linearly to 0."""

    total_num_steps: int | Auto | None = f.int_(ge=0)
    """Total optimizer steps of the run; required (HF ``"auto"``: the run's steps)."""
    warmup_min_lr: float | Auto | None = f.float_(ge=0)
    """Learning rate at the start of warmup (HF ``"auto"``: 0); default 0."""
    warmup_max_lr: float | Auto | None = f.float_(ge=0)
    """Learning rate at the end of warmup (HF ``"auto"``: ``learning_rate``); default 1e-3."""
    warmup_num_steps: int | Auto | None = f.int_(ge=0)
    """Warmup steps (HF ``"auto"``: ``warmup_steps`` or ``ceil(total x warmup_ratio)``, at least 1); default 1000."""
    warmup_type: str | Auto | None = f.choice("log", "linear")
    """Shape of the warmup, ``"log"`` or ``"linear"``; default ``"log"``."""
    last_batch_iteration: int | Auto | None = f.int_()
    """Index of the last batch when resuming; default -1."""


@f.section_class
class WarmupCosineLRParams:
    """``scheduler.params`` for ``WarmupCosineLR``: warm up, then cosine decay (ratios of the optimizer's lr)."""

    total_num_steps: int | Auto | None = f.int_(ge=0)
    """Total optimizer steps of the run; required (HF ``"auto"``: the run's steps)."""
    warmup_min_ratio: float | Auto | None = f.float_(ge=0)
    """Warmup starts at this fraction of the optimizer's lr; default 0."""
    warmup_num_steps: int | Auto | None = f.int_(ge=0)
    """Warmup steps (HF ``"auto"``: ``warmup_steps`` or ``ceil(total x warmup_ratio)``, at least 1); default 1000."""
    cos_min_ratio: float | Auto | None = f.float_(ge=0)
    """Cosine decay ends at this fraction of the optimizer's lr; default 1e-4."""
    warmup_type: str | Auto | None = f.choice("log", "linear")
    """Shape of the warmup, ``"log"`` or ``"linear"``; default ``"log"``."""
    last_batch_iteration: int | Auto | None = f.int_()
    """Index of the last batch when resuming; default -1."""


@f.section_class
class OneCycleParams:
    """``scheduler.params`` for ``OneCycle``: the 1-cycle policy of lr (and momentum)."""

    cycle_min_lr: float | Auto | None = f.float_(ge=0)
    """Lowest learning rate of the cycle; required."""
    cycle_max_lr: float | Auto | None = f.float_(ge=0)
    """Highest learning rate of the cycle; required."""
    decay_lr_rate: float | Auto | None = f.float_(ge=0)
    """Decay rate of the lr after the cycle; default 0."""
    cycle_first_step_size: int | Auto | None = f.int_(ge=0)
    """Steps in the first (rising) half of the cycle; default 2000."""
    cycle_second_step_size: int | Auto | None = f.int_(ge=0)
    """Steps in the second (falling) half; default equal to the first."""
    cycle_first_stair_count: int | Auto | None = f.int_(ge=0)
    """Stairs in the first half (0: no stairs); default 0."""
    cycle_second_stair_count: int | Auto | None = f.int_(ge=0)
    """Stairs in the second half (0: no stairs); default 0."""
    decay_step_size: int | Auto | None = f.int_(ge=0)
    """Steps between decays after the cycle; default 0."""
    cycle_momentum: bool | Auto | None = f.bool_()
    """Also cycle the momentum; default true."""
    cycle_min_mom: float | Auto | None = f.float_(ge=0)
    """Lowest momentum of the cycle; default 0.8."""
    cycle_max_mom: float | Auto | None = f.float_(ge=0)
    """Highest momentum of the cycle; default 0.9."""
    decay_mom_rate: float | Auto | None = f.float_(ge=0)
    """Decay rate of the momentum after the cycle; default 0."""
    last_batch_iteration: int | Auto | None = f.int_()
    """Index of the last batch when resuming; default -1."""


@f.section_class
class LRRangeTestParams:
    """``scheduler.params`` for ``LRRangeTest``: grow the lr to find a good range."""

    lr_range_test_min_lr: float | Auto | None = f.float_(ge=0)
    """Starting learning rate; default 1e-3."""
    lr_range_test_step_size: int | Auto | None = f.int_(gt=0)
    """Steps between lr increases; default 2000."""
    lr_range_test_step_rate: float | Auto | None = f.float_(ge=0)
    """Rate of the lr increase; default 1.0."""
    lr_range_test_staircase: bool | Auto | None = f.bool_()
    """Increase in steps (staircase) rather than continuously; default false."""
    last_batch_iteration: int | Auto | None = f.int_()
    """Index of the last batch when resuming; default -1."""


SchedulerParams = WarmupLRParams | WarmupDecayLRParams | WarmupCosineLRParams | OneCycleParams | LRRangeTestParams

SCHEDULER_PARAMS: dict[str, type] = {
    "WarmupLR": WarmupLRParams,
    "WarmupDecayLR": WarmupDecayLRParams,
    "WarmupCosineLR": WarmupCosineLRParams,
    "OneCycle": OneCycleParams,
    "LRRangeTest": LRRangeTestParams,
}

SCHEDULERS = tuple(SCHEDULER_PARAMS)
"""The scheduler names DeepSpeed knows (case matters)."""


def scheduler_params_class(type_name: str) -> type | None:
    """The typed params class of a DeepSpeed scheduler name (case matters), or ``None`` for others."""
    return SCHEDULER_PARAMS.get(type_name)


@f.section_class
class Scheduler:
    """``scheduler``: DeepSpeed builds the learning-rate schedule when set."""

    type: str = attrs.field(validator=attrs.validators.instance_of(str))
    """``WarmupLR``, ``WarmupDecayLR``, ``WarmupCosineLR``, ``OneCycle``, ``LRRangeTest``, or a ``torch.optim.lr_scheduler`` class name."""
    params: SchedulerParams | Mapping[str, Any] | None = None
    """Keyword arguments of the scheduler: typed for DeepSpeed's own, a table for torch schedulers."""
