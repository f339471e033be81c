"""validate() and check(): one row per rule, each a failing config and the diagnostic it must give."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from typing import Any

import pytest

from dsbuild import AUTO, Config, ConfigError, InvalidValueError, UnresolvedAutoError
from dsbuild import validate as validate_module
from dsbuild.config import Optimizer, Scheduler
from dsbuild.validate import RULES, Diagnostic, batch_triangle, check, validate

BATCH = {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2}
"""A batch that is valid at any world size, so rows show only the problem they are about."""


def cfg(**sections: Any) -> dict[str, Any]:
    """A ds_config dict with a valid batch plus ``sections``."""
    return {**BATCH, **sections}


Source = dict[str, Any] | Callable[[], Config]

_VERSION = validate_module.deepspeed_version()
DEEPSPEED = "DeepSpeed " + ".".join(map(str, _VERSION)) if _VERSION else "DeepSpeed"
"""How messages name the installed DeepSpeed (these tests hold for any version)."""

# (id, config, validate() keyword arguments, expected path, severity, message substring)
ROWS: list[tuple[str, Source, dict[str, Any], str, str, str]] = [
    # -- what DeepSpeed's parser refuses
    ("removed-section", cfg(amp={"enabled": True}), {},
     "amp", "error", f"removed from DeepSpeed: {DEEPSPEED} refuses a config with it"),
    ("unknown-top-level-key", cfg(gradient_clipp1ng=1.0), {},
     "gradient_clipp1ng", "error", "unknown key: DeepSpeed ignores it, so this setting is not applied"),
    ("unknown-top-level-key-no-match", cfg(cuda_visible_devices="0,1"), {},
     "cuda_visible_devices", "warning", "unknown key: DeepSpeed ignores it"),
    ("unknown-key-strict-section", cfg(zero_optimization={"stage": 2, "overlap_com": True}), {},
     "zero_optimization.overlap_com", "error", "unknown key: DeepSpeed refuses it (zero_optimization allows no other keys)"),
    ("removed-zero-key", cfg(zero_optimization={"stage": 3, "mics_shard_size": 8}), {},
     "zero_optimization.mics_shard_size", "error", "removed from DeepSpeed"),
    ("unknown-optimizer-param", cfg(optimizer={"type": "AdamW", "params": {"lr": 1e-4, "momentum": 0.9}}), {},
     "optimizer.params.momentum", "error", "AdamW takes no parameter 'momentum': DeepSpeed fails with a TypeError"),
    ("cosine-with-min-lr", cfg(scheduler={"type": "WarmupCosineLR", "params": {"total_num_steps": 100, "warmup_min_lr": 0}}), {},
     "scheduler.params.warmup_min_lr", "error", "WarmupCosineLR takes no parameter 'warmup_min_lr'"),
    ("deprecated-pin-memory", cfg(zero_optimization={"stage": 2, "cpu_offload_use_pin_memory": True}), {},
     "zero_optimization.cpu_offload_use_pin_memory", "warning", "deprecated; DeepSpeed reads and ignores it"),
    ("fp16-and-bf16", cfg(fp16={"enabled": True}, bf16={"enabled": True}), {},
     "fp16.enabled", "error", "fp16 and bf16 are both enabled"),
    ("loss-scale-window", cfg(fp16={"enabled": True, "loss_scale_window": 0}), {},
     "fp16.loss_scale_window", "error", "got 0, expected > 0 with dynamic loss scaling (loss_scale 0)"),
    ("min-loss-scale", cfg(fp16={"enabled": True, "min_loss_scale": -1}), {},
     "fp16.min_loss_scale", "error", "got -1, expected > 0 with dynamic loss scaling"),
    ("partial-offload", cfg(zero_optimization={"stage": 2, "offload_optimizer": {"device": "cpu", "ratio": 0.5}}), {},
     "zero_optimization.offload_optimizer.ratio", "error", "partial offload (ratio 0.5) needs ZeRO stage 3, got stage 2"),
    ("allreduce-sum-stage-3", cfg(gradient_allreduce_op="sum", zero_optimization={"stage": 3}), {},
     "gradient_allreduce_op", "error", '"sum" is not supported with ZeRO stage 3'),
    ("allreduce-sum-zenflow", cfg(gradient_allreduce_op="sum", zero_optimization={"stage": 2, "zenflow": {"topk_ratio": 0.1}}), {},
     "gradient_allreduce_op", "error", '"sum" is not supported with ZenFlow'),
    ("fp16-master-stage-0", cfg(fp16={"enabled": True, "fp16_master_weights_and_grads": True}), {},
     "fp16.fp16_master_weights_and_grads", "error", "needs ZeRO stage 1, 2 or 3, got stage 0"),
    ("bf16-states-stage-0", cfg(bf16={"enabled": True, "bf16_optimizer_states": True}), {},
     "bf16.bf16_optimizer_states", "error", "needs ZeRO stage 1, 2 or 3, got stage 0"),
    ("bf16-states-without-master", cfg(bf16={"enabled": True, "bf16_optimizer_states": True}, zero_optimization={"stage": 2}), {},
     "bf16.bf16_optimizer_states", "error", "needs bf16.bf16_master_weights_and_grads"),
    ("bf16-master-without-cpu-adam", cfg(bf16={"enabled": True, "bf16_master_weights_and_grads": True}, zero_optimization={"stage": 2}), {},
     "bf16.bf16_master_weights_and_grads", "error", "needs optimizer offload with DeepSpeed's CPU Adam"),
    ("compute-grad-norm-stage-3", cfg(zero_optimization={"stage": 3, "compute_grad_norm": False}), {},
     "zero_optimization.compute_grad_norm", "error", "false is supported only with ZeRO stage 1 or 2, got stage 3"),
    ("compute-grad-norm-clipping", cfg(zero_optimization={"stage": 2, "compute_grad_norm": False}), {},
     "zero_optimization.compute_grad_norm", "error", "false needs gradient clipping off, but DeepSpeed's default gradient_clipping 1.0 clips"),
    ("compute-grad-norm-offload", cfg(gradient_clipping=0, zero_optimization={"stage": 1, "compute_grad_norm": False, "offload_optimizer": {"device": "cpu"}}), {},
     "zero_optimization.compute_grad_norm", "error", "false does not work with optimizer offload"),
    ("batch-missing-resolved", {"gradient_accumulation_steps": 4}, {"resolved": True},
     "train_micro_batch_size_per_gpu", "error", "neither train_batch_size nor train_micro_batch_size_per_gpu is set"),
    ("batch-missing", {}, {},
     "train_micro_batch_size_per_gpu", "error", "DeepSpeed stops with an AssertionError"),
    ("batch-missing-hf", {}, {"target": "hf"},
     "train_micro_batch_size_per_gpu", "warning", "DeepSpeed stops with an AssertionError"),
    ("written-as-text", {"fp16": {"loss_scale": "3"}, "train_batch_size": 8}, {},
     "fp16.loss_scale", "warning", "written as '3', read as 3, as DeepSpeed's parser reads it"),
    ("written-as-text-by-hand", {"wall_clock_breakdown": "false", "train_batch_size": 8}, {},
     "wall_clock_breakdown", "error", "written as 'false', read as false by dsbuild, but DeepSpeed reads this key as written"),
    ("section-requirements", {"autotuning": {"results_dir": ""}, "train_batch_size": 8}, {},
     "autotuning.results_dir", "error", "empty: DeepSpeed asserts a directory name"),
    # -- what DeepSpeed finds when the engine starts
    ("optimizer-unknown", cfg(optimizer={"type": "sgd"}), {},
     "optimizer.type", "error", f"{DEEPSPEED} does not know optimizer 'sgd'"),
    ("optimizer-one-bit", cfg(optimizer={"type": "OneBitAdam"}), {},
     "optimizer.type", "error", "the 1-bit optimizers (OneBitAdam, OneBitLamb, ZeroOneAdam) were removed from DeepSpeed"),
    ("max-grad-norm-torch", cfg(optimizer={"type": "SGD", "params": {"lr": 0.1, "max_grad_norm": 1.0}}), {},
     "optimizer.params.max_grad_norm", "error", "DeepSpeed refuses max_grad_norm as an optimizer parameter"),
    ("max-grad-norm-lamb", cfg(optimizer={"type": "Lamb", "params": {"max_grad_norm": 1.0}}), {},
     "optimizer.params.max_grad_norm", "error", "DeepSpeed refuses max_grad_norm as an optimizer parameter"),
    ("max-grad-norm-adam", cfg(optimizer={"type": "AdamW", "params": {"max_grad_norm": 1.0}}), {},
     "optimizer.params.max_grad_norm", "error", "DeepSpeed refuses max_grad_norm as an optimizer parameter"),
    ("amsgrad-fused-adam", cfg(optimizer={"type": "Adam", "params": {"amsgrad": True}}), {},
     "optimizer.params.amsgrad", "error", "DeepSpeed's FusedAdam does not support AMSGrad"),
    ("adagrad-cpu-param", cfg(optimizer={"type": "Adagrad", "params": {"fp32_optimizer_states": True}}), {},
     "optimizer.params.fp32_optimizer_states", "error", "DeepSpeed builds torch.optim.Adagrad, which takes no fp32_optimizer_states"),
    ("torch-adam-bias-correction", cfg(optimizer={"type": "AdamW", "params": {"torch_adam": True, "bias_correction": True}}), {},
     "optimizer.params.bias_correction", "error", "torch's Adam/AdamW (torch_adam: true) take no bias_correction"),
    ("lamb-static-loss-scale", cfg(optimizer={"type": "Lamb"}, fp16={"enabled": True, "loss_scale": 128}), {},
     "fp16.loss_scale", "error", "DeepSpeed's Lamb needs dynamic loss scaling, got a static loss_scale 128"),
    ("untested-under-zero", cfg(optimizer={"type": "SGD", "params": {"lr": 0.1}}, zero_optimization={"stage": 2}), {},
     "optimizer.type", "error", "SGD is not among the optimizers DeepSpeed has tested with ZeRO"),
    ("lamb-untested-under-zero", cfg(optimizer={"type": "Lamb"}, zero_optimization={"stage": 1}), {},
     "optimizer.type", "error", "Lamb is not among the optimizers DeepSpeed has tested with ZeRO"),
    ("offload-stage-0", cfg(zero_optimization={"stage": 0, "offload_optimizer": {"device": "cpu"}}), {},
     "zero_optimization.offload_optimizer.device", "error", "optimizer offload ('cpu') needs ZeRO stage 1, 2 or 3, got stage 0"),
    ("offload-client-optimizer", cfg(zero_optimization={"stage": 2, "offload_optimizer": {"device": "cpu"}}), {},
     "zero_optimization.offload_optimizer.device", "warning", "must be DeepSpeedCPUAdam or DeepSpeedCPULion"),
    ("offload-lamb", cfg(optimizer={"type": "Lamb"}, zero_allow_untested_optimizer=True, zero_optimization={"stage": 2, "offload_optimizer": {"device": "cpu"}}), {},
     "optimizer.type", "error", "DeepSpeed's Lamb is a fused GPU kernel with no CPU version"),
    ("offload-torch-optimizer", cfg(optimizer={"type": "SGD"}, zero_allow_untested_optimizer=True, zero_optimization={"stage": 2, "offload_optimizer": {"device": "cpu"}}), {},
     "optimizer.type", "warning", "SGD has no DeepSpeed CPU implementation"),
    ("prescale-stage-3", cfg(prescale_gradients=True, zero_optimization={"stage": 3}), {},
     "prescale_gradients", "error", "not supported with ZeRO stage 3 reduce-scatter"),
    ("predivide-stage-2", cfg(gradient_predivide_factor=2.0, zero_optimization={"stage": 2}), {},
     "gradient_predivide_factor", "error", "2 is not supported with ZeRO stage 2 reduce-scatter (only 1.0)"),
    ("nvme-without-path", cfg(zero_optimization={"stage": 3, "offload_param": {"device": "nvme"}}), {},
     "zero_optimization.offload_param.nvme_path", "error", 'missing: device "nvme" needs a directory on the NVMe drive'),
    ("allgather-odd", cfg(zero_optimization={"stage": 2, "allgather_bucket_size": 500000001}), {},
     "zero_optimization.allgather_bucket_size", "error", "500000001 is odd; ZeRO stages 1-2 need a multiple of 2"),
    ("legacy-stage1", cfg(zero_optimization={"stage": 1, "legacy_stage1": True}), {},
     "zero_optimization.legacy_stage1", "error", "the old stage-1 implementation was removed from DeepSpeed"),
    ("param-dtype", cfg(bf16={"enabled": True}, data_types={"param_dtype": "fp16"}), {},
     "data_types.param_dtype", "error", "'fp16' conflicts with the training precision (bf16)"),
    ("managed-accumulation", cfg(managed_gradient_accumulation=False, zero_optimization={"stage": 1, "overlap_comm": True}), {},
     "managed_gradient_accumulation", "error", "false needs zero_optimization.overlap_comm off below stage 2"),
    ("amsgrad-cpu-adam", cfg(optimizer={"type": "Adam", "params": {"amsgrad": True}}, zero_optimization={"stage": 2, "offload_optimizer": {"device": "cpu"}}), {},
     "optimizer.params.amsgrad", "error", "DeepSpeed's DeepSpeedCPUAdam does not support AMSGrad"),
    ("scheduler-torch-required", cfg(scheduler={"type": "CosineAnnealingWarmRestarts", "params": {"eta_min": 0.0}}), {},
     "scheduler.params.T_0", "error", "missing: CosineAnnealingWarmRestarts needs it"),
    ("scheduler-torch-one-cycle", cfg(scheduler={"type": "OneCycleLR", "params": {"max_lr": 0.1}}), {},
     "scheduler.params.total_steps", "error", "missing: OneCycleLR needs total_steps, or epochs and steps_per_epoch"),
    ("scheduler-in-code", cfg(scheduler={"type": "LambdaLR"}), {},
     "scheduler.type", "error", "LambdaLR needs lr_lambda (Python objects), which a config file cannot hold"),
    ("scheduler-unknown", cfg(scheduler={"type": "WarmupCosineLr"}), {},
     "scheduler.type", "error", "DeepSpeed does not know scheduler 'WarmupCosineLr'"),
    ("scheduler-total-missing", cfg(scheduler={"type": "WarmupDecayLR", "params": {"warmup_num_steps": 10}}), {},
     "scheduler.params.total_num_steps", "error", "missing: WarmupDecayLR needs it"),
    ("scheduler-free-params", lambda: Config(scheduler=Scheduler(type="WarmupCosineLR", params={"total_num_steps": 10, "warmup_max_lr": 1e-3}), **BATCH), {},
     "scheduler.params.warmup_max_lr", "error", "WarmupCosineLR takes no parameter 'warmup_max_lr'"),
    ("one-cycle-bounds", cfg(scheduler={"type": "OneCycle", "params": {"cycle_max_lr": 1e-3}}), {},
     "scheduler.params.cycle_min_lr", "error", "missing: OneCycle needs it"),
    ("one-cycle-step-size", cfg(scheduler={"type": "OneCycle", "params": {"cycle_min_lr": 0, "cycle_max_lr": 1e-3, "cycle_first_step_size": 0}}), {},
     "scheduler.params.cycle_first_step_size", "error", "got 0, expected a positive number of steps"),
    ("warmup-zero-steps", cfg(scheduler={"type": "WarmupLR", "params": {"warmup_num_steps": 0}}), {},
     "scheduler.params.warmup_num_steps", "error", "got 0, expected a positive number of steps"),
    ("total-below-warmup", cfg(scheduler={"type": "WarmupDecayLR", "params": {"total_num_steps": 500}}), {},
     "scheduler.params.total_num_steps", "warning", "500 is less than warmup_num_steps 1000 (DeepSpeed's default)"),
    # -- what DeepSpeed never says
    ("offload-param-below-3", cfg(zero_optimization={"stage": 2, "offload_param": {"device": "cpu"}}), {},
     "zero_optimization.offload_param", "warning", "ignored at stage 2: DeepSpeed offloads parameters only at stage 3"),
    ("nvme-optimizer-below-3", cfg(optimizer={"type": "AdamW"}, zero_optimization={"stage": 2, "offload_optimizer": {"device": "nvme", "nvme_path": "/nvme"}}), {},
     "zero_optimization.offload_optimizer.device", "warning", '"nvme" at stage 2 offloads to CPU memory'),
    ("stage-3-key-below-3", cfg(zero_optimization={"stage": 2, "stage3_max_live_parameters": 1000}), {},
     "zero_optimization.stage3_max_live_parameters", "warning", "ignored at stage 2: only stage 3 reads it"),
    ("super-offload-below-3", cfg(optimizer={"type": "AdamW"}, zero_optimization={"stage": 1, "offload_optimizer": {"device": "cpu", "super_offload": True}}), {},
     "zero_optimization.offload_optimizer.super_offload", "warning", "ignored at stage 1: only stage 3 reads it"),
    ("zero3-without-16bit-gather", cfg(zero_optimization={"stage": 3}), {},
     "zero_optimization.stage3_gather_16bit_weights_on_model_save", "warning", "save_16bit_model / save_model (and LoRA adapters) come out empty"),
    ("zero3-gather-auto-hf", cfg(zero_optimization={"stage": 3, "stage3_gather_16bit_weights_on_model_save": "auto"}), {"target": "hf"},
     "zero_optimization.stage3_gather_16bit_weights_on_model_save", "warning", 'Accelerate fills "auto" with false'),
    ("batch-triangle", {"train_batch_size": 32, **BATCH}, {"world_size": 8},
     "train_batch_size", "error", "32 != train_micro_batch_size_per_gpu 4 x gradient_accumulation_steps 2 x world size 8 = 64"),
    ("batch-not-multiple", {"train_batch_size": 30, "train_micro_batch_size_per_gpu": 4}, {"world_size": 2},
     "train_batch_size", "error", "30 is not a multiple of train_micro_batch_size_per_gpu 4 x world size 2 = 8"),
    ("batch-below-world", {"train_batch_size": 3}, {"world_size": 4},
     "train_batch_size", "error", "3 is not a multiple of world size 4"),
    ("batch-no-world-fits", {"train_batch_size": 30, **BATCH}, {},
     "train_batch_size", "error", "30 is not a multiple of train_micro_batch_size_per_gpu 4 x gradient_accumulation_steps 2 = 8, so no world size fits"),
    ("sequence-parallel", cfg(sequence_parallel_size=3), {"world_size": 8},
     "sequence_parallel_size", "error", "3 does not divide the world size 8"),
    ("auto-precision", cfg(bf16={"enabled": "auto"}), {"target": "deepspeed"},
     "bf16.enabled", "warning", '"auto" must be resolved first: DeepSpeed reads it as false and trains in fp32'),
    ("auto-batch", {"train_micro_batch_size_per_gpu": "auto"}, {"target": "deepspeed"},
     "train_micro_batch_size_per_gpu", "error", '"auto" must be resolved first: DeepSpeed fails on it with a TypeError'),
    ("auto-unfilled", cfg(zero_optimization={"stage": "auto"}), {"target": "deepspeed"},
     "zero_optimization.stage", "error", '"auto" is not filled here by resolve() or the HF Trainer'),
    ("auto-unfilled-hf", cfg(optimizer={"type": "AdamW", "params": {"amsgrad": "auto"}}), {"target": "hf"},
     "optimizer.params.amsgrad", "error", '"auto" is not filled here by the HF Trainer (Accelerate stops on it)'),
    ("auto-bucket-below-3", cfg(zero_optimization={"stage": 2, "stage3_prefetch_bucket_size": "auto"}), {"target": "deepspeed"},
     "zero_optimization.stage3_prefetch_bucket_size", "error", '"auto" is filled only at stage 3 (by resolve() and the HF Trainer), got stage 2'),
    ("auto-filled-by-accelerate", cfg(zero_optimization={"stage": "auto"}), {"target": "hf"},
     "zero_optimization.stage", "warning", '"auto" is filled by Accelerate from its own zero_stage setting'),
    ("auto-resolved", {"train_micro_batch_size_per_gpu": "auto"}, {"resolved": True},
     "train_micro_batch_size_per_gpu", "error", '"auto" left after resolve'),
]  # fmt: skip


def _config(source: Source) -> Config:
    return source() if callable(source) else Config.from_dict(source, strict=False)


def _match(found: list[Diagnostic], path: str, severity: str, message: str) -> Diagnostic | None:
    return next((d for d in found if d.path == path and d.severity == severity and message in d.message), None)


@pytest.mark.parametrize(
    ("source", "kwargs", "path", "severity", "message"), [r[1:] for r in ROWS], ids=[r[0] for r in ROWS]
)
def test_rule(source: Source, kwargs: dict[str, Any], path: str, severity: str, message: str) -> None:
    """Each rule reports its failing config at the key the user wrote, with what is wrong and what to do."""
    found = validate(_config(source), **kwargs)
    match = _match(found, path, severity, message)
    assert match is not None, "\n".join(map(str, found)) or "no diagnostics"
    assert match.hint, f"{match} says nothing about what to do"


def test_every_rule_has_a_row() -> None:
    """The table above covers every rule in RULES (the docs' catalogue), so none goes untested."""
    covered = set()
    for _, source, kwargs, path, severity, message in ROWS:
        match = _match(validate(_config(source), **kwargs), path, severity, message)
        assert match is not None
        covered.add(match.rule)
    assert covered == set(RULES)


@pytest.mark.parametrize(
    ("source", "kwargs", "rule"),
    [
        pytest.param(cfg(gradient_predivide_factor=2.0, zero_optimization={"stage": 2, "reduce_scatter": False}), {}, "reduce-scatter-prescale", id="predivide-without-reduce-scatter"),
        pytest.param(cfg(gradient_predivide_factor=2.0, zero_optimization={"stage": 1}), {}, "reduce-scatter-prescale", id="predivide-stage-1"),
        pytest.param(cfg(zero_optimization={"stage": 3, "offload_optimizer": {"device": "cpu"}}), {"target": "hf"}, "offload-optimizer", id="accelerate-swaps-in-cpu-adam"),
        pytest.param(cfg(fp16={"enabled": False, "loss_scale_window": 0}), {}, "fp16-dynamic-loss-scale", id="window-unused-without-fp16"),
        pytest.param(cfg(fp16={"enabled": True, "loss_scale": 64, "min_loss_scale": 0}), {}, "fp16-dynamic-loss-scale", id="min-unused-with-static-scale"),
        pytest.param(cfg(optimizer={"type": "Lamb"}, fp16={"enabled": True, "loss_scale": 0}), {}, "lamb-static-loss-scale", id="lamb-dynamic"),
        pytest.param(cfg(bf16={"enabled": True, "bf16_master_weights_and_grads": True, "bf16_optimizer_states": True}, zero_optimization={"stage": 2}), {}, "low-precision-master-weights", id="bf16-master-on-device"),
        pytest.param(cfg(optimizer={"type": "AdamW"}, bf16={"enabled": True, "bf16_master_weights_and_grads": True}, zero_optimization={"stage": 3, "offload_optimizer": {"device": "cpu"}}), {}, "low-precision-master-weights", id="bf16-master-cpu-adam"),
        pytest.param(cfg(optimizer={"type": "Adam", "params": {"amsgrad": True, "torch_adam": True}}), {}, "optimizer-params", id="amsgrad-torch-adam"),
        pytest.param(cfg(scheduler={"type": "OneCycleLR", "params": {"max_lr": 0.1, "epochs": 2, "steps_per_epoch": 10}}), {}, "scheduler", id="one-cycle-lr-by-epochs"),
        pytest.param(cfg(optimizer={"type": "RMSprop"}, zero_allow_untested_optimizer=True, zero_optimization={"stage": 2}), {}, "untested-zero-optimizer", id="untested-allowed"),
        pytest.param(cfg(optimizer={"type": "adamw"}, zero_optimization={"stage": 3}), {}, "untested-zero-optimizer", id="lower-case-adamw-tested"),
        pytest.param(cfg(zero_optimization={"stage": 2, "stage3_prefetch_bucket_size": "auto"}), {"target": "hf"}, "auto", id="accelerate-fills-buckets-below-3"),
        pytest.param(cfg(data_types={"keep_in_fp32_modules": "auto"}), {}, "auto", id="deepspeeds-own-auto"),
        pytest.param({"train_batch_size": 64, **BATCH}, {"world_size": 8}, "batch-size", id="triangle-holds"),
        pytest.param({"train_batch_size": 32, "train_micro_batch_size_per_gpu": 4, "sequence_parallel_size": 2}, {"world_size": 16}, "batch-size", id="sequence-parallel-divides"),
        pytest.param({"train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto", "gradient_clipping": "auto", "bf16": {"enabled": "auto"}, "zero_optimization": {"stage": 3, "reduce_bucket_size": "auto", "stage3_prefetch_bucket_size": "auto", "stage3_param_persistence_threshold": "auto", "stage3_gather_16bit_weights_on_model_save": True}, "optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"}}, "scheduler": {"type": "WarmupDecayLR", "params": {"warmup_min_lr": "auto", "warmup_max_lr": "auto", "warmup_num_steps": "auto", "total_num_steps": "auto"}}}, {"target": "hf"}, "auto", id="hf-style-autos"),
    ],
)  # fmt: skip
def test_rule_stays_quiet(source: Source, kwargs: dict[str, Any], rule: str) -> None:
    """The cases next to each rule that DeepSpeed accepts are not reported."""
    found = [d for d in validate(_config(source), **kwargs) if d.rule == rule]
    assert found == []


