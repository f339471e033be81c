"""The typed model and its fluent builder: verbs, sections, docstrings, and coverage of what DeepSpeed reads."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import pytest

from dsbuild import AUTO, Config, ConfigError, InvalidValueError, UnknownKeyError
from dsbuild._util.docstrings import attribute_docs
from dsbuild.config import (
    BF16,
    FP16,
    SCHEDULERS,
    ActivationCheckpointing,
    AdagradParams,
    AdamParams,
    ConfigFields,
    LambParams,
    LionParams,
    LRRangeTestParams,
    OffloadOptimizer,
    OffloadParam,
    OneCycleParams,
    Optimizer,
    Scheduler,
    TensorBoard,
    WarmupCosineLRParams,
    WarmupDecayLRParams,
    WarmupLRParams,
    ZeroOptimization,
    section_classes,
)
from dsbuild.config.fields import key_of

PARAMS_CLASSES: tuple[type[Any], ...] = (
    AdamParams,
    LambParams,
    LionParams,
    AdagradParams,
    WarmupLRParams,
    WarmupDecayLRParams,
    WarmupCosineLRParams,
    OneCycleParams,
    LRRangeTestParams,
)
NOT_KEYS = {"extra", "ignored", "coerced", "source", "provenance"}


def keys_of(cls: type[Any]) -> set[str]:
    """The ds_config keys a section class takes (its attrs aliases)."""
    return {key_of(a) for a in attrs.fields(cls) if a.name not in NOT_KEYS}


def message(exc: pytest.ExceptionInfo[ConfigError]) -> str:
    return str(exc.value)


# -- the builder -------------------------------------------------------------------


def test_design_example_builds_the_ds_config() -> None:
    """The example of DESIGN.md gives exactly DeepSpeed's keys, only what was set, AUTO as "auto"."""
    cfg = (
        Config.zero(3)
        .offload_cpu()
        .bf16()
        .adamw(lr=2e-5, weight_decay=0.01)
        .warmup_decay_lr(warmup_steps=AUTO, total_steps=AUTO)
        .batch(micro=2, grad_accum=8)
        .clip_grad(1.0)
        .comm_dtype("fp32")
    )
    assert cfg.to_dict() == {
        "train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": 8,
        "bf16": {"enabled": True},
        "optimizer": {"type": "AdamW", "params": {"lr": 2e-5, "weight_decay": 0.01}},
        "scheduler": {"type": "WarmupDecayLR", "params": {"total_num_steps": "auto", "warmup_num_steps": "auto"}},
        "zero_optimization": {
            "stage": 3,
            "offload_optimizer": {"device": "cpu", "pin_memory": True},
            "offload_param": {"device": "cpu", "pin_memory": True},
        },
        "gradient_clipping": 1.0,
        "communication_data_type": "fp32",
    }
    assert Config.from_dict(cfg.to_dict()) == cfg


VERBS: list[tuple[str, Callable[[Config], Config]]] = [
    ("zero", lambda c: c.zero(2)),
    ("offload_cpu", lambda c: c.zero(3).offload_cpu()),
    ("offload_nvme", lambda c: c.zero(3).offload_nvme("/nvme")),
    ("bf16", lambda c: c.bf16()),
    ("fp16", lambda c: c.fp16(loss_scale=0)),
    ("fp32", lambda c: c.fp32()),
    ("adamw", lambda c: c.adamw(lr=1e-4)),
    ("adam", lambda c: c.adam(lr=1e-4)),
    ("lamb", lambda c: c.lamb(lr=1e-4)),
    ("lion", lambda c: c.lion(lr=1e-4)),
    ("adagrad", lambda c: c.adagrad(lr=1e-4)),
    ("optimizer", lambda c: c.optimizer("SGD", lr=0.1)),
    ("warmup_lr", lambda c: c.warmup_lr(warmup_steps=10)),
    ("warmup_decay_lr", lambda c: c.warmup_decay_lr(total_steps=100)),
    ("warmup_cosine_lr", lambda c: c.warmup_cosine_lr(total_steps=100)),
    ("one_cycle", lambda c: c.one_cycle(cycle_min_lr=0.0, cycle_max_lr=0.1)),
    ("lr_range_test", lambda c: c.lr_range_test(lr_range_test_min_lr=1e-5)),
    ("batch", lambda c: c.batch(micro=4)),
    ("clip_grad", lambda c: c.clip_grad(0.5)),
    ("comm_dtype", lambda c: c.comm_dtype("bf16")),
    ("zero_options", lambda c: c.zero_options(overlap_comm=False)),
    ("set", lambda c: c.set(steps_per_print=5)),
]


