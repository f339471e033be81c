"""``zero_optimization``: ZeRO stages, offload and the stage-3 knobs."""

from __future__ import annotations

from typing import Literal

from . import fields as f
from .fields import Auto

__all__ = ["LeafModule", "OffloadOptimizer", "OffloadParam", "ZenFlow", "ZeroOptimization"]

OffloadDevice = Literal["none", "cpu", "nvme"]


@f.section_class
class OffloadOptimizer:
    """``zero_optimization.offload_optimizer``: optimizer states (and the optimizer step) on CPU or NVMe."""

    device: OffloadDevice | Auto | None = f.choice("none", "cpu", "nvme")
    """Where optimizer states live: ``"cpu"`` or ``"nvme"`` (the step then runs on CPU); default ``"none"``."""
    nvme_path: str | Auto | None = f.str_(null=True)
    """Directory on the NVMe device for optimizer states; required when ``device = "nvme"``; default none."""
    buffer_count: int | Auto | None = f.int_(ge=0)
    """Buffers in the NVMe swap pool; at least the optimizer's states per parameter (Adam: 4); default 4."""
    pin_memory: bool | Auto | None = f.bool_()
    """Offload to page-locked CPU memory for fast, overlapped transfers; default true."""
    pipeline_read: bool | Auto | None = f.bool_()
    """Overlap reading the next NVMe tile with the current step (ZeRO-Infinity); default false."""
    pipeline_write: bool | Auto | None = f.bool_()
    """Overlap writing the previous NVMe tile with the current step; default false."""
    fast_init: bool | Auto | None = f.bool_()
    """Fast optimizer initialization when offloading to NVMe; default false."""
    ratio: float | Auto | None = f.float_(ge=0, le=1)
    """Fraction of optimizer states offloaded to CPU Adam; below 1 only at stage 3; default 1.0."""
    super_offload: bool | Auto | None = f.bool_()
    """High-performance CPU offload for Superchips (stage 3 only); default false."""
    cpuadam_cores_perc: float | Auto | None = f.float_(ge=0, le=1)
    """Fraction of CPU cores CPU Adam may use (stage 3 with ``super_offload``); default 0.8."""


@f.section_class
class OffloadParam:
    """``zero_optimization.offload_param``: parameters on CPU or NVMe (stage 3 only)."""

    device: OffloadDevice | Auto | None = f.choice("none", "cpu", "nvme")
    """Where parameters live between uses: ``"cpu"`` or ``"nvme"``; ignored below stage 3; default ``"none"``."""
    nvme_path: str | Auto | None = f.str_(null=True)
    """Directory on the NVMe device for parameters; required when ``device = "nvme"``; default none."""
    buffer_count: int | Auto | None = f.int_(ge=0)
    """Buffers in the NVMe parameter swap pool; default 5."""
    buffer_size: int | Auto | None = f.int_(ge=0)
    """Size in elements of each NVMe parameter buffer; default 1e8."""
    max_in_cpu: int | Auto | None = f.int_(ge=0)
    """Parameter elements kept in CPU memory when offloading to NVMe; default 1e9."""
    pin_memory: bool | Auto | None = f.bool_()
    """Offload to page-locked CPU memory; default true."""