def test_good_config_has_no_diagnostics() -> None:
    """A well-formed ZeRO-2 bf16 AdamW config at a fitting world size is clean."""
    config = (
        Config.zero(2).bf16().adamw(lr=2e-5, weight_decay=0.01).batch(micro=4, grad_accum=2, total=64).clip_grad(1.0)
    )
    assert validate(config, world_size=8) == []
    check(config, world_size=8, resolved=True)


def test_hf_preset_style_config_is_useful_by_default() -> None:
    """An all-"auto" HF config is judged for the HF Trainer by default (its "auto" values say who it is for): clean.
    Judged for DeepSpeed as written, the autos DeepSpeed fails on (the batch keys) are errors, those it reads as
    unset warnings, each saying how to resolve them."""
    config = Config.zero(3).bf16(enabled=AUTO).adamw(lr=AUTO).batch(micro=AUTO, grad_accum=AUTO)
    config = config.zero_options(stage3_gather_16bit_weights_on_model_save=True)
    assert validate(config) == validate(config, target="hf") == []
    found = validate(config, target="deepspeed")
    assert [d.severity for d in found] == ["error", "error", "warning", "warning"]
    assert all("cfg.resolve(...)" in (d.hint or "") for d in found)
    assert validate(Config.zero(2).batch(micro=2)) == validate(Config.zero(2).batch(micro=2), target="deepspeed")
    with pytest.raises(UnresolvedAutoError):
        check(config, resolved=True)


