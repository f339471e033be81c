"""The one memory model: model states per GPU, per node's CPU and on NVMe; activations; the GPU's headroom.

Model states are DeepSpeed's own accounting (``estimate_zero2/3_model_states_mem_needs``), extended to stages 0
and 1 and NVMe; activations follow Korthikanti et al. 2022, "Reducing Activation Recomputation in Large
Transformer Models"; the headroom is what a GPU loses to the CUDA context and fragmentation.
"""

from __future__ import annotations

import math
from typing import Literal

import attrs

from .precision import MIXED_ADAM, Precision
from .sizes import GiB, gib

__all__ = [
    "ADDITIONAL_BUFFER_FACTOR",
    "DEFAULT_HEADROOM",
    "PARAM_BUFFER_SIZE",
    "Activations",
    "Device",
    "Headroom",
    "activations",
    "estimate_activation_bytes",
    "layer_activation_bytes",
    "model_state_bytes",
    "param_buffer_size",
]

Device = Literal["none", "cpu", "nvme"]


ADDITIONAL_BUFFER_FACTOR = 1.5
"""DeepSpeed's default head room on CPU memory figures (``additional_buffer_factor``)."""


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
    precision: Precision = MIXED_ADAM,
) -> tuple[int, int, int]:
    """(GPU bytes per device, CPU bytes per node, NVMe bytes per node) of the model states.

    Stages 2 and 3 without NVMe are DeepSpeed's estimators term for term
    (``precision``'s default, bf16 with AdamW, is what they count),
    ``zero_init`` on, including their choices: a process loads the fp32 model
    on the CPU before ZeRO partitions it (``4 × params`` per GPU on the node,
    or per GPU in the job with stage 1-2 CPU offload, as DeepSpeed writes it),
    and offloaded optimizer states are counted per node as ``16 × params``
    at stages 1-2 and ``16 × params / nodes`` at stage 3. Another precision or
    optimizer changes the bytes per parameter (``Precision.per_param``), not the terms.
    """
    p, n_gpus, g, f = params, gpus_per_node * nodes, gpus_per_node, additional_buffer_factor
    loaded_fp32 = 4 * p * g * f  # each process on the node holds the full fp32 model before partitioning
    if stage < 3:
        if offload_param != "none" or offload_optimizer == "nvme" or (stage == 0 and offload_optimizer != "none"):
            raise ValueError(f"no such row: stage {stage}, optimizer {offload_optimizer}, params {offload_param}")
        s = precision.per_param(stage, offload_optimizer, offload_param)
        if offload_optimizer == "cpu":
            gpu = (s.weights + (s.gradients if stage == 1 else 0)) * p
            cpu = p * max(4 * n_gpus, s.optimizer) * f
        else:
            replicated = {0: s.total, 1: s.weights + s.gradients, 2: s.weights}[stage]
            gpu = replicated * p + int((s.total - replicated) * p / n_gpus)
            cpu = loaded_fp32
        return int(gpu), int(cpu), 0

    s = precision.per_param(stage, offload_optimizer, offload_param)
    w, opt = s.weights, s.optimizer
    on_gpu = (w if offload_param == "none" else 0) + (opt if offload_optimizer == "none" else 0)
    on_cpu = (w if offload_param == "cpu" else 0) + (opt if offload_optimizer == "cpu" else 0)
    on_nvme = (w if offload_param == "nvme" else 0) + (opt if offload_optimizer == "nvme" else 0)
    gathered = (s.weights + s.gradients) * largest_layer_params  # the largest layer, whole, with its gradients
    gpu = gathered + int(on_gpu * p / n_gpus)
    # With nothing kept on the CPU, zero.Init still materializes one layer per process there.
    cpu = on_cpu * p / nodes * f if on_cpu else 4 * largest_layer_params * g * f
    if offload_optimizer == "nvme":  # pinned fp32 swap buffers, one sub group each, per process
        cpu += g * _OPT_BUFFER_COUNT * min(_SUB_GROUP_SIZE, math.ceil(p / n_gpus)) * 4
    if offload_param == "nvme":  # pinned parameter swap buffers (the weights' dtype), per process
        cpu += g * _PARAM_BUFFER_COUNT * param_buffer_size(largest_layer_params, n_gpus) * w
    return int(gpu), int(cpu), int(on_nvme * p / nodes)