@pytest.mark.parametrize(("name", "verb"), VERBS, ids=[name for name, _ in VERBS])
def test_every_verb_returns_a_new_config_and_leaves_the_old_one(name: str, verb: Callable[[Config], Config]) -> None:
    """Configs are values: a verb returns a new Config; the one it was called on does not change."""
    before = Config.zero(1).fp16().adam(lr=1e-3).batch(micro=1)
    snapshot = before.to_dict()
    after = verb(before)
    assert isinstance(after, Config)
    assert after is not before and after != before
    assert before.to_dict() == snapshot


def test_verbs_work_on_the_class_and_on_an_empty_config() -> None:
    """Config.zero(3) starts from an empty config, like Config().zero(3)."""
    assert Config.zero(3) == Config().zero(3)
    assert Config.bf16().zero(2) == Config().bf16().zero(2)


def test_zero() -> None:
    """zero(stage) sets the stage (0-3 or AUTO) and keeps the other ZeRO settings."""
    cfg = Config.zero_options(overlap_comm=True).zero(2)
    assert cfg.zero_optimization == ZeroOptimization(stage=2, overlap_comm=True)
    assert Config.zero(AUTO).to_dict() == {"zero_optimization": {"stage": "auto"}}
    with pytest.raises(InvalidValueError) as e:
        Config.zero(4)
    assert message(e) == "zero_optimization.stage: got 4, expected an integer >= 0 and <= 3"
    assert Config.zero("3") == Config.zero(3)  # type: ignore[arg-type]  # as DeepSpeed's parser reads it
    with pytest.raises(InvalidValueError) as e:
        Config.zero("three")  # type: ignore[arg-type]
    assert message(e) == "zero_optimization.stage: got 'three', expected an integer >= 0 and <= 3"


def test_offload_cpu_by_stage() -> None:
    """offload_cpu moves optimizer states at stages 1-3, and parameters only at stage 3."""
    cpu = {"device": "cpu", "pin_memory": True}
    assert Config.zero(3).offload_cpu().to_dict()["zero_optimization"] == {
        "stage": 3,
        "offload_optimizer": cpu,
        "offload_param": cpu,
    }
    for stage in (1, 2):
        assert Config.zero(stage).offload_cpu().to_dict()["zero_optimization"] == {
            "stage": stage,
            "offload_optimizer": cpu,
        }
    assert Config.zero(3).offload_cpu(params=False).zero_optimization == ZeroOptimization(
        stage=3, offload_optimizer=OffloadOptimizer(device="cpu", pin_memory=True)
    )
    assert Config.zero(3).offload_cpu(optimizer=False, pin_memory=False).zero_optimization == ZeroOptimization(
        stage=3, offload_param=OffloadParam(device="cpu", pin_memory=False)
    )


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        (
            Config(),
            "zero_optimization.stage: offload needs ZeRO stage 1-3, got no stage (call .zero(stage) before offloading)",
        ),
        (
            Config.zero(0),
            "zero_optimization.stage: offload needs ZeRO stage 1-3, got stage 0 (call .zero(stage) before offloading)",
        ),
        (
            Config.zero(AUTO),
            'zero_optimization.stage: offload needs ZeRO stage 1-3, got stage "auto" (call .zero(stage) before offloading)',
        ),
    ],
)
def test_offload_needs_a_stage_first(config: Config, expected: str) -> None:
    """Offloading without a ZeRO stage fails at that call and says to set one."""
    with pytest.raises(InvalidValueError) as e:
        config.offload_cpu()
    assert message(e) == expected


