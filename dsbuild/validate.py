"""Static validation: diagnostics with dotted key paths, before anything is launched.

``validate()`` returns every problem found as a ``Diagnostic`` (errors first,
then warnings); ``check()`` raises one ``ConfigError`` that lists every error.
Each diagnostic names the key as it is written in the ds_config
(``zero_optimization.offload_param.device``) and says what to do.

The rules come from three places:

- what DeepSpeed's own parser (``DeepSpeedConfig``) refuses, so a config that
  passes ``check(..., resolved=True)`` is one DeepSpeed reads;
- what DeepSpeed only finds when the engine starts (optimizer, ZeRO and
  scheduler construction), minutes into a multi-node launch;
- what DeepSpeed never says: keys it ignores, settings that have no effect at
  the chosen stage, ZeRO-3 saves that come out empty.

``"auto"``. A config may hold ``"auto"`` values meant for ``Config.resolve()``
or for the Hugging Face Trainer (which fill them the same way). Passed to
DeepSpeed as it is, ``"auto"`` in a batch key is a bare ``TypeError`` and
``"auto"`` inside a section is silently replaced by DeepSpeed's default
(``bf16.enabled: "auto"`` trains in fp32). So that ``validate()`` is useful on
an HF-style preset, an ``"auto"`` is judged by who will fill it:

- ``resolved=True`` (how ``Session`` checks the config it hands to
  ``deepspeed.initialize``): every ``"auto"`` left is an error.
- ``target="deepspeed"`` (the default): an ``"auto"`` that ``resolve()`` and
  the HF Trainer fill is a warning saying it must be resolved first; one that
  nothing fills is an error.
- ``target="hf"`` (the config goes to the HF Trainer / Accelerate): the
  ``"auto"`` values the HF Trainer fills are fine; those Accelerate fills from
  its own settings (``zero_optimization.stage``, offload devices and paths)
  are a warning, since the config then does not say what runs; any other is an
  error (Accelerate stops on it with "not found in kwargs").

A missing batch size is an error only with ``resolved=True``; before that it is
a warning (``resolve()`` may still be given the training arguments).

Rules that depend on the installed DeepSpeed (features it removed) read its
version with ``importlib.metadata``, never by importing it; without DeepSpeed
installed the newest rules apply. Nothing here imports torch or DeepSpeed:
names of ``torch.optim`` classes are a static list.
"""

from __future__ import annotations

import functools
import importlib.metadata
import keyword
import operator
import re
from collections.abc import Callable, Iterator, Mapping
from itertools import compress, repeat
from typing import Any, Final, Literal, NamedTuple, TypeGuard, cast

import attrs

from ._suggest import did_you_mean
from .config import AUTO, SCHEDULERS, Config
from .config._fields import UNKNOWN_KEY_HINTS, describe, key_of
from .config.core import IGNORED_KEY_HINT, unknown_key
from .config.optim import Optimizer, Scheduler, optimizer_params_class, scheduler_params_class
from .config.zero import ZeroOptimization
from .errors import ConfigError, InvalidValueError, Problem, UnresolvedAutoError

__all__ = ["RULES", "Diagnostic", "batch_triangle", "check", "validate"]

Severity = Literal["error", "warning"]
Target = Literal["deepspeed", "hf"]


@attrs.frozen
class Diagnostic:
    """One finding about a config."""

    path: str
    """Dotted key path, e.g. ``zero_optimization.offload_param``."""
    severity: Severity
    """``"error"`` (DeepSpeed refuses it or it will not train as meant) or ``"warning"``."""
    message: str
    """What is wrong."""
    hint: str | None = None
    """What to do about it."""
    rule: str = ""
    """The rule that found it (see ``RULES``), e.g. ``"offload-param-below-stage-3"``."""

    def __str__(self) -> str:
        text = f"{self.path}: {self.message}" if self.path else self.message
        return f"{text} ({self.hint})" if self.hint else text


# -- what DeepSpeed knows -------------------------------------------------------

DEEPSPEED_OPTIMIZERS: Final = ("adagrad", "adam", "adamw", "lamb", "muadam", "muadamw", "musgd", "lion", "muon")
"""Optimizer names DeepSpeed builds itself (any case): ``DEEPSPEED_OPTIMIZERS`` in ``deepspeed/runtime/config.py``."""

_DISPLAY_NAMES: Final = ("Adam", "AdamW", "Adagrad", "Lamb", "Lion", "Muon", "MuAdam", "MuAdamW", "MuSGD")

TORCH_OPTIMIZERS: Final = (
    "ASGD", "Adadelta", "Adafactor", "Adagrad", "Adam", "AdamW", "Adamax", "LBFGS", "Muon",
    "NAdam", "RAdam", "RMSprop", "Rprop", "SGD", "SparseAdam",
)  # fmt: skip
"""``torch.optim`` optimizer classes (torch 2.13); DeepSpeed looks any other name up there, case-sensitively."""

TORCH_SCHEDULERS: Final = (
    "ChainedScheduler", "ConstantLR", "CosineAnnealingLR", "CosineAnnealingWarmRestarts", "CyclicLR",
    "ExponentialLR", "LambdaLR", "LinearLR", "MultiStepLR", "MultiplicativeLR", "OneCycleLR",
    "PolynomialLR", "ReduceLROnPlateau", "SequentialLR", "StepLR",
)  # fmt: skip
"""``torch.optim.lr_scheduler`` classes DeepSpeed falls back to for a scheduler name it does not have."""

ONE_BIT_OPTIMIZERS: Final = {"onebitadam": "OneBitAdam", "onebitlamb": "OneBitLamb", "zerooneadam": "ZeroOneAdam"}

ZERO_TESTED_OPTIMIZERS: Final = ("adam", "adamw", "adagrad", "lion", "muon")
"""Names whose optimizer class is in DeepSpeed's ``ZERO_SUPPORTED_OPTIMIZERS`` (FusedAdam, CPU Adam, torch
Adam/AdamW/Adagrad, CPU Adagrad, Fused/CPU Lion, Muon); anything else needs ``zero_allow_untested_optimizer``."""

_CPU_OPTIMIZERS: Final = ("adam", "adamw", "adagrad", "lion")
"""Names DeepSpeed runs with its own CPU optimizer when optimizer states are offloaded."""

_REMOVALS_SINCE: Final = (0, 19, 8)
"""First DeepSpeed checked to refuse the removed sections and 1-bit optimizers (issue deepspeedai/DeepSpeed#8489)."""

_WARMUP_STEPS_POSITIVE_SINCE: Final = (0, 19, 6)
"""DeepSpeed refuses ``warmup_num_steps: 0`` from here on (older versions clamped it)."""

# Sections DeepSpeed reads with pydantic models that forbid extra keys: an unknown key there stops DeepSpeed.
_STRICT_SECTIONS: Final = (
    "fp16", "bf16", "zero_optimization", "tensorboard", "csv_monitor", "wandb", "comet", "tensor_parallel",
    "comms_logger",
)  # fmt: skip

_REMOVED_ZERO_KEYS: Final = ("mics_shard_size", "mics_hierarchical_params_gather", "zeropp_loco_param")

