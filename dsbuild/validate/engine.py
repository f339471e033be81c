"""The rules of what DeepSpeed refuses only when the engine starts: optimizer, ZeRO and scheduler construction."""

from __future__ import annotations

from collections.abc import Iterator

import attrs

from .._util.suggest import did_you_mean
from ..config import SCHEDULERS
from ..config.fields import key_of
from ..config.keys import UNKNOWN_KEY_HINTS
from ..config.optim import scheduler_params_class
from .catalogue import (
    CPU_OPTIMIZERS,
    DISPLAY_NAMES,
    FUSED,
    ONE_BIT_OPTIMIZERS,
    REQUIRED_PARAMS,
    SCHEDULERS_IN_CODE,
    TORCH_OPTIMIZERS,
    TORCH_SCHEDULERS,
    WARMUP_STEPS_POSITIVE_SINCE,
    ZERO_TESTED_OPTIMIZERS,
)
from .facts import Diagnostic, Facts, is_table, known, param, rule


@rule("optimizer-name")
def optimizer_name(f: Facts) -> Iterator[Diagnostic]:
    """An optimizer name DeepSpeed does not know: not its own (any case), not a ``torch.optim`` class (exact case);
    the 1-bit optimizers were removed."""
    name = f.opt_name
    if name is None or f.opt_ds is not None or f.opt_torch:
        return
    if name.lower() in ONE_BIT_OPTIMIZERS:
        message = "the 1-bit optimizers (OneBitAdam, OneBitLamb, ZeroOneAdam) were removed from DeepSpeed"
        hint = 'use "Adam"/"AdamW" (or "Lamb" for OneBitLamb); for less communication see ZeRO++ (zero_quantized_gradients)'
        yield f.error("optimizer.type", message, hint) if f.is_removed() else f.warning("optimizer.type", message, hint)
        return
    hint = did_you_mean(name, (*DISPLAY_NAMES, *TORCH_OPTIMIZERS)) or (
        "use Adam, AdamW, Adagrad, Lamb, Lion or Muon, or a torch.optim class name (case matters)"
    )
    yield f.error("optimizer.type", f"{f.version_text} does not know optimizer {name!r}", hint)


@rule("optimizer-params")
def optimizer_params(f: Facts) -> Iterator[Diagnostic]:
    """Optimizer params the class DeepSpeed picks does not take: ``max_grad_norm`` (always refused), AMSGrad in the
    fused GPU kernels, CPU-only params without offload, ``bias_correction`` with ``torch_adam``."""
    if f.optimizer is None:
        return
    params = f.optimizer.params
    if param(params, "max_grad_norm") is not None or "optimizer.params.max_grad_norm" in f.config.ignored:
        yield f.error(
            "optimizer.params.max_grad_norm",
            "DeepSpeed refuses max_grad_norm as an optimizer parameter",
            "remove it and set gradient_clipping at the top level (.clip_grad(norm))",
        )
    if f.cpu_optimizer is None:
        return
    torch_adam = param(params, "torch_adam") is True
    if f.opt_ds in ("adam", "adamw") and torch_adam and param(params, "bias_correction") is not None:
        yield f.error(
            "optimizer.params.bias_correction",
            "torch's Adam/AdamW (torch_adam: true) take no bias_correction",
            "remove it",
        )
    fused = FUSED.get(f.opt_ds or "")
    if fused and (f.opt_ds == "lamb" or not torch_adam) and param(params, "amsgrad") is True:
        built = "DeepSpeedCPUAdam" if f.cpu_optimizer and f.opt_ds != "lamb" else fused
        yield f.error(
            "optimizer.params.amsgrad",
            f"DeepSpeed's {built} does not support AMSGrad",
            "remove amsgrad" + (", or set torch_adam = true (torch's Adam supports it)" if f.opt_ds != "lamb" else ""),
        )
    if f.opt_ds == "adagrad" and not f.cpu_optimizer:
        for key in ("amsgrad", "fp32_optimizer_states"):
            if param(params, key) is not None:
                yield f.error(
                    f"optimizer.params.{key}",
                    "without optimizer offload DeepSpeed builds torch.optim.Adagrad, which takes no " + key,
                    "remove it (it applies to CPU Adagrad, with offload_optimizer)",
                )