def test_offload_nvme() -> None:
    """offload_nvme writes the path and sizes to both offload sections, at stage 3 only."""
    cfg = Config.zero(3).offload_nvme(Path("/nvme"), buffer_count=5, buffer_size=10, max_in_cpu=7)
    assert cfg.to_dict()["zero_optimization"] == {
        "stage": 3,
        "offload_optimizer": {"device": "nvme", "nvme_path": "/nvme", "buffer_count": 5, "pin_memory": True},
        "offload_param": {
            "device": "nvme",
            "nvme_path": "/nvme",
            "buffer_size": 10,
            "max_in_cpu": 7,
            "pin_memory": True,
        },
    }
    with pytest.raises(InvalidValueError) as e:
        Config.zero(2).offload_nvme("/nvme")
    assert message(e) == "zero_optimization.stage: NVMe offload needs stage 3, got stage 2 (call .zero(3) first)"
    with pytest.raises(InvalidValueError) as e:
        Config.zero(3).offload_nvme("")
    assert message(e) == "zero_optimization.offload_optimizer.nvme_path: got '', expected a directory path"
    with pytest.raises(InvalidValueError) as e:
        Config.zero(3).offload_nvme("/nvme", buffer_count=-1)
    assert message(e) == "zero_optimization.offload_optimizer.buffer_count: got -1, expected an integer >= 0"


def test_precision_verbs_are_exclusive() -> None:
    """bf16() turns fp16 off and the other way round; fp32() turns both off."""
    assert Config.fp16().bf16().to_dict() == {"bf16": {"enabled": True}}
    assert Config.bf16().fp16(loss_scale=0, initial_scale_power=16).to_dict() == {
        "fp16": {"enabled": True, "loss_scale": 0, "initial_scale_power": 16}
    }
    assert Config.bf16().fp32() == Config()
    assert Config.bf16(enabled=AUTO).to_dict() == {"bf16": {"enabled": "auto"}}
    with pytest.raises(InvalidValueError) as e:
        Config.bf16(enabled="yes")
    assert message(e) == "bf16.enabled: got 'yes', expected true or false"
    with pytest.raises(UnknownKeyError) as e:
        Config.fp16(loss_scael=0)
    assert message(e) == "fp16.loss_scael: unknown key (did you mean 'loss_scale'?)"


def test_a_section_verb_takes_what_was_given_and_nothing_else() -> None:
    """A section verb's dict holds the keywords given: ``None`` leaves a field unset, a misspelt name is refused even
    when its value is ``None``, and a positional argument is a TypeError."""
    assert Config.zero(3).zero_options(overlap_comm=True, reduce_bucket_size=None).to_dict() == {
        "zero_optimization": {"stage": 3, "overlap_comm": True}
    }
    with pytest.raises(UnknownKeyError) as e:
        Config.bf16(enabeld=None)
    assert message(e) == "bf16.enabeld: unknown key (did you mean 'enabled'?)"
    with pytest.raises(UnknownKeyError, match=r"scheduler\.params\.warmup_stepz: unknown key"):
        Config.warmup_lr(warmup_stepz=None)
    with pytest.raises(TypeError, match="keyword arguments only"):
        Config.warmup_lr(0.0)


@pytest.mark.parametrize(
    ("verb", "type_name", "params_class"),
    [
        ("adamw", "AdamW", AdamParams),
        ("adam", "Adam", AdamParams),
        ("lamb", "Lamb", LambParams),
        ("lion", "Lion", LionParams),
        ("adagrad", "Adagrad", AdagradParams),
    ],
)
def test_optimizer_verbs(verb: str, type_name: str, params_class: type[Any]) -> None:
    """Each optimizer verb sets DeepSpeed's type name and its typed params."""
    cfg = getattr(Config, verb)(lr=AUTO, weight_decay=0.1)
    assert cfg.optimizer_config == Optimizer(type=type_name, params=params_class(lr=AUTO, weight_decay=0.1))


def test_optimizer_params() -> None:
    """betas given as a list are held as a tuple and written as a list; lr=1 stays an int."""
    cfg = Config.adamw(lr=1, betas=[0.9, 0.95], eps=1e-8)
    assert cfg.optimizer_config == Optimizer(type="AdamW", params=AdamParams(lr=1, betas=(0.9, 0.95), eps=1e-8))
    assert cfg.to_dict()["optimizer"] == {"type": "AdamW", "params": {"lr": 1, "betas": [0.9, 0.95], "eps": 1e-8}}
    assert Config.adamw(lr="auto").to_dict()["optimizer"]["params"] == {"lr": "auto"}