_STAGE3_ONLY: Final = (
    "sub_group_size", "stage3_prefetch_bucket_size", "stage3_param_persistence_threshold",
    "stage3_model_persistence_threshold", "stage3_max_live_parameters", "stage3_max_reuse_distance",
    "stage3_gather_16bit_weights_on_model_save", "stage3_module_granularity_threshold",
    "stage3_use_all_reduce_for_fetch_params", "stage3_allgather_sequential", "zero_hpz_partition_size",
    "zero_quantized_weights", "zero_quantized_nontrainable_weights", "zero_quantized_gradients",
    "save_muon_momentum_buffer_in_memory",
)  # fmt: skip
"""``zero_optimization`` keys only the stage-3 optimizer reads (DeepSpeed ignores them below stage 3)."""

_BATCH_KEYS: Final = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")

HF_FILLED: Final[Mapping[str, str]] = {
    "train_micro_batch_size_per_gpu": "per_device_train_batch_size",
    "gradient_accumulation_steps": "gradient_accumulation_steps",
    "train_batch_size": "world_size x per_device_train_batch_size x gradient_accumulation_steps",
    "gradient_clipping": "max_grad_norm",
    "optimizer.params.lr": "learning_rate",
    "optimizer.params.betas": "adam_beta1 and adam_beta2",
    "optimizer.params.eps": "adam_epsilon",
    "optimizer.params.weight_decay": "weight_decay",
    "scheduler.params.warmup_min_lr": "0",
    "scheduler.params.warmup_max_lr": "learning_rate",
    "scheduler.params.warmup_num_steps": "warmup_steps or warmup_ratio",
    "scheduler.params.total_num_steps": "the run's optimizer steps (total_steps / max_steps)",
    "fp16.enabled": "fp16",
    "bf16.enabled": "bf16",
    "zero_optimization.reduce_bucket_size": "the model's hidden_size",
    "zero_optimization.stage3_prefetch_bucket_size": "the model's hidden_size (stage 3)",
    "zero_optimization.stage3_param_persistence_threshold": "the model's hidden_size (stage 3)",
}
"""``"auto"`` keys that ``resolve()`` and the HF Trainer fill, with the training argument each comes from."""

_ACCELERATE_FILLED: Final[Mapping[str, tuple[str, str]]] = {
    "zero_optimization.stage": ("zero_stage", "2"),
    "zero_optimization.offload_optimizer.device": ("offload_optimizer_device", "'none'"),
    "zero_optimization.offload_param.device": ("offload_param_device", "'none'"),
    "zero_optimization.offload_optimizer.nvme_path": ("offload_optimizer_nvme_path", "none"),
    "zero_optimization.offload_param.nvme_path": ("offload_param_nvme_path", "none"),
    "zero_optimization.stage3_gather_16bit_weights_on_model_save": ("zero3_save_16bit_model", "false"),
}
"""``"auto"`` keys Accelerate's DeepSpeed plugin fills from its own settings under the HF Trainer (setting, default),
beyond ``HF_FILLED``; it also fills the stage-3 buckets at any stage."""

_STAGE3_BUCKETS: Final = (
    "zero_optimization.stage3_prefetch_bucket_size",
    "zero_optimization.stage3_param_persistence_threshold",
)

_RESOLVE_HINT: Final = 'cfg.resolve(...) or `dsbuild export --resolve`; for the HF Trainer validate with target="hf"'


@functools.cache
def _deepspeed_version() -> tuple[int, ...] | None:
    """The installed DeepSpeed's version as numbers, or ``None`` when it is not installed (newest rules).

    Read once per process (reading package metadata costs far more than validating a config).
    """
    try:
        text = importlib.metadata.version("deepspeed")
    except importlib.metadata.PackageNotFoundError:
        return None
    match = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?", text)
    return tuple(int(x) for x in match.groups(default="0")) if match else None


# -- the facts rules read -------------------------------------------------------


def _known(value: Any) -> Any:
    """``value`` unless it is ``AUTO`` (then ``None``: unknown until resolved)."""
    return None if value is AUTO else value


def _is_table(value: Any) -> TypeGuard[Mapping[str, Any]]:
    """``isinstance(value, Mapping)``, answered without the ABC check for a dict or a section (never a Mapping)."""
    kind = type(value)
    return kind is dict or (not _is_attrs(kind) and isinstance(value, Mapping))


def _param(params: Any, name: str) -> Any:
    """Optimizer/scheduler param ``name`` from typed params or a free table; ``None`` when unset."""
    if params is None:
        return None
    if type(params) is dict:  # a free table, as read from a file (the common case, checked first)
        return params.get(name)
    if _is_attrs(type(params)):  # typed params: a section, never a Mapping
        return getattr(params, name, None)
    if isinstance(params, Mapping):
        return params.get(name)
    return getattr(params, name, None)


@functools.cache
def _version_text(version: tuple[int, ...] | None) -> str:
    return "DeepSpeed " + ".".join(map(str, version)) if version else "DeepSpeed"


@functools.cache
def _no_zero() -> ZeroOptimization:
    """The ``zero_optimization`` section of a config without one (made once: sections are immutable)."""
    return ZeroOptimization()


class _Facts:
    """The config plus what DeepSpeed will make of it; ``None`` means unknown (an ``"auto"``)."""

    def __init__(
        self, config: Config, world_size: int | None, target: Target, resolved: bool, version: tuple[int, ...] | None
    ) -> None:
        self.config = config
        self.world_size = world_size
        self.target = target
        self.resolved = resolved
        self.version = version
        self.version_text = _version_text(version)
        self.rule = ""  # the rule running now (validate() sets it): its diagnostics carry its name

        zero = config.zero_optimization or _no_zero()
        self.zero = zero
        self.stage: int | None = 0 if zero.stage is None else _known(zero.stage)
        oo, op = zero.offload_optimizer, zero.offload_param
        self.oo_device: str | None = "none" if oo is None or oo.device is None else _known(oo.device)
        self.op_device: str | None = "none" if op is None or op.device is None else _known(op.device)
        self.cpu_optimizer: bool | None = None if self.oo_device is None else self.oo_device in ("cpu", "nvme")

        fp16, bf16 = config.fp16_config, config.bf16_config
        self.fp16: bool | None = False if fp16 is None or fp16.enabled is None else _known(fp16.enabled)
        self.bf16: bool | None = False if bf16 is None or bf16.enabled is None else _known(bf16.enabled)
        self.loss_scale: float | None = 0 if fp16 is None or fp16.loss_scale is None else _known(fp16.loss_scale)
        self.clipping: float | None = 1.0 if config.gradient_clipping is None else _known(config.gradient_clipping)

        self.optimizer: Optimizer | None = config.optimizer_config
        name = None if self.optimizer is None else self.optimizer.type
        self.opt_name: str | None = name
        # DeepSpeed lower-cases its own names and looks any other name up in torch.optim as written.
        self.opt_ds: str | None = name.lower() if name and name.lower() in DEEPSPEED_OPTIMIZERS else None
        self.opt_torch = name in TORCH_OPTIMIZERS and self.opt_ds is None

    def is_removed(self) -> bool:
        """Whether the installed DeepSpeed has dropped the removed features (unknown version: yes)."""
        return self.version is None or self.version >= _REMOVALS_SINCE

    def flag(self, value: Any, default: bool) -> bool | None:
        """A boolean setting with DeepSpeed's default; ``None`` when it is ``"auto"``."""
        return default if value is None else _known(value)

    def error(self, path: str, message: str, hint: str | None = None) -> Diagnostic:
        return Diagnostic(path, "error", message, hint, self.rule)

    def warning(self, path: str, message: str, hint: str | None = None) -> Diagnostic:
        return Diagnostic(path, "warning", message, hint, self.rule)

    def cpu_adam(self) -> bool | None:
        """Whether DeepSpeed will build its CPU Adam (needed by the low-precision master weights)."""
        if self.cpu_optimizer is None:
            return None
        if not self.cpu_optimizer:
            return False
        if self.optimizer is None:
            return None  # a client optimizer: DeepSpeedCPUAdam or not, we cannot tell
        return self.opt_ds in ("adam", "adamw") and _param(self.optimizer.params, "torch_adam") is not True


