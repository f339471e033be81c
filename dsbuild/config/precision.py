"""Precision sections: ``fp16``, ``bf16``, ``torch_autocast``, ``data_types``."""

from __future__ import annotations

from . import fields as f
from .fields import Auto

__all__ = ["BF16", "FP16", "DataTypes", "TorchAutocast"]

_DTYPES = (
    "fp16",
    "float16",
    "half",
    "bf16",
    "bfloat16",
    "fp32",
    "float32",
    "float",
    "torch.float16",
    "torch.bfloat16",
    "torch.float32",
)


@f.section_class
class FP16:
    """``fp16``: mixed precision with float16 and loss scaling."""

    enabled: bool | Auto | None = f.bool_()
    """Train in fp16 mixed precision (HF ``"auto"``: the training's ``fp16``); default false."""
    auto_cast: bool | Auto | None = f.bool_()
    """Cast the model's floating-point inputs to fp16; default false."""
    loss_scale: float | Auto | None = f.float_(ge=0)
    """Static loss scale; 0 selects dynamic loss scaling; default 0."""
    initial_scale_power: int | Auto | None = f.int_(le=1023)
    """Dynamic loss scaling starts at 2**initial_scale_power (above 1023 the scale is no float: the first step fails); default 16."""
    loss_scale_window: int | Auto | None = f.int_()
    """Steps between raising/lowering the dynamic loss scale (> 0 when dynamic); default 1000."""
    hysteresis: int | Auto | None = f.int_()
    """Overflows tolerated before the dynamic loss scale is lowered; default 2."""
    consecutive_hysteresis: bool | Auto | None = f.bool_()
    """Refill hysteresis after each step without overflow; default false."""
    min_loss_scale: int | Auto | None = f.int_()
    """Floor of the dynamic loss scale (> 0 when dynamic); default 1."""
    fp16_master_weights_and_grads: bool | Auto | None = f.bool_()
    """Keep master weights and gradients in fp16 (ZeRO 1-3 with CPU Adam only); default false."""


@f.section_class
class BF16:
    """``bf16`` (legacy name ``bfloat16``): mixed precision with bfloat16."""

    enabled: bool | Auto | None = f.bool_()
    """Train in bf16 mixed precision (HF ``"auto"``: the training's ``bf16``); default false."""
    immediate_grad_update: bool | Auto | None = f.bool_()
    """Apply gradient updates immediately rather than delayed; default false."""
    check_grad_overflow: bool | Auto | None = f.bool_()
    """Detect gradient overflow before the step and skip the step; default true."""
    bf16_master_weights_and_grads: bool | Auto | None = f.bool_()
    """Keep master weights and gradients in bf16 for the ZeRO optimizer (stages 1-3); default false."""
    bf16_optimizer_states: bool | Auto | None = f.bool_()
    """Keep optimizer states in bf16 (needs ``bf16_master_weights_and_grads``; stages 1-3); default false."""


@f.section_class
class TorchAutocast:
    """``torch_autocast``: run the forward pass under ``torch.autocast``."""

    enabled: bool | Auto | None = f.bool_()
    """Enable torch autocast for the forward pass; default false."""
    dtype: str | Auto | None = f.choice(*_DTYPES, null=False)
    """Lower-precision dtype for autocast, e.g. ``"bfloat16"``; default the accelerator's autocast dtype."""
    lower_precision_safe_modules: tuple[str, ...] | None = f.strs(null=False)
    """Module classes (``"torch.nn.Linear"``) whose parameters may be held in the lower precision; default all linear."""


@f.section_class
class DataTypes:
    """``data_types``: dtypes DeepSpeed uses for gradients, parameters and buffers."""

    grad_accum_dtype: str | Auto | None = f.choice("fp32", "fp16", "bf16")
    """dtype of the gradient accumulation buffer; default the training precision."""
    param_dtype: str | Auto | None = f.choice("fp32", "fp16", "bf16")
    """dtype the parameters are cast to; default the training precision."""
    buffer_dtype: str | Auto | None = f.choice("fp32", "fp16", "bf16")
    """dtype module buffers are cast to; default: kept as loaded."""
    keep_in_fp32_modules: tuple[str, ...] | Auto | None = f.strs(auto=True, null=False)
    """Name patterns of modules whose buffers stay fp32 under bf16/fp16; DeepSpeed's own ``"auto"`` picks them; default ``"auto"``."""
