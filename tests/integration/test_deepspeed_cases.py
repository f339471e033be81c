"""DeepSpeed's own accept/reject cases, judged by dsbuild and by the installed DeepSpeed's parser side by side.

The cases come from DeepSpeed's config tests (``tests/unit/runtime/test_ds_config_dict.py``,
``test_ds_config_model.py``, ``test_precision_config_*.py``, ``zero/test_zero_config.py``,
``zenflow/test_zf_config.py``, ``checkpoint/test_tag_validation.py``, ``monitor/test_monitor.py``) and from
probes of the sections dsbuild types since 0.2 (compile, hybrid engine, ZenFlow, timers, ...). DeepSpeed's
verdict is computed here, not copied: for each case, what DeepSpeed refuses dsbuild refuses (``strict=False``
plus ``check``), and what DeepSpeed accepts dsbuild accepts, except where dsbuild is stricter on purpose
(``STRICTER``, each with its reason).
"""

from __future__ import annotations

import copy
import logging
import os
from typing import Any

import pytest

from dsbuild import Config, ConfigError

os.environ.setdefault("DS_ACCELERATOR", "cpu")
from deepspeed.runtime import config as ds_config

pytestmark = pytest.mark.train  # the training extra; tests/conftest.py skips it without

B = {"train_micro_batch_size_per_gpu": 1}


def z(**zero: Any) -> dict[str, Any]:
    return {**B, "zero_optimization": zero}


