"""DeepSpeed features beyond ZeRO and precision: compile, pipeline, autotuning, data efficiency, the RLHF
hybrid engine, weight quantization, timers and AutoEP expert parallelism.

Few users touch these, so each is declared as DeepSpeed 0.19 reads it and no more: every key with its
type, bounds and choices (``tests/integration/test_schema_coverage.py`` compares them with the installed
DeepSpeed). ``compile``, ``hybrid_engine``, ``weight_quantization`` and ``timers.throughput`` are strict
pydantic models in DeepSpeed (an unknown key stops ``deepspeed.initialize``); the others are read by hand,
and DeepSpeed ignores a key it does not know.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from . import fields as f
from .fields import Auto

__all__ = [
    "Autotuning",
    "AutotuningModelInfo",
    "Compile",
    "DataEfficiency",
    "DataRouting",
    "DataSampling",
    "DynamicBatching",
    "ExpertParallel",
    "HybridEngine",
    "Pipeline",
    "ThroughputTimer",
    "Timers",
    "WeightQuantization",
]


@f.section_class
class Compile:
    """``compile``: DeepCompile, DeepSpeed's compiler passes for ZeRO (used by ``engine.compile()``)."""

    deepcompile: bool | Auto | None = f.bool_()
    """Turn on DeepCompile; default false."""
    passes: tuple[str, ...] | None = f.strs(choices=("z1", "z3", "autosp", "autotp"), null=True)
    """Optimization passes to compose: ``"z1"``, ``"z3"``, ``"autosp"``, ``"autotp"``; default chosen by the stage."""
    autoep_non_moe: bool | Auto | None = f.bool_()
    """Compile the callable parents of AutoEP layers, keeping AutoEP eager; default false."""
    free_activation: bool | Auto | None = f.bool_()
    """Free activations eagerly; default false."""
    free_activation_threshold: int | Auto | None = f.int_(ge=0)
    """With ``free_activation``, activations of at least this many bytes are freed eagerly; default 10 MiB."""
    offload_activation: bool | Auto | None = f.bool_()
    """Keep saved activations in pinned host memory until the backward pass; default false."""
    offload_activation_pin_memory: bool | Auto | None = f.bool_()
    """Pin the host buffers of activation offload; default true."""
    offload_opt_states: bool | Auto | None = f.bool_()
    """Keep optimizer states in pinned host memory during forward/backward; default false."""
    offload_parameters: bool | Auto | None = f.bool_()
    """Offload parameters; default false."""
    double_buffer: bool | Auto | None = f.bool_()
    """Double buffering; default true."""
    symmetric_memory: bool | Auto | None = f.bool_()
    """Symmetric memory; default false."""
    debug_log: bool | Auto | None = f.bool_()
    """Dump the compiled graphs; default false."""
    sync_before_reduce: bool | Auto | None = f.bool_()
    """Synchronize before each reduce; default false."""
    sync_after_reduce: bool | Auto | None = f.bool_()
    """Synchronize after each reduce; default false."""
    sync_before_allgather: bool | Auto | None = f.bool_()
    """Synchronize before each all-gather; default false."""
    sync_after_allgather: bool | Auto | None = f.bool_()
    """Synchronize after each all-gather; default false."""
    keep_int_input_tensors: bool | Auto | None = f.bool_()
    """Keep the real values of integer input tensors (not dummies) while compiling; default true."""
    keep_all_input_tensors: bool | Auto | None = f.bool_()
    """Keep the real values of all input tensors while compiling; default false."""


@f.section_class
class Pipeline:
    """``pipeline``: settings of DeepSpeed's pipeline-parallel engine (``deepspeed.pipe``)."""

    stages: int | Auto | None = f.int_(gt=0)
    """Number of pipeline stages; default ``"auto"`` (from the ``PipelineModule``)."""
    partition: str | Auto | None = f.str_()
    """How layers are split over stages: ``"parameters"``, ``"uniform"``, ``"type:REGEX"``; default ``"best"``."""
    seed_layers: bool | Auto | None = f.bool_()
    """Seed each layer's initialization by its index; default false."""
    activation_checkpoint_interval: int | Auto | None = f.int_(ge=0)
    """Checkpoint activations every this many layers (0: never); default 0."""
    pipe_partitioned: bool | Auto | None = f.bool_()
    """Partition activations sent between stages over tensor-parallel ranks; default true."""
    grad_partitioned: bool | Auto | None = f.bool_()
    """Partition gradients sent between stages over tensor-parallel ranks; default true."""
    use_reentrant: bool | Auto | None = f.bool_()
    """Use reentrant activation checkpointing in the pipeline engine; default true."""