@rule("lamb-static-loss-scale")
def lamb_loss_scale(f: Facts) -> Iterator[Diagnostic]:
    """LAMB needs dynamic loss scaling: a static ``fp16.loss_scale`` stops the engine."""
    if f.opt_ds == "lamb" and f.loss_scale is not None and f.loss_scale > 0:
        yield f.error(
            "fp16.loss_scale",
            f"DeepSpeed's Lamb needs dynamic loss scaling, got a static loss_scale {f.loss_scale:g}",
            "set loss_scale: 0 (dynamic) or remove it",
        )


@rule("untested-zero-optimizer")
def untested_optimizer(f: Facts) -> Iterator[Diagnostic]:
    """Under ZeRO, an optimizer DeepSpeed has not tested stops the engine unless ``zero_allow_untested_optimizer``."""
    if f.opt_name is None or f.stage is None or f.stage == 0 or f.opt_ds in ZERO_TESTED_OPTIMIZERS:
        return
    if f.opt_ds is None and not f.opt_torch:
        return  # an unknown name is reported by optimizer-name
    if f.flag(f.config.zero_allow_untested_optimizer, False) is not False:
        return
    yield f.error(
        "optimizer.type",
        f"{f.opt_name} is not among the optimizers DeepSpeed has tested with ZeRO (Adam, AdamW, Adagrad, Lion, Muon)",
        "set zero_allow_untested_optimizer: true to use it anyway",
    )


@rule("offload-optimizer")
def offload_optimizer(f: Facts) -> Iterator[Diagnostic]:
    """Optimizer offload: only at ZeRO 1-3; with no ``optimizer`` section the optimizer passed to
    ``deepspeed.initialize`` must be DeepSpeed's CPU Adam/Lion (``zero_force_ds_cpu_optimizer``; Accelerate swaps
    torch's in); Lamb has no CPU version; other torch optimizers step slowly on the CPU."""
    if not f.cpu_optimizer:
        return
    path = "zero_optimization.offload_optimizer.device"
    if f.stage == 0:
        yield f.error(
            path,
            f"optimizer offload ({f.oo_device!r}) needs ZeRO stage 1, 2 or 3, got stage 0 "
            "(DeepSpeed's CPU optimizer would get the device parameters and stop at the first step)",
            "use .zero(stage), or remove offload_optimizer",
        )
        return
    if f.optimizer is None:
        # Accelerate (under the HF Trainer) swaps a torch Adam/AdamW/Adagrad for DeepSpeed's CPU version itself.
        if f.target != "hf" and f.flag(f.config.zero_force_ds_cpu_optimizer, True):
            yield f.warning(
                path,
                "optimizer states are offloaded but there is no optimizer section: the optimizer you pass to "
                "deepspeed.initialize must be DeepSpeedCPUAdam or DeepSpeedCPULion, or DeepSpeed stops (ZeRORuntimeException)",
                "add an optimizer section (e.g. .adamw()), or set zero_force_ds_cpu_optimizer: false to accept a slow client optimizer",
            )
        return
    if f.opt_ds == "lamb":
        yield f.error(
            "optimizer.type",
            "DeepSpeed's Lamb is a fused GPU kernel with no CPU version: it cannot step offloaded optimizer states",
            "use AdamW (DeepSpeed's CPU Adam) with offload, or keep optimizer states on the device",
        )
    elif f.opt_ds not in CPU_OPTIMIZERS and (f.opt_ds is not None or f.opt_torch):
        yield f.warning(
            "optimizer.type",
            f"{f.opt_name} has no DeepSpeed CPU implementation: with offloaded states its step runs in plain PyTorch on the CPU (slow)",
            "use Adam, AdamW, Adagrad or Lion for DeepSpeed's vectorized CPU optimizers",
        )


