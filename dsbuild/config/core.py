"""``Config``: the whole ds_config as one frozen object, and its fluent builder.

Every builder verb returns a new ``Config``; a bad argument fails at the call
that made it, with the dotted key path. Verbs work on the class too:
``Config.zero(3)`` is ``Config().zero(3)``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Concatenate, Generic, ParamSpec, TypeVar, overload

import attrs

from .._suggest import did_you_mean
from ..errors import ConfigError, InvalidValueError, Problem, UnknownKeyError
from . import _fields as f
from ._fields import AUTO, Auto
from .misc import (
    ActivationCheckpointing,
    Aio,
    Checkpoint,
    Comet,
    CommsLogger,
    CsvMonitor,
    FlopsProfiler,
    TensorBoard,
    TensorParallel,
    Wandb,
)
from .optim import (
    AdagradParams,
    AdamParams,
    LambParams,
    LionParams,
    LRRangeTestParams,
    OneCycleParams,
    Optimizer,
    Scheduler,
    WarmupCosineLRParams,
    WarmupDecayLRParams,
    WarmupLRParams,
    optimizer_params_class,
)
from .precision import BF16, FP16, DataTypes, TorchAutocast
from .zero import OffloadOptimizer, OffloadParam, ZeroOptimization

if TYPE_CHECKING:
    # resolve.py is written alongside; until it lands mypy would report the import (hence both codes).
    from ..resolve import Explanation, Training  # type: ignore[import-not-found, unused-ignore]
    from ..validate import Diagnostic

__all__ = ["PASSTHROUGH_KEYS", "Config"]

P = ParamSpec("P")
R = TypeVar("R")

PASSTHROUGH_KEYS: Mapping[str, str] = {
    "autotuning": "DeepSpeed autotuner settings",
    "compile": "torch.compile / DeepCompile settings",
    "pipeline": "pipeline-parallel engine settings",
    "hybrid_engine": "RLHF hybrid engine settings",
    "data_efficiency": "data sampling and routing (curriculum learning)",
    "weight_quantization": "weight quantization settings",
    "timers": "throughput timer settings",
    "datastates_ckpt": "DataStates asynchronous checkpointing",
    "expert_parallel": "AutoEP expert parallelism",
}
"""Top-level sections DeepSpeed reads that dsbuild carries as written, untyped (the long tail)."""


class _verb(Generic[P]):
    """A builder verb usable on the class (starting from an empty config) or on an instance."""

    def __init__(self, fn: Callable[Concatenate[Config, P], Config]) -> None:
        self.fn = fn
        functools.update_wrapper(self, fn)  # type: ignore[arg-type]

    @overload
    def __get__(self, obj: None, owner: type[Config]) -> Callable[P, Config]: ...
    @overload
    def __get__(self, obj: Config, owner: type[Config]) -> Callable[P, Config]: ...
    def __get__(self, obj: Config | None, owner: type[Config]) -> Callable[P, Config]:
        target = owner() if obj is None else obj
        return functools.partial(self.fn, target)


def _build(cls: type[R], path: str, fields: Mapping[str, Any]) -> R:
    """``cls(**fields)`` with unknown names and bad values reported under ``path``, all at once."""
    checked = _checked(cls, path, fields)
    built: R = cls(**checked)
    return built


def _checked(cls: type[Any], path: str, fields: Mapping[str, Any]) -> dict[str, Any]:
    """``fields`` checked against section ``cls``: raises every unknown name and bad value under ``path`` at once.

    A section field also takes a table (``zero_options(offload_optimizer={"device": "cpu"})``),
    read as a file's table would be.
    """
    names = {f.key_of(a) for a in attrs.fields(cls)}
    problems = [unknown_key(cls, path, k, names) for k in fields if k not in names]
    checked: dict[str, Any] = {}
    for a in attrs.fields(cls):
        key = f.key_of(a)
        if key not in fields:
            continue
        value = fields[key]
        spec = a.metadata.get("dsbuild")
        if spec is not None:
            where = f"{path}.{key}" if path else key
            if spec.kind == "section" and isinstance(value, Mapping) and spec.section is not None:
                from ..convert import read_section  # the reader of file tables; imported late (layering)

                value, found = read_section(spec.section, value, where)
                problems.extend(found)
            else:
                if spec.auto and isinstance(value, str) and value == "auto":
                    value = AUTO  # "auto" means in Python what it means in a file
                elif spec.kind in ("strs", "pair") and isinstance(value, list):
                    value = tuple(value)
                message = f.check_value(spec, value)
                if message is not None:
                    problems.append(Problem(where, message))
        checked[key] = value
    _raise(problems)
    return checked


IGNORED_KEY_HINT = "DeepSpeed ignores it; remove it"
"""The hint for a key starting with ``_`` (a comment such as ``_comment``): not a misspelling."""


def unknown_key(cls: type, path: str, key: str, names: set[str]) -> Problem:
    """The problem of ``key`` given to section ``cls`` at ``path``, with the best hint we have.

    In order: a hint written for this key (``UNKNOWN_KEY_HINTS``); for ``_comment`` and other
    ``_`` keys, that DeepSpeed ignores them; a close name in the same section; the same key in
    another section (``offload_optimizer`` at the top -> ``zero_optimization.offload_optimizer``).
    """
    hint = f.UNKNOWN_KEY_HINTS.get((cls.__name__, key))
    if hint is None and key.startswith("_"):
        hint = IGNORED_KEY_HINT
    if hint is None and attrs.has(cls):
        # The attribute name of an aliased field (Config.fp16_config is written "fp16").
        alias = next((f.key_of(a) for a in attrs.fields(cls) if a.name == key and f.key_of(a) != key), None)
        hint = f"did you mean {alias!r}?" if alias is not None else None
    if hint is None:
        hint = did_you_mean(key, names)
    if hint is None:
        elsewhere = _key_paths().get(key)
        if elsewhere:
            hint = f"did you mean {elsewhere[0]!r}?"
    return Problem(f"{path}.{key}" if path else key, "unknown key", hint)


_NOT_KEYS = frozenset({"extra", "ignored", "source", "provenance"})
"""``Config`` attributes that are not ds_config keys."""


@functools.cache
def _key_paths() -> dict[str, list[str]]:
    """Every ds key -> the dotted paths it sits at (sections first, then optimizer/scheduler params)."""
    classes: dict[str, type[Any]] = dict(section_classes())
    optimizer_params: tuple[type[Any], ...] = (AdamParams, LambParams, LionParams, AdagradParams)
    scheduler_params: tuple[type[Any], ...] = (
        WarmupLRParams, WarmupDecayLRParams, WarmupCosineLRParams, OneCycleParams, LRRangeTestParams
    )
    for params in optimizer_params:
        classes[f"optimizer.params[{params.__name__}]"] = params
    for params in scheduler_params:
        classes[f"scheduler.params[{params.__name__}]"] = params
    paths: dict[str, list[str]] = {}
    for path, cls in classes.items():
        prefix = path.split("[", 1)[0]
        for a in attrs.fields(cls):
            if a.name in _NOT_KEYS:
                continue
            key = f.key_of(a)
            dotted = f"{prefix}.{key}" if prefix else key
            if dotted not in paths.setdefault(key, []):
                paths[key].append(dotted)
    return paths


def _raise(problems: list[Problem]) -> None:
    """Raise the problems together: unknown keys, bad values, or both."""
    if not problems:
        return
    unknown = [p for p in problems if p.message == "unknown key"]
    if len(unknown) == len(problems):
        raise UnknownKeyError(problems)
    raise (InvalidValueError if not unknown else ConfigError)(problems)


def _set(**fields: Any) -> dict[str, Any]:
    """The arguments that were given (``None`` means "leave unset")."""
    return {k: v for k, v in fields.items() if v is not None}


def _with_aliases(fields: dict[str, Any], aliases: Mapping[str, str], path: str) -> dict[str, Any]:
    """Rename short argument names (``warmup_steps``) to DeepSpeed's (``warmup_num_steps``)."""
    out = dict(fields)
    for short, name in aliases.items():
        if short in out:
            if name in out:
                raise InvalidValueError(
                    Problem(f"{path}.{name}", f"given twice, as {short!r} and {name!r}", f"pass only {name!r}")
                )
            out[name] = out.pop(short)
    return out