def test_optimizer_by_name() -> None:
    """DeepSpeed's names (any case) get typed params; other names (torch.optim) take any JSON params."""
    assert Config.optimizer("adamw", lr=0.1).optimizer_config == Optimizer(type="adamw", params=AdamParams(lr=0.1))
    sgd = Config.optimizer("SGD", lr=AUTO, momentum=0.9, betas=(0.9, 0.99), nested={"a": (1, 2)})
    assert sgd.to_dict()["optimizer"] == {
        "type": "SGD",
        "params": {"lr": "auto", "momentum": 0.9, "betas": [0.9, 0.99], "nested": {"a": [1, 2]}},
    }
    assert Config.from_dict(sgd.to_dict()) == sgd


@pytest.mark.parametrize(
    ("call", "error", "expected"),
    [
        (lambda: Config.adamw(lr=-1), InvalidValueError, "optimizer.params.lr: got -1, expected a number >= 0"),
        (lambda: Config.adamw(foo=1), UnknownKeyError, "optimizer.params.foo: unknown key"),
        (
            lambda: Config.adamw(max_grad_norm=1.0),
            UnknownKeyError,
            "optimizer.params.max_grad_norm: unknown key (DeepSpeed's Adam takes no max_grad_norm; set gradient_clipping at the top level)",
        ),
        (lambda: Config.optimizer(""), InvalidValueError, "optimizer.type: got '', expected an optimizer name"),
        (
            lambda: Config.optimizer("SGD", lr=float("nan"), x={1, 2}),
            InvalidValueError,
            "2 problems:\n  optimizer.params.lr: got nan, expected a JSON value\n  optimizer.params.x: got {1, 2}, expected a JSON value",
        ),
    ],
)
def test_optimizer_errors(call: Callable[[], Config], error: type[ConfigError], expected: str) -> None:
    """A bad optimizer argument fails at the call, naming optimizer.params.<key>."""
    with pytest.raises(error) as e:
        call()
    assert message(e) == expected


SCHEDULER_VERBS = [
    ("warmup_lr", "WarmupLR", WarmupLRParams),
    ("warmup_decay_lr", "WarmupDecayLR", WarmupDecayLRParams),
    ("warmup_cosine_lr", "WarmupCosineLR", WarmupCosineLRParams),
    ("one_cycle", "OneCycle", OneCycleParams),
    ("lr_range_test", "LRRangeTest", LRRangeTestParams),
]


@pytest.mark.parametrize(("verb", "type_name", "params_class"), SCHEDULER_VERBS)
def test_scheduler_verbs(verb: str, type_name: str, params_class: type[Any]) -> None:
    """The five scheduler verbs set DeepSpeed's scheduler names and typed params."""
    cfg = getattr(Config, verb)(last_batch_iteration=-1)
    assert cfg.scheduler == Scheduler(type=type_name, params=params_class(last_batch_iteration=-1))
    assert {name for _, name, _ in SCHEDULER_VERBS} == set(SCHEDULERS)


def test_scheduler_short_names() -> None:
    """warmup_steps, total_steps, min_lr, max_lr are short for DeepSpeed's names."""
    cfg = Config.warmup_decay_lr(warmup_steps=AUTO, total_steps=1000, min_lr=0, max_lr=AUTO)
    assert cfg.to_dict()["scheduler"] == {
        "type": "WarmupDecayLR",
        "params": {"total_num_steps": 1000, "warmup_min_lr": 0, "warmup_max_lr": "auto", "warmup_num_steps": "auto"},
    }