def test_errors_come_before_warnings() -> None:
    """validate() lists every error first, then the warnings."""
    found = validate(
        Config.from_dict(
            cfg(
                zero_optimization={"stage": 2, "offload_param": {"device": "cpu"}},
                fp16={"enabled": True},
                bf16={"enabled": True},
            )
        )
    )
    assert [d.severity for d in found] == ["error", "warning"]


def test_check_reports_every_error_at_once() -> None:
    """check() raises one ConfigError listing each error, one per line, warnings left out."""
    config = Config.from_dict(
        cfg(
            fp16={"enabled": True},
            bf16={"enabled": True},
            gradient_allreduce_op="sum",
            zero_optimization={"stage": 3, "offload_param": {"device": "nvme"}},
            optimizer={"type": "OneBitAdam"},
        )
    )
    with pytest.raises(ConfigError) as caught:
        check(config)
    assert not isinstance(caught.value, UnresolvedAutoError)
    assert str(caught.value) == "\n".join(
        [
            "4 problems:",
            "  fp16.enabled: fp16 and bf16 are both enabled (keep one: .bf16() or .fp16() turns the other off)",
            '  gradient_allreduce_op: "sum" is not supported with ZeRO stage 3 (remove it to reduce with "mean")',
            "  optimizer.type: the 1-bit optimizers (OneBitAdam, OneBitLamb, ZeroOneAdam) were removed from DeepSpeed"
            ' (use "Adam"/"AdamW" (or "Lamb" for OneBitLamb); for less communication see ZeRO++ (zero_quantized_gradients))',
            '  zero_optimization.offload_param.nvme_path: missing: device "nvme" needs a directory on the NVMe drive'
            " (set nvme_path, e.g. .offload_nvme('/local_nvme'))",
        ]
    )