@f.section_class
class AutotuningModelInfo:
    """``autotuning.model_info``: what the autotuner knows of the model (else it profiles it)."""

    profile: bool | Auto | None = f.bool_()
    """Only profile the model (parameters, activations) and stop; default false."""
    num_params: int | Auto | None = f.int_(ge=0)
    """Number of model parameters; default measured."""
    hidden_size: int | Auto | None = f.int_(gt=0)
    """Hidden size of the model; default measured."""
    num_layers: int | Auto | None = f.int_(gt=0)
    """Number of layers of the model; default measured."""


@f.section_class
class Autotuning:
    """``autotuning``: DeepSpeed's autotuner (``deepspeed --autotuning``), which searches ZeRO and batch settings."""

    enabled: bool | Auto | None = f.bool_()
    """Run the autotuner; default false."""
    fast: bool | Auto | None = f.bool_()
    """Tune the micro-batch size only, not the ZeRO settings; default true."""
    results_dir: str | Auto | None = f.str_(null=False)
    """Directory of the tuning results (not empty); default ``"autotuning_results"``."""
    exps_dir: str | Auto | None = f.str_(null=False)
    """Directory of the experiments' configs (not empty); default ``"autotuning_exps"``."""
    overwrite: bool | Auto | None = f.bool_()
    """Run experiments again whose results exist; default true."""
    metric: str | Auto | None = f.choice("latency", "throughput", "flops", "forward", "step")
    """What to optimize; default ``"throughput"``."""
    metric_path: str | Auto | None = f.str_()
    """File the metric is written to; default none (the autotuner's own)."""
    start_profile_step: int | Auto | None = f.int_(ge=0)
    """First step measured in each experiment; default 3."""
    end_profile_step: int | Auto | None = f.int_(ge=0)
    """Last step measured in each experiment; default 5."""
    tuner_type: str | Auto | None = f.choice("gridsearch", "random", "model_based")
    """Search strategy; default ``"gridsearch"``."""
    tuner_early_stopping: int | Auto | None = f.int_(ge=0)
    """Stop after this many experiments without improvement; default 5."""
    tuner_num_trials: int | Auto | None = f.int_(gt=0)
    """Most experiments per tuning space; default 50."""
    arg_mappings: Mapping[str, Any] | None = f.mapping()
    """ds_config key -> training script argument, for scripts that take batch sizes as arguments; default none."""
    model_info: AutotuningModelInfo | None = f.section(AutotuningModelInfo)
    """What the autotuner knows of the model; default measured by profiling."""
    model_info_path: str | Auto | None = f.str_()
    """File the model profile is written to; default none."""
    mp_size: int | Auto | None = f.int_(gt=0)
    """Model-parallel degree; default 1."""
    max_train_batch_size: int | Auto | None = f.int_(gt=0)
    """Largest global batch size tried; default none."""
    min_train_batch_size: int | Auto | None = f.int_(gt=0)
    """Smallest global batch size tried; default 1."""
    max_train_micro_batch_size_per_gpu: int | Auto | None = f.int_(gt=0)
    """Largest micro-batch size tried; default 1024."""
    min_train_micro_batch_size_per_gpu: int | Auto | None = f.int_(gt=0)
    """Smallest micro-batch size tried; default 1."""
    num_tuning_micro_batch_sizes: int | Auto | None = f.int_(gt=0)
    """Micro-batch sizes tried per ZeRO setting; default 3."""


@f.section_class
class DynamicBatching:
    """``data_efficiency.data_sampling.dynamic_batching``: batches of a token budget instead of a sample count."""

    enabled: bool | Auto | None = f.bool_()
    """Batch by tokens; default false."""
    max_tokens: int | Auto | None = f.int_(gt=0)
    """Token budget of a batch; required when enabled."""
    min_batch_size: int | Auto | None = f.int_(gt=0, null=False)
    """Fewest samples in a batch; default 1."""
    max_batch_size: int | Auto | None = f.int_(gt=0, null=False)
    """Most samples in a batch; default none."""
    sequence_picking_order: str | Auto | None = f.choice("random", "seqlen", "dataloader")
    """Order in which sequences are packed into batches; default ``"dataloader"``."""
    lr_scaling_method: str | Auto | None = f.choice("linear", "sqrt", "none")
    """How the learning rate follows the batch size; default ``"linear"``."""
    verbose: bool | Auto | None = f.bool_()
    """Log each batch's composition; default false."""