@pytest.mark.parametrize(
    ("call", "error", "expected"),
    [
        (
            lambda: Config.warmup_lr(warmup_steps=1, warmup_num_steps=2),
            InvalidValueError,
            "scheduler.params.warmup_num_steps: given twice, as 'warmup_steps' and 'warmup_num_steps' (pass only 'warmup_num_steps')",
        ),
        (
            lambda: Config.warmup_cosine_lr(min_lr=0),
            UnknownKeyError,
            "scheduler.params.warmup_min_lr: unknown key (WarmupCosineLR takes ratios of the optimizer's lr: use warmup_min_ratio)",
        ),
        (
            lambda: Config.warmup_decay_lr(total_steps=-5, warmup_type="cosine"),
            InvalidValueError,
            "2 problems:\n  scheduler.params.total_num_steps: got -5, expected an integer >= 0\n"
            "  scheduler.params.warmup_type: got 'cosine', expected one of 'log', 'linear'",
        ),
    ],
)
def test_scheduler_errors(call: Callable[[], Config], error: type[ConfigError], expected: str) -> None:
    """A bad scheduler argument fails at the call, naming scheduler.params.<key>."""
    with pytest.raises(error) as e:
        call()
    assert message(e) == expected


def test_batch() -> None:
    """batch() sets micro, accumulation and total; all are positive integers or AUTO."""
    assert Config.batch(micro=2, grad_accum=AUTO, total=64).to_dict() == {
        "train_batch_size": 64,
        "train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": "auto",
    }
    assert Config.batch() == Config()
    with pytest.raises(InvalidValueError) as e:
        Config.batch(micro=0, grad_accum=2.5, total="eight")  # type: ignore[arg-type]
    assert message(e) == (
        "3 problems:\n"
        "  train_batch_size: got 'eight', expected an integer > 0\n"
        "  train_micro_batch_size_per_gpu: got 0, expected an integer > 0\n"
        "  gradient_accumulation_steps: got 2.5, expected an integer > 0"
    )


def test_clip_grad_and_comm_dtype() -> None:
    """clip_grad takes a norm >= 0 (or AUTO); comm_dtype one of DeepSpeed's three names."""
    assert Config.clip_grad(AUTO).clip_grad(0).to_dict() == {"gradient_clipping": 0}
    assert Config.comm_dtype("bf16").to_dict() == {"communication_data_type": "bf16"}
    with pytest.raises(InvalidValueError) as e:
        Config.clip_grad(-1)
    assert message(e) == "gradient_clipping: got -1, expected a number >= 0"
    with pytest.raises(InvalidValueError) as e:
        Config.comm_dtype("fp8")
    assert message(e) == "communication_data_type: got 'fp8', expected one of 'fp32', 'fp16', 'bf16'"


def test_zero_options() -> None:
    """zero_options sets zero_optimization fields by DeepSpeed name; a table works for an offload section."""
    cfg = Config.zero(3).zero_options(overlap_comm=True, reduce_bucket_size=AUTO, offload_optimizer={"device": "cpu"})
    assert cfg.zero_optimization == ZeroOptimization(
        stage=3, overlap_comm=True, reduce_bucket_size=AUTO, offload_optimizer=OffloadOptimizer(device="cpu")
    )
    assert Config.zero_options(zenflow={"topk_ratio": 0.1, "select_strategy": "step"}).to_dict() == {
        "zero_optimization": {"zenflow": {"topk_ratio": 0.1, "select_strategy": "step"}}
    }


