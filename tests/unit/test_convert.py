"""The converter: DeepSpeed's keys out, aliases and legacy keys in, strict types, every problem at once."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from dsbuild import AUTO, Config, ConfigError, InvalidValueError, UnknownKeyError
from dsbuild.config import (
    BF16,
    AdamParams,
    DataTypes,
    OffloadOptimizer,
    OffloadParam,
    Optimizer,
    Scheduler,
    TensorParallel,
    TensorParallelTP,
    ZeroOptimization,
)
from dsbuild.io.convert import REMOVED_KEYS, RENAMED_KEYS, to_dict

from_dict = Config.from_dict


def read_error(data: Any, *, strict: bool = True) -> ConfigError:
    with pytest.raises(ConfigError) as e:
        from_dict(data, strict=strict)
    return e.value


# -- writing -----------------------------------------------------------------------


def test_empty_config_writes_nothing() -> None:
    """Nothing set, nothing written: DeepSpeed's defaults apply."""
    assert to_dict(Config()) == {}
    assert Config().to_dict() == {}


def test_only_what_was_set_is_written() -> None:
    """Unset fields are left out; a set false/0 is written; an empty section stays an empty table."""
    cfg = Config(zero_optimization=ZeroOptimization(stage=0, overlap_comm=False), bf16=BF16())
    assert to_dict(cfg) == {"bf16": {}, "zero_optimization": {"stage": 0, "overlap_comm": False}}


def test_written_keys_are_deepspeeds() -> None:
    """fp16/bf16/optimizer are written under DeepSpeed's keys, AUTO as "auto", tuples as lists."""
    cfg = (
        Config.fp16(loss_scale=0)
        .adamw(lr=AUTO, betas=(0.9, 0.999))
        .set(data_types=DataTypes(keep_in_fp32_modules=("norm",)))
    )
    d = to_dict(cfg)
    assert d == {
        "fp16": {"enabled": True, "loss_scale": 0},
        "optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": [0.9, 0.999]}},
        "data_types": {"keep_in_fp32_modules": ["norm"]},
    }
    assert json.loads(json.dumps(d)) == d


def test_passthrough_sections_are_carried_as_written() -> None:
    """Open tables (datastates_ckpt), AutoEP (whose null means "fused") and removed sections (amp) survive a round
    trip exactly; the long-tail sections DeepSpeed reads by name (compile, autotuning) are typed."""
    d = {
        "datastates_ckpt": {"host_cache_size": 16, "x": [1, None]},
        "expert_parallel": {"enabled": True, "expert_w3": None},
        "amp": {"enabled": True},
    }
    cfg = from_dict(d)
    assert cfg.extra == d
    assert to_dict(cfg) == d
    typed = from_dict({"compile": {"deepcompile": True}, "autotuning": {"enabled": False}})
    assert typed.extra == {} and typed.compile is not None and typed.compile.deepcompile is True
    assert set(REMOVED_KEYS) >= {"amp", "sparse_attention", "curriculum_learning"}


def test_ignored_keys_are_never_written() -> None:
    """Keys kept by a non-strict read are for validate(), not for DeepSpeed."""
    cfg = from_dict({"_comment": "x", "steps_per_print": 5}, strict=False)
    assert cfg.ignored == {"_comment": "x"}
    assert to_dict(cfg) == {"steps_per_print": 5}


def test_round_trip_of_a_full_config() -> None:
    """A config with every kind of field reads back equal after to_dict."""
    cfg = (
        Config.zero(3)
        .offload_nvme("/nvme", buffer_count=5)
        .bf16(immediate_grad_update=True)
        .lamb(lr=1e-3, betas=[0.9, AUTO])
        .one_cycle(cycle_min_lr=0, cycle_max_lr=1e-3, cycle_momentum=False)
        .batch(micro=AUTO, total=512)
        .clip_grad(AUTO)
        .comm_dtype("fp16")
        .zero_options(zenflow={"topk_ratio": 0.05, "select_strategy": "auto"}, stage3_prefetch_bucket_size=AUTO)
        .set(tensor_parallel=TensorParallel(autotp_size=2, tp=TensorParallelTP(tp_size=2)), log_level="warning")
    )
    assert from_dict(to_dict(cfg)) == cfg


