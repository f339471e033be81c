"""The rules of what DeepSpeed never says: settings with no effect at the chosen stage, saves that come out empty."""

from __future__ import annotations

from collections.abc import Iterator

from ..config import AUTO
from .catalogue import STAGE3_ONLY
from .facts import Diagnostic, Facts, rule


@rule("offload-param-below-stage-3")
def offload_param(f: Facts) -> Iterator[Diagnostic]:
    """``offload_param`` below stage 3: DeepSpeed ignores it silently, parameters stay on the device."""
    if f.stage is not None and f.stage < 3 and f.op_device in ("cpu", "nvme"):
        yield f.warning(
            "zero_optimization.offload_param",
            f"ignored at stage {f.stage}: DeepSpeed offloads parameters only at stage 3",
            "remove offload_param, or use .zero(3)",
        )


@rule("nvme-optimizer-below-stage-3")
def nvme_below_3(f: Facts) -> Iterator[Diagnostic]:
    """NVMe optimizer offload below stage 3: stages 1-2 keep the states in CPU memory, nvme_path is unused."""
    if f.stage in (1, 2) and f.oo_device == "nvme":
        yield f.warning(
            "zero_optimization.offload_optimizer.device",
            f'"nvme" at stage {f.stage} offloads to CPU memory: only stage 3 (ZeRO-Infinity) writes to NVMe',
            'use device "cpu", or .zero(3) for NVMe',
        )


@rule("stage-3-only-key")
def stage3_keys(f: Facts) -> Iterator[Diagnostic]:
    """Keys only the stage-3 optimizer reads (``stage3_*``, ``sub_group_size``, ZeRO++ ...), set below stage 3."""
    if f.stage is None or f.stage == 3:
        return
    for key in STAGE3_ONLY:
        if getattr(f.zero, key) is not None:
            yield f.warning(
                f"zero_optimization.{key}",
                f"ignored at stage {f.stage}: only stage 3 reads it",
                "remove it, or use .zero(3)",
            )
    oo = f.zero.offload_optimizer
    for key in ("super_offload", "cpuadam_cores_perc"):
        if oo is not None and getattr(oo, key) is not None:
            yield f.warning(
                f"zero_optimization.offload_optimizer.{key}",
                f"ignored at stage {f.stage}: only stage 3 reads it",
                "remove it, or use .zero(3)",
            )


@rule("zero3-16bit-save")
def gather_on_save(f: Facts) -> Iterator[Diagnostic]:
    """ZeRO-3 without ``stage3_gather_16bit_weights_on_model_save``: saved models and LoRA adapters come out empty."""
    if f.stage != 3:
        return
    value = f.zero.stage3_gather_16bit_weights_on_model_save
    if value is True or (value is AUTO and f.target != "hf"):
        return  # an "auto" outside the HF Trainer is reported by the auto rule
    what = 'Accelerate fills "auto" with false' if value is AUTO else "not enabled"
    yield f.warning(
        "zero_optimization.stage3_gather_16bit_weights_on_model_save",
        f"{what}: with ZeRO-3 the weights are partitioned, so save_16bit_model / save_model (and LoRA adapters) come out empty",
        "set it true, or consolidate checkpoints with zero_to_fp32.py",
    )
