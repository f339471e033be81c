"""resolve(): the HF Trainer's "auto" table row by row, conflicts, leftovers, the batch triangle, explain()."""

from __future__ import annotations

import enum
from pathlib import Path
from types import SimpleNamespace as NS
from typing import Any

import attrs
import pytest

from dsbuild import (
    AUTO,
    Config,
    ConfigError,
    ConflictError,
    InvalidValueError,
    UnknownKeyError,
    UnresolvedAutoError,
)
from dsbuild.config.walk import auto_paths
from dsbuild.resolve.explain import Explanation, explain, render_explanation
from dsbuild.resolve.resolution import model_hidden_size, resolve
from dsbuild.resolve.training import Training

BATCH = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1}
"""A valid batch at any world size, so rows about other keys need no training arguments."""

AUTO_BATCH = {"train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto"}
"""The batch for rows with training arguments: taken from them, so it never disagrees."""


def run(data: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
    """The ds_config dict of ``data`` resolved with ``kwargs``."""
    return resolve(Config.from_dict(data), **kwargs).to_dict()


def error(data: dict[str, Any] | Config, cls: type[ConfigError] = ConfigError, **kwargs: Any) -> ConfigError:
    """The error ``resolve`` raises for ``data`` (exactly of class ``cls``)."""
    config = data if isinstance(data, Config) else Config.from_dict(data)
    with pytest.raises(cls) as info:
        resolve(config, **kwargs)
    assert type(info.value) is cls
    return info.value


def lines(err: ConfigError) -> list[str]:
    return [str(p) for p in err.problems]


def validate_all(obj: Any) -> None:
    """Run every attrs validator of ``obj`` and its sections (resolve builds them without validators)."""
    attrs.validate(obj)
    for a in attrs.fields(type(obj)):
        value = getattr(obj, a.name)
        if attrs.has(type(value)):
            validate_all(value)


HF_ALL_AUTO: dict[str, Any] = {
    "fp16": {"enabled": "auto", "loss_scale": 0},
    "bf16": {"enabled": "auto"},
    "optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"}},
    "scheduler": {
        "type": "WarmupDecayLR",
        "params": {
            "warmup_min_lr": "auto",
            "warmup_max_lr": "auto",
            "warmup_num_steps": "auto",
            "total_num_steps": "auto",
        },
    },
    "zero_optimization": {
        "stage": 3,
        "reduce_bucket_size": "auto",
        "stage3_prefetch_bucket_size": "auto",
        "stage3_param_persistence_threshold": "auto",
    },
    "gradient_accumulation_steps": "auto",
    "gradient_clipping": "auto",
    "train_batch_size": "auto",
    "train_micro_batch_size_per_gpu": "auto",
}
"""transformers' own tests/deepspeed ds_config_zero3.json, every HF "auto" in place."""

TRAINING = Training(
    learning_rate=3e-5,
    weight_decay=0.1,
    adam_beta1=0.8,
    adam_beta2=0.95,
    adam_epsilon=1e-6,
    per_device_train_batch_size=4,
    gradient_accumulation_steps=2,
    max_grad_norm=0.5,
    warmup_steps=10,
    bf16=True,
)


def resolved_hf(**kwargs: Any) -> dict[str, Any]:
    args: dict[str, Any] = {"world_size": 8, "training": TRAINING, "hidden_size": 64, "total_steps": 1000}
    return run(HF_ALL_AUTO, **{**args, **kwargs})


# -- the HF table, row by row ----------------------------------------------------


def test_every_hf_auto_of_a_zero3_config_is_filled() -> None:
    """The whole table at once: the transformers test config resolves to the HF Trainer's values."""
    assert resolved_hf() == {
        "train_batch_size": 64,
        "train_micro_batch_size_per_gpu": 4,
        "gradient_accumulation_steps": 2,
        "fp16": {"enabled": False, "loss_scale": 0},
        "bf16": {"enabled": True},
        "optimizer": {"type": "AdamW", "params": {"lr": 3e-5, "betas": [0.8, 0.95], "eps": 1e-6, "weight_decay": 0.1}},
        "scheduler": {
            "type": "WarmupDecayLR",
            "params": {"total_num_steps": 1000, "warmup_min_lr": 0, "warmup_max_lr": 3e-5, "warmup_num_steps": 10},
        },
        "zero_optimization": {
            "stage": 3,
            "reduce_bucket_size": 4096,
            "stage3_prefetch_bucket_size": 3686,
            "stage3_param_persistence_threshold": 640,
        },
        "gradient_clipping": 0.5,
    }