def test_check_passes_warnings() -> None:
    """Warnings alone do not make check() raise."""
    config = Config.from_dict(cfg(zero_optimization={"stage": 2, "offload_param": {"device": "cpu"}}))
    assert [d.severity for d in validate(config)] == ["warning"]
    check(config)


def test_older_deepspeed_gets_warnings_for_removed_features(monkeypatch: pytest.MonkeyPatch) -> None:
    """Before DeepSpeed removed amp and the 1-bit optimizers they still ran: a warning, not an error."""
    monkeypatch.setattr(validate_module, "deepspeed_version", lambda: (0, 16, 4))
    config = Config.from_dict(cfg(amp={"enabled": True}, optimizer={"type": "OneBitAdam"}))
    assert {(d.path, d.severity) for d in validate(config)} == {("amp", "warning"), ("optimizer.type", "warning")}


def test_without_deepspeed_the_newest_rules_apply(monkeypatch: pytest.MonkeyPatch) -> None:
    """No DeepSpeed installed: the removed features are errors, and messages say just "DeepSpeed"."""
    monkeypatch.setattr(validate_module, "deepspeed_version", lambda: None)
    found = validate(Config.from_dict(cfg(amp={"enabled": True})))
    assert [(d.severity, d.message) for d in found] == [
        ("error", "removed from DeepSpeed: DeepSpeed refuses a config with it")
    ]