# -- reading: legacy keys and aliases -------------------------------------------------


def test_bfloat16_is_read_as_bf16() -> None:
    """The legacy top-level key bfloat16 is read and written back as bf16."""
    cfg = from_dict({"bfloat16": {"enabled": True}})
    assert cfg.bf16_config == BF16(enabled=True)
    assert to_dict(cfg) == {"bf16": {"enabled": True}}


@pytest.mark.parametrize(("old", "new"), sorted(RENAMED_KEYS[ZeroOptimization].items()))
def test_legacy_zero_names_are_read_as_the_modern_ones(old: str, new: str) -> None:
    """Un-prefixed stage-3 names and the old fp16 gather flag are read and written with the modern name."""
    value = True if "gather" in old or "sequential" in old or "use_all_reduce" in old else 1000
    cfg = from_dict({"zero_optimization": {old: value}})
    assert to_dict(cfg) == {"zero_optimization": {new: value}}


def test_legacy_and_modern_together_is_an_error() -> None:
    """A key given under both names cannot be read one way: say which to keep."""
    e = read_error(
        {
            "bfloat16": {"enabled": True},
            "bf16": {"enabled": False},
            "zero_optimization": {"prefetch_bucket_size": 1, "stage3_prefetch_bucket_size": 2},
        }
    )
    assert str(e) == (
        "2 problems:\n"
        "  bfloat16: given together with 'bf16', which replaces it (keep only 'bf16')\n"
        "  zero_optimization.prefetch_bucket_size: given together with 'stage3_prefetch_bucket_size', which replaces it"
        " (keep only 'stage3_prefetch_bucket_size')"
    )


def test_tensor_parallel_aliases() -> None:
    """tensor_parallel.tensor_parallel and kernel_inject are read as tp and replace_with_kernel_inject."""
    cfg = from_dict({"tensor_parallel": {"tensor_parallel": {"tp_size": 2}, "kernel_inject": True}})
    assert to_dict(cfg) == {"tensor_parallel": {"tp": {"tp_size": 2}, "replace_with_kernel_inject": True}}


def test_cpu_offload_flags() -> None:
    """cpu_offload / cpu_offload_param true become CPU offload sections, as DeepSpeed does; false is nothing."""
    cfg = from_dict({"zero_optimization": {"stage": 3, "cpu_offload": True, "cpu_offload_param": True}})
    assert cfg.zero_optimization == ZeroOptimization(
        stage=3, offload_optimizer=OffloadOptimizer(device="cpu"), offload_param=OffloadParam(device="cpu")
    )
    assert to_dict(cfg) == {
        "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}, "offload_param": {"device": "cpu"}}
    }
    assert from_dict({"zero_optimization": {"cpu_offload": False}}) == from_dict({"zero_optimization": {}})
    assert str(read_error({"zero_optimization": {"cpu_offload": "yes"}})) == (
        "zero_optimization.cpu_offload: got 'yes', expected true or false"
    )
    assert str(read_error({"zero_optimization": {"cpu_offload": True, "offload_optimizer": {"device": "nvme"}}})) == (
        "zero_optimization.cpu_offload: given together with 'offload_optimizer', which replaces it"
        " (keep only 'offload_optimizer')"
    )


def test_cpu_offload_use_pin_memory_is_reported() -> None:
    """DeepSpeed reads cpu_offload_use_pin_memory and ignores it: an error when strict, kept as ignored when not."""
    data = {"zero_optimization": {"cpu_offload_use_pin_memory": True}}
    e = read_error(data)
    assert type(e) is InvalidValueError
    assert str(e) == (
        "zero_optimization.cpu_offload_use_pin_memory: deprecated and ignored by DeepSpeed"
        " (set pin_memory in offload_optimizer / offload_param)"
    )
    assert from_dict(data, strict=False).ignored == {"zero_optimization.cpu_offload_use_pin_memory": True}