@pytest.mark.parametrize(
    ("key", "training", "world_size", "expected"),
    [
        ("train_micro_batch_size_per_gpu", Training(per_device_train_batch_size=3), 1, 3),
        ("gradient_accumulation_steps", Training(gradient_accumulation_steps=5), 1, 5),
        ("train_batch_size", Training(per_device_train_batch_size=3, gradient_accumulation_steps=5), 4, 60),
        ("gradient_clipping", Training(max_grad_norm=0.0), 1, 0.0),
    ],
)
def test_top_level_rows(key: str, training: Training, world_size: int, expected: Any) -> None:
    """Batch sizes and clipping come from per_device_train_batch_size, gradient_accumulation_steps, max_grad_norm."""
    data = {"train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto", key: "auto"}
    assert run(data, training=training, world_size=world_size)[key] == expected


@pytest.mark.parametrize("optimizer", ["AdamW", "Adam", "Lamb", "Lion"])
def test_optimizer_rows(optimizer: str) -> None:
    """lr, betas (a list), eps and weight_decay of every DeepSpeed optimizer that has them."""
    params = {"lr": "auto", "betas": "auto", "weight_decay": "auto"}
    if optimizer != "Lion":
        params["eps"] = "auto"
    out = run({**AUTO_BATCH, "optimizer": {"type": optimizer, "params": params}}, training=TRAINING)
    expected = {"lr": 3e-5, "betas": [0.8, 0.95], "weight_decay": 0.1}
    if optimizer != "Lion":
        expected["eps"] = 1e-6
    assert out["optimizer"]["params"] == expected


def test_a_torch_optimizer_gets_lists_in_its_free_params() -> None:
    """A torch optimizer's params table is filled by the same keys; betas is a list, like a file's."""
    config = Config.from_dict(
        {**AUTO_BATCH, "optimizer": {"type": "AdamW8bit", "params": {"lr": "auto", "betas": "auto"}}}
    )
    resolved = resolve(config, training=TRAINING)
    assert resolved.optimizer_config is not None
    assert resolved.optimizer_config.params == {"lr": 3e-5, "betas": [0.8, 0.95]}
    assert Config.from_dict(resolved.to_dict()) == resolved


def test_warmup_min_lr_is_filled_with_zero_and_never_checked() -> None:
    """HF fills warmup_min_lr with 0 (not a training argument) and leaves an explicit one alone."""
    auto = {**BATCH, "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": "auto"}}}
    assert run(auto)["scheduler"]["params"] == {"warmup_min_lr": 0}
    explicit = {**AUTO_BATCH, "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 1e-7}}}
    assert run(explicit, training=TRAINING)["scheduler"]["params"] == {"warmup_min_lr": 1e-7}


def test_warmup_max_lr_is_the_learning_rate() -> None:
    data = {**AUTO_BATCH, "scheduler": {"type": "WarmupLR", "params": {"warmup_max_lr": "auto"}}}
    assert run(data, training=TRAINING)["scheduler"]["params"] == {"warmup_max_lr": 3e-5}


@pytest.mark.parametrize(
    ("training", "total_steps", "expected"),
    [
        (Training(warmup_steps=10), None, 10),
        (Training(warmup_steps=2.7), None, 2),  # HF: int(warmup_steps) when >= 1
        (Training(warmup_steps=0), None, 1),  # at least 1: DeepSpeed >= 0.19.6 refuses 0
        (Training(warmup_steps=0.1), 1000, 100),  # HF 5: below 1 is a ratio of the run's steps
        (Training(warmup_steps=0.001), 999, 1),  # ceil(0.999)
        (Training(warmup_ratio=0.05), 1000, 50),  # HF 4 spelling, used when warmup_steps is 0
        (Training(warmup_steps=7, warmup_ratio=0.5), 1000, 7),  # warmup_steps wins, as in HF 4
        (Training(warmup_steps=0.1, max_steps=300), None, 30),  # the run's steps from max_steps
    ],
)
def test_warmup_num_steps(training: Training, total_steps: int | None, expected: int) -> None:
    """max(1, warmup_steps if >= 1 else ceil(total_steps x warmup_steps)), as HF's get_warmup_steps."""
    data = {**AUTO_BATCH, "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": "auto"}}}
    out = run(data, training=training, total_steps=total_steps)
    assert out["scheduler"]["params"]["warmup_num_steps"] == expected