@f.section_class
class ZenFlow:
    """``zero_optimization.zenflow``: ZenFlow, stall-free offloaded training (important gradients on the GPU,
    the rest applied by the CPU optimizer in the background)."""

    topk_ratio: float | Auto | None = f.float_(gt=0, lt=1)
    """Share of gradient columns updated on the GPU each step (between 0 and 1); default 0.1."""
    select_strategy: str | Auto | None = f.choice("step", "epoch")
    """When the important columns are chosen again: ``"step"``, ``"epoch"``; default ``"auto"``."""
    select_interval: int | Auto | None = f.int_(gt=0)
    """Steps or epochs between selections; default ``"auto"``."""
    update_interval: int | Auto | None = f.int_(ge=1)
    """Steps between applications of the accumulated unimportant gradients; default ``"auto"``."""
    overlap_step: bool | Auto | None = f.bool_()
    """Overlap the CPU optimizer step with forward/backward; default false."""
    offload: bool | Auto | None = f.bool_()
    """Offload the selective optimizer states to CPU; default false."""
    auto_ratio: float | Auto | None = f.float_(ge=0, le=1)
    """Threshold of the ``"auto"`` update interval; default 0.99."""
    full_warm_up_rounds: int | Auto | None = f.int_(ge=0)
    """Rounds at the start in which all gradients are applied; default 0."""
    pt_reserved_cores_perc: float | Auto | None = f.float_(ge=0, le=1)
    """Share of CPU cores kept for PyTorch threads (the rest run ZenFlow's workers); default 0.5."""
    steps_per_epoch: int | Auto | None = f.int_(gt=0, null=True)
    """Steps per epoch; set by DeepSpeed while training, not by users; default none."""


@f.section_class
class LeafModule:
    """``zero_optimization.leaf_module``: modules ZeRO-3 fetches as one unit (mixture-of-experts blocks)."""

    classes: tuple[str, ...] | None = f.strs()
    """Class names (short or dotted) of leaf modules; replaces DeepSpeed's default (Mixtral, Qwen2/3 MoE blocks)."""
    names: tuple[str, ...] | None = f.strs()
    """Module names (as ``named_modules`` gives them) of leaf modules; default none."""
    name_suffixes: tuple[str, ...] | None = f.strs()
    """Module name suffixes of leaf modules; default none."""