_LOG_LEVELS = tuple(
    spelling for level in ("debug", "info", "warning", "error", "critical") for spelling in (level, level.upper())
)
"""The levels DeepSpeed's ``log_level`` takes (it lower-cases the value)."""

def _is_mapping(_inst: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if not isinstance(value, Mapping):
        raise InvalidValueError(Problem(attribute.name, f"got {f.describe(value)}, expected a table"))


_SCHEDULER_ALIASES = {
    "warmup_steps": "warmup_num_steps",
    "total_steps": "total_num_steps",
    "min_lr": "warmup_min_lr",
    "max_lr": "warmup_max_lr",
}


@f.section_class
class Config:
    """A DeepSpeed config (the ds_config dict), typed; ``None`` fields are unset and not written.

    Attributes are the ds_config keys, except the three whose key is also a
    builder verb: ``fp16_config``, ``bf16_config`` and ``optimizer_config`` hold
    the ``fp16``, ``bf16`` and ``optimizer`` sections (the constructor takes
    ``fp16=``, ``bf16=``, ``optimizer=``).
    """

    train_batch_size: int | Auto | None = f.int_(gt=0)
    """Global batch size per optimizer step: micro x accumulation x world size (HF ``"auto"``); derived when unset."""
    train_micro_batch_size_per_gpu: int | Auto | None = f.int_(gt=0)
    """Samples per device per forward/backward (HF ``"auto"``: ``per_device_train_batch_size``); derived when unset."""
    gradient_accumulation_steps: int | Auto | None = f.int_(gt=0)
    """Micro-batches accumulated per optimizer step (HF ``"auto"``); default 1 or derived."""
    fp16_config: FP16 | None = attrs.field(default=None, alias="fp16", **f.section_options(FP16))
    """fp16 mixed precision with loss scaling; default off."""
    bf16_config: BF16 | None = attrs.field(default=None, alias="bf16", **f.section_options(BF16))
    """bf16 mixed precision (legacy key ``bfloat16``); default off."""
    optimizer_config: Optimizer | None = attrs.field(default=None, alias="optimizer", **f.section_options(Optimizer))
    """Optimizer DeepSpeed builds; default none (pass your own to ``deepspeed.initialize``)."""
    scheduler: Scheduler | None = f.section(Scheduler)
    """Learning-rate scheduler DeepSpeed builds; default none."""
    zero_optimization: ZeroOptimization | None = f.section(ZeroOptimization)
    """ZeRO settings; default stage 0 (plain data parallel)."""
    gradient_clipping: float | Auto | None = f.float_(ge=0)
    """Clip gradients to this global norm (HF ``"auto"``: ``max_grad_norm``); 0 is off; default 1.0."""
    communication_data_type: str | Auto | None = f.choice("fp32", "fp16", "bf16")
    """dtype of gradient communication: ``"fp32"``, ``"fp16"`` or ``"bf16"``; default the training precision."""
    seq_parallel_communication_data_type: str | Auto | None = f.choice("fp32", "fp16", "bf16")
    """dtype of sequence-parallel communication; default ``"fp32"``."""
    prescale_gradients: bool | Auto | None = f.bool_()
    """Divide gradients by the world size before all-reduce instead of after; default false."""
    gradient_predivide_factor: float | Auto | None = f.float_(gt=0)
    """Divide gradients by this factor before all-reduce, the rest after; default 1.0."""
    gradient_allreduce_op: str | Auto | None = f.choice("mean", "sum")
    """Gradient reduction, ``"mean"`` or ``"sum"`` (``"sum"`` not at stage 3); default ``"mean"``."""
    steps_per_print: int | Auto | None = f.int_(gt=0)
    """Log progress every this many steps; default none (never)."""
    wall_clock_breakdown: bool | Auto | None = f.bool_()
    """Time forward, backward and step separately; default false."""
    memory_breakdown: bool | Auto | None = f.bool_()
    """Log memory use at points of the step; default false."""
    dump_state: bool | Auto | None = f.bool_()
    """Print the engine state after initialization; default false."""
    disable_allgather: bool | Auto | None = f.bool_()
    """Disable the all-gather of updated parameters (legacy); default false."""
    disable_python_gc: bool | Auto | None = f.bool_()
    """Disable Python's automatic garbage collection during training; default false."""
    dataloader_drop_last: bool | Auto | None = f.bool_()
    """Drop the last incomplete batch of DeepSpeed's data loader; default false."""
    managed_gradient_accumulation: bool | Auto | None = f.bool_()
    """Let the engine manage gradient accumulation boundaries; default true."""
    vocabulary_size: int | Auto | None = f.int_(gt=0)
    """Vocabulary size, only for a tensor-core alignment warning; default none."""
    sequence_parallel_size: int | Auto | None = f.int_(gt=0)
    """Ulysses sequence-parallel degree (divides the data-parallel world size); default 1."""
    data_parallel_size: int | Auto | None = f.int_(gt=0)
    """Data-parallel degree; with ``sequence_parallel_size``, ``deepspeed.initialize`` builds a (data, sequence) mesh; default derived."""
    use_data_before_expert_parallelism: bool | Auto | None = f.bool_()
    """Order process groups data-parallel first for MoE; default false."""
    zero_allow_untested_optimizer: bool | Auto | None = f.bool_()
    """Allow an optimizer DeepSpeed has not tested with ZeRO (a client or torch optimizer); default false."""
    zero_force_ds_cpu_optimizer: bool | Auto | None = f.bool_()
    """With optimizer offload, insist on DeepSpeed's CPU optimizer; default true."""
    log_level: str | Auto | None = f.choice(*_LOG_LEVELS)
    """Level of DeepSpeed's logger (``"debug"``, ``"info"``, ``"warning"``, ``"error"``, ``"critical"``); default unchanged."""
    activation_checkpointing: ActivationCheckpointing | None = f.section(ActivationCheckpointing)
    """DeepSpeed activation checkpointing; default off."""
    tensorboard: TensorBoard | None = f.section(TensorBoard)
    """TensorBoard monitor; default off."""
    csv_monitor: CsvMonitor | None = f.section(CsvMonitor)
    """CSV monitor; default off."""
    wandb: Wandb | None = f.section(Wandb)
    """Weights & Biases monitor; default off."""
    comet: Comet | None = f.section(Comet)
    """Comet monitor; default off."""
    flops_profiler: FlopsProfiler | None = f.section(FlopsProfiler)
    """FLOPs profiler; default off."""
    checkpoint: Checkpoint | None = f.section(Checkpoint)
    """Checkpoint saving and loading; default DeepSpeed's."""
    data_types: DataTypes | None = f.section(DataTypes)
    """dtypes of gradient accumulation, parameters, buffers; default the training precision."""
    torch_autocast: TorchAutocast | None = f.section(TorchAutocast)
    """torch.autocast for the forward pass; default off."""
    aio: Aio | None = f.section(Aio)
    """Asynchronous I/O for NVMe offload; default DeepSpeed's."""
    tensor_parallel: TensorParallel | None = f.section(TensorParallel)
    """Automatic tensor parallelism for training; default off."""
    comms_logger: CommsLogger | None = f.section(CommsLogger)
    """Communication logger; default off."""
    extra: Mapping[str, Any] = attrs.field(factory=dict, validator=_is_mapping)
    """Sections dsbuild carries as written (``autotuning``, ``compile``, ``pipeline``, ... see ``PASSTHROUGH_KEYS``)."""
    ignored: Mapping[str, Any] = attrs.field(factory=dict, eq=False, repr=False)
    """Keys DeepSpeed ignores, kept by ``from_dict(strict=False)`` so ``validate()`` reports them; never written."""
    source: str | None = attrs.field(default=None, eq=False, repr=False)
    """Where the values came from, for ``explain()``: ``"preset zero3"``, ``"file ds.json"``; ``None`` when built in code."""
    provenance: Mapping[str, str] = attrs.field(factory=dict, eq=False, repr=False)
    """Dotted key -> where ``resolve()`` got its value (``"training argument learning_rate"``, ``"batch triangle"``, ...)."""

    # -- builder verbs -------------------------------------------------------

    @_verb
    def zero(self, /, stage: int) -> Config:
        """Use ZeRO ``stage`` (0-3), keeping any other ZeRO settings."""
        zero = self.zero_optimization or ZeroOptimization()
        return attrs.evolve(self, zero_optimization=_evolve(zero, "zero_optimization", stage=stage))

    @_verb
    def zero_options(self, /, **fields: Any) -> Config:
        """Set ``zero_optimization`` fields by their DeepSpeed names, e.g. ``overlap_comm=True``."""
        zero = self.zero_optimization or ZeroOptimization()
        return attrs.evolve(self, zero_optimization=_evolve(zero, "zero_optimization", **fields))

    @_verb
    def offload_cpu(self, /, optimizer: bool = True, params: bool = True, pin_memory: bool = True) -> Config:
        """Offload optimizer states to CPU (stage 1-3) and, at stage 3, parameters too."""
        return self._offload("cpu", optimizer, params, {"pin_memory": pin_memory}, {"pin_memory": pin_memory})

    @_verb
    def offload_nvme(
        self,
        /,
        path: str,
        optimizer: bool = True,
        params: bool = True,
        pin_memory: bool = True,
        buffer_count: int | None = None,
        buffer_size: int | None = None,
        max_in_cpu: int | None = None,
    ) -> Config:
        """Offload optimizer states and parameters to NVMe under ``path`` (ZeRO-Infinity, stage 3)."""
        if not isinstance(path, (str, Path)) or not str(path):
            raise InvalidValueError(
                Problem("zero_optimization.offload_optimizer.nvme_path", f"got {f.describe(path)}, expected a directory path")
            )
        if self._stage() != 3:
            raise InvalidValueError(
                Problem("zero_optimization.stage", f"NVMe offload needs stage 3, got {self._stage_text()}", "call .zero(3) first")
            )
        common = {"nvme_path": str(path), "pin_memory": pin_memory}
        opt = _set(**common, buffer_count=buffer_count)
        par = _set(**common, buffer_size=buffer_size, max_in_cpu=max_in_cpu)
        return self._offload("nvme", optimizer, params, opt, par)

    def _stage(self) -> int | Auto | None:
        return None if self.zero_optimization is None else self.zero_optimization.stage

    def _stage_text(self) -> str:
        stage = self._stage()
        return "no stage" if stage is None else f"stage {f.describe(stage)}"

    def _offload(
        self, device: str, optimizer: bool, params: bool, opt_fields: dict[str, Any], param_fields: dict[str, Any]
    ) -> Config:
        stage = self._stage()
        if not isinstance(stage, int) or stage < 1:
            raise InvalidValueError(
                Problem(
                    "zero_optimization.stage",
                    f"offload needs ZeRO stage 1-3, got {self._stage_text()}",
                    "call .zero(stage) before offloading",
                )
            )
        zero = self.zero_optimization or ZeroOptimization()
        changes: dict[str, Any] = {}
        if optimizer:
            changes["offload_optimizer"] = _build(
                OffloadOptimizer, "zero_optimization.offload_optimizer", {"device": device, **opt_fields}
            )
        if params and stage == 3:
            changes["offload_param"] = _build(
                OffloadParam, "zero_optimization.offload_param", {"device": device, **param_fields}
            )
        return attrs.evolve(self, zero_optimization=attrs.evolve(zero, **changes))

    @_verb
    def bf16(self, /, **fields: Any) -> Config:
        """Train in bf16 mixed precision (turns fp16 off); extra ``bf16`` fields by name."""
        section = _build(BF16, "bf16", {"enabled": True, **fields})
        return attrs.evolve(self, bf16=section, fp16=None)

    @_verb
    def fp16(self, /, **fields: Any) -> Config:
        """Train in fp16 mixed precision (turns bf16 off), e.g. ``.fp16(loss_scale=0, initial_scale_power=16)``."""
        section = _build(FP16, "fp16", {"enabled": True, **fields})
        return attrs.evolve(self, fp16=section, bf16=None)

    @_verb
    def fp32(self, /) -> Config:
        """Train in full fp32: no ``fp16`` or ``bf16`` section."""
        return attrs.evolve(self, fp16=None, bf16=None)

    @_verb
    def adamw(
        self,
        /,
        lr: float | Auto | None = None,
        betas: tuple[float, float] | list[float] | Auto | None = None,
        eps: float | Auto | None = None,
        weight_decay: float | Auto | None = None,
        **params: Any,
    ) -> Config:
        """DeepSpeed's AdamW (fused on GPU, CPU Adam with offload)."""
        return self.optimizer("AdamW", **_set(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay), **params)

    @_verb
    def adam(
        self,
        /,
        lr: float | Auto | None = None,
        betas: tuple[float, float] | list[float] | Auto | None = None,
        eps: float | Auto | None = None,
        weight_decay: float | Auto | None = None,
        **params: Any,
    ) -> Config:
        """DeepSpeed's Adam (``adam_w_mode`` defaults to true in DeepSpeed, i.e. AdamW)."""
        return self.optimizer("Adam", **_set(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay), **params)

    @_verb
    def lamb(self, /, lr: float | Auto | None = None, weight_decay: float | Auto | None = None, **params: Any) -> Config:
        """DeepSpeed's LAMB (FusedLamb)."""
        return self.optimizer("Lamb", **_set(lr=lr, weight_decay=weight_decay), **params)

    @_verb
    def lion(self, /, lr: float | Auto | None = None, weight_decay: float | Auto | None = None, **params: Any) -> Config:
        """DeepSpeed's Lion."""
        return self.optimizer("Lion", **_set(lr=lr, weight_decay=weight_decay), **params)

    @_verb
    def adagrad(self, /, lr: float | Auto | None = None, weight_decay: float | Auto | None = None, **params: Any) -> Config:
        """DeepSpeed's Adagrad (CPU Adagrad)."""
        return self.optimizer("Adagrad", **_set(lr=lr, weight_decay=weight_decay), **params)

    @_verb
    def optimizer(self, /, type: str, **params: Any) -> Config:  # noqa: A002 - DeepSpeed's key is "type"
        """Any optimizer by DeepSpeed name (typed params) or ``torch.optim`` class name (params as given)."""
        if not isinstance(type, str) or not type:
            raise InvalidValueError(Problem("optimizer.type", f"got {f.describe(type)}, expected an optimizer name"))
        cls = optimizer_params_class(type)
        typed: Any = _build(cls, "optimizer.params", params) if cls is not None else _json_params("optimizer.params", params)
        return attrs.evolve(self, optimizer=Optimizer(type=type, params=typed))

    def _scheduler(self, type: str, cls: type, params: dict[str, Any]) -> Config:  # noqa: A002
        fields = _with_aliases(_set(**params), _SCHEDULER_ALIASES, "scheduler.params")
        return attrs.evolve(self, scheduler=Scheduler(type=type, params=_build(cls, "scheduler.params", fields)))

    @_verb
    def warmup_lr(self, /, **params: Any) -> Config:
        """``WarmupLR``: warm up from ``warmup_min_lr`` to ``warmup_max_lr`` over ``warmup_num_steps`` (alias ``warmup_steps``), then hold."""
        return self._scheduler("WarmupLR", WarmupLRParams, params)

    @_verb
    def warmup_decay_lr(self, /, **params: Any) -> Config:
        """``WarmupDecayLR``: warm up, then decay linearly to 0 at ``total_num_steps`` (alias ``total_steps``)."""
        return self._scheduler("WarmupDecayLR", WarmupDecayLRParams, params)

    @_verb
    def warmup_cosine_lr(self, /, **params: Any) -> Config:
        """``WarmupCosineLR``: warm up, then cosine decay; ratios of the optimizer's lr."""
        return self._scheduler("WarmupCosineLR", WarmupCosineLRParams, params)

    @_verb
    def one_cycle(self, /, **params: Any) -> Config:
        """``OneCycle``: the 1-cycle policy between ``cycle_min_lr`` and ``cycle_max_lr``."""
        return self._scheduler("OneCycle", OneCycleParams, params)

    @_verb
    def lr_range_test(self, /, **params: Any) -> Config:
        """``LRRangeTest``: grow the lr from ``lr_range_test_min_lr`` to find a good range."""
        return self._scheduler("LRRangeTest", LRRangeTestParams, params)

    @_verb
    def batch(
        self,
        /,
        micro: int | Auto | None = None,
        grad_accum: int | Auto | None = None,
        total: int | Auto | None = None,
    ) -> Config:
        """Batch sizes: ``micro`` per device, ``grad_accum`` steps, ``total`` global (any two give the third)."""
        return _evolve(
            self,
            "",
            **_set(
                train_micro_batch_size_per_gpu=micro,
                gradient_accumulation_steps=grad_accum,
                train_batch_size=total,
            ),
        )

    @_verb
    def clip_grad(self, /, norm: float | Auto) -> Config:
        """Clip gradients to global norm ``norm`` (0 turns clipping off)."""
        return _evolve(self, "", gradient_clipping=norm)

    @_verb
    def comm_dtype(self, /, dtype: str) -> Config:
        """Communicate gradients in ``"fp32"``, ``"fp16"`` or ``"bf16"``."""
        return _evolve(self, "", communication_data_type=dtype)

    @_verb
    def set(self, /, **fields: Any) -> Config:
        """Set top-level fields by their DeepSpeed names, e.g. ``.set(steps_per_print=10)``."""
        return _evolve(self, "", **fields)

    # -- the other layers, as methods ----------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """The ds_config dict: DeepSpeed's exact keys, only what is set, ``AUTO`` as ``"auto"``."""
        from ..convert import to_dict

        return to_dict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, strict: bool = True) -> Config:
        """Read a ds_config dict (aliases and legacy keys too); ``strict=False`` keeps going past unknown keys."""
        from ..convert import from_dict

        return from_dict(data, strict=strict)

    def to_json(self, path: str | Path) -> Path:
        """Write the ds_config as JSON (atomically)."""
        from ..io import write_json

        return write_json(self, path)

    def to_toml(self, path: str | Path) -> Path:
        """Write the ds_config as TOML (atomically)."""
        from ..io import write_toml

        return write_toml(self, path)

    @classmethod
    def from_json(cls, path: str | Path, *, strict: bool = True) -> Config:
        """Read a JSON ds_config file."""
        from ..io import read_json

        return read_json(path, strict=strict)

    @classmethod
    def from_toml(cls, path: str | Path, *, strict: bool = True) -> Config:
        """Read a TOML config file (``extends`` and ``description`` understood)."""
        from ..io import read_toml

        return read_toml(path, strict=strict)

    @classmethod
    def load(cls, path: str | Path, *, strict: bool = True) -> Config:
        """Read a config file by its suffix: ``.json``, ``.toml``, ``.yaml``/``.yml``."""
        from ..io import load

        return load(path, strict=strict)

    @classmethod
    def preset(cls, name: str) -> Config:
        """A packaged preset by name, e.g. ``Config.preset("zero3_offload")``."""
        from ..presets import load_preset

        return load_preset(name)

    def validate(
        self, *, world_size: int | None = None, target: str = "deepspeed", resolved: bool = False
    ) -> list[Diagnostic]:
        """Every problem found, as diagnostics (errors first, then warnings) with dotted key paths.

        ``target="hf"`` for a config handed to the HF Trainer / Accelerate (they fill its ``"auto"``);
        ``resolved=True`` makes any ``"auto"`` left an error.
        """
        from ..validate import validate

        return validate(self, world_size=world_size, target=target, resolved=resolved)

    def check(self, *, world_size: int | None = None, target: str = "deepspeed", resolved: bool = False) -> Config:
        """Raise one ``ConfigError`` listing every error; return the config when there is none."""
        from ..validate import check

        check(self, world_size=world_size, target=target, resolved=resolved)
        return self

    def resolve(
        self,
        *,
        world_size: int = 1,
        training: Training | Any | None = None,
        model: Any | None = None,
        hidden_size: int | None = None,
        total_steps: int | None = None,
    ) -> Config:
        """Fill every ``AUTO`` as the HF Trainer would, apply the batch triangle, and check for conflicts."""
        from ..resolve import resolve

        resolved: Config = resolve(
            self, world_size=world_size, training=training, model=model, hidden_size=hidden_size, total_steps=total_steps
        )
        return resolved

    def explain(self) -> list[Explanation]:
        """Each key's value and where it came from (after ``resolve``)."""
        from ..resolve import explain

        explanations: list[Explanation] = explain(self)
        return explanations


