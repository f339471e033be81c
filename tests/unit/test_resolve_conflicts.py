"""resolve(): explicit values that disagree with the training arguments, and "auto" values nothing fills."""

from __future__ import annotations

from types import SimpleNamespace as NS
from typing import Any

import pytest
from _resolve_helpers import AUTO_BATCH, BATCH, HF_ALL_AUTO, TRAINING, error, lines, run

from dsbuild import ConflictError, UnresolvedAutoError
from dsbuild.resolve.training import Training

# -- conflicts ---------------------------------------------------------------------


CONFLICTING: dict[str, Any] = {
    "train_batch_size": 32,
    "train_micro_batch_size_per_gpu": 4,
    "gradient_accumulation_steps": "auto",
    "gradient_clipping": 1,
    "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "betas": [0.9, 0.999], "eps": "auto", "weight_decay": 0.1}},
    "scheduler": {
        "type": "WarmupDecayLR",
        "params": {"total_num_steps": 500, "warmup_num_steps": 100, "warmup_min_lr": 1e-7, "warmup_max_lr": 3e-5},
    },
    "fp16": {"enabled": True},
    "bf16": {"enabled": False},
    "zero_optimization": {"stage": 3, "reduce_bucket_size": 1000},
}


def test_every_conflict_is_reported_at_once_in_hf_order() -> None:
    """One ConflictError, one line per disagreeing key: its value, the argument's name and value (HF's order).
    fp16 was not set in the training arguments, so the config's fp16.enabled stands (no line for it)."""
    err = error(CONFLICTING, ConflictError, world_size=8, training=TRAINING, total_steps=1000)
    assert str(err).splitlines() == [
        "7 problems:",
        "  train_batch_size: 32 disagrees with world size 8 × per_device_train_batch_size 4 ×"
        ' gradient_accumulation_steps 2 = 64 (set the key to "auto" or to 64)',
        '  gradient_clipping: 1 disagrees with max_grad_norm = 0.5 (set the key to "auto" or to 0.5)',
        '  optimizer.params.lr: 0.0001 disagrees with learning_rate = 3e-05 (set the key to "auto" or to 3e-05)',
        "  optimizer.params.betas: [0.9, 0.999] disagrees with [adam_beta1, adam_beta2] = [0.8, 0.95]"
        ' (set the key to "auto" or to [0.8, 0.95])',
        '  bf16.enabled: false disagrees with bf16 or bf16_full_eval = true (set the key to "auto" or to true)',
        '  scheduler.params.total_num_steps: 500 disagrees with total_steps = 1000 (set the key to "auto" or to 1000)',
        "  scheduler.params.warmup_num_steps: 100 disagrees with max(1, warmup_steps) = 10"
        ' (set the key to "auto" or to 10)',
    ]


def test_values_that_agree_are_no_conflict() -> None:
    """Numbers compare by value (1 == 1.0) and betas as lists, as HF's ``!=`` does."""
    data = {
        "train_batch_size": 64.0,
        "train_micro_batch_size_per_gpu": 4,
        "gradient_accumulation_steps": 2,
        "gradient_clipping": 1,
        "optimizer": {"type": "AdamW", "params": {"lr": 5e-5, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0}},
    }
    training = Training(per_device_train_batch_size=4, gradient_accumulation_steps=2)
    assert run(data, world_size=8, training=training) == {**data, "train_batch_size": 64}


def test_fill_only_keys_are_never_conflicts() -> None:
    """warmup_min_lr and the hidden-size buckets are HF's fill_only: an explicit value stays, unchecked."""
    data = {
        **BATCH,
        "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 1e-6}},
        "zero_optimization": {
            "stage": 3,
            "reduce_bucket_size": 5,
            "stage3_prefetch_bucket_size": 6,
            "stage3_param_persistence_threshold": 7,
        },
    }
    out = run(data, training=Training(per_device_train_batch_size=2), hidden_size=64)
    assert out == {"train_batch_size": 2, **data}


def test_a_half_auto_pair_is_filled_and_its_other_half_checked() -> None:
    """betas ["auto", 0.95]: the "auto" takes adam_beta1, 0.95 must equal adam_beta2 (HF flags the whole pair)."""
    data = {**AUTO_BATCH, "optimizer": {"type": "AdamW", "params": {"betas": ["auto", 0.95]}}}
    assert run(data, training=TRAINING)["optimizer"]["params"] == {"betas": [0.8, 0.95]}
    err = error(data, ConflictError, training=Training())
    assert lines(err) == [
        'optimizer.params.betas: ["auto", 0.95] disagrees with [adam_beta1, adam_beta2] = [0.9, 0.999]'
        ' (set the key to "auto" or to [0.9, 0.999])'
    ]