@pytest.mark.parametrize(
    ("call", "error", "expected"),
    [
        (
            lambda: Config.zero_options(overlap_com=True),
            UnknownKeyError,
            "zero_optimization.overlap_com: unknown key (did you mean 'overlap_comm'?)",
        ),
        (
            lambda: Config.zero_options(prefetch_bucket_size=1),
            UnknownKeyError,
            "zero_optimization.prefetch_bucket_size: unknown key (did you mean 'stage3_prefetch_bucket_size'?)",
        ),
        (
            lambda: Config.zero_options(mics_shard_size=4),
            UnknownKeyError,
            "zero_optimization.mics_shard_size: unknown key (MiCS sharding was removed from DeepSpeed: remove this key)",
        ),
        (
            lambda: Config.zero_options(offload_optimizer={"device": "gpu", "pin_memory": "yes", "x": 1}),
            ConfigError,
            "3 problems:\n"
            "  zero_optimization.offload_optimizer.device: got 'gpu', expected one of 'none', 'cpu', 'nvme'\n"
            "  zero_optimization.offload_optimizer.pin_memory: got 'yes', expected true or false\n"
            "  zero_optimization.offload_optimizer.x: unknown key",
        ),
        (
            lambda: Config.set(offload_optimizer={"device": "cpu"}),
            UnknownKeyError,
            "offload_optimizer: unknown key (did you mean 'zero_optimization.offload_optimizer'?)",
        ),
        (lambda: Config.set(_comment="hi"), UnknownKeyError, "_comment: unknown key (DeepSpeed ignores it; remove it)"),
        (
            lambda: Config.set(steps_per_print=0, wall_clock_breakdown="no"),
            InvalidValueError,
            "2 problems:\n  steps_per_print: got 0, expected an integer > 0\n  wall_clock_breakdown: got 'no', expected true or false",
        ),
        (
            lambda: Config.set(steps_per_print=0, gradient_clipp1ng=1),
            ConfigError,
            "2 problems:\n  gradient_clipp1ng: unknown key (did you mean 'gradient_clipping'?)\n"
            "  steps_per_print: got 0, expected an integer > 0",
        ),
        (
            lambda: Config.set(zero_optimization=AUTO),
            InvalidValueError,
            'zero_optimization: "auto" is not allowed here; expected a table',
        ),
        (lambda: Config.set(fp16_config=FP16()), UnknownKeyError, "fp16_config: unknown key (did you mean 'fp16'?)"),
    ],
)
def test_zero_options_and_set_errors(call: Callable[[], Config], error: type[ConfigError], expected: str) -> None:
    """Unknown names and bad values fail at the call, all of them at once, with dotted paths and hints."""
    with pytest.raises(error) as e:
        call()
    assert type(e.value) is error
    assert message(e) == expected


def test_set() -> None:
    """set() takes top-level fields by DeepSpeed name, sections as instances or tables."""
    cfg = Config.set(
        steps_per_print=10,
        log_level="info",
        fp16={"enabled": True, "loss_scale": 0},
        activation_checkpointing=ActivationCheckpointing(partition_activations=True),
        tensorboard={"enabled": True, "output_path": "runs"},
    )
    assert cfg.to_dict() == {
        "fp16": {"enabled": True, "loss_scale": 0},
        "steps_per_print": 10,
        "activation_checkpointing": {"partition_activations": True},
        "tensorboard": {"enabled": True, "output_path": "runs"},
        "log_level": "info",
    }
    assert Config.set(gradient_clipping="auto").gradient_clipping is AUTO


# -- the section classes -----------------------------------------------------------


ALL_CLASSES: list[type[Any]] = [*section_classes().values(), *PARAMS_CLASSES]


@pytest.mark.parametrize("cls", ALL_CLASSES, ids=lambda c: c.__name__)
def test_sections_are_frozen_keyword_only_attrs_classes(cls: type[Any]) -> None:
    """Every section is a frozen attrs class taking keyword arguments only; every field defaults to unset."""
    assert attrs.has(cls)
    instance = cls(type="X") if cls in (Optimizer, Scheduler) else cls()
    first = next(a for a in attrs.fields(cls) if a.name not in NOT_KEYS)
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        setattr(instance, first.name, None)
    with pytest.raises(TypeError):
        cls(None)
    for a in attrs.fields(cls):
        assert a.kw_only, a.name
        if a.name not in NOT_KEYS and a.name != "type":
            assert a.default is None, a.name


def test_section_classes_by_ds_key_path() -> None:
    """section_classes() names each section by its dotted ds_config path (fp16, not fp16_config)."""
    classes = section_classes()
    assert classes[""] is ConfigFields and issubclass(Config, ConfigFields)
    assert classes["fp16"] is FP16 and classes["bf16"] is BF16 and classes["optimizer"] is Optimizer
    assert classes["zero_optimization.offload_param"] is OffloadParam
    assert "fp16_config" not in classes