Rule = Callable[[_Facts], Iterator[Diagnostic]]
RULES: dict[str, Rule] = {}
"""Every rule by its id, in the order they run (the docs' rule catalogue is built from their docstrings)."""


def _rule(name: str) -> Callable[[Rule], Rule]:
    def register(fn: Rule) -> Rule:
        RULES[name] = fn
        return fn

    return register


# -- the rules: what DeepSpeed's parser refuses ---------------------------------


@_rule("removed-section")
def _removed_sections(f: _Facts) -> Iterator[Diagnostic]:
    """A top-level section DeepSpeed removed (``amp``, ``sparse_attention``, ...): DeepSpeed refuses the config."""
    if not f.config.extra:
        return
    from .convert import REMOVED_KEYS

    for key in f.config.extra:
        if key in REMOVED_KEYS:
            if f.is_removed():
                yield f.error(
                    key, f"removed from DeepSpeed: {f.version_text} refuses a config with it", REMOVED_KEYS[key]
                )
            else:
                yield f.warning(key, "deprecated: newer DeepSpeed refuses a config with it", REMOVED_KEYS[key])


@_rule("unknown-key")
def _unknown_keys(f: _Facts) -> Iterator[Diagnostic]:
    """Keys kept by ``from_dict(strict=False)``: DeepSpeed ignores them at the top level and in some sections,
    refuses them in its strict sections (``zero_optimization``, ``fp16``, ...), and fails on unknown optimizer and
    scheduler params when it builds them."""
    for path, _value in f.config.ignored.items():
        if path == "optimizer.params.max_grad_norm":
            continue  # the optimizer-params rule says it better
        head, _, rest = path.partition(".")
        key = path.rpartition(".")[2]
        hint = _unknown_key_hint(f.config, path)
        if key == "cpu_offload_use_pin_memory":
            yield f.warning(
                path,
                "deprecated; DeepSpeed reads and ignores it",
                "set pin_memory in offload_optimizer / offload_param",
            )
        elif head == "zero_optimization" and key in _REMOVED_ZERO_KEYS and rest == key:
            if f.is_removed():
                yield f.error(path, f"removed from DeepSpeed: {f.version_text} refuses a config with it", hint)
            else:
                yield f.warning(path, "deprecated: newer DeepSpeed refuses a config with it", hint)
        elif head in ("optimizer", "scheduler") and rest.startswith("params."):
            what = f.opt_name if head == "optimizer" else _scheduler_name(f.config)
            yield f.error(
                path,
                f"{what} takes no parameter {key!r}: DeepSpeed fails with a TypeError when it builds the {head}",
                hint or "remove it",
            )
        elif head in _STRICT_SECTIONS and rest:
            yield f.error(path, f"unknown key: DeepSpeed refuses it ({head} allows no other keys)", hint or "remove it")
        elif hint is not None and hint.startswith("did you mean"):
            # A misspelt known key: DeepSpeed ignores it silently, so the setting meant is not applied.
            yield f.error(path, "unknown key: DeepSpeed ignores it, so this setting is not applied", hint)
        else:
            yield f.warning(path, "unknown key: DeepSpeed ignores it", hint or "remove it or fix its spelling")


@_rule("fp16-and-bf16")
def _both_precisions(f: _Facts) -> Iterator[Diagnostic]:
    """fp16 and bf16 both enabled: DeepSpeed's parser refuses it."""
    if f.fp16 and f.bf16:
        yield f.error(
            "fp16.enabled", "fp16 and bf16 are both enabled", "keep one: .bf16() or .fp16() turns the other off"
        )


@_rule("fp16-dynamic-loss-scale")
def _loss_scale_bounds(f: _Facts) -> Iterator[Diagnostic]:
    """With fp16 and dynamic loss scaling (``loss_scale`` 0), ``loss_scale_window`` and ``min_loss_scale`` must be > 0."""
    fp16 = f.config.fp16_config
    if fp16 is None or not f.fp16 or f.loss_scale != 0:
        return
    for key, default in (("loss_scale_window", 1000), ("min_loss_scale", 1)):
        value = getattr(fp16, key)
        value = default if value is None else _known(value)
        if value is not None and value <= 0:
            yield f.error(
                f"fp16.{key}",
                f"got {value}, expected > 0 with dynamic loss scaling (loss_scale 0)",
                f"remove it for DeepSpeed's default {default}, or set a static fp16.loss_scale",
            )


@_rule("partial-offload-below-stage-3")
def _partial_offload(f: _Facts) -> Iterator[Diagnostic]:
    """``offload_optimizer.ratio`` below 1 (partial offload) needs stage 3: DeepSpeed's parser refuses it."""
    oo = f.zero.offload_optimizer
    ratio = None if oo is None or oo.ratio is None else _known(oo.ratio)
    if ratio is not None and ratio < 1 and f.stage is not None and f.stage != 3:
        yield f.error(
            "zero_optimization.offload_optimizer.ratio",
            f"partial offload (ratio {ratio}) needs ZeRO stage 3, got stage {f.stage}",
            "remove ratio to offload all optimizer states, or use .zero(3)",
        )


@_rule("allreduce-sum")
def _allreduce_sum(f: _Facts) -> Iterator[Diagnostic]:
    """``gradient_allreduce_op: "sum"`` is refused at stage 3, with ZenFlow and with DeepCompile."""
    if _known(f.config.gradient_allreduce_op) != "sum":
        return
    compile_section = f.config.extra.get("compile")
    deepcompile = isinstance(compile_section, Mapping) and compile_section.get("deepcompile") is True
    for reason, applies in (
        ("ZeRO stage 3", f.stage == 3),
        ("ZenFlow (zero_optimization.zenflow)", f.zero.zenflow is not None),
        ("DeepCompile (compile.deepcompile)", deepcompile),
    ):
        if applies:
            yield f.error(
                "gradient_allreduce_op", f'"sum" is not supported with {reason}', 'remove it to reduce with "mean"'
            )