@pytest.mark.parametrize(
    ("data", "zero"),
    [
        ({"zero_optimization": True}, {"stage": 1}),
        ({"zero_optimization": False}, {"stage": 0}),
        ({"zero_optimization": True, "allgather_size": 1e8}, {"stage": 1, "allgather_bucket_size": 100000000}),
    ],
)
def test_zero_optimization_true(data: dict[str, Any], zero: dict[str, Any]) -> None:
    """DeepSpeed's oldest form, "zero_optimization": true, is stage 1 (with the top-level allgather_size)."""
    assert to_dict(from_dict(data)) == {"zero_optimization": zero}


def test_reading_does_not_change_the_input() -> None:
    """from_dict reads; it never edits the caller's dict (legacy keys included)."""
    data = {
        "zero_optimization": True,
        "allgather_size": 1e8,
        "bfloat16": {"enabled": True},
        "optimizer": {"type": "SGD", "params": {"lr": "auto"}},
        "datastates_ckpt": {"x": [1]},
        "expert_parallel": {"top_k": "2"},
    }
    before = copy.deepcopy(data)
    from_dict(data)
    assert data == before


# -- reading: coercion and strictness -----------------------------------------------------


@pytest.mark.parametrize(
    ("written", "read"),
    [(5e8, 500000000), ("5e8", 500000000), ("1.0e+9", 1000000000), (1e14, 100000000000000), (3.0, 3), (7, 7)],
)
def test_integral_floats_are_integers(written: Any, read: int) -> None:
    """5e8 (JSON/TOML floats, YAML's "5e8" strings) in an integer field is the integer DeepSpeed needs."""
    cfg = from_dict({"zero_optimization": {"reduce_bucket_size": written}})
    assert cfg.zero_optimization is not None
    value = cfg.zero_optimization.reduce_bucket_size
    assert value == read and type(value) is int