@f.section_class
class ZeroOptimization:
    """``zero_optimization``: the ZeRO redundancy optimizer."""

    stage: int | Auto | None = f.int_(ge=0, le=3)
    """0 off, 1 partitions optimizer states, 2 also gradients, 3 also parameters; default 0."""
    contiguous_gradients: bool | Auto | None = f.bool_()
    """Copy gradients into one contiguous buffer as produced (less fragmentation); default true."""
    reduce_scatter: bool | Auto | None = f.bool_()
    """Average gradients with reduce/reduce-scatter instead of all-reduce; default true."""
    reduce_bucket_size: int | Auto | None = f.int_(gt=0)
    """Elements reduced at a time (HF ``"auto"``: hidden_size²); default 5e8."""
    use_multi_rank_bucket_allreduce: bool | Auto | None = f.bool_()
    """Combine the reduce buckets of all ranks into one all-reduce; default true."""
    allgather_partitions: bool | Auto | None = f.bool_()
    """All-gather updated partitions (instead of a series of broadcasts) after each step; default true."""
    allgather_bucket_size: int | Auto | None = f.int_(ge=0)
    """Elements all-gathered at a time (stages 1-2); default 5e8."""
    overlap_comm: bool | Auto | None = f.bool_(null=True)
    """Overlap gradient reduction with the backward pass; default true at stage 3, false below."""
    compute_grad_norm: bool | Auto | None = f.bool_()
    """Compute the global gradient norm at stages 1-2 (false only without clipping); default true."""
    load_from_fp32_weights: bool | Auto | None = f.bool_()
    """Initialize fp32 master weights from the checkpoint's fp32 copies; default true."""
    elastic_checkpoint: bool | Auto | None = f.bool_()
    """Legacy elastic checkpoints (not supported at stage 3; use universal checkpoints); default false."""
    offload_optimizer: OffloadOptimizer | None = f.section(OffloadOptimizer, null=True)
    """Optimizer states to CPU or NVMe (stages 1-3); default none."""
    offload_param: OffloadParam | None = f.section(OffloadParam, null=True)
    """Parameters to CPU or NVMe (stage 3 only, silently ignored below); default none."""
    zenflow: ZenFlow | None = f.section(ZenFlow, null=True)
    """ZenFlow: stall-free offloaded training; default off."""
    sub_group_size: int | Auto | None = f.int_(ge=0)
    """Tile size (elements) of the optimizer step for ZeRO-3 offload / ZeRO-Infinity; default 1e9."""
    stage3_prefetch_bucket_size: int | Auto | None = f.int_(ge=0)
    """Parameter elements fetched ahead of use at stage 3 (HF ``"auto"``: 0.9 x hidden_size²); default 5e7."""
    stage3_param_persistence_threshold: int | Auto | None = f.int_(ge=0)
    """Parameters smaller than this stay unpartitioned at stage 3 (HF ``"auto"``: 10 x hidden_size); default 1e5."""
    stage3_model_persistence_threshold: int | Auto | None = f.int_(ge=0)
    """Upper bound on unpartitioned parameter elements at stage 3; default sys.maxsize."""
    stage3_max_live_parameters: int | Auto | None = f.int_(ge=0)
    """Parameters resident per GPU before release at stage 3; default 1e9."""
    stage3_max_reuse_distance: int | Auto | None = f.int_(ge=0)
    """Keep a parameter if it is reused within this many parameters (stage 3); default 1e9."""
    stage3_gather_16bit_weights_on_model_save: bool | Auto | None = f.bool_()
    """Gather the partitioned 16-bit weights when saving the model at stage 3 (else it saves empty); default false."""
    stage3_module_granularity_threshold: int | Auto | None = f.int_()
    """Modules finer than this are fetched as one unit at stage 3; default 0 (off)."""
    stage3_use_all_reduce_for_fetch_params: bool | Auto | None = f.bool_()
    """Fetch stage-3 parameters with all-reduce instead of all-gather; default false."""
    stage3_allgather_sequential: bool | Auto | None = f.bool_()
    """All-gather stage-3 parameters one by one, without bucketing; default false."""
    ignore_unused_parameters: bool | Auto | None = f.bool_()
    """Tolerate parameters that get no gradient (stage 2); default true."""
    legacy_stage1: bool | Auto | None = f.bool_()
    """Use the old stage-1 implementation; default false."""
    round_robin_gradients: bool | Auto | None = f.bool_()
    """Parallelize gradient copies to CPU across ranks (stages 1-2 with offload); default false."""
    parameter_alignment: bool | Auto | None = f.bool_()
    """Pad stage 1-2 flat buffers so each parameter is 16-byte aligned; default false."""
    zero_hpz_partition_size: int | Auto | None = f.int_(ge=0)
    """Ranks in the secondary parameter partition group (ZeRO++ hpZ); default 1."""
    zero_quantized_weights: bool | Auto | None = f.bool_()
    """Quantize weights for the all-gather (ZeRO++ qwZ); default false."""
    zero_quantized_nontrainable_weights: bool | Auto | None = f.bool_()
    """Store non-trainable weights quantized (useful for LoRA); default false."""
    zero_quantized_gradients: bool | Auto | None = f.bool_()
    """Quantize gradients for the reduction (ZeRO++ qgZ); default false."""
    memory_efficient_linear: bool | Auto | None = f.bool_()
    """Use the memory-efficient linear implementation at stage 3; default true."""
    pipeline_loading_checkpoint: bool | Auto | None = f.bool_()
    """Force pipelined checkpoint loading at stage 3; default false."""
    override_module_apply: bool | Auto | None = f.bool_()
    """Override ``nn.Module.apply`` at stage 3 so it sees gathered parameters; default true."""
    log_trace_cache_warnings: bool | Auto | None = f.bool_()
    """Log stage-3 trace-cache warnings (invalidations); default false."""
    enable_sanity_checks: bool | Auto | None = f.bool_()
    """Run DeepSpeed's internal sanity checks (debugging); default false."""
    save_muon_momentum_buffer_in_memory: bool | Auto | None = f.bool_()
    """Keep the Muon momentum buffer in memory instead of NVMe (stage 3); default false."""
    leaf_module: LeafModule | None = f.section(LeafModule, null=True)
    """Modules ZeRO-3 fetches as one unit; default DeepSpeed's list of MoE blocks."""