def test_a_batch_size_derived_by_the_triangle_must_agree_with_the_training() -> None:
    """Unset keys DeepSpeed derives (accumulation 1 here) are checked against the training arguments too."""
    training = Training(per_device_train_batch_size=4, gradient_accumulation_steps=8)
    err = error({"train_micro_batch_size_per_gpu": 4}, ConflictError, world_size=2, training=training)
    assert lines(err) == [
        "gradient_accumulation_steps: not set, and DeepSpeed's batch triangle gives 1, which disagrees with"
        ' gradient_accumulation_steps = 8 (set the key to "auto" or to 8)',
        "train_batch_size: not set, and DeepSpeed's batch triangle gives 8, which disagrees with world size 2 ×"
        ' per_device_train_batch_size 4 × gradient_accumulation_steps 8 = 64 (set the key to "auto" or to 64)',
    ]
    agreeing = run(
        {"train_micro_batch_size_per_gpu": 4}, world_size=2, training=Training(per_device_train_batch_size=4)
    )
    assert agreeing == {"train_batch_size": 8, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1}


def test_without_training_nothing_is_compared() -> None:
    """Explicit values stand when no training arguments are given: there is nothing to disagree with."""
    data = {k: v for k, v in CONFLICTING.items() if k not in ("gradient_accumulation_steps", "optimizer")}
    data["optimizer"] = {"type": "AdamW", "params": {"lr": 1e-4}}
    out = run(data, world_size=8, hidden_size=8)
    assert out["optimizer"] == {"type": "AdamW", "params": {"lr": 1e-4}}
    assert out["gradient_accumulation_steps"] == 1
    assert out["scheduler"]["params"]["total_num_steps"] == 500


# -- autos nothing fills -------------------------------------------------------------

STAGE2 = {"stage": 2, "reduce_bucket_size": "auto"}