CASES: dict[str, dict[str, Any]] = {
    # test_precision_config_loss_scale.py / test_precision_config_dynamic_scale.py
    "loss-scale-negative": {**B, "fp16": {"loss_scale": -1}},
    "loss-scale-bool": {**B, "fp16": {"loss_scale": True}},
    "loss-scale-list": {**B, "fp16": {"loss_scale": []}},
    "loss-scale-0": {**B, "fp16": {"loss_scale": 0}},
    "loss-scale-float": {**B, "fp16": {"loss_scale": 128.0}},
    "loss-scale-text": {**B, "fp16": {"loss_scale": "3"}},
    "window-text": {**B, "fp16": {"loss_scale_window": "2"}},
    "min-scale-text": {**B, "fp16": {"min_loss_scale": "2"}},
    "window-0-enabled": {**B, "fp16": {"enabled": True, "loss_scale_window": 0}},
    "window-negative-enabled": {**B, "fp16": {"enabled": True, "loss_scale_window": -1}},
    "window-bool": {**B, "fp16": {"loss_scale_window": True}},
    "min-scale-0-enabled": {**B, "fp16": {"enabled": True, "min_loss_scale": 0}},
    "min-scale-dict": {**B, "fp16": {"min_loss_scale": {}}},
    "fp16-unknown-key": {**B, "fp16": {"foo": 1}},
    "fp16-enabled-text": {**B, "fp16": {"enabled": "true"}},
    "bf16-enabled-1": {**B, "bf16": {"enabled": 1}},
    "bfloat16-legacy": {**B, "bfloat16": {"enabled": True}},
    "fp16-and-bf16": {**B, "fp16": {"enabled": True}, "bf16": {"enabled": True}},
    # zero/test_zero_config.py
    "reduce-bucket-1": z(reduce_bucket_size=1),
    "reduce-bucket-0": z(reduce_bucket_size=0),
    "reduce-bucket-5e8": z(reduce_bucket_size=5e8),
    "reduce-bucket-fraction": z(reduce_bucket_size=5.5),
    "cpu-offload-param-legacy": z(stage=3, cpu_offload_param=True),
    "cpu-offload-legacy": z(stage=2, cpu_offload=True),
    "cpu-offload-and-offload-optimizer": z(stage=2, cpu_offload=True, offload_optimizer={"device": "cpu"}),
    "gather-fp16-legacy": z(stage=3, stage3_gather_fp16_weights_on_model_save=True),
    "stage3-prefixes": z(stage=3, stage3_prefetch_bucket_size=12345, stage3_max_reuse_distance=12345),
    "offload-null": z(stage=3, offload_param=None, offload_optimizer=None),
    "offload-empty": z(stage=3, offload_param={}, offload_optimizer={}),
    "adaptive-prefetch-unknown": z(stage=3, stage3_adaptive_prefetch_bucket_size=True),
    "offload-not-a-table": z(stage=2, offload_optimizer="not a dict"),
    "stage-4": z(stage=4),
    "stage-text": z(stage="3"),
    "stage-null": z(stage=None),
    "zenflow-ok": z(
        stage=2,
        offload_optimizer={"device": "cpu"},
        zenflow={"topk_ratio": 0.25, "select_strategy": "auto", "select_interval": 4, "update_interval": 8},
    ),
    "zenflow-epoch": z(stage=2, offload_optimizer={"device": "cpu"}, zenflow={"select_strategy": "epoch"}),
    "zenflow-not-a-table": z(stage=2, zenflow=123),
    "zenflow-topk-0": z(stage=2, zenflow={"topk_ratio": 0.0}),
    "zenflow-topk-1": z(stage=2, zenflow={"topk_ratio": 1.0}),
    "zenflow-strategy": z(stage=2, zenflow={"select_strategy": "foo"}),
    "zenflow-update-0": z(stage=2, zenflow={"update_interval": 0}),
    "leaf-module-ok": z(stage=3, leaf_module={"classes": ["A"]}),
    "mics-removed": z(stage=3, mics_shard_size=2),
    "partial-offload-stage-2": z(stage=2, offload_optimizer={"device": "cpu", "ratio": 0.5}),
    "offload-device-gpu": z(stage=2, offload_optimizer={"device": "gpu"}),
    "compute-grad-norm-stage-3": z(stage=3, compute_grad_norm=False),
    "legacy-zero-true": {**B, "zero_optimization": True, "allgather_size": 1e8},
    # test_ds_config_dict.py: batch sizes, removed sections, tag validation, monitors
    "only-accumulation": {"gradient_accumulation_steps": 2},
    "no-batch-size": {"gradient_clipping": 1.0},
    "batch-16-8-2": {"train_batch_size": 16, "train_micro_batch_size_per_gpu": 8, "gradient_accumulation_steps": 2},
    "batch-33-17-2": {"train_batch_size": 33, "train_micro_batch_size_per_gpu": 17, "gradient_accumulation_steps": 2},
    "micro-0": {"train_micro_batch_size_per_gpu": 0},
    "batch-auto": {"train_batch_size": "auto"},
    "compression-training": {**B, "compression_training": {}},
    "tag-validation-fail": {**B, "checkpoint": {"tag_validation": "FAIL"}},
    "tag-validation-mixed-case": {**B, "checkpoint": {"tag_validation": "wArN"}},
    "tag-validation-foo": {**B, "checkpoint": {"tag_validation": "foo"}},
    "tensorboard": {**B, "tensorboard": {"enabled": True, "output_path": "out/", "job_name": "test"}},
    "wandb": {**B, "wandb": {"enabled": False, "group": "g", "team": "t", "project": "p"}},
    "csv-monitor": {**B, "csv_monitor": {"enabled": True, "output_path": "x", "job_name": "test"}},
    "comet": {**B, "comet": {"enabled": True, "samples_log_interval": 42, "workspace": "w", "project": "p"}},
    # hand-read keys: case, choices, types
    "allreduce-upper": {**B, "gradient_allreduce_op": "SUM"},
    "allreduce-max": {**B, "gradient_allreduce_op": "max"},
    "allreduce-sum-stage-3": {**B, "gradient_allreduce_op": "sum", "zero_optimization": {"stage": 3}},
    "comm-dtype-upper": {**B, "communication_data_type": "FP16"},
    "comm-dtype-int8": {**B, "communication_data_type": "int8"},
    "log-level-upper": {**B, "log_level": "INFO"},
    "autocast-bfloat16": {**B, "torch_autocast": {"enabled": True, "dtype": "bfloat16"}},
    "autocast-foo": {**B, "torch_autocast": {"dtype": "foo"}},
    "autocast-modules-not-names": {**B, "torch_autocast": {"lower_precision_safe_modules": [1]}},
    "keep-fp32-not-a-list": {**B, "data_types": {"keep_in_fp32_modules": "x"}},
    "pipeline-stage-text": {**B, "checkpoint": {"parallel_write": {"pipeline_stage": "true"}}},
    "writer-lower": {**B, "checkpoint": {"writer": {"type": "fast", "data_parallel": "replica"}}},
    "writer-foo": {**B, "checkpoint": {"writer": {"type": "foo"}}},
    "optimizer-upper": {**B, "optimizer": {"type": "ADAMW", "params": {"lr": 1e-3}}},
    # sections typed since 0.2: strict pydantic models in DeepSpeed
    "compile-disable": {**B, "compile": {"disable": False, "backend": "inductor"}},
    "compile-not-a-table": {**B, "compile": 5},
    "compile-passes-z2": {**B, "compile": {"passes": ["z2"]}},
    "compile-passes-z3": {**B, "compile": {"passes": ["z3"]}},
    "compile-deepcompile": {**B, "compile": {"deepcompile": True}},
    "hybrid-max-out-0": {**B, "hybrid_engine": {"max_out_tokens": 0}},
    "hybrid-ok": {**B, "hybrid_engine": {"enabled": True, "max_out_tokens": 256}},
    "timers-throughput-unknown": {**B, "timers": {"throughput": {"foo": 1}}},
    "timers-throughput-ok": {**B, "timers": {"throughput": {"enabled": True, "synchronized": False}}},
    "weight-quantization-q-type": {**B, "weight_quantization": {"q_type": "foo"}},
    "weight-quantization-ok": {**B, "weight_quantization": {"num_bits": 4, "q_type": "asymmetric"}},
    "tensor-parallel-dtype": {**B, "tensor_parallel": {"dtype": "bf16"}},
    "tensor-parallel-tp": {**B, "tensor_parallel": {"tp": {"tp_size": 2}}},
    "tensor-parallel-backend": {**B, "tensor_parallel": {"vocab_parallel_ce_backend": "triton"}},
    "comms-logger-not-a-list": {**B, "comms_logger": {"prof_ops": "all_reduce"}},
    "autotuning-results-dir-empty": {**B, "autotuning": {"results_dir": ""}},
    "load-balance-coeff": {**B, "expert_parallel": {"load_balance_coeff": 0.1}},
    "dynamic-batching-without-max-tokens": {
        **B,
        "data_efficiency": {"enabled": True, "data_sampling": {"enabled": True, "dynamic_batching": {"enabled": True}}},
    },
}