def test_typed_model_refuses_at_load_what_deepspeed_refuses() -> None:
    """Some of DeepSpeed's refusals never reach validate(): the typed model stops them at load, with the path."""
    with pytest.raises(InvalidValueError, match=r"checkpoint\.tag_validation: got 'sometimes'"):
        Config.from_dict(cfg(checkpoint={"tag_validation": "sometimes"}))
    with pytest.raises(InvalidValueError, match=r"zero_optimization\.stage: got 4"):
        Config.from_dict(cfg(zero_optimization={"stage": 4}))


def test_free_optimizer_params_with_auto_are_found() -> None:
    """An "auto" in a torch optimizer's free params is found at its dotted path."""
    config = Config(optimizer=Optimizer(type="SGD", params={"lr": AUTO, "momentum": AUTO}), **BATCH)
    found = {d.path: d.severity for d in validate(config, target="hf")}
    assert found == {"optimizer.params.momentum": "error"}


@pytest.mark.parametrize(
    ("d", "world", "expected"),
    [
        ({"train_batch_size": 32, "train_micro_batch_size_per_gpu": 4}, 4, (32, 4, 2)),
        ({"train_batch_size": 32, "gradient_accumulation_steps": 2}, 4, (32, 4, 2)),
        ({"train_micro_batch_size_per_gpu": 4}, 4, (16, 4, 1)),
        ({"train_batch_size": 30, "train_micro_batch_size_per_gpu": 4}, 4, None),
        ({"train_micro_batch_size_per_gpu": "auto"}, 4, None),
    ],
)
def test_batch_triangle(d: dict[str, Any], world: int, expected: tuple[int, int, int] | None) -> None:
    """batch_triangle derives the missing sizes, or gives None when they cannot be derived."""
    assert batch_triangle(Config.from_dict(d), world) == expected