@pytest.mark.parametrize("scheduler", ["WarmupDecayLR", "WarmupCosineLR"])
def test_total_num_steps_is_the_runs_steps(scheduler: str) -> None:
    data = {
        **AUTO_BATCH,
        "scheduler": {"type": scheduler, "params": {"total_num_steps": "auto", "warmup_num_steps": "auto"}},
    }
    assert run(data, training=Training(), total_steps=500)["scheduler"]["params"] == {
        "total_num_steps": 500,
        "warmup_num_steps": 1,
    }
    with_max_steps = run(data, training=Training(max_steps=200))
    assert with_max_steps["scheduler"]["params"]["total_num_steps"] == 200


def test_the_total_steps_argument_wins_over_max_steps() -> None:
    data = {**AUTO_BATCH, "scheduler": {"type": "WarmupDecayLR", "params": {"total_num_steps": "auto"}}}
    assert run(data, training=Training(max_steps=200), total_steps=300)["scheduler"]["params"] == {
        "total_num_steps": 300
    }


@pytest.mark.parametrize(
    ("training", "fp16", "bf16"),
    [
        (Training(), False, False),
        (Training(fp16=True), True, False),
        (Training(bf16=True), False, True),
        (Training(fp16_full_eval=True), True, False),
        (Training(bf16_full_eval=True), False, True),
    ],
)
def test_precision_rows(training: Training, fp16: bool, bf16: bool) -> None:
    """fp16.enabled is fp16 or fp16_full_eval; bf16.enabled is bf16 or bf16_full_eval (HF)."""
    out = run({**AUTO_BATCH, "fp16": {"enabled": "auto"}, "bf16": {"enabled": "auto"}}, training=training)
    assert (out["fp16"]["enabled"], out["bf16"]["enabled"]) == (fp16, bf16)


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_reduce_bucket_size_is_hidden_size_squared_at_any_stage(stage: int) -> None:
    data = {**BATCH, "zero_optimization": {"stage": stage, "reduce_bucket_size": "auto"}}
    assert run(data, hidden_size=4096)["zero_optimization"]["reduce_bucket_size"] == 4096 * 4096


def test_stage3_buckets_from_the_hidden_size() -> None:
    """0.9 x hidden_size² (truncated, as int() in HF) and 10 x hidden_size, at stage 3."""
    data = {
        **BATCH,
        "zero_optimization": {
            "stage": 3,
            "stage3_prefetch_bucket_size": "auto",
            "stage3_param_persistence_threshold": "auto",
        },
    }
    assert run(data, hidden_size=4097)["zero_optimization"] == {
        "stage": 3,
        "stage3_prefetch_bucket_size": int(0.9 * 4097 * 4097),
        "stage3_param_persistence_threshold": 40970,
    }


def test_save_on_each_node_sets_node_local_storage() -> None:
    """HF sets checkpoint.use_node_local_storage when save_on_each_node; dsbuild fills only an unset or "auto" key."""
    assert run(AUTO_BATCH, training=Training(save_on_each_node=True))["checkpoint"] == {"use_node_local_storage": True}
    assert "checkpoint" not in run(AUTO_BATCH, training=Training())
    auto = {**AUTO_BATCH, "checkpoint": {"use_node_local_storage": "auto", "tag_validation": "Warn"}}
    assert run(auto, training=Training())["checkpoint"] == {"use_node_local_storage": False, "tag_validation": "Warn"}
    explicit_false = {**AUTO_BATCH, "checkpoint": {"use_node_local_storage": False}}
    err = error(explicit_false, ConflictError, training=Training(save_on_each_node=True))
    assert lines(err) == [
        'checkpoint.use_node_local_storage: false disagrees with save_on_each_node = true (set the key to "auto" or to true)'
    ]


def test_sequence_parallel_counts_data_parallel_ranks() -> None:
    """DeepSpeed's triangle uses world size / sequence_parallel_size; so does the filled train_batch_size."""
    data = {"sequence_parallel_size": 4, "train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto"}
    out = run(data, world_size=8, training=Training(per_device_train_batch_size=2, gradient_accumulation_steps=3))
    assert out["train_batch_size"] == 2 * 3 * 2
    err = error({"sequence_parallel_size": 4, **BATCH}, InvalidValueError, world_size=6)
    assert lines(err) == ["sequence_parallel_size: 4 does not divide the world size 6"]


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


# -- the batch triangle ----------------------------------------------------------------