LEFTOVERS: list[tuple[dict[str, Any], dict[str, Any], str]] = [
    (
        {**AUTO_BATCH, "scheduler": {"type": "WarmupDecayLR", "params": {"total_num_steps": "auto"}}},
        {"training": Training()},
        'scheduler.params.total_num_steps: "auto" needs the number of optimizer steps (pass total_steps=...)',
    ),
    (
        {**BATCH, "zero_optimization": STAGE2},
        {},
        'zero_optimization.reduce_bucket_size: "auto" needs the model\'s hidden size (pass model= or hidden_size=)',
    ),
    (
        {**BATCH, "zero_optimization": STAGE2},
        {"model": NS(config=NS(vocab_size=5))},
        'zero_optimization.reduce_bucket_size: "auto" needs the model\'s hidden size, but model.config has neither'
        " hidden_size nor hidden_sizes (pass hidden_size=)",
    ),
    (
        {**BATCH, "zero_optimization": STAGE2},
        {"model": NS(config=NS(hidden_size=None))},
        'zero_optimization.reduce_bucket_size: "auto" needs the model\'s hidden size, but'
        " model.config.hidden_size is None (pass hidden_size=)",
    ),
    (
        {**BATCH, "optimizer": {"type": "AdamW", "params": {"lr": "auto"}}},
        {},
        'optimizer.params.lr: "auto" needs the training argument learning_rate (pass training=...)',
    ),
    (
        {**BATCH, "bf16": {"enabled": "auto"}},
        {},
        'bf16.enabled: "auto" needs the training arguments bf16 and bf16_full_eval (pass training=...)',
    ),
    (
        {**AUTO_BATCH, "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": "auto"}}},
        {"training": Training(warmup_steps=0.1)},
        'scheduler.params.warmup_num_steps: "auto" needs the number of optimizer steps to turn warmup_steps=0.1'
        " into steps (pass total_steps=...)",
    ),
    (
        {"train_batch_size": "auto", "gradient_accumulation_steps": 2},
        {},
        'train_batch_size: "auto" needs per_device_train_batch_size and gradient_accumulation_steps'
        " (pass training=...)",
    ),
    (
        {**BATCH, "zero_optimization": {"stage": 2, "stage3_prefetch_bucket_size": "auto"}},
        {"hidden_size": 64},
        'zero_optimization.stage3_prefetch_bucket_size: "auto" is filled only at ZeRO stage 3, and this config has'
        " stage 2; DeepSpeed would silently use its default (set a number or remove the key)",
    ),
    (
        {**BATCH, "zero_optimization": {"stage3_param_persistence_threshold": "auto"}},
        {"hidden_size": 64},
        'zero_optimization.stage3_param_persistence_threshold: "auto" is filled only at ZeRO stage 3, and this'
        " config has no stage (0); DeepSpeed would silently use its default (set a number or remove the key)",
    ),
    (
        {**AUTO_BATCH, "zero_optimization": {"stage": 3, "stage3_gather_16bit_weights_on_model_save": "auto"}},
        {"training": Training()},
        'zero_optimization.stage3_gather_16bit_weights_on_model_save: "auto" is filled by Accelerate\'s DeepSpeed'
        " plugin, not by the HF Trainer; DeepSpeed alone would silently use its default (set true to save a"
        " usable 16-bit model at stage 3, or false)",
    ),
    (
        {**AUTO_BATCH, "zero_optimization": {"stage": "auto"}},
        {"training": Training()},
        'zero_optimization.stage: "auto" is filled by Accelerate\'s DeepSpeed plugin, not by the HF Trainer;'
        " DeepSpeed alone would silently use its default (set 0, 1, 2 or 3)",
    ),
    (
        {**AUTO_BATCH, "zero_optimization": {"stage": 3, "stage3_max_live_parameters": "auto"}},
        {"training": Training()},
        'zero_optimization.stage3_max_live_parameters: "auto" is not filled by the HF Trainer; DeepSpeed would'
        " silently use its default (set a value or remove the key)",
    ),
    (
        {**AUTO_BATCH, "scheduler": {"type": "OneCycle", "params": {"cycle_max_lr": "auto"}}},
        {"training": Training()},
        'scheduler.params.cycle_max_lr: "auto" is not filled by the HF Trainer; DeepSpeed would silently use its'
        " default (set a value or remove the key)",
    ),
    (
        {**AUTO_BATCH, "optimizer": {"type": "SGD", "params": {"lr": "auto", "momentum": "auto"}}},
        {"training": Training()},
        'optimizer.params.momentum: "auto" is not filled by the HF Trainer; DeepSpeed would silently use its'
        " default (set a value or remove the key)",
    ),
    (
        {**BATCH, "checkpoint": {"use_node_local_storage": "auto"}},
        {},
        'checkpoint.use_node_local_storage: "auto" needs the training argument save_on_each_node (pass training=...)',
    ),
]


@pytest.mark.parametrize(("data", "kwargs", "expected"), LEFTOVERS)
def test_an_auto_nothing_fills_names_what_would(data: dict[str, Any], kwargs: dict[str, Any], expected: str) -> None:
    assert lines(error(data, UnresolvedAutoError, **kwargs)) == [expected]


def test_every_leftover_is_reported_at_once_in_file_order() -> None:
    err = error(HF_ALL_AUTO, UnresolvedAutoError, world_size=8)
    assert [p.path for p in err.problems] == [
        "train_batch_size",
        "train_micro_batch_size_per_gpu",
        "gradient_accumulation_steps",
        "fp16.enabled",
        "bf16.enabled",
        "optimizer.params.lr",
        "optimizer.params.betas",
        "optimizer.params.eps",
        "optimizer.params.weight_decay",
        "scheduler.params.total_num_steps",
        # warmup_min_lr needs nothing: HF fills it with 0 whatever the arguments
        "scheduler.params.warmup_max_lr",
        "scheduler.params.warmup_num_steps",
        "zero_optimization.reduce_bucket_size",
        "zero_optimization.stage3_prefetch_bucket_size",
        "zero_optimization.stage3_param_persistence_threshold",
        "gradient_clipping",
    ]


def test_deepspeeds_own_auto_is_kept() -> None:
    """data_types.keep_in_fp32_modules = "auto" is DeepSpeed's, not HF's: it stays."""
    data = {**BATCH, "data_types": {"keep_in_fp32_modules": "auto"}}
    assert run(data)["data_types"] == {"keep_in_fp32_modules": "auto"}


def test_conflicts_come_before_leftovers() -> None:
    data = {**BATCH, "gradient_clipping": 2.0, "zero_optimization": {"reduce_bucket_size": "auto"}}
    err = error(data, ConflictError, training=Training(per_device_train_batch_size=2, max_grad_norm=0.5))
    assert [p.path for p in err.problems] == ["gradient_clipping"]
