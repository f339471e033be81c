"""Every top-level key of DeepSpeed's config in one of three rows, so nothing a config asks for is silently ignored.

- ``TRAINED``: runs on DeepSpeed's CPU accelerator in the test suite (the test named).
- ``ELSEWHERE``: checked statically (types, bounds, DeepSpeed's own parser); it runs where its hardware, library or
  service is (a GPU, NVMe, apex, an account), with the command that smoke-tests it there.
- ``REFUSED``: ``Session`` and ``dsbuild train`` refuse a config that turns it on, before any process starts, with
  the reason (``refusals``): dsbuild does not wire what it needs, and DeepSpeed would otherwise train without it or
  stop at the first step.

``docs/features.md`` is this table in prose; ``tests/integration/test_features.py`` walks DeepSpeed's own config
schema and fails when a key is in no row. Stdlib only (layer 0).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Final

import attrs

from ..errors import Problem

__all__ = ["ELSEWHERE", "FEATURES", "REFUSED", "TRAINED", "Feature", "refusals", "writer_refusals"]

TRAINED: Final = "trained"
ELSEWHERE: Final = "elsewhere"
REFUSED: Final = "refused"


def _enabled(value: Any) -> bool:
    return isinstance(value, Mapping) and value.get("enabled") is True


def _present(value: Any) -> bool:
    return value is not None and value != {} and value is not False


@attrs.frozen
class Feature:
    """One top-level key: its row, what the row says (the test, the smoke command, or the reason)."""

    row: str
    what: str
    """``TRAINED``: the test; ``ELSEWHERE``: where it runs and the smoke command; ``REFUSED``: why."""
    asked: Callable[[Any], bool] = _present
    """``REFUSED`` only: whether a value turns the feature on (a section with ``enabled = false`` does not)."""


_SMOKE = "dsbuild train JOB --set strategy.overrides."

FEATURES: Final[dict[str, Feature]] = {
    # -- trained here -------------------------------------------------------------------------------------------
    "sequence_parallel_size": Feature(
        TRAINED,
        "Ulysses (DeepSpeed's UlyssesSPAttentionHF and its mpu): tests/integration/test_run_shapes.py, 2 processes "
        "against 1 at generated shapes (ZeRO-2 and ZeRO-3, micro-batch 1-4, accumulation 1-4, packed, LoRA)",
    ),
    "tensor_parallel": Feature(
        TRAINED,
        "AutoTP training (autotp_size): tests/integration/test_run_shapes.py, 2 processes against 1 at generated "
        "shapes (ZeRO-1 and ZeRO-2, micro-batch 1-4, accumulation 1-4, packed), the saved model gathered whole",
    ),
    "train_batch_size": Feature(TRAINED, "every Session test; tests/integration/test_loss_parity.py on 2 processes"),
    "train_micro_batch_size_per_gpu": Feature(TRAINED, "every Session test"),
    "gradient_accumulation_steps": Feature(TRAINED, "tests/integration/test_loss_parity.py (accumulation 8 and 4)"),
    "gradient_clipping": Feature(TRAINED, "tests/integration/test_loss_parity.py (the HF Trainer's max_grad_norm)"),
    "optimizer": Feature(TRAINED, "Adam/AdamW everywhere, Muon in tests/integration/test_muon.py"),
    "scheduler": Feature(TRAINED, "tests/integration/test_session.py, tests/integration/test_lr_schedule.py"),
    "zero_optimization": Feature(
        TRAINED,
        "stages 0-3, CPU offload, zero.Init: tests/integration/test_session.py (NVMe offload needs NVMe: "
        f"{_SMOKE}zero_optimization.offload_optimizer.device='\"nvme\"')",
    ),
    "zero_allow_untested_optimizer": Feature(TRAINED, "tests/integration/test_deepspeed_cases.py"),
    "zero_force_ds_cpu_optimizer": Feature(TRAINED, "CPU offload in tests/integration/test_session.py"),
    "bf16": Feature(TRAINED, "the demo job and tests/integration/test_train.py"),
    "bfloat16": Feature(TRAINED, "DeepSpeed's older name of bf16, read as bf16"),
    "checkpoint": Feature(
        TRAINED,
        "tests/integration/test_checkpoints.py, tests/integration/test_preemption.py; DeepSpeed's writer engines "
        "(checkpoint.writer, ZeRO-3): tests/integration/test_checkpoint_writers.py",
    ),
    "compile": Feature(
        TRAINED,
        "torch_compile in tests/integration/test_compile_and_timeout.py; DeepCompile is refused on the CPU "
        f"accelerator and needs a GPU: {_SMOKE}compile.deepcompile=true",
    ),
    "csv_monitor": Feature(TRAINED, "dsbuild's default monitor, in every dsbuild train test"),
    "tensorboard": Feature(TRAINED, "report_to = tensorboard, tests/integration/test_training_arguments.py"),
    "steps_per_print": Feature(TRAINED, "DeepSpeed's log interval, in every Session test"),
    "wall_clock_breakdown": Feature(TRAINED, "DeepSpeed's timers, read by every engine (off by default)"),
    "memory_breakdown": Feature(TRAINED, "DeepSpeed's memory log, read by every engine (off by default)"),
    # -- checked, runs elsewhere ----------------------------------------------------------------------------------
    "fp16": Feature(ELSEWHERE, f"a GPU (DeepSpeed's CPU accelerator has no fp16 training): {_SMOKE}fp16.enabled=true"),
    "amp": Feature(ELSEWHERE, f"a GPU with NVIDIA apex: {_SMOKE}amp.enabled=true"),
    "torch_autocast": Feature(ELSEWHERE, f"a GPU: {_SMOKE}torch_autocast.enabled=true"),
    "aio": Feature(ELSEWHERE, "NVMe offload's I/O, with NVMe: the NVMe row of zero_optimization"),
    "communication_data_type": Feature(ELSEWHERE, f"several GPUs: {_SMOKE}communication_data_type='\"bf16\"'"),
    "seq_parallel_communication_data_type": Feature(
        ELSEWHERE,
        f"sequence parallelism's all-to-all in another dtype, on GPUs: {_SMOKE}sequence_parallel_size=2 "
        "--set strategy.overrides.seq_parallel_communication_data_type='\"bf16\"' --nproc-per-node 2",
    ),
    "data_types": Feature(ELSEWHERE, f"a GPU: {_SMOKE}data_types.grad_accum_dtype='\"fp32\"'"),
    "prescale_gradients": Feature(ELSEWHERE, f"several GPUs: {_SMOKE}prescale_gradients=true"),
    "gradient_predivide_factor": Feature(ELSEWHERE, f"several GPUs: {_SMOKE}gradient_predivide_factor=2.0"),
    "gradient_allreduce_op": Feature(ELSEWHERE, f"several GPUs: {_SMOKE}gradient_allreduce_op='\"avg\"'"),
    "sparse_gradients": Feature(ELSEWHERE, "models with sparse embeddings (torch.nn.Embedding(sparse=True))"),
    "disable_allgather": Feature(ELSEWHERE, "DeepSpeed's legacy switch, read as it reads it"),
    "allgather_size": Feature(ELSEWHERE, "legacy: read only when zero_optimization is a boolean"),
    "managed_gradient_accumulation": Feature(ELSEWHERE, f"a GPU: {_SMOKE}managed_gradient_accumulation=true"),
    "graph_harvesting": Feature(ELSEWHERE, f"CUDA graphs, a GPU: {_SMOKE}graph_harvesting=true"),
    "disable_python_gc": Feature(ELSEWHERE, "DeepSpeed's switch, read as it reads it"),
    "activation_checkpointing": Feature(
        ELSEWHERE,
        "models that call deepspeed.checkpointing.checkpoint (Megatron-style); HF models recompute activations "
        "with training.gradient_checkpointing",
    ),
    "flops_profiler": Feature(ELSEWHERE, f"a GPU: {_SMOKE}flops_profiler.enabled=true"),
    "comms_logger": Feature(ELSEWHERE, f"several processes: {_SMOKE}comms_logger.enabled=true"),
    "timers": Feature(ELSEWHERE, "DeepSpeed's throughput timer, read by every engine"),
    "dump_state": Feature(ELSEWHERE, "DeepSpeed's debug dump at start-up"),
    "log_level": Feature(ELSEWHERE, "DeepSpeed's logger level"),
    "wandb": Feature(ELSEWHERE, "a Weights & Biases account: training.report_to = wandb"),
    "comet": Feature(ELSEWHERE, "a Comet account: training.report_to = comet_ml"),
    "nebula": Feature(ELSEWHERE, "Azure's Nebula checkpoint service"),
    "datastates_ckpt": Feature(ELSEWHERE, "the DataStates-LLM library (asynchronous checkpoints)"),
    "dataloader_drop_last": Feature(ELSEWHERE, "DeepSpeed's own data loader (deepspeed.initialize(training_data=))"),
    "vocabulary_size": Feature(ELSEWHERE, "read with data_efficiency's random-LTD (refused for now)"),
    # -- refused ----------------------------------------------------------------------------------------------------
    "pipeline": Feature(
        REFUSED, "DeepSpeed's pipeline engine needs a deepspeed.pipe.PipelineModule; Session trains whole models"
    ),
    "hybrid_engine": Feature(
        REFUSED, "DeepSpeed-Chat's generation engine for RLHF, not a training feature Session runs", _enabled
    ),
    "elasticity": Feature(
        REFUSED, "elastic batch sizes need DeepSpeed's elastic agent; dsbuild train fixes the batch", _enabled
    ),
    "expert_parallel": Feature(REFUSED, "AutoEP (mixture-of-experts) is not wired through Session", _enabled),
    "use_data_before_expert_parallelism": Feature(REFUSED, "with expert parallelism (refused)", lambda v: v is True),
    "progressive_layer_drop": Feature(
        REFUSED, "needs a model that takes PLD's keep probability in its forward", _enabled
    ),
    "curriculum_learning": Feature(
        REFUSED, "needs DeepSpeed's curriculum data sampler; Session's loader is its own", _enabled
    ),
    "data_efficiency": Feature(
        REFUSED, "needs DeepSpeed's data sampler and random-LTD layers; Session's loader is its own", _enabled
    ),
    "eigenvalue": Feature(REFUSED, "for MoQ quantization (quantize_training), which Session does not run", _enabled),
    "quantize_training": Feature(REFUSED, "MoQ needs DeepSpeed's quantizer in the model", _enabled),
    "compression_training": Feature(REFUSED, "needs deepspeed.compression.init_compression(model) in your code"),
    "sparse_attention": Feature(REFUSED, "needs the model's attention replaced with DeepSpeed's sparse attention"),
    "weight_quantization": Feature(REFUSED, "quantized weights for the hybrid engine's inference", _enabled),
    "autotuning": Feature(
        REFUSED,
        "DeepSpeed's autotuner runs from its own launcher (deepspeed --autotuning run), not inside a run",
        _enabled,
    ),
}
"""DeepSpeed's top-level config keys (0.19.8), each in its row."""