TRIANGLES: list[tuple[dict[str, Any], int, tuple[int, int, int]]] = [
    ({"train_batch_size": 64, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2}, 8, (64, 4, 2)),
    ({"train_batch_size": 64, "train_micro_batch_size_per_gpu": 4}, 8, (64, 4, 2)),
    ({"train_batch_size": 64, "gradient_accumulation_steps": 2}, 8, (64, 4, 2)),
    ({"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2}, 8, (64, 4, 2)),
    ({"train_batch_size": 64}, 8, (64, 8, 1)),  # DeepSpeed: accumulation 1, micro = total / world size
    ({"train_micro_batch_size_per_gpu": 4}, 8, (32, 4, 1)),  # DeepSpeed: accumulation 1
    ({"train_batch_size": 12}, 1, (12, 12, 1)),
    (
        {"train_batch_size": "auto", "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2},
        8,
        (64, 4, 2),
    ),
    (
        {"train_batch_size": 64, "train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": 2},
        8,
        (64, 4, 2),
    ),
    (
        {"train_batch_size": 64, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": "auto"},
        8,
        (64, 4, 2),
    ),
    ({"train_batch_size": 64, "train_micro_batch_size_per_gpu": "auto"}, 8, (64, 8, 1)),
]


@pytest.mark.parametrize(("given", "world_size", "expected"), TRIANGLES)
def test_batch_triangle_derives_and_writes_all_three(
    given: dict[str, Any], world_size: int, expected: tuple[int, int, int]
) -> None:
    """Any two give the third; one alone follows DeepSpeed's _set_batch_related_parameters; "auto" is derived."""
    out = run(given, world_size=world_size)
    assert (
        out["train_batch_size"],
        out["train_micro_batch_size_per_gpu"],
        out["gradient_accumulation_steps"],
    ) == expected


NOT_SET = (
    "train_micro_batch_size_per_gpu: not set; DeepSpeed needs train_batch_size or train_micro_batch_size_per_gpu"
    ' (set it to a number, or to "auto" and give the training arguments)'
)

NOT_A_MULTIPLE = (
    " (use a multiple of {}, or set train_micro_batch_size_per_gpu and gradient_accumulation_steps instead)"
)
"""The hint of a train_batch_size that the other sizes do not divide (the same words as validate's: dsbuild.resolve.batch)."""

BAD_TRIANGLES: list[tuple[dict[str, Any], int, str]] = [
    (
        {"train_batch_size": 60, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2},
        8,
        "train_batch_size: 60 != train_micro_batch_size_per_gpu 4 x gradient_accumulation_steps 2 x world size 8 = 64"
        " (set train_batch_size 64, or leave it out and let DeepSpeed derive it)",
    ),
    (
        {"train_batch_size": 60, "train_micro_batch_size_per_gpu": 4},
        8,
        "train_batch_size: 60 is not a multiple of train_micro_batch_size_per_gpu 4 x world size 8 = 32"
        + NOT_A_MULTIPLE.format(32),
    ),
    (
        {"train_batch_size": 16, "train_micro_batch_size_per_gpu": 4},
        8,
        "train_batch_size: 16 is not a multiple of train_micro_batch_size_per_gpu 4 x world size 8 = 32"
        + NOT_A_MULTIPLE.format(32),
    ),
    (
        {"train_batch_size": 60, "gradient_accumulation_steps": 4},
        8,
        "train_batch_size: 60 is not a multiple of gradient_accumulation_steps 4 x world size 8 = 32"
        + NOT_A_MULTIPLE.format(32),
    ),
    ({"train_batch_size": 12}, 8, "train_batch_size: 12 is not a multiple of world size 8" + NOT_A_MULTIPLE.format(8)),
    ({"gradient_accumulation_steps": 4}, 8, NOT_SET),
    ({}, 1, NOT_SET),
]


@pytest.mark.parametrize(("given", "world_size", "expected"), BAD_TRIANGLES)
def test_batch_triangle_that_does_not_divide_shows_the_numbers(
    given: dict[str, Any], world_size: int, expected: str
) -> None:
    assert lines(error(given, InvalidValueError, world_size=world_size)) == [expected]


def test_one_known_batch_size_and_an_auto_accumulation_is_left_unresolved() -> None:
    """DeepSpeed's default accumulation of 1 applies to an unset key, never to an "auto" one."""
    err = error({"train_batch_size": 64, "gradient_accumulation_steps": "auto"}, UnresolvedAutoError, world_size=8)
    assert [p.path for p in err.problems] == ["gradient_accumulation_steps"]


# -- the hidden size -------------------------------------------------------------------

ZERO3_BUCKETS = {**BATCH, "zero_optimization": {"stage": 3, "reduce_bucket_size": "auto"}}


@pytest.mark.parametrize(
    ("model", "expected"),
    [
        (NS(config=NS(hidden_size=64)), 64),
        (NS(config=NS(hidden_sizes=[32, 96, 64])), 96),
        (NS(config=NS(text_config=NS(hidden_size=48))), 48),
        (NS(config=NS(text_config=NS(hidden_sizes=[8, 24]))), 24),
        (NS(config=NS(hidden_size=16, hidden_sizes=[99], text_config=NS(hidden_size=99))), 16),
        (NS(hidden_size=40), 40),  # a model config itself
        (NS(text_config=NS(hidden_size=12)), 12),
        ({"hidden_size": 20}, 20),  # a config table (config.json)
        (NS(config={"text_config": {"hidden_sizes": [4, 6]}}), 6),
    ],
)
def test_hidden_size_lookup(model: Any, expected: int) -> None:
    """model.config.hidden_size, else max(hidden_sizes), else the same under text_config; a config works too."""
    assert model_hidden_size(model) == expected
    assert run(ZERO3_BUCKETS, model=model)["zero_optimization"]["reduce_bucket_size"] == expected * expected


def test_hidden_size_argument_wins_over_the_model() -> None:
    resolved = resolve(Config.from_dict(ZERO3_BUCKETS), model=NS(config=NS(hidden_size=64)), hidden_size=8)
    assert resolved.to_dict()["zero_optimization"]["reduce_bucket_size"] == 64
    assert resolved.provenance["zero_optimization.reduce_bucket_size"] == "hidden_size argument 8 (hidden size²)"


def test_the_model_is_not_read_when_no_key_needs_it() -> None:
    """As HF: the hidden size is looked up only for an "auto" that needs it."""
    assert run(BATCH, model=NS(config=NS())) == {"train_batch_size": 2, **BATCH}


# -- arguments -------------------------------------------------------------------------------


class SchedulerType(str, enum.Enum):
    """Like transformers' SchedulerType: a string enum."""

    LINEAR = "linear"
    COSINE = "cosine"


def test_training_may_be_any_object_with_the_hf_names() -> None:
    """A TrainingArguments stand-in: its attributes are read, missing ones take Training's defaults."""
    args = NS(learning_rate=1e-3, per_device_train_batch_size=2, bf16=True, lr_scheduler_type=SchedulerType.LINEAR)
    out = run(HF_ALL_AUTO, training=args, hidden_size=8, total_steps=10)
    assert out["optimizer"]["params"] == {"lr": 1e-3, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.0}
    assert (out["train_micro_batch_size_per_gpu"], out["gradient_accumulation_steps"]) == (2, 1)
    assert (out["fp16"]["enabled"], out["bf16"]["enabled"]) == (False, True)
    assert out["gradient_clipping"] == 1.0


def test_a_bad_training_object_names_its_fields() -> None:
    err = error(BATCH, InvalidValueError, training=NS(learning_rate=-1, per_device_train_batch_size=0))
    assert lines(err) == [
        "training.learning_rate: got -1, expected a number >= 0",
        "training.per_device_train_batch_size: got 0, expected an integer > 0",
    ]


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        ({"world_size": 0}, ["world_size: got 0, expected an integer > 0"]),
        ({"world_size": True}, ["world_size: got true, expected an integer > 0"]),
        ({"world_size": None}, ["world_size: got None, expected an integer > 0"]),
        (
            {"hidden_size": 0, "total_steps": -1},
            ["hidden_size: got 0, expected an integer > 0", "total_steps: got -1, expected an integer >= 0"],
        ),
        ({"total_steps": 10.0}, ["total_steps: got 10.0, expected an integer >= 0"]),
    ],
)
def test_bad_arguments(kwargs: dict[str, Any], expected: list[str]) -> None:
    assert lines(error(BATCH, InvalidValueError, **kwargs)) == expected


# -- purity, idempotence, explicit values ----------------------------------------------


def test_resolve_is_pure_and_idempotent() -> None:
    config = Config.from_dict(HF_ALL_AUTO)
    before = config.to_dict()
    args: dict[str, Any] = {"world_size": 8, "training": TRAINING, "hidden_size": 64, "total_steps": 1000}
    once = resolve(config, **args)
    assert config.to_dict() == before and config.provenance == {}
    twice = resolve(once, **args)
    assert twice == once
    assert twice.provenance == once.provenance
    assert resolve(once, world_size=8) == once  # nothing left to fill: no arguments needed


def test_a_config_with_nothing_to_fill_comes_back_unchanged() -> None:
    config = Config.from_dict(
        {"train_batch_size": 8, "train_micro_batch_size_per_gpu": 8, "gradient_accumulation_steps": 1}
    )
    assert resolve(config) is config


def test_explicit_values_are_never_changed() -> None:
    data = {
        **BATCH,
        "train_batch_size": 16,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "eps": "auto"}},
        "zero_optimization": {"stage": 3, "reduce_bucket_size": 10, "stage3_prefetch_bucket_size": "auto"},
    }
    out = run(data, world_size=8, hidden_size=4, training=Training(per_device_train_batch_size=2, learning_rate=1e-4))
    assert out["optimizer"]["params"] == {"lr": 1e-4, "eps": 1e-8}
    assert out["zero_optimization"] == {"stage": 3, "reduce_bucket_size": 10, "stage3_prefetch_bucket_size": 14}