@_rule("low-precision-master-weights")
def _master_weights(f: _Facts) -> Iterator[Diagnostic]:
    """fp16/bf16 master weights and bf16 optimizer states need ZeRO 1-3 (parser) and, mostly, CPU offload with
    DeepSpeed's CPU Adam (engine)."""
    fp16, bf16 = f.config.fp16_config, f.config.bf16_config
    fp16_master = fp16 is not None and fp16.fp16_master_weights_and_grads is True
    bf16_master = bf16 is not None and bf16.bf16_master_weights_and_grads is True
    bf16_states = bf16 is not None and bf16.bf16_optimizer_states is True
    if not (fp16_master or bf16_master or bf16_states):
        return  # every finding below is about one of them
    settings = (
        ("fp16.fp16_master_weights_and_grads", fp16_master),
        ("bf16.bf16_master_weights_and_grads", bf16_master),
        ("bf16.bf16_optimizer_states", bf16_states),
    )
    if f.stage == 0:
        for path, on in settings:
            if on:
                yield f.error(path, "needs ZeRO stage 1, 2 or 3, got stage 0", "use .zero(stage) or remove it")
        return
    if bf16_states and bf16 is not None and bf16.bf16_master_weights_and_grads in (None, False):
        yield f.error(
            "bf16.bf16_optimizer_states",
            "needs bf16.bf16_master_weights_and_grads",
            "set bf16_master_weights_and_grads: true",
        )
    if fp16_master and bf16_master:
        yield f.error(
            "bf16.bf16_master_weights_and_grads",
            "fp16_master_weights_and_grads and bf16_master_weights_and_grads exclude each other",
            "keep the one matching the training precision",
        )
    cpu_adam = f.cpu_adam()
    # bf16 master weights may stay on the device only when the optimizer states are bf16 too, without offload.
    bf16_on_device = bf16_states and f.cpu_optimizer is False
    needs_cpu_adam = (
        ("fp16.fp16_master_weights_and_grads", fp16_master),
        ("bf16.bf16_master_weights_and_grads", bf16_master and not bf16_on_device),
    )
    for path, needed in needs_cpu_adam:
        if needed and cpu_adam is False:
            yield f.error(
                path,
                "needs optimizer offload with DeepSpeed's CPU Adam (the engine stops otherwise)",
                "offload optimizer states (.offload_cpu()) with optimizer Adam or AdamW, without torch_adam",
            )


@_rule("compute-grad-norm")
def _compute_grad_norm(f: _Facts) -> Iterator[Diagnostic]:
    """``compute_grad_norm: false`` only at stages 1-2 (parser), and there only without clipping, offload or
    ZenFlow (engine)."""
    if f.zero.compute_grad_norm is not False:
        return
    path = "zero_optimization.compute_grad_norm"
    if f.stage is not None and f.stage not in (1, 2):
        yield f.error(path, f"false is supported only with ZeRO stage 1 or 2, got stage {f.stage}", "remove it")
        return
    if f.clipping is not None and f.clipping > 0:
        source = (
            "DeepSpeed's default gradient_clipping 1.0"
            if f.config.gradient_clipping is None
            else f"gradient_clipping {f.clipping}"
        )
        yield f.error(
            path,
            f"false needs gradient clipping off, but {source} clips",
            "set gradient_clipping: 0, or remove compute_grad_norm",
        )
    if f.oo_device in ("cpu", "nvme"):
        yield f.error(path, "false does not work with optimizer offload", "remove compute_grad_norm or the offload")
    if f.zero.zenflow is not None:
        yield f.error(path, "false does not work with ZenFlow", "remove compute_grad_norm or zenflow")
    grad_accum = f.config.data_types.grad_accum_dtype if f.config.data_types else None
    if f.stage == 1 and f.bf16 and _known(grad_accum) == "fp32" and f.oo_device != "cpu":
        yield f.error(
            path,
            "false does not work at stage 1 with bf16 and fp32 gradient accumulation (DeepSpeed's BF16 optimizer)",
            "remove compute_grad_norm",
        )


# -- the rules: what DeepSpeed finds when the engine starts ----------------------


@_rule("optimizer-name")
def _optimizer_name(f: _Facts) -> Iterator[Diagnostic]:
    """An optimizer name DeepSpeed does not know: not its own (any case), not a ``torch.optim`` class (exact case);
    the 1-bit optimizers were removed."""
    name = f.opt_name
    if name is None or f.opt_ds is not None or f.opt_torch:
        return
    if name.lower() in ONE_BIT_OPTIMIZERS:
        message = "the 1-bit optimizers (OneBitAdam, OneBitLamb, ZeroOneAdam) were removed from DeepSpeed"
        hint = 'use "Adam"/"AdamW" (or "Lamb" for OneBitLamb); for less communication see ZeRO++ (zero_quantized_gradients)'
        yield f.error("optimizer.type", message, hint) if f.is_removed() else f.warning("optimizer.type", message, hint)
        return
    hint = did_you_mean(name, (*_DISPLAY_NAMES, *TORCH_OPTIMIZERS)) or (
        "use Adam, AdamW, Adagrad, Lamb, Lion or Muon, or a torch.optim class name (case matters)"
    )
    yield f.error("optimizer.type", f"{f.version_text} does not know optimizer {name!r}", hint)


_FUSED: Final = {"adam": "FusedAdam", "adamw": "FusedAdam", "lamb": "FusedLamb"}


@_rule("optimizer-params")
def _optimizer_params(f: _Facts) -> Iterator[Diagnostic]:
    """Optimizer params the class DeepSpeed picks does not take: ``max_grad_norm`` (always refused), AMSGrad in the
    fused GPU kernels, CPU-only params without offload, ``bias_correction`` with ``torch_adam``."""
    if f.optimizer is None:
        return
    params = f.optimizer.params
    if _param(params, "max_grad_norm") is not None or "optimizer.params.max_grad_norm" in f.config.ignored:
        yield f.error(
            "optimizer.params.max_grad_norm",
            "DeepSpeed refuses max_grad_norm as an optimizer parameter",
            "remove it and set gradient_clipping at the top level (.clip_grad(norm))",
        )
    if f.cpu_optimizer is None:
        return
    torch_adam = _param(params, "torch_adam") is True
    if f.opt_ds in ("adam", "adamw") and torch_adam and _param(params, "bias_correction") is not None:
        yield f.error(
            "optimizer.params.bias_correction",
            "torch's Adam/AdamW (torch_adam: true) take no bias_correction",
            "remove it",
        )
    fused = _FUSED.get(f.opt_ds or "")
    if fused and (f.opt_ds == "lamb" or (not f.cpu_optimizer and not torch_adam)) and _param(params, "amsgrad") is True:
        yield f.error(
            "optimizer.params.amsgrad",
            f"DeepSpeed's {fused} does not support AMSGrad",
            "remove amsgrad" + (" (CPU Adam, with offload_optimizer, supports it)" if fused == "FusedAdam" else ""),
        )
    if f.opt_ds == "adagrad" and not f.cpu_optimizer:
        for key in ("amsgrad", "fp32_optimizer_states"):
            if _param(params, key) is not None:
                yield f.error(
                    f"optimizer.params.{key}",
                    "without optimizer offload DeepSpeed builds torch.optim.Adagrad, which takes no " + key,
                    "remove it (it applies to CPU Adagrad, with offload_optimizer)",
                )


@_rule("lamb-static-loss-scale")
def _lamb_loss_scale(f: _Facts) -> Iterator[Diagnostic]:
    """LAMB needs dynamic loss scaling: a static ``fp16.loss_scale`` stops the engine."""
    if f.opt_ds == "lamb" and f.loss_scale is not None and f.loss_scale > 0:
        yield f.error(
            "fp16.loss_scale",
            f"DeepSpeed's Lamb needs dynamic loss scaling, got a static loss_scale {f.loss_scale:g}",
            "set loss_scale: 0 (dynamic) or remove it",
        )