def test_bad_arguments() -> None:
    """A misspelt target or a world size below 1 fails at once, naming the argument."""
    with pytest.raises(InvalidValueError, match="target: got 'huggingface'"):
        validate(Config(), target="huggingface")
    with pytest.raises(InvalidValueError, match="world_size: got 0"):
        validate(Config(), world_size=0)


@pytest.mark.procs
def test_validate_imports_no_torch() -> None:
    """validate is the config layer: importing and running it loads neither torch nor deepspeed."""
    code = (
        "import sys; from dsbuild import Config; from dsbuild.validate import validate; "
        "validate(Config.zero(3).bf16().adamw()); "
        "print(sorted(m for m in ('torch', 'deepspeed', 'transformers', 'peft') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_torch_scheduler_table_matches_the_installed_torch() -> None:
    """The required arguments dsbuild lists for torch's schedulers are exactly those of the installed torch's
    constructors (besides the optimizer), so a table kept without importing torch stays true."""
    import inspect

    lr_scheduler = pytest.importorskip("torch.optim.lr_scheduler")
    from dsbuild.validate.catalogue import REQUIRED_PARAMS, SCHEDULERS_IN_CODE, TORCH_SCHEDULERS

    for name in TORCH_SCHEDULERS:
        parameters = inspect.signature(getattr(lr_scheduler, name).__init__).parameters
        required = tuple(
            p for p, v in parameters.items() if v.default is inspect.Parameter.empty and p not in ("self", "optimizer")
        )
        ours = (SCHEDULERS_IN_CODE[name],) if name in SCHEDULERS_IN_CODE else REQUIRED_PARAMS.get(name, ())
        assert set(ours) <= set(required) and (name in SCHEDULERS_IN_CODE or set(ours) == set(required)), name