def test_keys_left_for_another_tool_keep_their_auto_and_are_not_checked() -> None:
    """``leave`` (what Accelerate fills): those "auto" stay, an explicit value there is the tool's business, the batch
    triangle waits for it; every other "auto" is filled or reported as before."""
    data = {
        **AUTO_BATCH,
        "train_batch_size": "auto",
        "optimizer": {"type": "AdamW", "params": {"lr": 0.5, "eps": "auto", "weight_decay": "auto"}},
    }
    leave = {*AUTO_BATCH, "train_batch_size", "optimizer.params.lr", "optimizer.params.weight_decay"}
    out = run(data, world_size=8, training=Training(learning_rate=1e-3, adam_epsilon=1e-6), leave=leave)
    assert {k: out[k] for k in ("train_batch_size", *AUTO_BATCH)} == dict.fromkeys(
        ("train_batch_size", *AUTO_BATCH), "auto"
    )
    assert out["optimizer"]["params"] == {"lr": 0.5, "eps": 1e-6, "weight_decay": "auto"}
    with pytest.raises(UnresolvedAutoError) as caught:
        run(data, leave=leave)
    assert [p.path for p in caught.value.problems] == ["optimizer.params.eps"]


def test_resolved_sections_pass_their_validators() -> None:
    """resolve builds sections without re-running validators: every value it writes must fit anyway."""
    resolved = resolve(Config.from_dict(HF_ALL_AUTO), world_size=8, training=TRAINING, hidden_size=64, total_steps=1)
    validate_all(resolved)
    assert Config.from_dict(resolved.to_dict()) == resolved
    assert auto_paths(resolved) == []


