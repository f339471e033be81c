"""What training keeps per parameter: the weights' and gradients' dtype, the fp32 master weights, the optimizer's states.

DeepSpeed's estimators (``estimate_zero2/3_model_states_mem_needs``) count mixed-precision Adam: 2 bytes of 16-bit
weights, 2 of 16-bit gradients and 16 on the optimizer's side (fp32 gradients 4, fp32 master weights 4, momentum and
variance 8). Other runs keep what DeepSpeed's engine and ZeRO optimizers allocate for them (0.19):

- ``bf16``/``fp16``: DeepSpeed casts the weights to 16 bits whatever dtype the model was loaded in;
- ``fp32`` (neither section enabled): DeepSpeed leaves the weights in the dtype the model was loaded in (``[model]
  dtype``, fp32 when not given). Stage 0 hands the optimizer the model's own weights and gradients (no master copy,
  its states in the weights' dtype); stages 1 and 2 clone the rank's partition into fp32 (ZeRO's master copy, a copy
  even of fp32 weights); stage 3 updates fp32 partitions in place, with no copy, unless it offloads them;
- the optimizer's states: 2 per parameter for Adam, AdamW and LAMB (momentum, variance), 1 for Lion (momentum),
  Adagrad (the sum of squares) and SGD with momentum, 0 for SGD without; any other optimizer is counted as Adam.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Final, Literal

import attrs

if TYPE_CHECKING:
    from ..api import Config

__all__ = ["DTYPE_BYTES", "MIXED_ADAM", "OPTIMIZER_STATES", "Precision", "StateBytes", "TrainingPrecision"]

TrainingPrecision = Literal["bf16", "fp16", "fp32"]


DTYPE_BYTES: Final[Mapping[str, int]] = {
    "bf16": 2, "bfloat16": 2, "fp16": 2, "float16": 2, "half": 2, "fp32": 4, "float32": 4, "float": 4,
}  # fmt: skip
"""Bytes of one weight in each ``[model] dtype`` (the job's names; ``"auto"`` and none given: fp32)."""


OPTIMIZER_STATES: Final[Mapping[str, int]] = {"adam": 2, "adamw": 2, "lamb": 2, "lion": 1, "adagrad": 1, "sgd": 1}
"""fp32 states per parameter of each optimizer (its name in any case); one not listed is counted as Adam's 2."""


@attrs.frozen
class StateBytes:
    """Bytes per parameter of one row's model states, by what ZeRO partitions or offloads together."""

    weights: int
    """The weights the model computes with."""
    gradients: int
    """The model's gradients (the weights' dtype)."""
    optimizer: int
    """The optimizer's side: fp32 gradients, fp32 master weights and the optimizer's states, where kept."""

    @property
    def total(self) -> int:
        """All three."""
        return self.weights + self.gradients + self.optimizer


@attrs.frozen
class Precision:
    """The training precision, the model's dtype and the optimizer a plan counts the model states of."""

    training: TrainingPrecision = attrs.field(default="bf16", validator=attrs.validators.in_(("bf16", "fp16", "fp32")))
    """``"bf16"`` or ``"fp16"`` (mixed precision: the ds_config's section enabled) or ``"fp32"``."""
    dtype: str | None = attrs.field(
        default=None, validator=attrs.validators.optional(attrs.validators.in_((*DTYPE_BYTES, "auto")))
    )
    """The dtype the model is loaded in (``[model] dtype``); counts only in fp32 training. ``None``: not given."""
    optimizer: str = "AdamW"
    """The optimizer's name (``optimizer.type``)."""
    states: int | None = None
    """fp32 states per parameter the optimizer keeps; ``None``: its row of ``OPTIMIZER_STATES``."""

    @classmethod
    def of(cls, config: Config, dtype: str | None = None) -> Precision:
        """The precision and optimizer of a resolved config (``bf16.enabled``, ``fp16.enabled``, ``optimizer``)."""
        training: TrainingPrecision = "fp32"
        if config.bf16_config is not None and config.bf16_config.enabled is True:
            training = "bf16"
        elif config.fp16_config is not None and config.fp16_config.enabled is True:
            training = "fp16"
        section = config.optimizer_config
        name = section.type if section is not None else "AdamW"
        params: Any = section.params if section is not None else None
        no_momentum = name.lower() == "sgd" and isinstance(params, Mapping) and not params.get("momentum", 0)
        return cls(training, dtype, name, 0 if no_momentum else None)

    @property
    def optimizer_states(self) -> int:
        """fp32 states per parameter: ``states``, else the optimizer's (Adam's 2 for one not listed)."""
        return self.states if self.states is not None else OPTIMIZER_STATES.get(self.optimizer.lower(), 2)

    @property
    def weight_bytes(self) -> int:
        """Bytes per weight: 2 in mixed precision (DeepSpeed casts the model), else the model's dtype's (fp32 by
        default)."""
        if self.training != "fp32":
            return 2
        return DTYPE_BYTES.get(self.dtype or "fp32", 4)

    def per_param(self, stage: int, offload_optimizer: str = "none", offload_param: str = "none") -> StateBytes:
        """Bytes per parameter of a row's weights, gradients and optimizer side (the module docstring says why)."""
        w, states = self.weight_bytes, self.optimizer_states
        if self.training == "fp32" and stage == 0:  # the optimizer updates the model's own weights
            return StateBytes(w, w, states * w)
        in_place = self.training == "fp32" and w == 4 and stage == 3 and offload_optimizer == offload_param == "none"
        return StateBytes(w, w, 4 + (0 if in_place else 4) + 4 * states)

    @property
    def states_text(self) -> str:
        """``"AdamW's 2 states"``."""
        n = self.optimizer_states
        return f"{self.optimizer}'s {n} state" + ("s" if n != 1 else "")

    @property
    def label(self) -> str:
        """``"bf16 mixed precision, AdamW"``, ``"fp32 (model dtype bf16), SGD"``."""
        if self.training != "fp32":
            return f"{self.training} mixed precision, {self.optimizer}"
        return f"fp32 (model dtype {self.dtype if self.dtype not in (None, 'auto') else 'fp32'}), {self.optimizer}"

    def describe(self) -> str:
        """What the model states count per parameter, for the plan's notes."""
        w = self.weight_bytes
        kind = f"{w * 8}-bit" if self.training == "fp32" else self.training
        moments = self.states_text
        text = f"model states of {self.label}: {w} bytes/param {kind} weights, {w} bytes {kind} gradients, "
        mixed = self.per_param(1).optimizer
        if self.training != "fp32":
            return text + f"{mixed} bytes fp32 gradients + master weights + {moments}; stage 3 with zero.Init"
        at = [f"{mixed} bytes fp32 gradients + master weights + {moments} at stages 1-2 and with offload"]
        if w == 4:
            at.append(f"{self.per_param(3).optimizer} at stage 3 (it updates the fp32 partition in place)")
        at.append(f"{self.per_param(0).optimizer} at stage 0 (the optimizer's states alone, in the weights' dtype)")
        return text + "; ".join(at) + "; stage 3 with zero.Init"


MIXED_ADAM: Final = Precision()
"""What DeepSpeed's estimators count and ``plan`` assumes unless told: bf16 mixed precision with AdamW."""
