"""Memory planning: what each ZeRO stage and offload choice needs per GPU and per node, and which to use.

The figures are DeepSpeed's own model-state accounting
(``estimate_zero2_model_states_mem_needs`` and ``estimate_zero3_model_states_mem_needs``
with ``zero_init`` on), reproduced here without importing DeepSpeed and
extended to stages 0 and 1 and to NVMe offload. Mixed-precision training with
Adam keeps, per parameter:

- 2 bytes of 16-bit parameters,
- 2 bytes of 16-bit gradients,
- 16 bytes of optimizer-side state: fp32 gradients (4), fp32 master
  parameters (4), Adam momentum and variance (8).

ZeRO partitions the optimizer-side state across GPUs at stage 1, the
gradients too at stage 2 and the parameters too at stage 3; offload moves the
optimizer-side state (stages 1-3) or the 16-bit parameters (stage 3) to CPU
memory or, at stage 3, to NVMe. Activations, temporary buffers and the CUDA
context are not in these figures.

Nothing here imports torch or DeepSpeed: a parameter count, an HF config (an
object, a dict, or a local ``config.json``) or a model object in hand is
enough. Only an architecture the analytic counter does not know is built on
PyTorch's ``meta`` device (no memory allocated) to count it.
"""

from .core import DEFAULT_NVME_PATH, SPEED_ORDER, Plan, Row, plan
from .count import ModelSize, count_params
from .memory import estimate_activation_bytes, model_state_bytes
from .render import format_plan_table, plan_to_json
from .sizes import parse_count, parse_size

__all__ = [
    "DEFAULT_NVME_PATH",
    "SPEED_ORDER",
    "ModelSize",
    "Plan",
    "Row",
    "count_params",
    "estimate_activation_bytes",
    "format_plan_table",
    "model_state_bytes",
    "parse_count",
    "parse_size",
    "plan",
    "plan_to_json",
]
