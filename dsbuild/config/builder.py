"""``ConfigBase``: the ds_config's fields plus the fluent builder.

Every builder verb returns a new config (``attrs.evolve``, which re-runs the
validators); a bad argument fails at the call that made it, with the dotted key
path. Verbs work on the class too: ``Config.zero(3)`` is ``Config().zero(3)``.
"""

from __future__ import annotations

import os
import types
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Concatenate, Generic, ParamSpec, TypeVar, overload

import attrs

from ..errors import InvalidValueError, Problem, error_of
from . import fields as f
from .core import ConfigFields
from .fields import AUTO, Auto
from .keys import unknown_key
from .optim import (
    LRRangeTestParams,
    OneCycleParams,
    Optimizer,
    Scheduler,
    WarmupCosineLRParams,
    WarmupDecayLRParams,
    WarmupLRParams,
    optimizer_params_class,
)
from .precision import BF16, FP16
from .zero import LeafModule, OffloadOptimizer, OffloadParam, ZenFlow, ZeroOptimization

if TYPE_CHECKING:  # annotations only: building a config imports neither
    from typing_extensions import Never, Self

__all__ = ["ConfigBase"]

P = ParamSpec("P")
R = TypeVar("R")
C = TypeVar("C")


class _verb(Generic[P]):
    """A builder verb usable on the class (starting from an empty config) or on an instance.

    Either way it is the method itself, bound: ``help()``, ``inspect.signature`` and editors
    see its own parameters and docstring.
    """

    def __init__(self, fn: Callable[Concatenate[Any, P], Any]) -> None:
        self.fn = fn
        self.__doc__ = fn.__doc__
        self.__name__ = fn.__name__
        self.__wrapped__ = fn

    @overload
    def __get__(self, obj: None, owner: type[C]) -> Callable[P, C]: ...
    @overload
    def __get__(self, obj: C, owner: type[C]) -> Callable[P, C]: ...
    def __get__(self, obj: C | None, owner: type[C]) -> Callable[P, C]:
        target = owner() if obj is None else obj
        bound: Callable[P, C] = types.MethodType(self.fn, target)
        return bound


class _options(_verb[P]):
    """A section verb (``zero_options``, ``bf16``, ``fp16``, the schedulers): a builder verb that names every field of
    its section as a keyword (``help()``, ``inspect.signature``, editors and mypy see each, typed) and receives the
    ones given as one explicit dict, its parameter after ``self``: ``None`` is "leave unset" and is not in it. The
    body reads only that dict (its keywords are all ``None`` there).

    A name the verb does not take arrives too (typed ``Never`` in ``**unknown``, so mypy flags it) and is checked
    like the others, so a misspelling gets its "did you mean" at run time, also as ``None``.
    """

    def __init__(self, fn: Callable[Concatenate[Any, dict[str, Any], P], Any]) -> None:
        import inspect  # already imported by attrs

        whole = inspect.signature(fn)
        self_, _given, *keywords = whole.parameters.values()
        named = [p for p in keywords if p.kind is inspect.Parameter.KEYWORD_ONLY]
        assert all(p.default is None for p in named), f"{fn.__name__}: a section verb's keywords default to None"
        named_set = frozenset(p.name for p in named)
        call: Callable[..., Any] = fn  # called with the dict its own signature declares

        def verb(self: Any, /, *args: Any, **kwargs: Any) -> Any:
            if args:  # every parameter is keyword-only
                raise TypeError(f"{fn.__name__}() takes keyword arguments only ({len(args)} positional given)")
            return call(self, {k: v for k, v in kwargs.items() if v is not None or k not in named_set})

        verb.__name__, verb.__qualname__, verb.__doc__ = fn.__name__, fn.__qualname__, fn.__doc__
        verb.__signature__ = whole.replace(parameters=[self_, *keywords])  # type: ignore[attr-defined]
        super().__init__(verb)  # bound as any builder verb is


def _build(cls: type[R], path: str, fields: Mapping[str, Any]) -> R:
    """``cls(**fields)`` with unknown names and bad values reported under ``path``, all at once."""
    return cls(**_checked(cls, path, fields))


def _checked(cls: type[Any], path: str, fields: Mapping[str, Any]) -> dict[str, Any]:
    """``fields`` checked against section ``cls``: raises every unknown name and bad value under ``path`` at once."""
    problems: list[Problem] = []
    checked = _check_into(cls, path, fields, problems)
    if problems:
        raise error_of(problems)
    return checked