def test_numbers_written_as_text_are_read_as_numbers() -> None:
    """A number field reads "1e-5" (YAML 1.1 leaves it a string) and "0.5" as the number, as DeepSpeed's parser does
    (its own tests assert fp16.loss_scale "3" is valid); the text form is kept for validate() to mention."""
    assert from_dict({"gradient_clipping": "1e-1"}).gradient_clipping == 0.1
    cfg = from_dict({"gradient_clipping": "0.5", "fp16": {"loss_scale": "3", "loss_scale_window": "2"}})
    assert to_dict(cfg) == {"gradient_clipping": 0.5, "fp16": {"loss_scale": 3, "loss_scale_window": 2}}
    assert cfg.coerced == {"gradient_clipping": "0.5", "fp16.loss_scale": "3", "fp16.loss_scale_window": "2"}
    assert from_dict({"zero_optimization": {"stage": "3", "overlap_comm": "True", "reduce_scatter": 0}}).to_dict() == {
        "zero_optimization": {"stage": 3, "overlap_comm": True, "reduce_scatter": False}
    }
    assert str(read_error({"gradient_clipping": "half"})) == "gradient_clipping: got 'half', expected a number >= 0"
    assert str(read_error({"gradient_clipping": "1e400"})) == "gradient_clipping: got '1e400', expected a number >= 0"
    adam = from_dict({"optimizer": {"type": "Adam", "params": {"betas": ["9e-1", "auto"]}}}).optimizer_config
    assert adam == Optimizer(type="Adam", params=AdamParams(betas=(0.9, AUTO)))


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        ({"zero_optimization": {"stage": 2.5}}, "zero_optimization.stage: got 2.5, expected an integer >= 0 and <= 3"),
        (
            {"zero_optimization": {"reduce_bucket_size": "2.5e0"}},
            "zero_optimization.reduce_bucket_size: got '2.5e0', expected an integer > 0",
        ),
        ({"zero_optimization": {"stage": "4"}}, "zero_optimization.stage: got 4, expected an integer >= 0 and <= 3"),
        (
            {"zero_optimization": {"stage": True}},
            "zero_optimization.stage: got true, expected an integer >= 0 and <= 3",
        ),
        ({"train_batch_size": True}, "train_batch_size: got true, expected an integer > 0"),
        ({"train_batch_size": "3.5"}, "train_batch_size: got '3.5', expected an integer > 0"),
        (
            {"zero_optimization": {"overlap_comm": "yes"}},
            "zero_optimization.overlap_comm: got 'yes', expected true or false",
        ),
        ({"zero_optimization": {"overlap_comm": 2}}, "zero_optimization.overlap_comm: got 2, expected true or false"),
        ({"gradient_clipping": True}, "gradient_clipping: got true, expected a number >= 0"),
        ({"gradient_clipping": float("inf")}, "gradient_clipping: got inf, expected a number >= 0"),
        ({"gradient_clipping": float("nan")}, "gradient_clipping: got nan, expected a number >= 0"),
        (
            {"zero_optimization": {"offload_optimizer": {"device": "gpu"}}},
            "zero_optimization.offload_optimizer.device: got 'gpu', expected one of 'none', 'cpu', 'nvme'",
        ),
        (
            {"zero_optimization": {"offload_optimizer": {"ratio": 1.5}}},
            "zero_optimization.offload_optimizer.ratio: got 1.5, expected a number >= 0 and <= 1",
        ),
        (
            {"optimizer": {"type": "Adam", "params": {"betas": [0.9]}}},
            "optimizer.params.betas: got a list [0.9], expected a list of two numbers each >= 0 and < 1",
        ),
        (
            {"optimizer": {"type": "AdamW", "params": {"betas": [1.5, 0.999]}}},
            "optimizer.params.betas: got a list [1.5, 0.999], expected a list of two numbers each >= 0 and < 1",
        ),
        (
            {"fp16": {"initial_scale_power": 100000}},
            "fp16.initial_scale_power: got 100000, expected an integer <= 1023",
        ),
        (
            {"zero_optimization": {"stage": None}},
            "zero_optimization.stage: null: DeepSpeed needs a value here (remove the key for DeepSpeed's default)",
        ),
        ({"bf16": None}, "bf16: null: DeepSpeed needs a value here (remove the key for DeepSpeed's default)"),
        ({"zero_optimization": 3}, "zero_optimization: got 3, expected a table"),
        (
            {"zero_optimization": {"offload_optimizer": "auto"}},
            "zero_optimization.offload_optimizer: got 'auto', expected a table",
        ),
        (
            {"zero_optimization": {"zenflow": "auto"}},
            "zero_optimization.zenflow: got 'auto', expected a table",
        ),
        ({"optimizer": {"params": {"lr": 1}}}, "optimizer.type: missing"),
        ({"optimizer": {"type": 3}}, "optimizer.type: got 3, expected a name"),
        ({"optimizer": {"type": "SGD", "params": [1]}}, "optimizer.params: got a list [1], expected a table"),
        ({"datastates_ckpt": {1, 2}}, "datastates_ckpt: got {1, 2}, expected JSON values"),
        ({"compile": 5}, "compile: got 5, expected a table"),
        (
            {"compile": {"passes": ["z2"]}},
            "compile.passes: got a list ['z2'], expected a list of strings from 'z1', 'z3', 'autosp', 'autotp'",
        ),
        ({"hybrid_engine": {"max_out_tokens": 0}}, "hybrid_engine.max_out_tokens: got 0, expected an integer > 0"),
        ({"expert_parallel": {"top_k": "two"}}, "expert_parallel.top_k: got 'two', expected an integer > 0"),
        ({1: 2}, "key 1 is not a string"),
        ("ds.json", "a ds_config is a table of keys, got 'ds.json'"),
        (None, "a ds_config is a table of keys, got None"),
    ],
)
def test_bad_values_are_refused_with_their_path(data: Any, expected: str) -> None:
    """Values DeepSpeed refuses are refused ("yes", true for an int, 2.5, "3.5"); the path is dotted."""
    e = read_error(data)
    assert str(e) == expected
    assert not isinstance(e, UnknownKeyError)


