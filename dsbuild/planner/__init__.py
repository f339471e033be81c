"""Memory planning: what each ZeRO stage and offload choice needs per GPU and per node, and which to use.

Each GPU needs three things, and a plan counts all three:

- the model states: DeepSpeed's own accounting (``estimate_zero2_model_states_mem_needs`` and
  ``estimate_zero3_model_states_mem_needs`` with ``zero_init`` on), reproduced here without importing DeepSpeed
  and extended to stages 0 and 1, to NVMe offload, and to the run's precision, model dtype and optimizer
  (``Precision``: fp32 training keeps 4-byte weights and gradients and no master copy at stage 0, nor at stage 3
  without offload; Lion and SGD keep fewer states than Adam). Mixed-precision training with Adam keeps, per parameter,
  2 bytes of 16-bit parameters, 2 bytes of 16-bit gradients and 16 bytes of optimizer-side state (fp32
  gradients 4, fp32 master parameters 4, Adam momentum and variance 8). ZeRO partitions the optimizer-side state
  across GPUs at stage 1, the gradients too at stage 2 and the parameters too at stage 3; offload moves the
  optimizer-side state (stages 1-3) or the 16-bit parameters (stage 3) to CPU memory or, at stage 3, to NVMe;
- the activations of one micro-batch, from the model's shape (Korthikanti et al. 2022, "Reducing Activation
  Recomputation in Large Transformer Models"), with or without gradient checkpointing;
- a headroom for the CUDA context, workspaces, communication buckets and fragmentation (2 GiB + 10% of the GPU
  by default).

Nothing here imports torch or DeepSpeed: a parameter count, an HF config (an
object, a dict, or a local ``config.json``) or a model object in hand is
enough. Only an architecture the analytic counter does not know is built on
PyTorch's ``meta`` device (no memory allocated) to count it.
"""

from .checkpoint_copy import Staging, staging, with_staging
from .core import DEFAULT_MICRO_BATCH, DEFAULT_NVME_PATH, DEFAULT_SEQ_LEN, SPEED_ORDER, Plan, Row, plan
from .count import ModelSize, Shape, count_params
from .memory import (
    DEFAULT_HEADROOM,
    Activations,
    Headroom,
    activations,
    estimate_activation_bytes,
    layer_activation_bytes,
    model_state_bytes,
)
from .precision import MIXED_ADAM, OPTIMIZER_STATES, Precision, StateBytes
from .render import format_plan_table, plan_to_json
from .sizes import parse_count, parse_headroom, parse_size

__all__ = [
    "DEFAULT_HEADROOM",
    "DEFAULT_MICRO_BATCH",
    "DEFAULT_NVME_PATH",
    "DEFAULT_SEQ_LEN",
    "MIXED_ADAM",
    "OPTIMIZER_STATES",
    "SPEED_ORDER",
    "Activations",
    "Headroom",
    "ModelSize",
    "Plan",
    "Precision",
    "Row",
    "Shape",
    "Staging",
    "StateBytes",
    "activations",
    "count_params",
    "estimate_activation_bytes",
    "format_plan_table",
    "layer_activation_bytes",
    "model_state_bytes",
    "parse_count",
    "parse_headroom",
    "parse_size",
    "plan",
    "plan_to_json",
    "staging",
    "with_staging",
]