STRICTER: dict[str, str] = {}
"""Cases DeepSpeed's parser accepts that dsbuild refuses on purpose, with the reason."""

RESOLVE_FIRST = {"batch-auto"}
"""Cases with an "auto" meant for ``resolve()``: a warning before, an error for a config said to be resolved."""


def deepspeed_verdict(d: dict[str, Any]) -> str | None:
    """``None`` when DeepSpeed's parser reads ``d`` (one process), else why it refused."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ds_config.dist, "get_world_size", lambda *a, **k: 1)
        mp.setattr(ds_config.dist, "get_rank", lambda *a, **k: 0)
        logging.getLogger("DeepSpeed").setLevel(logging.CRITICAL)
        try:
            ds_config.DeepSpeedConfig(copy.deepcopy(d))
        except Exception as error:
            return f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
    return None


def dsbuild_verdict(d: dict[str, Any], *, resolved: bool = False) -> str | None:
    """``None`` when dsbuild reads ``d`` (``strict=False``) and ``check`` passes, else its message."""
    try:
        Config.from_dict(copy.deepcopy(d), strict=False).check(world_size=1, resolved=resolved)
    except ConfigError as error:
        return str(error)
    return None


@pytest.mark.parametrize("name", sorted(CASES))
def test_dsbuild_and_deepspeed_agree(name: str) -> None:
    """What DeepSpeed's parser refuses, dsbuild refuses; what it reads, dsbuild reads (``STRICTER`` aside)."""
    d = CASES[name]
    theirs, ours = deepspeed_verdict(d), dsbuild_verdict(d, resolved=name in RESOLVE_FIRST)
    if theirs is not None:
        assert ours is not None, f"DeepSpeed refuses {d} ({theirs}); dsbuild passes it"
    elif name in STRICTER:
        assert ours is not None, f"{name} is listed as refused by dsbuild on purpose, but dsbuild passes it"
    else:
        assert ours is None, f"DeepSpeed reads {d}; dsbuild refuses it: {ours}"