def param_buffer_size(largest_layer_params: int, world_size: int) -> int:
    """``offload_param.buffer_size``: DeepSpeed's 1e8 elements, or a layer's partition when that is larger."""
    needed = math.ceil(largest_layer_params / world_size)
    return PARAM_BUFFER_SIZE if needed <= PARAM_BUFFER_SIZE else -(-needed // 10**7) * 10**7


def layer_activation_bytes(micro_batch: int, seq_len: int, hidden_size: int, num_heads: int | None) -> int:
    """Activations one transformer layer keeps for its backward pass, in bytes (16-bit, no tensor parallelism).

    Korthikanti et al. 2022, section 4.1: ``s·b·h·(34 + 5·a·s/h)`` = ``34·s·b·h``
    (attention 11, MLP 19, the two layer norms 4) ``+ 5·a·s²·b`` (the attention
    scores: softmax output 2, its dropout mask 1, the dropout output 2). With
    ``num_heads=None`` the scores are taken as never stored: an attention kernel
    such as FlashAttention (or PyTorch SDPA's flash and memory-efficient
    backends) recomputes them, leaving ``34·s·b·h``.
    """
    scores = 5 * num_heads * seq_len * seq_len * micro_batch if num_heads else 0
    return 34 * seq_len * micro_batch * hidden_size + scores


@attrs.frozen
class Activations:
    """Activation memory of one micro-batch on each GPU, by part, in bytes."""

    layer_inputs: int
    """With gradient checkpointing, the 16-bit input every layer keeps (``2·s·b·h`` each); 0 without."""
    layers: int
    """Full activations held at once: every layer's without checkpointing, one layer's (recomputed) with it."""
    logits: int
    """The fp32 logits the loss reads (``4·s·b·V``)."""

    @property
    def total(self) -> int:
        """All three together."""
        return self.layer_inputs + self.layers + self.logits


def activations(
    micro_batch: int,
    seq_len: int,
    hidden_size: int,
    num_layers: int,
    *,
    num_heads: int | None = None,
    checkpointing: bool = False,
    vocab_size: int | None = None,
    sequence_parallel: int = 1,
) -> Activations:
    """Activation memory per GPU of one micro-batch (16-bit training, no tensor parallelism).

    Each layer keeps ``layer_activation_bytes`` without checkpointing. With
    full activation recomputation (what HF ``gradient_checkpointing`` and
    ``torch.utils.checkpoint`` around each layer do, not the paper's selective
    recomputation) a layer keeps only its 16-bit input, ``2·s·b·h``, and
    during the backward pass one layer's full activations are rebuilt at a
    time. ``vocab_size`` adds the logits the loss reads in fp32,
    ``4·s·b·V`` (the paper's cross-entropy term): for a large vocabulary this
    is the largest single tensor. ZeRO does not partition activations, so
    the figure is the same for every stage. Real use varies with the
    architecture (gated MLPs, grouped-query attention) and the framework's
    temporaries: it is an estimate, not a bound.

    ``sequence_parallel`` (Ulysses, ``sequence_parallel_size``) divides every part: each GPU holds its shard of
    the sequence, and during attention the whole sequence for its share of the heads.
    """
    layer = layer_activation_bytes(micro_batch, seq_len, hidden_size, num_heads)
    inputs = 2 * seq_len * micro_batch * hidden_size * num_layers if checkpointing else 0
    held = layer if checkpointing else layer * num_layers
    logits = 4 * seq_len * micro_batch * vocab_size if vocab_size else 0
    sp = max(sequence_parallel, 1)
    return Activations(inputs // sp, held // sp, logits // sp)


def estimate_activation_bytes(
    micro_batch: int,
    seq_len: int,
    hidden_size: int,
    num_layers: int,
    *,
    num_heads: int | None = None,
    checkpointing: bool = False,
    vocab_size: int | None = None,
    sequence_parallel: int = 1,
) -> int:
    """``activations(...).total``: the activation bytes per GPU of one micro-batch, as one number."""
    return activations(
        micro_batch,
        seq_len,
        hidden_size,
        num_layers,
        num_heads=num_heads,
        checkpointing=checkpointing,
        vocab_size=vocab_size,
        sequence_parallel=sequence_parallel,
    ).total


@attrs.frozen
class Headroom:
    """GPU memory kept free of the plan: the CUDA context, library workspaces, communication buckets, fragmentation."""

    fixed: int
    """Bytes per GPU, whatever its size (the CUDA context, cuBLAS and NCCL workspaces)."""
    percent: float
    """Percent of the GPU's memory (the caching allocator's fragmentation, DeepSpeed's temporary buffers)."""

    def of(self, gpu_memory: int | None) -> int:
        """Bytes kept free on a GPU of ``gpu_memory`` bytes; only ``fixed`` when the GPU's size is not known."""
        return self.fixed + (int(gpu_memory * self.percent / 100) if gpu_memory else 0)

    def describe(self) -> str:
        """``"2.00 GiB + 10% of the GPU"``."""
        parts = [gib(self.fixed)] if self.fixed else []
        if self.percent:
            parts.append(f"{self.percent:g}% of the GPU")
        return " + ".join(parts) or "none"


DEFAULT_HEADROOM = Headroom(2 * GiB, 10.0)
"""2 GiB for the CUDA context and workspaces, plus 10% of the GPU for fragmentation and temporary buffers."""