@rule("reduce-scatter-prescale")
def prescale(f: Facts) -> Iterator[Diagnostic]:
    """``prescale_gradients`` or ``gradient_predivide_factor`` != 1 with ZeRO-2/3 reduce-scatter stops the engine."""
    reduce_scatter = f.flag(f.zero.reduce_scatter, True)
    averaging = f.config.gradient_allreduce_op in (None, "mean")  # stage 2 asserts only when averaging
    applies = reduce_scatter and (f.stage == 3 or (f.stage == 2 and averaging))
    if not applies:
        return
    hint = "remove it, or set zero_optimization.reduce_scatter: false"
    if f.config.prescale_gradients is True:
        yield f.error("prescale_gradients", f"not supported with ZeRO stage {f.stage} reduce-scatter", hint)
    factor = known(f.config.gradient_predivide_factor)
    if factor is not None and factor != 1:
        yield f.error(
            "gradient_predivide_factor",
            f"{factor:g} is not supported with ZeRO stage {f.stage} reduce-scatter (only 1.0)",
            hint,
        )


@rule("nvme-path")
def nvme_path(f: Facts) -> Iterator[Diagnostic]:
    """NVMe offload without ``nvme_path`` (where it takes effect: stage 3) fails when the engine starts."""
    if f.stage is not None and f.stage != 3:
        return
    for key, section in (("offload_optimizer", f.zero.offload_optimizer), ("offload_param", f.zero.offload_param)):
        if section is not None and section.device == "nvme" and section.nvme_path is None:
            yield f.error(
                f"zero_optimization.{key}.nvme_path",
                'missing: device "nvme" needs a directory on the NVMe drive',
                "set nvme_path, e.g. .offload_nvme('/local_nvme')",
            )


@rule("allgather-bucket-odd")
def allgather_bucket(f: Facts) -> Iterator[Diagnostic]:
    """Stages 1-2 assert ``allgather_bucket_size`` is a multiple of 2 (NCCL start alignment)."""
    size = known(f.zero.allgather_bucket_size)
    if f.stage in (1, 2) and size is not None and size % 2:
        yield f.error(
            "zero_optimization.allgather_bucket_size",
            f"{size} is odd; ZeRO stages 1-2 need a multiple of 2",
            f"use {size + 1}",
        )


@rule("legacy-stage1")
def legacy_stage1(f: Facts) -> Iterator[Diagnostic]:
    """``legacy_stage1: true`` stops the engine (removed in DeepSpeed 0.5.9)."""
    if f.zero.legacy_stage1 is True and f.stage != 0:
        yield f.error(
            "zero_optimization.legacy_stage1", "the old stage-1 implementation was removed from DeepSpeed", "remove it"
        )


@rule("param-dtype")
def param_dtype(f: Facts) -> Iterator[Diagnostic]:
    """``data_types.param_dtype`` must match the enabled precision, or the engine stops."""
    param_dtype = known(f.config.data_types.param_dtype) if f.config.data_types else None
    if param_dtype is None or f.fp16 is None or f.bf16 is None:
        return
    mode = "fp16" if f.fp16 else "bf16" if f.bf16 else "fp32"
    if param_dtype != mode:
        yield f.error(
            "data_types.param_dtype",
            f"{param_dtype!r} conflicts with the training precision ({mode})",
            "enable the matching fp16/bf16 section, or remove param_dtype",
        )