def _evolve(obj: R, path: str, **changes: Any) -> R:
    """``attrs.evolve`` with unknown names and bad values reported under ``path``."""
    checked = _checked(type(obj), path, changes)
    evolved: R = attrs.evolve(obj, **checked)  # type: ignore[misc]  # R is an attrs class; mypy cannot tell
    return evolved


def _json_params(path: str, params: Mapping[str, Any]) -> dict[str, Any]:
    """Params of a torch optimizer: any JSON values, ``AUTO`` allowed."""
    problems = []
    out: dict[str, Any] = {}
    for key, value in params.items():
        if value is AUTO or (isinstance(value, str) and value == "auto"):
            out[key] = AUTO  # as a file's "auto" is read
            continue
        message = f.check_value(f.Spec("json"), value)
        if message is not None:
            problems.append(Problem(f"{path}.{key}", message))
        out[key] = f.plain_json(value)  # tuples, also nested, written and read back as lists
    if problems:
        raise InvalidValueError(problems)
    return out


def section_classes() -> dict[str, type]:
    """Every section class by the dotted path it sits at (for docs and tests)."""
    out: dict[str, type] = {}

    def walk(cls: type[Any], path: str) -> None:
        out[path] = cls
        for a in attrs.fields(cls):
            spec = a.metadata.get("dsbuild")
            if spec is not None and spec.kind == "section" and spec.section is not None:
                key = f.key_of(a)  # the ds key: "fp16", not the attribute "fp16_config"
                walk(spec.section, f"{path}.{key}" if path else key)

    walk(Config, "")
    return out


__all__ += ["section_classes"]