def test_config_resolve_is_wired() -> None:
    config = Config.from_dict(HF_ALL_AUTO)
    args: dict[str, Any] = {"world_size": 2, "training": TRAINING, "hidden_size": 64, "total_steps": 1000}
    assert config.resolve(**args) == resolve(config, **args)


def test_builder_autos_resolve() -> None:
    config = (
        Config.zero(3)
        .bf16()
        .adamw(lr=AUTO, weight_decay=AUTO)
        .warmup_decay_lr(warmup_steps=AUTO, total_steps=AUTO)
        .batch(micro=AUTO, grad_accum=AUTO)
        .clip_grad(AUTO)
    )
    out = config.resolve(world_size=4, training=TRAINING, total_steps=100).to_dict()
    assert out["train_batch_size"] == 32
    assert out["scheduler"]["params"] == {"total_num_steps": 100, "warmup_num_steps": 10}


# -- explain ---------------------------------------------------------------------------------


def test_explain_a_resolved_config() -> None:
    config = attrs.evolve(Config.from_dict(HF_ALL_AUTO), source="preset zero3")
    resolved = resolve(config, world_size=8, training=TRAINING, model=NS(config=NS(hidden_size=64)), total_steps=1000)
    found = {e.path: (e.value, e.origin) for e in explain(resolved)}
    assert found == {
        "train_batch_size": (
            64,
            "training arguments: world size 8 × per_device_train_batch_size 4 × gradient_accumulation_steps 2",
        ),
        "train_micro_batch_size_per_gpu": (4, "training argument per_device_train_batch_size"),
        "gradient_accumulation_steps": (2, "training argument gradient_accumulation_steps"),
        "fp16.enabled": (False, "training arguments fp16, fp16_full_eval"),
        "fp16.loss_scale": (0, "preset zero3"),
        "bf16.enabled": (True, "training arguments bf16, bf16_full_eval"),
        "optimizer.type": ("AdamW", "preset zero3"),
        "optimizer.params.lr": (3e-5, "training argument learning_rate"),
        "optimizer.params.betas": ([0.8, 0.95], "training arguments adam_beta1, adam_beta2"),
        "optimizer.params.eps": (1e-6, "training argument adam_epsilon"),
        "optimizer.params.weight_decay": (0.1, "training argument weight_decay"),
        "scheduler.type": ("WarmupDecayLR", "preset zero3"),
        "scheduler.params.total_num_steps": (1000, "total_steps argument"),
        "scheduler.params.warmup_min_lr": (0, "the HF Trainer's 0 (not a training argument)"),
        "scheduler.params.warmup_max_lr": (3e-5, "training argument learning_rate"),
        "scheduler.params.warmup_num_steps": (10, "training argument warmup_steps (at least 1)"),
        "zero_optimization.stage": (3, "preset zero3"),
        "zero_optimization.reduce_bucket_size": (4096, "hidden size 64 of the model (hidden size²)"),
        "zero_optimization.stage3_prefetch_bucket_size": (3686, "hidden size 64 of the model (0.9 × hidden size²)"),
        "zero_optimization.stage3_param_persistence_threshold": (640, "hidden size 64 of the model (10 × hidden size)"),
        "gradient_clipping": (0.5, "training argument max_grad_norm"),
    }
    assert [e.path for e in explain(resolved)] == list(resolved_paths(resolved))  # to_dict's order