@_rule("untested-zero-optimizer")
def _untested_optimizer(f: _Facts) -> Iterator[Diagnostic]:
    """Under ZeRO, an optimizer DeepSpeed has not tested stops the engine unless ``zero_allow_untested_optimizer``."""
    if f.opt_name is None or f.stage is None or f.stage == 0 or f.opt_ds in ZERO_TESTED_OPTIMIZERS:
        return
    if f.opt_ds is None and not f.opt_torch:
        return  # an unknown name is reported by optimizer-name
    if f.flag(f.config.zero_allow_untested_optimizer, False) is not False:
        return
    yield f.error(
        "optimizer.type",
        f"{f.opt_name} is not among the optimizers DeepSpeed has tested with ZeRO (Adam, AdamW, Adagrad, Lion, Muon)",
        "set zero_allow_untested_optimizer: true to use it anyway",
    )


@_rule("offload-optimizer")
def _offload_optimizer(f: _Facts) -> Iterator[Diagnostic]:
    """Optimizer offload: only at ZeRO 1-3; with no ``optimizer`` section the optimizer passed to
    ``deepspeed.initialize`` must be DeepSpeed's CPU Adam/Lion (``zero_force_ds_cpu_optimizer``; Accelerate swaps
    torch's in); Lamb has no CPU version; other torch optimizers step slowly on the CPU."""
    if not f.cpu_optimizer:
        return
    path = "zero_optimization.offload_optimizer.device"
    if f.stage == 0:
        yield f.error(
            path,
            f"optimizer offload ({f.oo_device!r}) needs ZeRO stage 1, 2 or 3, got stage 0 "
            "(DeepSpeed's CPU optimizer would get the device parameters and stop at the first step)",
            "use .zero(stage), or remove offload_optimizer",
        )
        return
    if f.optimizer is None:
        # Accelerate (under the HF Trainer) swaps a torch Adam/AdamW/Adagrad for DeepSpeed's CPU version itself.
        if f.target != "hf" and f.flag(f.config.zero_force_ds_cpu_optimizer, True):
            yield f.warning(
                path,
                "optimizer states are offloaded but there is no optimizer section: the optimizer you pass to "
                "deepspeed.initialize must be DeepSpeedCPUAdam or DeepSpeedCPULion, or DeepSpeed stops (ZeRORuntimeException)",
                "add an optimizer section (e.g. .adamw()), or set zero_force_ds_cpu_optimizer: false to accept a slow client optimizer",
            )
        return
    if f.opt_ds == "lamb":
        yield f.error(
            "optimizer.type",
            "DeepSpeed's Lamb is a fused GPU kernel with no CPU version: it cannot step offloaded optimizer states",
            "use AdamW (DeepSpeed's CPU Adam) with offload, or keep optimizer states on the device",
        )
    elif f.opt_ds not in _CPU_OPTIMIZERS and (f.opt_ds is not None or f.opt_torch):
        yield f.warning(
            "optimizer.type",
            f"{f.opt_name} has no DeepSpeed CPU implementation: with offloaded states its step runs in plain PyTorch on the CPU (slow)",
            "use Adam, AdamW, Adagrad or Lion for DeepSpeed's vectorized CPU optimizers",
        )


@_rule("reduce-scatter-prescale")
def _prescale(f: _Facts) -> Iterator[Diagnostic]:
    """``prescale_gradients`` or ``gradient_predivide_factor`` != 1 with ZeRO-2/3 reduce-scatter stops the engine."""
    reduce_scatter = f.flag(f.zero.reduce_scatter, True)
    averaging = f.config.gradient_allreduce_op in (None, "mean")  # stage 2 asserts only when averaging
    applies = reduce_scatter and (f.stage == 3 or (f.stage == 2 and averaging))
    if not applies:
        return
    hint = "remove it, or set zero_optimization.reduce_scatter: false"
    if f.config.prescale_gradients is True:
        yield f.error("prescale_gradients", f"not supported with ZeRO stage {f.stage} reduce-scatter", hint)
    factor = _known(f.config.gradient_predivide_factor)
    if factor is not None and factor != 1:
        yield f.error(
            "gradient_predivide_factor",
            f"{factor:g} is not supported with ZeRO stage {f.stage} reduce-scatter (only 1.0)",
            hint,
        )


@_rule("nvme-path")
def _nvme_path(f: _Facts) -> Iterator[Diagnostic]:
    """NVMe offload without ``nvme_path`` (where it takes effect: stage 3) fails when the engine starts."""
    if f.stage is not None and f.stage != 3:
        return
    for key, section in (("offload_optimizer", f.zero.offload_optimizer), ("offload_param", f.zero.offload_param)):
        if section is not None and section.device == "nvme" and section.nvme_path is None:
            yield f.error(
                f"zero_optimization.{key}.nvme_path",
                'missing: device "nvme" needs a directory on the NVMe drive',
                "set nvme_path, e.g. .offload_nvme('/local_nvme')",
            )


@_rule("allgather-bucket-odd")
def _allgather_bucket(f: _Facts) -> Iterator[Diagnostic]:
    """Stages 1-2 assert ``allgather_bucket_size`` is a multiple of 2 (NCCL start alignment)."""
    size = _known(f.zero.allgather_bucket_size)
    if f.stage in (1, 2) and size is not None and size % 2:
        yield f.error(
            "zero_optimization.allgather_bucket_size",
            f"{size} is odd; ZeRO stages 1-2 need a multiple of 2",
            f"use {size + 1}",
        )


@_rule("legacy-stage1")
def _legacy_stage1(f: _Facts) -> Iterator[Diagnostic]:
    """``legacy_stage1: true`` stops the engine (removed in DeepSpeed 0.5.9)."""
    if f.zero.legacy_stage1 is True and f.stage != 0:
        yield f.error(
            "zero_optimization.legacy_stage1", "the old stage-1 implementation was removed from DeepSpeed", "remove it"
        )


@_rule("param-dtype")
def _param_dtype(f: _Facts) -> Iterator[Diagnostic]:
    """``data_types.param_dtype`` must match the enabled precision, or the engine stops."""
    param_dtype = _known(f.config.data_types.param_dtype) if f.config.data_types else None
    if param_dtype is None or f.fp16 is None or f.bf16 is None:
        return
    mode = "fp16" if f.fp16 else "bf16" if f.bf16 else "fp32"
    if param_dtype != mode:
        yield f.error(
            "data_types.param_dtype",
            f"{param_dtype!r} conflicts with the training precision ({mode})",
            "enable the matching fp16/bf16 section, or remove param_dtype",
        )


@_rule("managed-gradient-accumulation")
def _managed_accumulation(f: _Facts) -> Iterator[Diagnostic]:
    """``managed_gradient_accumulation: false`` works with ``overlap_comm`` only at ZeRO stage 2 and up."""
    if f.config.managed_gradient_accumulation is not False or f.stage is None or f.stage >= 2:
        return
    if f.flag(f.zero.overlap_comm, f.stage == 3):
        yield f.error(
            "managed_gradient_accumulation",
            f"false needs zero_optimization.overlap_comm off below stage 2 (stage is {f.stage})",
            "set overlap_comm: false, or use ZeRO stage 2 or 3",
        )


_REQUIRED_PARAMS: Final[Mapping[str, tuple[str, ...]]] = {
    "WarmupDecayLR": ("total_num_steps",), "WarmupCosineLR": ("total_num_steps",),
    "OneCycle": ("cycle_min_lr", "cycle_max_lr"),
}  # fmt: skip


