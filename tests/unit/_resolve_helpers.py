"""Shared by the tests/unit/test_resolve_*.py files: the batches, the HF "auto" config, and runners of resolve()."""

from __future__ import annotations

from typing import Any

import pytest

from dsbuild import Config, ConfigError
from dsbuild.resolve.resolution import resolve
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