def test_auto_is_read_where_allowed() -> None:
    """ "auto" in a file is AUTO in any field that takes it, inside sections too."""
    cfg = from_dict(
        {
            "train_batch_size": "auto",
            "fp16": {"enabled": "auto"},
            "optimizer": {"type": "RMSprop", "params": {"lr": "auto", "alpha": [1, "auto"]}},
        }
    )
    assert cfg.train_batch_size is AUTO
    assert cfg.fp16_config is not None and cfg.fp16_config.enabled is AUTO
    assert cfg.optimizer_config == Optimizer(type="RMSprop", params={"lr": AUTO, "alpha": [1, "auto"]})


def test_typed_and_free_params() -> None:
    """DeepSpeed's optimizers/schedulers get typed params (any case for optimizers); others any JSON."""
    assert from_dict({"optimizer": {"type": "adamw", "params": {"lr": 1}}}).optimizer_config == Optimizer(
        type="adamw", params=AdamParams(lr=1)
    )
    sched = from_dict({"scheduler": {"type": "CosineAnnealingLR", "params": {"T_max": 10}}}).scheduler
    assert sched == Scheduler(type="CosineAnnealingLR", params={"T_max": 10})


def test_keep_in_fp32_modules() -> None:
    """data_types.keep_in_fp32_modules is DeepSpeed's own "auto" or a list of name patterns."""
    assert from_dict({"data_types": {"keep_in_fp32_modules": "auto"}}).data_types == DataTypes(
        keep_in_fp32_modules=AUTO
    )
    assert to_dict(from_dict({"data_types": {"keep_in_fp32_modules": ["norm", "auto"]}})) == {
        "data_types": {"keep_in_fp32_modules": ["norm", "auto"]}
    }


def test_null_is_unset_where_deepspeed_reads_it_as_its_default() -> None:
    """A null where DeepSpeed reads it as its default (a key it reads by hand, an optional field) means "not set"
    and is not written back; where DeepSpeed refuses it (``stage``, a whole ``bf16``) it is refused."""
    assert from_dict({"gradient_clipping": None, "zero_optimization": {"overlap_comm": None}}) == Config(
        zero_optimization=ZeroOptimization()
    )
    assert str(read_error({"zero_optimization": {"stage": None}})).startswith("zero_optimization.stage: null: ")