@f.section_class
class DataSampling:
    """``data_efficiency.data_sampling``: curriculum learning and dynamic batching."""

    enabled: bool | Auto | None = f.bool_()
    """Use DeepSpeed's data sampler; default false."""
    num_epochs: int | Auto | None = f.int_(gt=0)
    """Epochs the sampler plans for; default 1000."""
    num_workers: int | Auto | None = f.int_(ge=0)
    """Data loader worker processes; default 0."""
    pin_memory: bool | Auto | None = f.bool_()
    """Pin the data loader's memory; default false."""
    curriculum_learning: Mapping[str, Any] | None = f.mapping(null=False)
    """Curriculum learning (``enabled``, ``curriculum_metrics``, ...), passed to DeepSpeed as written; default off."""
    dynamic_batching: DynamicBatching | None = f.section(DynamicBatching)
    """Batches of a token budget; default off."""


@f.section_class
class DataRouting:
    """``data_efficiency.data_routing``: random layerwise token dropping (random-LTD)."""

    enabled: bool | Auto | None = f.bool_()
    """Use data routing; default false."""
    random_ltd: Mapping[str, Any] | None = f.mapping(null=False)
    """Random-LTD settings (``enabled``, ``layer_num``, ...), passed to DeepSpeed as written; default off."""


@f.section_class
class DataEfficiency:
    """``data_efficiency``: DeepSpeed's data-efficiency library (curriculum learning, random-LTD)."""

    enabled: bool | Auto | None = f.bool_()
    """Use the data-efficiency library; default false."""
    seed: int | Auto | None = f.int_(ge=0)
    """Seed of its sampling; default 1234."""
    data_sampling: DataSampling | None = f.section(DataSampling)
    """Curriculum learning and dynamic batching; default off."""
    data_routing: DataRouting | None = f.section(DataRouting)
    """Random layerwise token dropping; default off."""


@f.section_class
class HybridEngine:
    """``hybrid_engine``: the RLHF hybrid engine (DeepSpeed-Chat), switching one model between training and
    generation."""

    enabled: bool | Auto | None = f.bool_()
    """Use the hybrid engine; default false."""
    max_out_tokens: int | Auto | None = f.int_(gt=0)
    """Longest generation; default 512."""
    inference_tp_size: int | Auto | None = f.int_(gt=0)
    """Tensor-parallel degree during generation; default 1."""
    release_inference_cache: bool | Auto | None = f.bool_()
    """Free the generation cache after each generation; default false."""
    pin_parameters: bool | Auto | None = f.bool_()
    """Pin the gathered parameters' memory; default true."""
    tp_gather_partition_size: int | Auto | None = f.int_(gt=0)
    """Layers gathered at once for tensor-parallel generation; default 8."""
    enable_cuda_graph: bool | Auto | None = f.bool_()
    """Capture generation in CUDA graphs; default false."""


@f.section_class
class WeightQuantization:
    """``weight_quantization``: quantized weights (ZeRO-Inference, post-init quantization)."""

    enabled: bool | Auto | None = f.bool_()
    """Quantize weights; default true (once the section is given)."""
    num_bits: int | Auto | None = f.int_(gt=0)
    """Bits per quantized weight; default 8."""
    q_type: str | Auto | None = f.choice("symmetric", "asymmetric")
    """Quantization: ``"symmetric"`` or ``"asymmetric"``; default ``"symmetric"``."""
    q_groups: int | Auto | None = f.int_(gt=0)
    """Quantization groups per weight; default 1."""
    quantized_initialization: Mapping[str, Any] | None = f.mapping()
    """Quantize while the model is initialized (settings as DeepSpeed reads them); default none."""
    post_init_quant: Mapping[str, Any] | None = f.mapping()
    """Quantize named modules after initialization (settings as DeepSpeed reads them); default none."""


@f.section_class
class ThroughputTimer:
    """``timers.throughput``: the engine's throughput timer."""

    enabled: bool | Auto | None = f.bool_()
    """Measure throughput; default true."""
    synchronized: bool | Auto | None = f.bool_()
    """Synchronize the device for each measurement (exact, but slower); default true."""


@f.section_class
class Timers:
    """``timers``: the engine's timers."""

    throughput: ThroughputTimer | None = f.section(ThroughputTimer)
    """The throughput timer; default on, synchronized."""