def _check_into(cls: type[Any], path: str, fields: Mapping[str, Any], problems: list[Problem]) -> dict[str, Any]:
    """``fields`` coerced and checked against section ``cls``; every problem is appended to ``problems``.

    Unknown names are reported first, then bad values in the section's field order. A section field also
    takes a table (``zero_options(offload_optimizer={"device": "cpu"})``), whose keys are checked the way a
    file's table is: in the table's order.
    """
    by_key = {f.key_of(a): a for a in attrs.fields(cls)}
    problems.extend(unknown_key(cls, path, k, set(by_key)) for k in fields if k not in by_key)
    return {key: _checked_value(by_key[key], path, fields[key], problems) for key in by_key if key in fields}


def _check_table(cls: type[Any], path: str, table: Mapping[str, Any], problems: list[Problem]) -> dict[str, Any]:
    """A table given where section ``cls`` goes, checked key by key in its own order."""
    by_key = {f.key_of(a): a for a in attrs.fields(cls)}
    checked: dict[str, Any] = {}
    for key, value in table.items():
        if key not in by_key:
            problems.append(unknown_key(cls, path, key, set(by_key)))
        else:
            checked[key] = _checked_value(by_key[key], path, value, problems)
    return checked


def _checked_value(attribute: attrs.Attribute[Any], path: str, value: Any, problems: list[Problem]) -> Any:
    """One field's value coerced and checked (a table for a section built into it); problems appended."""
    spec = attribute.metadata.get("dsbuild")
    if spec is None:
        return value
    where = f"{path}.{f.key_of(attribute)}" if path else f.key_of(attribute)
    if spec.kind == "section" and isinstance(value, Mapping) and spec.section is not None:
        before = len(problems)
        table = _check_table(spec.section, where, value, problems)
        return spec.section(**table) if len(problems) == before else None
    value = f.coerce(spec, value)  # what a value means in a file, it means in Python
    message = f.check_value(spec, value)
    if message is not None:
        problems.append(Problem(where, message))
    return value


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


_SCHEDULER_ALIASES = {
    "warmup_steps": "warmup_num_steps",
    "total_steps": "total_num_steps",
    "min_lr": "warmup_min_lr",
    "max_lr": "warmup_max_lr",
}


T = TypeVar("T")


def _evolved(config: T, **changes: Any) -> T:
    """``attrs.evolve`` of a config from a verb of one of its mixins (which mypy does not see as attrs classes)."""
    evolved: T = attrs.evolve(config, **changes)  # type: ignore[misc]
    return evolved


class _OptimizerVerbs:
    """The optimizer verbs of ``ConfigBase``: DeepSpeed's optimizers by name, their params typed."""

    __slots__ = ()

    @_verb
    def adamw(
        self,
        /,
        lr: float | Auto | None = None,
        betas: tuple[float, float] | list[float] | Auto | None = None,
        eps: float | Auto | None = None,
        weight_decay: float | Auto | None = None,
        **params: Any,
    ) -> Self:
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
    ) -> Self:
        """DeepSpeed's Adam (``adam_w_mode`` defaults to true in DeepSpeed, i.e. AdamW)."""
        return self.optimizer("Adam", **_set(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay), **params)

    @_verb
    def lamb(self, /, lr: float | Auto | None = None, weight_decay: float | Auto | None = None, **params: Any) -> Self:
        """DeepSpeed's LAMB (FusedLamb)."""
        return self.optimizer("Lamb", **_set(lr=lr, weight_decay=weight_decay), **params)

    @_verb
    def lion(self, /, lr: float | Auto | None = None, weight_decay: float | Auto | None = None, **params: Any) -> Self:
        """DeepSpeed's Lion."""
        return self.optimizer("Lion", **_set(lr=lr, weight_decay=weight_decay), **params)

    @_verb
    def adagrad(
        self, /, lr: float | Auto | None = None, weight_decay: float | Auto | None = None, **params: Any
    ) -> Self:
        """DeepSpeed's Adagrad (CPU Adagrad)."""
        return self.optimizer("Adagrad", **_set(lr=lr, weight_decay=weight_decay), **params)

    @_verb
    def muon(
        self,
        /,
        lr: float | Auto | None = None,
        muon_lr: float | Auto | None = None,
        adam_lr: float | Auto | None = None,
        momentum: float | Auto | None = None,
        weight_decay: float | Auto | None = None,
        **params: Any,
    ) -> Self:
        """DeepSpeed's Muon: Muon on the hidden 2-D weights, an auxiliary Adam on the rest (``betas``, ``eps``,
        ``adam_w_mode``, ``ns_method``, ``per_head_muon`` as keywords)."""
        given = _set(lr=lr, muon_lr=muon_lr, adam_lr=adam_lr, momentum=momentum, weight_decay=weight_decay)
        return self.optimizer("Muon", **given, **params)

    @_verb
    def optimizer(self, /, type: str, **params: Any) -> Self:  # noqa: A002 - DeepSpeed's key is "type"
        """Any optimizer by DeepSpeed name (typed params) or ``torch.optim`` class name (params as given)."""
        if not isinstance(type, str) or not type:
            raise InvalidValueError(Problem("optimizer.type", f"got {f.describe(type)}, expected an optimizer name"))
        cls = optimizer_params_class(type)
        typed: Any = (
            _build(cls, "optimizer.params", params) if cls is not None else _json_params("optimizer.params", params)
        )
        return _evolved(self, optimizer=Optimizer(type=type, params=typed))


