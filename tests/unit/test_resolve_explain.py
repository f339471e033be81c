"""resolve(): purity, idempotence, explicit values kept, and explain()'s provenance of every value."""

from __future__ import annotations

from types import SimpleNamespace as NS
from typing import Any

import attrs
import pytest
from _resolve_helpers import AUTO_BATCH, BATCH, HF_ALL_AUTO, TRAINING, run

from dsbuild import AUTO, Config, UnresolvedAutoError
from dsbuild.config.walk import auto_paths
from dsbuild.resolve.explain import Explanation, explain, render_explanation
from dsbuild.resolve.resolution import resolve
from dsbuild.resolve.training import Training


def validate_all(obj: Any) -> None:
    """Run every attrs validator of ``obj`` and its sections (resolve builds them without validators)."""
    attrs.validate(obj)
    for a in attrs.fields(type(obj)):
        value = getattr(obj, a.name)
        if attrs.has(type(value)):
            validate_all(value)


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