@f.section_class
class ExpertParallel:
    """``expert_parallel``: AutoEP, automatic expert parallelism for mixture-of-experts models.

    Carried as written (an explicit ``null`` means something here: ``expert_w3 = null`` is "fused"),
    but every key is checked against this declaration.
    """

    enabled: bool | Auto | None = f.bool_()
    """Use AutoEP; default false."""
    autoep_size: int | Auto | None = f.int_(gt=0)
    """Expert-parallel degree; default 1."""
    preset_model: str | Auto | None = f.str_()
    """A model family AutoEP knows (its layer names); default none."""
    expert_tensor_parallel_size: int | Auto | None = f.int_(gt=0)
    """Tensor-parallel degree inside each expert; default 1."""
    moe_layer_pattern: str | Auto | None = f.str_()
    """Regex of the MoE layers' names; default the preset's."""
    router_pattern: str | Auto | None = f.str_()
    """Regex of the routers' names; default the preset's."""
    expert_pattern: str | Auto | None = f.str_()
    """Regex of the experts' names; default the preset's."""
    expert_activation: str | Auto | None = f.str_()
    """Activation of the experts (one DeepSpeed's AutoEP knows, e.g. ``"silu"``); default the preset's."""
    expert_w1: str | Auto | None = f.str_()
    """Attribute name of the experts' first weight; default the preset's."""
    expert_w2: str | Auto | None = f.str_()
    """Attribute name of the experts' second weight; default the preset's."""
    expert_w3: str | Auto | None = f.str_()
    """Attribute name of the experts' third weight (``null``: fused with w1); default the preset's."""
    num_experts_attr: str | Auto | None = f.str_()
    """Config attribute holding the number of experts; default the preset's."""
    top_k_attr: str | Auto | None = f.str_()
    """Config attribute holding top-k; default the preset's."""
    top_k: int | Auto | None = f.int_(gt=0)
    """Experts per token; default ``"auto"`` (from the model config)."""
    score_func: str | Auto | None = f.choice("softmax", "sigmoid")
    """Router scoring; default ``"auto"`` (the preset's)."""
    score_apply: str | Auto | None = f.choice("pre", "post")
    """Apply router scores before or after the experts; default ``"auto"``."""
    route_norm: bool | Auto | None = f.bool_()
    """Normalize the top-k scores; default the preset's."""
    route_scale: float | Auto | None = f.float_()
    """Scale of the routing weights; default 1.0."""
    routed_scaling_factor: float | Auto | None = f.float_()
    """Scaling factor of the routed experts' output; default ``"auto"`` (from the model config)."""
    num_expert_groups: int | Auto | None = f.int_(ge=1)
    """Expert groups for group-limited routing; default none."""
    num_limited_groups: int | Auto | None = f.int_(ge=1)
    """Groups a token may be routed to; default none."""
    has_shared_experts: bool | Auto | None = f.bool_()
    """The MoE layers have shared experts; default the preset's."""
    shared_experts_pattern: str | Auto | None = f.str_()
    """Regex of the shared experts' names; default the preset's."""
    shared_experts_gate_pattern: str | Auto | None = f.str_()
    """Regex of the shared experts' gates; default the preset's."""
    load_balance_coeff: float | Auto | None = f.float_()
    """Not supported by DeepSpeed 0.19 (any value other than null is refused)."""
    use_grouped_mm: bool | Auto | None = f.bool_()
    """Use grouped matrix multiplication for the experts; default true."""
    disable_triton_grouped_mm: bool | Auto | None = f.bool_()
    """Do not use Triton's grouped matrix multiplication; default false."""
    gate_up_impl: str | Auto | None = f.choice("separate", "fused")
    """Gate and up projections as separate or fused weights; default ``"separate"``."""
    combine_impl: str | Auto | None = f.choice("weighted_sum", "fused_weighted_sum", "legacy_bmm")
    """How expert outputs are combined; default ``"auto"``."""
    row_weighting_impl: str | Auto | None = f.choice("eager", "fused")
    """How rows are weighted; default ``"auto"``."""
    comm_backend: str | Auto | None = f.choice("comm", "deepep")
    """All-to-all backend: ``"comm"`` (torch.distributed) or ``"deepep"``; default ``"comm"``."""
    comm_max_tokens_per_rank: int | Auto | None = f.int_(ge=0)
    """Token capacity per rank of the DeepEP buffers (> 0 with ``"deepep"``); default 0."""
    comm_num_sm: int | Auto | None = f.int_(ge=1)
    """Streaming multiprocessors DeepEP may use; default 12."""
    comm_qp_margin: int | Auto | None = f.int_(ge=0)
    """Extra queue pairs of DeepEP; default 4."""
    async_split_plan: bool | Auto | None = f.bool_()
    """Plan the token split asynchronously; default false."""
    validate_folding_routing: bool | Auto | None = f.bool_()
    """Check the folded routing against the unfolded one (debugging); default false."""