def resolved_paths(config: Config) -> list[str]:
    out: list[str] = []

    def walk(d: dict[str, Any], prefix: str) -> None:
        for k, v in d.items():
            if isinstance(v, dict) and v:
                walk(v, f"{prefix}{k}.")
            else:
                out.append(f"{prefix}{k}")

    walk(config.to_dict(), "")
    return out


def test_explain_a_config_never_resolved() -> None:
    config = Config.from_dict({"train_batch_size": 8, "optimizer": {"type": "AdamW", "params": {"lr": "auto"}}})
    assert explain(config) == [
        Explanation("train_batch_size", 8, "set by the user"),
        Explanation("optimizer.type", "AdamW", "set by the user"),
        Explanation("optimizer.params.lr", "auto", "set by the user"),
    ]
    assert config.explain() == explain(config)


def test_explain_records_the_batch_triangle() -> None:
    resolved = Config.from_dict({"train_batch_size": 64, "train_micro_batch_size_per_gpu": 4}).resolve(world_size=8)
    assert [(e.path, e.origin) for e in explain(resolved)] == [
        ("train_batch_size", "set by the user"),
        ("train_micro_batch_size_per_gpu", "set by the user"),
        ("gradient_accumulation_steps", "batch triangle: train_batch_size 64 / (micro 4 × world size 8)"),
    ]
    only_micro = Config.from_dict({"train_micro_batch_size_per_gpu": 4}).resolve(world_size=2)
    assert [e.origin for e in explain(only_micro)] == [
        "batch triangle: micro 4 × accumulation 1 × world size 2",
        "set by the user",
        "DeepSpeed's default when gradient_accumulation_steps is not set",
    ]


def test_render_explanation_aligns_columns() -> None:
    text = render_explanation(
        [
            Explanation("train_batch_size", 64, "batch triangle"),
            Explanation("optimizer.params.betas", [0.9, 0.95], "training arguments adam_beta1, adam_beta2"),
            Explanation("bf16.enabled", True, "set by the user"),
        ]
    )
    assert text.splitlines() == [
        "train_batch_size        64           batch triangle",
        "optimizer.params.betas  [0.9, 0.95]  training arguments adam_beta1, adam_beta2",
        "bf16.enabled            true         set by the user",
    ]
    assert render_explanation([]) == ""
    assert str(Explanation("a.b", "auto", "set by the user")) == 'a.b = "auto"  (set by the user)'


# -- Training ---------------------------------------------------------------------------------


def test_training_defaults_are_hfs() -> None:
    t = Training()
    assert (t.learning_rate, t.weight_decay, t.adam_beta1, t.adam_beta2, t.adam_epsilon) == (
        5e-5,
        0.0,
        0.9,
        0.999,
        1e-8,
    )
    assert (t.per_device_train_batch_size, t.per_device_eval_batch_size, t.gradient_accumulation_steps) == (8, 8, 1)
    assert (t.max_grad_norm, t.warmup_steps, t.warmup_ratio, t.num_train_epochs, t.max_steps) == (1.0, 0, 0.0, 3.0, -1)
    assert (t.lr_scheduler_type, t.bf16, t.fp16, t.seed) == ("linear", False, False, 42)
    assert (t.logging_steps, t.save_steps, t.save_total_limit, t.output_dir, t.save_on_each_node) == (
        500,
        500,
        None,
        None,
        False,
    )