def test_construction_validates() -> None:
    """Built directly, a section checks its values too (the path is the attribute's)."""
    with pytest.raises(InvalidValueError) as e:
        FP16(enabled="yes")  # type: ignore[arg-type]
    assert message(e) == "enabled: got 'yes', expected true or false"
    with pytest.raises(InvalidValueError) as e:
        TensorBoard(output_path="auto")
    assert message(e) == "output_path: got the string 'auto', expected a string (use AUTO for \"auto\")"
    with pytest.raises(InvalidValueError) as e:
        Config(extra=[1])  # type: ignore[arg-type]
    assert message(e) == "extra: got a list [1], expected a table"
    with pytest.raises(InvalidValueError):
        attrs.evolve(ZeroOptimization(stage=1), stage=9)


def test_aliased_sections_take_their_ds_keys() -> None:
    """fp16/bf16/optimizer are attributes *_config (the names are verbs) but keyword arguments by ds key."""
    cfg = Config(fp16=FP16(enabled=True), bf16=BF16(enabled=False), optimizer=Optimizer(type="Adam"))
    assert cfg.fp16_config == FP16(enabled=True)
    assert cfg.bf16_config == BF16(enabled=False)
    assert cfg.optimizer_config == Optimizer(type="Adam")
    assert cfg.to_dict() == {"fp16": {"enabled": True}, "bf16": {"enabled": False}, "optimizer": {"type": "Adam"}}


def test_repr_shows_only_what_is_set() -> None:
    """repr lists set fields only, by ds key."""
    cfg = Config.zero(3).bf16().adamw(lr=AUTO)
    assert repr(cfg) == (
        "Config(bf16=BF16(enabled=True), optimizer=Optimizer(type='AdamW', params=AdamParams(lr=AUTO)), "
        "zero_optimization=ZeroOptimization(stage=3))"
    )
    assert repr(AUTO) == "AUTO" and str(AUTO) == "auto"


def test_provenance_fields_do_not_count_for_equality() -> None:
    """ignored, source and provenance describe where values came from, not the config: == ignores them."""
    assert Config(source="file a.json", provenance={"x": "y"}, ignored={"_comment": 1}) == Config()


@pytest.mark.parametrize("cls", ALL_CLASSES, ids=lambda c: c.__name__)
def test_every_field_has_a_one_line_docstring(cls: type[Any]) -> None:
    """Each field of each section is followed by a one-line attribute docstring (read from the source)."""
    docs = attribute_docs(cls)
    for a in attrs.fields(cls):
        assert a.name in docs, f"{cls.__name__}.{a.name} is not declared in the class body"
        doc = docs[a.name]
        assert doc is not None, f"{cls.__name__}.{a.name} has no docstring"
        assert doc.strip() and "\n" not in doc.strip(), f"{cls.__name__}.{a.name}: docstring is not one line"


@pytest.mark.parametrize(
    ("verb", "cls", "extra"),
    [
        ("zero_options", ZeroOptimization, set()),
        ("fp16", FP16, set()),
        ("bf16", BF16, set()),
        ("warmup_lr", WarmupLRParams, {"warmup_steps", "min_lr", "max_lr"}),
        ("warmup_decay_lr", WarmupDecayLRParams, {"warmup_steps", "total_steps", "min_lr", "max_lr"}),
        ("warmup_cosine_lr", WarmupCosineLRParams, {"warmup_steps", "total_steps"}),
        ("one_cycle", OneCycleParams, set()),
        ("lr_range_test", LRRangeTestParams, set()),
    ],
)
def test_section_verbs_take_every_field_as_a_keyword(verb: str, cls: type[Any], extra: set[str]) -> None:
    """A section's verb names each of its fields as a keyword parameter (editors, help() and mypy see them all),
    with the field's type, so a field added to the section cannot be forgotten in the verb."""
    parameters = inspect.signature(getattr(Config, verb)).parameters
    fields = {key_of(a): a for a in attrs.fields(cls)}
    assert set(parameters) == set(fields) | extra | {"unknown"}  # unknown: a misspelling, with its "did you mean"
    for name, a in fields.items():
        assert parameters[name].kind is inspect.Parameter.KEYWORD_ONLY
        base = str(a.type).split(" | ")[0].replace("tuple[str, ...]", "Sequence[str]")
        assert str(parameters[name].annotation).startswith(base), name
    assert getattr(Config, verb).__doc__