class _SchedulerVerbs:
    """The scheduler verbs of ``ConfigBase``: DeepSpeed's schedulers, their params typed (HF's short names too)."""

    __slots__ = ()

    def _scheduler(self, type: str, cls: type, params: dict[str, Any]) -> Self:  # noqa: A002
        fields = _with_aliases(params, _SCHEDULER_ALIASES, "scheduler.params")
        return _evolved(self, scheduler=Scheduler(type=type, params=_build(cls, "scheduler.params", fields)))

    @_options
    def warmup_lr(
        self,
        given: dict[str, Any],
        /,
        *,
        warmup_min_lr: float | Auto | None = None,
        warmup_max_lr: float | Auto | None = None,
        warmup_num_steps: int | float | Auto | None = None,
        warmup_type: str | Auto | None = None,
        last_batch_iteration: int | float | Auto | None = None,
        warmup_steps: int | float | Auto | None = None,
        min_lr: float | Auto | None = None,
        max_lr: float | Auto | None = None,
        **unknown: Never,
    ) -> Self:
        """``WarmupLR``: warm up from ``warmup_min_lr`` to ``warmup_max_lr`` over ``warmup_num_steps`` (alias ``warmup_steps``), then hold."""
        return self._scheduler("WarmupLR", WarmupLRParams, given)

    @_options
    def warmup_decay_lr(
        self,
        given: dict[str, Any],
        /,
        *,
        total_num_steps: int | float | Auto | None = None,
        warmup_min_lr: float | Auto | None = None,
        warmup_max_lr: float | Auto | None = None,
        warmup_num_steps: int | float | Auto | None = None,
        warmup_type: str | Auto | None = None,
        last_batch_iteration: int | float | Auto | None = None,
        warmup_steps: int | float | Auto | None = None,
        total_steps: int | float | Auto | None = None,
        min_lr: float | Auto | None = None,
        max_lr: float | Auto | None = None,
        **unknown: Never,
    ) -> Self:
        """``WarmupDecayLR``: warm up, then decay linearly to 0 at ``total_num_steps`` (alias ``total_steps``)."""
        return self._scheduler("WarmupDecayLR", WarmupDecayLRParams, given)

    @_options
    def warmup_cosine_lr(
        self,
        given: dict[str, Any],
        /,
        *,
        total_num_steps: int | float | Auto | None = None,
        warmup_min_ratio: float | Auto | None = None,
        warmup_num_steps: int | float | Auto | None = None,
        cos_min_ratio: float | Auto | None = None,
        warmup_type: str | Auto | None = None,
        last_batch_iteration: int | float | Auto | None = None,
        warmup_steps: int | float | Auto | None = None,
        total_steps: int | float | Auto | None = None,
        **unknown: Never,
    ) -> Self:
        """``WarmupCosineLR``: warm up, then cosine decay; ratios of the optimizer's lr."""
        return self._scheduler("WarmupCosineLR", WarmupCosineLRParams, given)

    @_options
    def one_cycle(
        self,
        given: dict[str, Any],
        /,
        *,
        cycle_min_lr: float | Auto | None = None,
        cycle_max_lr: float | Auto | None = None,
        decay_lr_rate: float | Auto | None = None,
        cycle_first_step_size: int | float | Auto | None = None,
        cycle_second_step_size: int | float | Auto | None = None,
        cycle_first_stair_count: int | float | Auto | None = None,
        cycle_second_stair_count: int | float | Auto | None = None,
        decay_step_size: int | float | Auto | None = None,
        cycle_momentum: bool | Auto | None = None,
        cycle_min_mom: float | Auto | None = None,
        cycle_max_mom: float | Auto | None = None,
        decay_mom_rate: float | Auto | None = None,
        last_batch_iteration: int | float | Auto | None = None,
        **unknown: Never,
    ) -> Self:
        """``OneCycle``: the 1-cycle policy between ``cycle_min_lr`` and ``cycle_max_lr``."""
        return self._scheduler("OneCycle", OneCycleParams, given)

    @_options
    def lr_range_test(
        self,
        given: dict[str, Any],
        /,
        *,
        lr_range_test_min_lr: float | Auto | None = None,
        lr_range_test_step_size: int | float | Auto | None = None,
        lr_range_test_step_rate: float | Auto | None = None,
        lr_range_test_staircase: bool | Auto | None = None,
        last_batch_iteration: int | float | Auto | None = None,
        **unknown: Never,
    ) -> Self:
        """``LRRangeTest``: grow the lr from ``lr_range_test_min_lr`` to find a good range."""
        return self._scheduler("LRRangeTest", LRRangeTestParams, given)


