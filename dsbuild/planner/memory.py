"""Model-state memory per GPU, per node's CPU and on NVMe for one ZeRO stage and offload choice, and activations.

DeepSpeed's own accounting (``estimate_zero2/3_model_states_mem_needs``), extended to stages 0 and 1 and NVMe.
"""

from __future__ import annotations

import math
from typing import Literal

__all__ = [
    "ADDITIONAL_BUFFER_FACTOR",
    "OPT",
    "P16",
    "PARAM_BUFFER_SIZE",
    "Device",
    "estimate_activation_bytes",
    "model_state_bytes",
    "param_buffer_size",
]

Device = Literal["none", "cpu", "nvme"]


ADDITIONAL_BUFFER_FACTOR = 1.5
"""DeepSpeed's default head room on CPU memory figures (``additional_buffer_factor``)."""


P16 = 2  # 16-bit parameters


_G16 = 2  # 16-bit gradients


OPT = 16  # fp32 gradients + fp32 master parameters + Adam momentum and variance


_SUB_GROUP_SIZE = 10**9  # zero_optimization.sub_group_size


_OPT_BUFFER_COUNT = 4  # offload_optimizer.buffer_count


_PARAM_BUFFER_COUNT = 5  # offload_param.buffer_count


PARAM_BUFFER_SIZE = 10**8  # offload_param.buffer_size (elements)


def model_state_bytes(
    stage: int,
    offload_optimizer: Device,
    offload_param: Device,
    params: int,
    largest_layer_params: int = 0,
    gpus_per_node: int = 1,
    nodes: int = 1,
    additional_buffer_factor: float = ADDITIONAL_BUFFER_FACTOR,
) -> tuple[int, int, int]:
    """(GPU bytes per device, CPU bytes per node, NVMe bytes per node) of the model states.

    Stages 2 and 3 without NVMe are DeepSpeed's estimators term for term,
    ``zero_init`` on, including their choices: a process loads the fp32 model
    on the CPU before ZeRO partitions it (``4 × params`` per GPU on the node,
    or per GPU in the job with stage 1-2 CPU offload, as DeepSpeed writes it),
    and offloaded optimizer states are counted per node as ``16 × params``
    at stages 1-2 and ``16 × params / nodes`` at stage 3.
    """
    p, n_gpus, g, f = params, gpus_per_node * nodes, gpus_per_node, additional_buffer_factor
    loaded_fp32 = 4 * p * g * f  # each process on the node holds the full fp32 model before partitioning
    if stage < 3:
        if offload_param != "none" or offload_optimizer == "nvme" or (stage == 0 and offload_optimizer != "none"):
            raise ValueError(f"no such row: stage {stage}, optimizer {offload_optimizer}, params {offload_param}")
        if offload_optimizer == "cpu":
            gpu = (P16 + (_G16 if stage == 1 else 0)) * p
            cpu = p * max(4 * n_gpus, OPT) * f
        else:
            replicated = {0: P16 + _G16 + OPT, 1: P16 + _G16, 2: P16}[stage]
            gpu = replicated * p + int((P16 + _G16 + OPT - replicated) * p / n_gpus)
            cpu = loaded_fp32
        return int(gpu), int(cpu), 0

    on_gpu = (P16 if offload_param == "none" else 0) + (OPT if offload_optimizer == "none" else 0)
    on_cpu = (P16 if offload_param == "cpu" else 0) + (OPT if offload_optimizer == "cpu" else 0)
    on_nvme = (P16 if offload_param == "nvme" else 0) + (OPT if offload_optimizer == "nvme" else 0)
    gpu = 4 * largest_layer_params + int(on_gpu * p / n_gpus)
    # With nothing kept on the CPU, zero.Init still materializes one layer per process there.
    cpu = on_cpu * p / nodes * f if on_cpu else 4 * largest_layer_params * g * f
    if offload_optimizer == "nvme":  # pinned fp32 swap buffers, one sub group each, per process
        cpu += g * _OPT_BUFFER_COUNT * min(_SUB_GROUP_SIZE, math.ceil(p / n_gpus)) * 4
    if offload_param == "nvme":  # pinned 16-bit parameter swap buffers, per process
        cpu += g * _PARAM_BUFFER_COUNT * param_buffer_size(largest_layer_params, n_gpus) * 2
    return int(gpu), int(cpu), int(on_nvme * p / nodes)


def param_buffer_size(largest_layer_params: int, world_size: int) -> int:
    """``offload_param.buffer_size``: DeepSpeed's 1e8 elements, or a layer's partition when that is larger."""
    needed = math.ceil(largest_layer_params / world_size)
    return PARAM_BUFFER_SIZE if needed <= PARAM_BUFFER_SIZE else -(-needed // 10**7) * 10**7


def estimate_activation_bytes(
    micro_batch: int,
    seq_len: int,
    hidden_size: int,
    num_layers: int,
    *,
    num_heads: int | None = None,
    checkpointing: bool = False,
    vocab_size: int | None = None,
) -> int:
    """APPROXIMATE activation memory per GPU of one micro-batch, in bytes (16-bit training, no tensor parallel).

    Korthikanti et al., "Reducing Activation Recomputation in Large Transformer
    Models" (2022): a transformer layer keeps ``s·b·h·(34 + 5·a·s/h)`` bytes;
    with ``num_heads=None`` the attention scores are taken as never stored
    (FlashAttention / SDPA), leaving ``34·s·b·h``. With activation
    checkpointing each layer keeps only its 16-bit input (``2·s·b·h``) plus one
    layer recomputed at a time. ``vocab_size`` adds the fp32 logits
    (``4·s·b·V``). Real use varies with the architecture (gated MLPs, GQA),
    the attention kernel and the framework's temporaries: treat it as a
    starting point, not a bound.
    """
    sbh = seq_len * micro_batch * hidden_size
    per_layer = 34 * sbh + (5 * num_heads * seq_len * seq_len * micro_batch if num_heads else 0)
    total = 2 * sbh * num_layers + per_layer if checkpointing else per_layer * num_layers
    if vocab_size:
        total += 4 * seq_len * micro_batch * vocab_size
    return int(total)