@_rule("scheduler")
def _scheduler(f: _Facts) -> Iterator[Diagnostic]:
    """Scheduler names DeepSpeed does not know, params its scheduler does not take, required params missing
    (``total_num_steps``, OneCycle's lr bounds), step counts DeepSpeed refuses."""
    scheduler = f.config.scheduler
    if scheduler is None:
        return
    name = scheduler.type
    if name not in SCHEDULERS and name not in TORCH_SCHEDULERS:
        hint = did_you_mean(name, (*SCHEDULERS, *TORCH_SCHEDULERS)) or (
            "use " + ", ".join(SCHEDULERS) + " or a torch.optim.lr_scheduler class name (case matters)"
        )
        yield f.error("scheduler.type", f"DeepSpeed does not know scheduler {name!r}", hint)
        return
    params = scheduler.params
    typed = scheduler_params_class(name)
    if typed is not None and _is_table(params):
        names = {key_of(a) for a in attrs.fields(typed)}
        for key in params:
            if key not in names:
                hint = UNKNOWN_KEY_HINTS.get((typed.__name__, key)) or did_you_mean(key, names) or "remove it"
                yield f.error(
                    f"scheduler.params.{key}",
                    f"{name} takes no parameter {key!r}: DeepSpeed fails with a TypeError",
                    hint,
                )
    required = _REQUIRED_PARAMS.get(name, ())
    for key in required:
        if _param(params, key) is None:
            hint = 'set it, or "auto" for resolve() / the HF Trainer' if key == "total_num_steps" else "set it"
            yield f.error(f"scheduler.params.{key}", f"missing: {name} needs it", hint)
    if name in ("WarmupLR", "WarmupDecayLR", "WarmupCosineLR"):
        written = _param(params, "warmup_num_steps")
        warmup = 1000 if written is None else _known(written)
        if warmup == 0:
            message = "got 0, expected a positive number of steps"
            hint = "use 1 for no warmup"
            if f.version is None or f.version >= _WARMUP_STEPS_POSITIVE_SINCE:
                yield f.error("scheduler.params.warmup_num_steps", message, hint)
            else:
                yield f.warning("scheduler.params.warmup_num_steps", message + " (newer DeepSpeed refuses 0)", hint)
        total = _known(_param(params, "total_num_steps"))
        if "total_num_steps" in required and isinstance(total, int) and isinstance(warmup, int) and total < warmup:
            default = " (DeepSpeed's default)" if written is None else ""
            yield f.warning(
                "scheduler.params.total_num_steps",
                f"{total} is less than warmup_num_steps {warmup}{default}: the schedule never leaves warmup",
                "lower warmup_num_steps or raise total_num_steps",
            )
    if name == "OneCycle" and _known(_param(params, "cycle_first_step_size")) == 0:
        yield f.error(
            "scheduler.params.cycle_first_step_size",
            "got 0, expected a positive number of steps",
            "remove it for the default 2000",
        )


# -- the rules: what DeepSpeed never says ----------------------------------------


@_rule("offload-param-below-stage-3")
def _offload_param(f: _Facts) -> Iterator[Diagnostic]:
    """``offload_param`` below stage 3: DeepSpeed ignores it silently, parameters stay on the device."""
    if f.stage is not None and f.stage < 3 and f.op_device in ("cpu", "nvme"):
        yield f.warning(
            "zero_optimization.offload_param",
            f"ignored at stage {f.stage}: DeepSpeed offloads parameters only at stage 3",
            "remove offload_param, or use .zero(3)",
        )


@_rule("nvme-optimizer-below-stage-3")
def _nvme_below_3(f: _Facts) -> Iterator[Diagnostic]:
    """NVMe optimizer offload below stage 3: stages 1-2 keep the states in CPU memory, nvme_path is unused."""
    if f.stage in (1, 2) and f.oo_device == "nvme":
        yield f.warning(
            "zero_optimization.offload_optimizer.device",
            f'"nvme" at stage {f.stage} offloads to CPU memory: only stage 3 (ZeRO-Infinity) writes to NVMe',
            'use device "cpu", or .zero(3) for NVMe',
        )


@_rule("stage-3-only-key")
def _stage3_keys(f: _Facts) -> Iterator[Diagnostic]:
    """Keys only the stage-3 optimizer reads (``stage3_*``, ``sub_group_size``, ZeRO++ ...), set below stage 3."""
    if f.stage is None or f.stage == 3:
        return
    for key in _STAGE3_ONLY:
        if getattr(f.zero, key) is not None:
            yield f.warning(
                f"zero_optimization.{key}",
                f"ignored at stage {f.stage}: only stage 3 reads it",
                "remove it, or use .zero(3)",
            )
    oo = f.zero.offload_optimizer
    for key in ("super_offload", "cpuadam_cores_perc"):
        if oo is not None and getattr(oo, key) is not None:
            yield f.warning(
                f"zero_optimization.offload_optimizer.{key}",
                f"ignored at stage {f.stage}: only stage 3 reads it",
                "remove it, or use .zero(3)",
            )


@_rule("zero3-16bit-save")
def _gather_on_save(f: _Facts) -> Iterator[Diagnostic]:
    """ZeRO-3 without ``stage3_gather_16bit_weights_on_model_save``: saved models and LoRA adapters come out empty."""
    if f.stage != 3:
        return
    value = f.zero.stage3_gather_16bit_weights_on_model_save
    if value is True or (value is AUTO and f.target != "hf"):
        return  # an "auto" outside the HF Trainer is reported by the auto rule
    what = 'Accelerate fills "auto" with false' if value is AUTO else "not enabled"
    yield f.warning(
        "zero_optimization.stage3_gather_16bit_weights_on_model_save",
        f"{what}: with ZeRO-3 the weights are partitioned, so save_16bit_model / save_model (and LoRA adapters) come out empty",
        "set it true, or consolidate checkpoints with zero_to_fp32.py",
    )