def refusals(ds_config: Mapping[str, Any]) -> list[Problem]:
    """A problem for each key of ``ds_config`` that turns on a feature in the ``REFUSED`` row, naming the key."""
    found = []
    for key, feature in FEATURES.items():
        if feature.row == REFUSED and key in ds_config and feature.asked(ds_config[key]):
            found.append(Problem(key, f"not run by dsbuild: {feature.what}", "remove it, or run DeepSpeed yourself"))
    return found + writer_refusals(ds_config)


_PYTHON_WRITER: Final = 'set checkpoint.writer.type = "python" for plain file writes, or remove checkpoint.writer'


def writer_refusals(ds_config: Mapping[str, Any]) -> list[Problem]:
    """A problem for each setting of ``checkpoint.writer`` (DeepSpeed's writer engines) whose checkpoint could not be
    loaded back or would be incomplete, on any machine (DeepSpeed 0.19). What a machine lacks (the fast writer's
    ``async_io`` op) is ``session.writers.fast_writer_refusal``."""
    checkpoint = ds_config.get("checkpoint")
    writer = checkpoint.get("writer") if isinstance(checkpoint, Mapping) else None
    if not isinstance(writer, Mapping):
        return []
    found = []
    kind = str(writer.get("type") or "FAST").upper()
    if kind == "MOCK":
        found.append(
            Problem("checkpoint.writer.type", "MOCK: DeepSpeed's mock writer writes no files, so a checkpoint would "
                    "hold nothing to resume from", _PYTHON_WRITER)
        )  # fmt: skip
    zero = ds_config.get("zero_optimization")
    stage = zero.get("stage", 0) if isinstance(zero, Mapping) else 0
    if isinstance(stage, int) and stage < 3:
        found.append(
            Problem(
                "checkpoint.writer",
                f"at ZeRO stage {stage}: DeepSpeed 0.19's writer engines fail at engine start below stage 3 "
                "(model_checkpointing's data-parallel writer config asks its parallel info for a dp_rank it does not "
                "hold: AttributeError), and the fast writer would write each file as FILE-RANK.COUNT parts, which "
                "load_checkpoint does not read",
                "use ZeRO stage 3 with checkpoint.writer, or remove checkpoint.writer",
            )
        )
    if writer.get("data_parallel") is not None:
        found.append(
            Problem(
                "checkpoint.writer.data_parallel",
                f"{writer['data_parallel']}: ignored by DeepSpeed 0.19 at ZeRO stage 3, where its writer config gives "
                "every rank a writer of its own files (and below stage 3 checkpoint.writer is refused)",
                "remove checkpoint.writer.data_parallel: each rank then writes its own files",
            )
        )
    return found