@rule("managed-gradient-accumulation")
def managed_accumulation(f: Facts) -> Iterator[Diagnostic]:
    """``managed_gradient_accumulation: false`` works with ``overlap_comm`` only at ZeRO stage 2 and up."""
    if f.config.managed_gradient_accumulation is not False or f.stage is None or f.stage >= 2:
        return
    if f.flag(f.zero.overlap_comm, f.stage == 3):
        yield f.error(
            "managed_gradient_accumulation",
            f"false needs zero_optimization.overlap_comm off below stage 2 (stage is {f.stage})",
            "set overlap_comm: false, or use ZeRO stage 2 or 3",
        )


@rule("scheduler")
def scheduler(f: Facts) -> Iterator[Diagnostic]:
    """Scheduler names DeepSpeed does not know, params its scheduler does not take, required params missing
    (``total_num_steps``, OneCycle's lr bounds), step counts DeepSpeed refuses."""
    scheduler = f.config.scheduler
    if scheduler is None:
        return
    name = scheduler.type
    if name not in SCHEDULERS and name not in TORCH_SCHEDULERS:
        hint = did_you_mean(name, (*SCHEDULERS, *TORCH_SCHEDULERS)) or (
            "use " + ", ".join(SCHEDULERS) + " or a torch.optim.lr_scheduler class name (case matters)"
        )
        yield f.error("scheduler.type", f"DeepSpeed does not know scheduler {name!r}", hint)
        return
    if name in SCHEDULERS_IN_CODE:
        yield f.error(
            "scheduler.type",
            f"{name} needs {SCHEDULERS_IN_CODE[name]} (Python objects), which a config file cannot hold",
            "build the scheduler in code and pass it as lr_scheduler to Session / deepspeed.initialize",
        )
        return
    params = scheduler.params
    typed = scheduler_params_class(name)
    if typed is not None and is_table(params):
        names = {key_of(a) for a in attrs.fields(typed)}
        for key in params:
            if key not in names:
                hint = UNKNOWN_KEY_HINTS.get((typed.__name__, key)) or did_you_mean(key, names) or "remove it"
                yield f.error(
                    f"scheduler.params.{key}",
                    f"{name} takes no parameter {key!r}: DeepSpeed fails with a TypeError",
                    hint,
                )
    required = REQUIRED_PARAMS.get(name, ())
    for key in required:
        if param(params, key) is None:
            hint = 'set it, or "auto" for resolve() / the HF Trainer' if key == "total_num_steps" else "set it"
            yield f.error(f"scheduler.params.{key}", f"missing: {name} needs it", hint)
    if name in ("WarmupLR", "WarmupDecayLR", "WarmupCosineLR"):
        written = param(params, "warmup_num_steps")
        warmup = 1000 if written is None else known(written)
        if warmup == 0:
            message = "got 0, expected a positive number of steps"
            hint = "use 1 for no warmup"
            if f.version is None or f.version >= WARMUP_STEPS_POSITIVE_SINCE:
                yield f.error("scheduler.params.warmup_num_steps", message, hint)
            else:
                yield f.warning("scheduler.params.warmup_num_steps", message + " (newer DeepSpeed refuses 0)", hint)
        total = known(param(params, "total_num_steps"))
        if "total_num_steps" in required and isinstance(total, int) and isinstance(warmup, int) and total < warmup:
            default = " (DeepSpeed's default)" if written is None else ""
            yield f.warning(
                "scheduler.params.total_num_steps",
                f"{total} is less than warmup_num_steps {warmup}{default}: the schedule never leaves warmup",
                "lower warmup_num_steps or raise total_num_steps",
            )
    if (
        name == "OneCycleLR"
        and param(params, "total_steps") is None
        and (param(params, "epochs") is None or param(params, "steps_per_epoch") is None)
    ):
        yield f.error(
            "scheduler.params.total_steps",
            "missing: OneCycleLR needs total_steps, or epochs and steps_per_epoch",
            "set total_steps",
        )
    if name == "OneCycle" and known(param(params, "cycle_first_step_size")) == 0:
        yield f.error(
            "scheduler.params.cycle_first_step_size",
            "got 0, expected a positive number of steps",
            "remove it for the default 2000",
        )