@_rule("batch-size")
def _batch(f: _Facts) -> Iterator[Diagnostic]:
    """Batch sizes: neither ``train_batch_size`` nor the micro batch set (DeepSpeed asserts), or a batch triangle
    that does not divide at the given world size (also: no world size fits it at all)."""
    c = f.config
    train, micro, accum = c.train_batch_size, c.train_micro_batch_size_per_gpu, c.gradient_accumulation_steps
    if train is None and micro is None:
        message = (
            "neither train_batch_size nor train_micro_batch_size_per_gpu is set: DeepSpeed stops with an AssertionError"
        )
        hint = 'set train_micro_batch_size_per_gpu (.batch(micro=...)), or "auto" for resolve() / the HF Trainer'
        yield (
            f.error("train_micro_batch_size_per_gpu", message, hint)
            if f.resolved
            else f.warning("train_micro_batch_size_per_gpu", message, hint)
        )
        return
    if train is AUTO or micro is AUTO or accum is AUTO:
        return
    train = train if isinstance(train, int) else None
    micro = micro if isinstance(micro, int) else None
    accum = accum if isinstance(accum, int) else None
    if f.world_size is None:
        yield from _batch_without_world(f, train, micro, accum)
        return
    sp = _known(c.sequence_parallel_size) or 1
    if f.world_size % sp:
        yield f.error(
            "sequence_parallel_size",
            f"{sp} does not divide the world size {f.world_size}",
            "use a sequence-parallel degree that divides the number of processes",
        )
        return
    problem = _triangle(train, micro, accum, f.world_size // sp)[1]
    if problem is not None:
        yield f.error("train_batch_size", *problem)


def _batch_without_world(f: _Facts, train: int | None, micro: int | None, accum: int | None) -> Iterator[Diagnostic]:
    if train is None:
        return
    per_rank = (micro or 1) * (accum or 1)
    if (micro is not None or accum is not None) and train % per_rank:
        given = [
            (k, v) for k, v in (("train_micro_batch_size_per_gpu", micro), ("gradient_accumulation_steps", accum)) if v
        ]
        product = " x ".join(f"{k} {v}" for k, v in given) + (f" = {per_rank}" if len(given) > 1 else "")
        yield f.error(
            "train_batch_size",
            f"{train} is not a multiple of {product}, so no world size fits",
            f"use a multiple of {per_rank}, or leave train_batch_size out and let DeepSpeed derive it",
        )


def _triangle(
    train: int | None, micro: int | None, accum: int | None, dp: int
) -> tuple[tuple[int, int, int] | None, tuple[str, str] | None]:
    """DeepSpeed's batch triangle at data-parallel size ``dp``: the three sizes, or the problem (message, hint)."""
    if train is None and micro is None:
        return None, None
    if train is not None and micro is not None and accum is not None:
        if train != micro * accum * dp:
            return None, (
                f"{train} != train_micro_batch_size_per_gpu {micro} x gradient_accumulation_steps {accum} x world size {dp} = {micro * accum * dp}",
                f"set train_batch_size {micro * accum * dp}, or leave it out and let DeepSpeed derive it",
            )
        return (train, micro, accum), None
    if train is None:
        assert micro is not None
        accum = accum or 1
        return (micro * accum * dp, micro, accum), None
    # DeepSpeed derives the missing size with floor division, then asserts the product.
    given, name = (
        (micro, "train_micro_batch_size_per_gpu") if micro is not None else (accum or 1, "gradient_accumulation_steps")
    )
    unit = given * dp
    if train % unit:  # also train < unit: DeepSpeed would derive a size of 0
        what = (
            f"{name} {given} x world size {dp} = {unit}"
            if micro is not None or accum is not None
            else f"world size {dp}"
        )
        return None, (
            f"{train} is not a multiple of {what}",
            f"use a multiple of {unit}, or set train_micro_batch_size_per_gpu and gradient_accumulation_steps instead",
        )
    derived = train // unit
    if micro is not None:
        return (train, micro, derived), None
    return (train, derived, accum or 1), None


@_rule("auto")
def _autos(f: _Facts) -> Iterator[Diagnostic]:
    """``"auto"`` left for DeepSpeed: judged by who fills it, per the target and ``resolved`` (module docstring)."""
    for path in _auto_paths(f.config, ""):
        filler = HF_FILLED.get(path)
        below_3 = path in _STAGE3_BUCKETS and f.stage is not None and f.stage != 3
        if below_3:
            filler = None  # the HF Trainer and resolve() fill the stage-3 buckets only at stage 3
        if f.resolved:
            if filler:
                hint = f"resolve() fills it from {filler}: give resolve() that"
            else:
                hint = "remove it: only stage 3 reads it" if below_3 else "set a value: nothing fills it"
            yield f.error(path, '"auto" left after resolve', hint)
        elif f.target == "hf":
            if (
                filler
                or path in _STAGE3_BUCKETS
                or path == "zero_optimization.stage3_gather_16bit_weights_on_model_save"
            ):
                continue  # filled (Accelerate fills the buckets at any stage; zero3-16bit-save speaks of the save flag)
            if path in _ACCELERATE_FILLED:
                setting, default = _ACCELERATE_FILLED[path]
                yield f.warning(
                    path,
                    f'"auto" is filled by Accelerate from its own {setting} setting (accelerate config or the '
                    f"ACCELERATE_DEEPSPEED_* environment; default {default}), not from this config",
                    "write the value here, so the config says what runs",
                )
                continue
            yield f.error(
                path,
                '"auto" is not filled here by the HF Trainer (Accelerate stops on it)',
                "set a value, or remove the key for DeepSpeed's default",
            )
        elif filler is not None:
            if path in _BATCH_KEYS or path == "gradient_clipping":
                consequence = "DeepSpeed fails on it with a TypeError"
            elif path in ("fp16.enabled", "bf16.enabled"):
                consequence = "DeepSpeed reads it as false and trains in fp32"
            else:
                consequence = "DeepSpeed reads it as unset and uses its default"
            yield f.warning(path, f'"auto" must be resolved first: {consequence}', _RESOLVE_HINT)
        elif below_3:
            yield f.error(
                path,
                f'"auto" is filled only at stage 3 (by resolve() and the HF Trainer), got stage {f.stage}',
                "remove it: only stage 3 reads it",
            )
        else:
            yield f.error(
                path,
                '"auto" is not filled here by resolve() or the HF Trainer',
                "set a value, or remove the key for DeepSpeed's default",
            )


def _auto_paths(obj: Any, path: str) -> list[str]:
    """Dotted paths of every ``AUTO`` in a config (typed sections and free optimizer/scheduler params)."""
    found: list[str] = []
    _collect_autos(obj, path, found)
    return found


def _collect_autos(obj: Any, path: str, found: list[str]) -> None:
    """Append to ``found`` the path of every ``AUTO`` in the section ``obj`` (at ``path``), in field order."""
    walker = _WALKERS.get(type(obj))
    if walker is None:
        walker = _WALKERS[type(obj)] = _make_walker(type(obj))
    walker(obj, path, found)


def _collect_all(obj: Any, path: str, found: list[str]) -> None:
    """``_collect_autos`` for a section with ``AUTO`` among its own fields: every field is looked at."""
    keys, values, free = _auto_layout(type(obj))
    got = values(obj)
    # A plain number, string or boolean holds no AUTO: those (most fields, with the unset ones) are skipped at C speed.
    for i in compress(_INDICES, map(_PLAIN_TYPES.get, map(type, got), _ONES)):
        _collect_field(got[i], f"{path}.{keys[i]}" if path else keys[i], free[i], found)


def _collect_field(value: Any, sub: str, free: bool, found: list[str]) -> None:
    """The ``AUTO`` of one field, at ``sub``, that is set."""
    if sub == "data_types.keep_in_fp32_modules":
        return  # DeepSpeed's own "auto": it picks the modules itself
    if value is AUTO or (isinstance(value, tuple) and any(x is AUTO for x in value)):
        found.append(sub)
    elif _is_attrs(type(value)):
        _collect_autos(value, sub, found)
    elif free and isinstance(value, Mapping):  # free params of torch optimizers and schedulers
        found.extend([f"{sub}.{key}" for key, item in value.items() if item is AUTO])


class _AutoLayout(NamedTuple):
    """The fields ``_auto_paths`` reads in a section class: all but ``extra``, ``ignored``, ``source``,
    ``provenance``."""

    keys: tuple[str, ...]
    """Their ds keys."""
    values: Callable[[Any], tuple[Any, ...]]
    """A getter of all their values at once."""
    free: tuple[bool, ...]
    """Which are free tables (no ``Spec``: optimizer/scheduler params)."""


_Walker = Callable[[Any, str, list[str]], None]
_WALKERS: dict[type, _Walker] = {}
_AUTO_LAYOUTS: dict[type, _AutoLayout] = {}
_ATTRS_CLASSES: dict[type, bool] = {}
_INDICES: Final = range(1 << 30)
_ONES: Final = repeat(1)
_PLAIN_TYPES: Final[dict[type, int]] = {type(None): 0, bool: 0, int: 0, float: 0, str: 0}
"""Types of values that hold no ``AUTO`` (mapped to 0: skipped); any other type maps to 1 by default."""
_FLAT_KINDS: Final = ("int", "float", "bool", "str", "choice", "mapping", "json")
"""Field kinds whose value holds no ``AUTO`` unless it is ``AUTO`` (their validators allow nothing else)."""


def _auto_fields(cls: type) -> list[attrs.Attribute[Any]]:
    return [a for a in attrs.fields(cls) if a.name not in ("extra", "ignored", "source", "provenance")]


def _auto_layout(cls: type) -> _AutoLayout:
    layout = _AUTO_LAYOUTS.get(cls)
    if layout is None:
        fields = _auto_fields(cls)
        names = [a.name for a in fields]
        getter = operator.attrgetter(*names) if len(names) > 1 else lambda obj: tuple(getattr(obj, n) for n in names)
        layout = _AUTO_LAYOUTS[cls] = _AutoLayout(
            keys=tuple(key_of(a) for a in fields),
            values=getter,
            free=tuple(a.metadata.get("dsbuild") is None for a in fields),
        )
    return layout


def _make_walker(cls: type) -> _Walker:
    """``_collect_autos`` for the section class ``cls``, as straight-line code (an attribute read is then a few
    instructions, not a call), like the ``__init__`` attrs writes.

    The common case is a section with no ``AUTO`` among its fields: then only its sections, pairs, lists and
    optimizer/scheduler params can hold one further down, and only those are looked at. Otherwise
    ``_collect_all`` looks at every field.
    """
    fields = _auto_fields(cls)
    reads = [f"obj.{a.name}" if a.name.isidentifier() and not keyword.iskeyword(a.name) else f"getattr(obj, {a.name!r})"
             for a in fields]  # fmt: skip
    lines = ["def walk(obj, path, found, AUTO=AUTO):"]
    if fields:
        lines += [
            "    if " + " or ".join(f"{read} is AUTO" for read in reads) + ":",
            "        return all(obj, path, found)",
        ]
    for a, read in zip(fields, reads, strict=True):
        spec = a.metadata.get("dsbuild")
        if spec is not None and spec.kind in _FLAT_KINDS:
            continue
        key = key_of(a)
        sub = f"path + {'.' + key!r} if path else {key!r}"
        lines += [f"    value = {read}", "    if value is not None:"]
        if spec is not None and spec.kind == "section":
            lines.append(f"        section(value, {sub}, found)")  # a section (its validator says so)
        else:
            lines.append(f"        field(value, {sub}, {spec is None}, found)")
    lines.append("    return None")
    namespace = {"AUTO": AUTO, "all": _collect_all, "section": _collect_autos, "field": _collect_field}
    exec(compile("\n".join(lines), f"<auto walker of {cls.__module__}.{cls.__qualname__}>", "exec"), namespace)
    return cast(_Walker, namespace["walk"])


def _is_attrs(cls: type) -> bool:
    """``attrs.has(cls)``, remembered per class."""
    known = _ATTRS_CLASSES.get(cls)
    if known is None:
        known = _ATTRS_CLASSES[cls] = attrs.has(cls)
    return known


# -- helpers ---------------------------------------------------------------------


def _scheduler_name(config: Config) -> str:
    return config.scheduler.type if config.scheduler is not None else "the scheduler"


def _unknown_key_hint(config: Config, path: str) -> str | None:
    """ "did you mean" (or a known replacement) for an unknown key at ``path``, as the reader gives it."""
    *parents, key = path.split(".")
    cls = _section_at(config, parents)
    if cls is None:
        return None
    names = {key_of(a) for a in attrs.fields(cls)} - {"extra", "ignored", "source", "provenance"}
    hint = unknown_key(cls, "", key, names).hint
    return "remove it" if hint == IGNORED_KEY_HINT else hint


def _section_at(config: Config, parents: list[str]) -> Any:
    """The section class at a dotted key path (optimizer/scheduler params by their ``type``), or ``None``."""
    cls: Any = Config
    for part in parents:
        if cls is Optimizer and part == "params":
            cls = optimizer_params_class(config.optimizer_config.type) if config.optimizer_config else None
        elif cls is Scheduler and part == "params":
            cls = scheduler_params_class(config.scheduler.type) if config.scheduler else None
        else:
            attribute = {key_of(a): a for a in attrs.fields(cls)}.get(part)
            spec = attribute.metadata.get("dsbuild") if attribute is not None else None
            cls = spec.section if spec is not None and spec.kind == "section" else None
        if cls is None:
            return None
    return cls


def batch_triangle(config: Config, world_size: int) -> tuple[int, int, int] | None:
    """``(train_batch_size, micro, accumulation)`` as DeepSpeed derives them at ``world_size`` processes.

    ``None`` when they cannot be derived: a batch key is ``"auto"``, none is set, or they do not divide (``validate``
    says which). ``sequence_parallel_size`` divides the world size first, as DeepSpeed does.
    """
    keys = (config.train_batch_size, config.train_micro_batch_size_per_gpu, config.gradient_accumulation_steps)
    if AUTO in keys or AUTO is config.sequence_parallel_size:
        return None
    sp = config.sequence_parallel_size or 1
    if world_size % sp:
        return None
    train, micro, accum = (k if isinstance(k, int) else None for k in keys)
    return _triangle(train, micro, accum, world_size // sp)[0]


# -- entry points ----------------------------------------------------------------


def validate(
    config: Config, *, world_size: int | None = None, target: str = "deepspeed", resolved: bool = False
) -> list[Diagnostic]:
    """Every problem of ``config``: errors first, then warnings.

    ``world_size`` (the number of processes) enables the batch-divisibility check; ``target`` is ``"deepspeed"``
    (the config goes to DeepSpeed as is) or ``"hf"`` (to the HF Trainer / Accelerate, which fill their
    ``"auto"`` values); ``resolved=True`` says the config should have no ``"auto"`` left.
    """
    if target not in ("deepspeed", "hf"):
        raise InvalidValueError(Problem("target", f"got {describe(target)}, expected one of 'deepspeed', 'hf'"))
    if world_size is not None and (not isinstance(world_size, int) or isinstance(world_size, bool) or world_size < 1):
        raise InvalidValueError(Problem("world_size", f"got {describe(world_size)}, expected an integer >= 1"))
    facts = _Facts(config, world_size, cast(Target, target), resolved, _deepspeed_version())
    errors: list[Diagnostic] = []
    warnings: list[Diagnostic] = []
    for name, rule in RULES.items():
        facts.rule = name
        for d in rule(facts):
            if d.rule != name or type(d) is not Diagnostic:
                d = attrs.evolve(d, rule=name)
            (errors if d.severity == "error" else warnings).append(d)
    return errors + warnings


def check(config: Config, *, world_size: int | None = None, target: str = "deepspeed", resolved: bool = False) -> None:
    """Raise one ``ConfigError`` listing every error of ``config`` (warnings do not raise).

    The error is an ``UnresolvedAutoError`` when every problem is an ``"auto"`` left over.
    """
    errors = [
        d for d in validate(config, world_size=world_size, target=target, resolved=resolved) if d.severity == "error"
    ]
    if not errors:
        return
    problems = [Problem(d.path, d.message, d.hint) for d in errors]
    if all(d.rule == "auto" for d in errors):
        raise UnresolvedAutoError(problems)
    raise ConfigError(problems)