def test_training_reports_every_problem_at_once() -> None:
    bad: dict[str, Any] = {
        "learning_rate": -1,
        "per_device_train_batch_size": 0,
        "gradient_accumulation_steps": 1.5,
        "adam_beta2": 1.0,
        "warmup_steps": -2,
        "lr_scheduler_type": "cosin",
        "bf16": True,
        "fp16": True,
        "logging_steps": 2.5,
        "save_total_limit": -1,
        "seed": None,
        "max_grad_norm": "1",
    }
    with pytest.raises(InvalidValueError) as info:
        Training(**bad)
    assert lines(info.value) == [
        "training.learning_rate: got -1, expected a number >= 0",
        "training.per_device_train_batch_size: got 0, expected an integer > 0",
        "training.gradient_accumulation_steps: got 1.5, expected an integer > 0",
        "training.max_grad_norm: got '1', expected a number >= 0",
        "training.warmup_steps: got -2, expected a number >= 0",
        "training.lr_scheduler_type: got 'cosin', expected one of 'linear', 'cosine', 'cosine_with_restarts',"
        " 'polynomial', 'constant', 'constant_with_warmup', 'inverse_sqrt', 'reduce_lr_on_plateau',"
        " 'cosine_with_min_lr', 'cosine_warmup_with_min_lr', 'warmup_stable_decay', 'greedy'",
        "training.seed: got None, expected an integer >= 0",
        "training.save_total_limit: got -1, expected an integer >= 0",
        "training.adam_beta2: got 1.0, expected a number >= 0 and < 1",
        "training.logging_steps: got 2.5, expected a whole number above 1 (or a fraction below 1)",
        "training.bf16: true together with fp16; at most one of fp16 and bf16 can be true",
    ]


def test_training_from_dict() -> None:
    """A job's [training] table: names checked with "did you mean", numbers as files spell them."""
    t = Training.from_dict({"learning_rate": "2e-5", "per_device_train_batch_size": 4.0, "bf16": True})
    assert (t.learning_rate, t.per_device_train_batch_size, t.bf16) == (2e-5, 4, True)
    assert Training.from_dict(t.to_dict()) == t
    with pytest.raises(UnknownKeyError) as unknown:
        Training.from_dict({"learning_rat": 1e-4, "gradient_acumulation_steps": 2})
    assert lines(unknown.value) == [
        "training.learning_rat: unknown key (did you mean 'learning_rate'?)",
        "training.gradient_acumulation_steps: unknown key (did you mean 'gradient_accumulation_steps'?)",
    ]
    with pytest.raises(ConfigError) as both:
        Training.from_dict({"lr": 1e-4, "seed": -1})
    assert type(both.value) is ConfigError
    assert lines(both.value) == ["training.lr: unknown key", "training.seed: got -1, expected an integer >= 0"]
    with pytest.raises(InvalidValueError, match="training: got 3, expected a table"):
        Training.from_dict(3)  # type: ignore[arg-type]


def test_training_of_reads_attributes() -> None:
    t = Training.of(NS(learning_rate=1e-3, lr_scheduler_type=SchedulerType.COSINE, output_dir="out", report_to="none"))
    assert (t.learning_rate, t.lr_scheduler_type, t.output_dir, t.seed) == (1e-3, "cosine", "out", 42)
    assert Training.of(t) is t


def test_training_output_dir_takes_a_path() -> None:
    assert Training(output_dir=Path("runs") / "a").output_dir == str(Path("runs") / "a")
    with pytest.raises(InvalidValueError, match=r"^training.output_dir: got 3, expected a string$"):
        Training(output_dir=3)  # type: ignore[arg-type]


def test_training_get_warmup_steps() -> None:
    """HF's TrainingArguments.get_warmup_steps, with HF 4's warmup_ratio when warmup_steps is 0."""
    assert Training(warmup_steps=10).get_warmup_steps(1000) == 10
    assert Training(warmup_steps=0.1).get_warmup_steps(1000) == 100
    assert Training(warmup_ratio=0.2).get_warmup_steps(1000) == 200
    assert Training().get_warmup_steps(1000) == 0


def test_micro_batches_of_an_epoch_under_sequence_and_tensor_parallelism() -> None:
    """What Session.fit's loader gives each rank: AutoTP groups read one share (world / tp replicas); a
    sequence-parallel rank takes a shard of each of its group's micro-batches (sp times its own)."""
    from dsbuild.resolve.training import micro_batches

    assert micro_batches(100, 4, 2, drop_last=False) == 13  # ceil(25 / 2)
    assert micro_batches(100, 4, 2, drop_last=False, tensor_parallel=2) == 25  # 50 samples each
    assert micro_batches(100, 4, 2, drop_last=False, sequence_parallel=2) == 26  # 13 of its own, 13 of its partner's