# -- reading: unknown keys ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        ({"gradient_clipp1ng": 1.0}, "gradient_clipp1ng: unknown key (did you mean 'gradient_clipping'?)"),
        (
            {"zero_optimization": {"overlap_com": True}},
            "zero_optimization.overlap_com: unknown key (did you mean 'overlap_comm'?)",
        ),
        (
            {"zero_optimization": {"offload_optimizer": {"devcie": "cpu"}}},
            "zero_optimization.offload_optimizer.devcie: unknown key (did you mean 'device'?)",
        ),
        (
            {"offload_optimizer": {"device": "cpu"}},
            "offload_optimizer: unknown key (did you mean 'zero_optimization.offload_optimizer'?)",
        ),
        ({"loss_scale": 0}, "loss_scale: unknown key (did you mean 'fp16.loss_scale'?)"),
        (
            {"zero_optimization": {"pin_memory": True}},
            "zero_optimization.pin_memory: unknown key (did you mean 'zero_optimization.offload_optimizer.pin_memory'?)",
        ),
        (
            {"optimizer": {"type": "AdamW", "lr": 1e-3}},
            "optimizer.lr: unknown key (did you mean 'optimizer.params.lr'?)",
        ),
        ({"_comment": "see the docs"}, "_comment: unknown key (DeepSpeed ignores it; remove it)"),
        (
            {"zero_optimization": {"_note": "x"}},
            "zero_optimization._note: unknown key (DeepSpeed ignores it; remove it)",
        ),
        (
            {"optimizer": {"type": "Adam", "params": {"max_grad_norm": 1}}},
            "optimizer.params.max_grad_norm: unknown key (DeepSpeed's Adam takes no max_grad_norm; set gradient_clipping at the top level)",
        ),
        (
            {"scheduler": {"type": "WarmupCosineLR", "params": {"warmup_max_lr": 1}}},
            "scheduler.params.warmup_max_lr: unknown key (WarmupCosineLR warms up to the optimizer's lr: remove warmup_max_lr)",
        ),
        (
            {"zero_optimization": {"mics_shard_size": 2}},
            "zero_optimization.mics_shard_size: unknown key (MiCS sharding was removed from DeepSpeed: remove this key)",
        ),
        (
            {"monitor_config": {"enabled": True}},
            "monitor_config: unknown key (DeepSpeed ignores it: monitors are the top-level tensorboard, wandb, csv_monitor"
            " and comet sections)",
        ),
        ({"cuda_visible_devices": 0}, "cuda_visible_devices: unknown key"),
        (
            {"aio": {"thread_count": 2}},
            "aio.thread_count: unknown key (renamed intra_op_parallelism in DeepSpeed, which reads only the new name; "
            "the HF docs' NVMe example still writes thread_count)",
        ),
    ],
)
def test_unknown_keys_name_the_path_and_suggest(data: dict[str, Any], expected: str) -> None:
    """Unknown keys at any depth are errors naming the dotted path, with the best hint there is."""
    e = read_error(data)
    assert type(e) is UnknownKeyError
    assert str(e) == expected


def test_problems_are_reported_together() -> None:
    """Every problem of a file is reported at once, one per line, unknown keys and bad values alike."""
    e = read_error(
        {
            "foo": 1,
            "zero_optimization": {"stgae": 3, "overlap_comm": 3},
            "_comment": "x",
            "bf16": {"enabled": "auto", "x": 1},
        }
    )
    assert type(e) is ConfigError
    assert str(e) == (
        "5 problems:\n"
        "  foo: unknown key\n"
        "  zero_optimization.stgae: unknown key (did you mean 'stage'?)\n"
        "  zero_optimization.overlap_comm: got 3, expected true or false\n"
        "  _comment: unknown key (DeepSpeed ignores it; remove it)\n"
        "  bf16.x: unknown key"
    )
    assert [p.path for p in e.problems] == [
        "foo",
        "zero_optimization.stgae",
        "zero_optimization.overlap_comm",
        "_comment",
        "bf16.x",
    ]


def test_error_class_follows_the_problems() -> None:
    """Only unknown keys: UnknownKeyError; only bad values: InvalidValueError; both: ConfigError."""
    assert type(read_error({"a": 1, "b": 2})) is UnknownKeyError
    assert type(read_error({"train_batch_size": 0, "gradient_clipping": -1})) is InvalidValueError
    assert type(read_error({"a": 1, "train_batch_size": 0})) is ConfigError


def test_non_strict_carries_unknown_keys() -> None:
    """strict=False reads past unknown keys (at any depth) and keeps them, by dotted path, in Config.ignored."""
    cfg = from_dict(
        {"foo": 1, "zero_optimization": {"stgae": 3, "stage": 2}, "_comment": "x", "bf16": {"x": [1]}}, strict=False
    )
    assert cfg == Config(zero_optimization=ZeroOptimization(stage=2), bf16=BF16())
    assert cfg.ignored == {"foo": 1, "zero_optimization.stgae": 3, "_comment": "x", "bf16.x": [1]}


def test_non_strict_still_refuses_bad_values() -> None:
    """strict=False is about unknown keys only: a bad value is still an error."""
    e = read_error({"foo": 1, "zero_optimization": {"overlap_comm": 3}}, strict=False)
    assert type(e) is InvalidValueError
    assert str(e) == "zero_optimization.overlap_comm: got 3, expected true or false"
