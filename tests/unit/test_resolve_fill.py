"""resolve(): the HF Trainer's "auto" table row by row, and the hidden size its buckets come from."""

from __future__ import annotations

from types import SimpleNamespace as NS
from typing import Any

import pytest
from _resolve_helpers import AUTO_BATCH, BATCH, HF_ALL_AUTO, TRAINING, error, lines, run

from dsbuild import Config, ConflictError, InvalidValueError
from dsbuild.resolve.resolution import model_hidden_size, resolve
from dsbuild.resolve.training import Training


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