class ConfigBase(ConfigFields, _OptimizerVerbs, _SchedulerVerbs):
    """A ds_config's fields and its fluent builder (``dsbuild.Config`` adds reading, writing, checking, resolving).

    A plain subclass: the fields, ``__init__``, equality and hashing are ``ConfigFields``'s (attrs writes them
    once); a config is only ever equal to one of its own class.
    """

    __slots__ = ()

    # -- builder verbs -------------------------------------------------------

    @_verb
    def zero(self, /, stage: int) -> Self:
        """Use ZeRO ``stage`` (0-3), keeping any other ZeRO settings."""
        zero = self.zero_optimization or ZeroOptimization()
        return attrs.evolve(self, zero_optimization=_evolve(zero, "zero_optimization", stage=stage))

    @_options
    def zero_options(
        self,
        given: dict[str, Any],
        /,
        *,
        stage: int | float | Auto | None = None,
        contiguous_gradients: bool | Auto | None = None,
        reduce_scatter: bool | Auto | None = None,
        reduce_bucket_size: int | float | Auto | None = None,
        use_multi_rank_bucket_allreduce: bool | Auto | None = None,
        allgather_partitions: bool | Auto | None = None,
        allgather_bucket_size: int | float | Auto | None = None,
        overlap_comm: bool | Auto | None = None,
        compute_grad_norm: bool | Auto | None = None,
        load_from_fp32_weights: bool | Auto | None = None,
        elastic_checkpoint: bool | Auto | None = None,
        offload_optimizer: OffloadOptimizer | Mapping[str, Any] | None = None,
        offload_param: OffloadParam | Mapping[str, Any] | None = None,
        zenflow: ZenFlow | Mapping[str, Any] | None = None,
        sub_group_size: int | float | Auto | None = None,
        stage3_prefetch_bucket_size: int | float | Auto | None = None,
        stage3_param_persistence_threshold: int | float | Auto | None = None,
        stage3_model_persistence_threshold: int | float | Auto | None = None,
        stage3_max_live_parameters: int | float | Auto | None = None,
        stage3_max_reuse_distance: int | float | Auto | None = None,
        stage3_gather_16bit_weights_on_model_save: bool | Auto | None = None,
        stage3_module_granularity_threshold: int | float | Auto | None = None,
        stage3_use_all_reduce_for_fetch_params: bool | Auto | None = None,
        stage3_allgather_sequential: bool | Auto | None = None,
        ignore_unused_parameters: bool | Auto | None = None,
        legacy_stage1: bool | Auto | None = None,
        round_robin_gradients: bool | Auto | None = None,
        parameter_alignment: bool | Auto | None = None,
        zero_hpz_partition_size: int | float | Auto | None = None,
        zero_quantized_weights: bool | Auto | None = None,
        zero_quantized_nontrainable_weights: bool | Auto | None = None,
        zero_quantized_gradients: bool | Auto | None = None,
        memory_efficient_linear: bool | Auto | None = None,
        pipeline_loading_checkpoint: bool | Auto | None = None,
        override_module_apply: bool | Auto | None = None,
        log_trace_cache_warnings: bool | Auto | None = None,
        enable_sanity_checks: bool | Auto | None = None,
        save_muon_momentum_buffer_in_memory: bool | Auto | None = None,
        leaf_module: LeafModule | Mapping[str, Any] | None = None,
        **unknown: Never,
    ) -> Self:
        """Set ``zero_optimization`` fields by their DeepSpeed names, e.g. ``overlap_comm=True``.

        Every ZeRO setting is a keyword (see ``ZeroOptimization`` for what each does); ``None`` leaves it
        unchanged, an integral float such as ``1e9`` is the integer, and an offload section takes a table.
        """
        zero = self.zero_optimization or ZeroOptimization()
        return attrs.evolve(self, zero_optimization=_evolve(zero, "zero_optimization", **given))

    @_verb
    def offload_cpu(self, /, optimizer: bool = True, params: bool = True, pin_memory: bool = True) -> Self:
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
    ) -> Self:
        """Offload optimizer states and parameters to NVMe under ``path`` (ZeRO-Infinity, stage 3)."""
        if not isinstance(path, (str, os.PathLike)) or not os.fspath(path):
            raise InvalidValueError(
                Problem(
                    "zero_optimization.offload_optimizer.nvme_path",
                    f"got {f.describe(path)}, expected a directory path",
                )
            )
        if self._stage() != 3:
            raise InvalidValueError(
                Problem(
                    "zero_optimization.stage",
                    f"NVMe offload needs stage 3, got {self._stage_text()}",
                    "call .zero(3) first",
                )
            )
        common = {"nvme_path": os.fspath(path), "pin_memory": pin_memory}
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
    ) -> Self:
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

    @_options
    def bf16(
        self,
        given: dict[str, Any],
        /,
        *,
        enabled: bool | Auto | None = None,
        immediate_grad_update: bool | Auto | None = None,
        check_grad_overflow: bool | Auto | None = None,
        bf16_master_weights_and_grads: bool | Auto | None = None,
        bf16_optimizer_states: bool | Auto | None = None,
        **unknown: Never,
    ) -> Self:
        """Train in bf16 mixed precision (turns fp16 off); other ``bf16`` settings by name (see ``BF16``)."""
        section = _build(BF16, "bf16", {"enabled": True, **given})
        return attrs.evolve(self, bf16=section, fp16=None)

    @_options
    def fp16(
        self,
        given: dict[str, Any],
        /,
        *,
        enabled: bool | Auto | None = None,
        auto_cast: bool | Auto | None = None,
        loss_scale: float | Auto | None = None,
        initial_scale_power: int | float | Auto | None = None,
        loss_scale_window: int | float | Auto | None = None,
        hysteresis: int | float | Auto | None = None,
        consecutive_hysteresis: bool | Auto | None = None,
        min_loss_scale: int | float | Auto | None = None,
        fp16_master_weights_and_grads: bool | Auto | None = None,
        **unknown: Never,
    ) -> Self:
        """Train in fp16 mixed precision (turns bf16 off), e.g. ``.fp16(loss_scale=0, initial_scale_power=16)``;
        other ``fp16`` settings by name (see ``FP16``)."""
        section = _build(FP16, "fp16", {"enabled": True, **given})
        return attrs.evolve(self, fp16=section, bf16=None)

    @_verb
    def fp32(self, /) -> Self:
        """Train in full fp32: no ``fp16`` or ``bf16`` section."""
        return attrs.evolve(self, fp16=None, bf16=None)

    @_verb
    def batch(
        self,
        /,
        micro: int | Auto | None = None,
        grad_accum: int | Auto | None = None,
        total: int | Auto | None = None,
    ) -> Self:
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
    def clip_grad(self, /, norm: float | Auto) -> Self:
        """Clip gradients to global norm ``norm`` (0 turns clipping off)."""
        return _evolve(self, "", gradient_clipping=norm)

    @_verb
    def comm_dtype(self, /, dtype: str) -> Self:
        """Communicate gradients in ``"fp32"``, ``"fp16"`` or ``"bf16"``."""
        return _evolve(self, "", communication_data_type=dtype)

    @_verb
    def set(self, /, **fields: Any) -> Self:
        """Set top-level fields by their DeepSpeed names, e.g. ``.set(steps_per_print=10)``."""
        return _evolve(self, "", **fields)


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
