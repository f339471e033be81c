"""The one converter between configs (``ConfigBase``) and DeepSpeed's ds_config dict.

Reading (``from_dict``) accepts what DeepSpeed accepts — its aliases and legacy
keys, ``5e8`` for an integer, ``"3"`` where its parser reads 3 (one coercion
policy, ``fields.coerce``; the unusual forms are kept in ``Config.coerced`` for
``validate()`` to mention) — and writes back the modern spelling. It is strict
where DeepSpeed is sloppy: ``"yes"`` is not a boolean, ``True`` is not an
integer, and a key DeepSpeed would ignore is an error (or, with
``strict=False``, a warning carried to ``validate()``). Every problem is
collected with its dotted key path and reported at once.

Writing (``to_dict``) gives DeepSpeed's exact keys, only what was set, as
plain JSON types; ``AUTO`` is written ``"auto"``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, TypeVar

import attrs

from ..config import (
    AUTO,
    NOT_KEYS,
    PASSTHROUGH_KEYS,
    PASSTHROUGH_SCHEMAS,
    ConfigBase,
    ConfigFields,
    takes_null,
)
from ..config.fields import Spec, check_value, coerce, describe, key_of, unusual
from ..config.keys import unknown_key
from ..config.misc import TensorParallel
from ..config.optim import Optimizer, Scheduler, optimizer_params_class, scheduler_params_class
from ..config.zero import ZeroOptimization
from ..errors import ConfigError, InvalidValueError, Problem, error_of

# and converter, made on first use
__all__ = ["LEGACY_OFFLOAD_KEYS", "REMOVED_KEYS", "RENAMED_KEYS", "from_dict", "to_dict"]

C = TypeVar("C", bound=ConfigBase)

RENAMED_KEYS: Mapping[type, Mapping[str, str]] = {
    ConfigFields: {"bfloat16": "bf16"},
    ZeroOptimization: {
        "stage3_gather_fp16_weights_on_model_save": "stage3_gather_16bit_weights_on_model_save",
        "gather_16bit_weights_on_model_save": "stage3_gather_16bit_weights_on_model_save",
        "prefetch_bucket_size": "stage3_prefetch_bucket_size",
        "param_persistence_threshold": "stage3_param_persistence_threshold",
        "model_persistence_threshold": "stage3_model_persistence_threshold",
        "max_live_parameters": "stage3_max_live_parameters",
        "max_reuse_distance": "stage3_max_reuse_distance",
        "module_granularity_threshold": "stage3_module_granularity_threshold",
        "use_all_reduce_for_fetch_params": "stage3_use_all_reduce_for_fetch_params",
        "allgather_sequential": "stage3_allgather_sequential",
    },
    TensorParallel: {"tensor_parallel": "tp", "kernel_inject": "replace_with_kernel_inject"},
}
"""Legacy and alias spellings DeepSpeed reads, by section, and the modern key dsbuild writes."""

LEGACY_OFFLOAD_KEYS: Mapping[str, str] = {"cpu_offload": "offload_optimizer", "cpu_offload_param": "offload_param"}
"""ZeRO's deprecated booleans DeepSpeed still reads, and the section dsbuild writes for ``true``
(``{"device": "cpu"}``; ``false`` is nothing)."""

REMOVED_KEYS: Mapping[str, str] = {
    "amp": "NVIDIA Apex AMP was removed from DeepSpeed: use bf16, fp16 or torch_autocast",
    "sparse_attention": "Sparse Attention was removed from DeepSpeed: remove this section",
    "compression_training": "the compression library was removed from DeepSpeed: remove this section",
    "nebula": "Nebula checkpointing was removed from DeepSpeed: remove this section",
    "quantize_training": "MoQ quantize_training was removed from DeepSpeed: remove this section",
    "sparse_gradients": "sparse gradients were removed from DeepSpeed: remove this key",
    "eigenvalue": "eigenvalue MoQ was removed from DeepSpeed: remove this section",
    "elasticity": "elastic training was removed from DeepSpeed: set the batch sizes directly",
    "graph_harvesting": "graph harvesting was removed from DeepSpeed: remove this key",
    "curriculum_learning": "use data_efficiency.data_sampling.curriculum_learning instead",
    "progressive_layer_drop": "Progressive Layer Drop was removed from DeepSpeed: remove this section",
}
"""Top-level sections DeepSpeed 0.19 refuses, with what to do. They are carried (so nothing is lost) and
reported by ``validate()`` as errors."""


@attrs.frozen
class _Field:
    """How the reader treats one key of a section."""

    init: str
    """The constructor argument (the attribute name: ``fp16_config`` for ``fp16``)."""
    spec: Spec


_FIELDS: dict[type, dict[str, _Field]] = {}


def _fields_of(cls: type) -> dict[str, _Field]:
    """The fields of a section class by ds key (computed once per class)."""
    if cls not in _FIELDS:
        _FIELDS[cls] = _read_fields(cls)
    return _FIELDS[cls]


def _read_fields(cls: type) -> dict[str, _Field]:
    return {
        key_of(a): _Field(a.alias or a.name, a.metadata["dsbuild"])
        for a in attrs.fields(cls)
        if "dsbuild" in a.metadata
    }


class _Reader:
    """One ``from_dict`` call: strictness, and the warnings of a non-strict read."""

    def __init__(self, strict: bool) -> None:
        self.strict = strict
        self.problems: list[Problem] = []
        self.ignored: dict[str, Any] = {}
        self.coerced: dict[str, Any] = {}

    def unknown(self, cls: type, path: str, key: str, value: Any, names: set[str]) -> None:
        problem = unknown_key(cls, path, key, names)
        if self.strict:
            self.problems.append(problem)
        else:
            self.ignored[problem.path] = value

    def section(self, cls: type, data: Any, path: str) -> Any:
        if not isinstance(data, Mapping):
            self.problems.append(Problem(path, f"got {describe(data)}, expected a table"))
            return None
        data = self.legacy(cls, data, path)
        if cls is Optimizer or cls is Scheduler:
            return self.typed_section(cls, data, path)
        fields = _fields_of(ConfigFields if issubclass(cls, ConfigFields) else cls)
        kwargs: dict[str, Any] = {}
        for key, value in data.items():
            field = fields.get(key)
            if field is None:
                if not isinstance(key, str):
                    self.problems.append(Problem(path, f"key {key!r} is not a string"))
                else:
                    self.unknown(cls, path, key, value, set(fields))
            elif value is not None:
                kwargs[field.init] = self.value(field.spec, value, f"{path}.{key}" if path else key)
            elif not takes_null(field.spec, path):
                self.problems.append(
                    Problem(
                        f"{path}.{key}" if path else key,
                        "null: DeepSpeed needs a value here",
                        "remove the key for DeepSpeed's default",
                    )
                )
        # Every value was checked on the way in (its problems collected), so attrs' validators are off for the
        # construction; it would otherwise stop at the first bad value.
        with attrs.validators.disabled():
            return cls(**kwargs)

    def value(self, spec: Spec, value: Any, path: str) -> Any:
        if spec.kind == "section":
            assert spec.section is not None
            return self.section(spec.section, value, path)
        read = coerce(spec, value)
        message = check_value(spec, read)
        if message is not None:
            self.problems.append(Problem(path, message))
        elif unusual(value, read):
            self.coerced[path] = value
        if spec.kind == "mapping" and isinstance(read, Mapping):
            return dict(read)
        return read

    def legacy(self, cls: type, data: Mapping[str, Any], path: str) -> Mapping[str, Any]:
        """Rewrite legacy and alias keys to the modern ones (a key given twice is an error)."""
        renames = RENAMED_KEYS.get(ConfigFields if issubclass(cls, ConfigFields) else cls)
        if renames is None and cls is not ZeroOptimization:
            return data
        out = dict(data)
        for old, new in (renames or {}).items():
            if old in out:
                value = out.pop(old)
                if new in out:
                    where = f"{path}." if path else ""
                    self.problems.append(
                        Problem(
                            f"{where}{old}", f"given together with {new!r}, which replaces it", f"keep only {new!r}"
                        )
                    )
                    continue
                out[new] = value
        if cls is ZeroOptimization:
            self.legacy_offload(out, path)
        return out

    def legacy_offload(self, zero: dict[str, Any], path: str) -> None:
        for old, new in LEGACY_OFFLOAD_KEYS.items():
            if old not in zero:
                continue
            value = zero.pop(old)
            if not isinstance(value, bool):
                self.problems.append(Problem(f"{path}.{old}", f"got {describe(value)}, expected true or false"))
            elif new in zero and value:
                self.problems.append(
                    Problem(f"{path}.{old}", f"given together with {new!r}, which replaces it", f"keep only {new!r}")
                )
            elif value:
                zero[new] = {"device": "cpu"}
        if "cpu_offload_use_pin_memory" in zero:
            # DeepSpeed reads this deprecated key and then ignores it; say so rather than drop it silently.
            value = zero.pop("cpu_offload_use_pin_memory")
            problem = Problem(
                f"{path}.cpu_offload_use_pin_memory",
                "deprecated and ignored by DeepSpeed",
                "set pin_memory in offload_optimizer / offload_param",
            )
            if self.strict:
                self.problems.append(problem)
            else:
                self.ignored[problem.path] = value

    def typed_section(self, cls: type, data: Mapping[str, Any], path: str) -> Any:
        """``optimizer`` / ``scheduler``: the params class depends on ``type``."""
        fields = {"type", "params", *(("legacy_fusion",) if cls is Optimizer else ())}
        kwargs: dict[str, Any] = {}
        for key in data:
            if key not in fields:
                self.unknown(cls, path, key, data[key], fields)
        type_name = data.get("type")
        if not isinstance(type_name, str) or not type_name:
            what = "missing" if type_name is None else f"got {describe(type_name)}, expected a name"
            self.problems.append(Problem(f"{path}.type", what))
            return None
        kwargs["type"] = type_name
        if cls is Optimizer and "legacy_fusion" in data:
            kwargs["legacy_fusion"] = self.value(
                _fields_of(Optimizer)["legacy_fusion"].spec, data["legacy_fusion"], f"{path}.legacy_fusion"
            )
        params = data.get("params")
        if params is not None:
            lookup = optimizer_params_class if cls is Optimizer else scheduler_params_class
            params_cls = lookup(type_name)
            if params_cls is None:
                kwargs["params"] = self.free_params(params, f"{path}.params")
            else:
                kwargs["params"] = self.section(params_cls, params, f"{path}.params")
        with attrs.validators.disabled():
            return cls(**kwargs)

    def free_params(self, params: Any, path: str) -> Any:
        if not isinstance(params, Mapping):
            self.problems.append(Problem(path, f"got {describe(params)}, expected a table"))
            return None
        out: dict[str, Any] = {}
        for key, value in params.items():
            value = AUTO if value == "auto" and isinstance(value, str) else value
            if value is not AUTO and check_value(Spec("json"), value) is not None:
                self.problems.append(Problem(f"{path}.{key}", f"got {describe(value)}, expected a JSON value"))
            out[key] = value
        return out

    def config(self, data: Any, cls: type[C]) -> C:
        if not isinstance(data, Mapping):
            raise ConfigError(Problem("", f"a ds_config is a table of keys, got {describe(data)}"))
        data = dict(data)
        # DeepSpeed's oldest form: "zero_optimization": true means stage 1 (+ top-level allgather_size).
        zero = data.get("zero_optimization")
        if isinstance(zero, bool):
            data["zero_optimization"] = {"stage": 1 if zero else 0}
            if zero and "allgather_size" in data:
                data["zero_optimization"]["allgather_bucket_size"] = data.pop("allgather_size")
        extra = {k: data.pop(k) for k in list(data) if k in PASSTHROUGH_KEYS or k in REMOVED_KEYS}
        for key, value in extra.items():
            if check_value(Spec("json"), value) is not None:
                self.problems.append(Problem(key, f"got {describe(value)}, expected JSON values"))
            elif key in PASSTHROUGH_SCHEMAS and isinstance(value, Mapping):
                # Checked against its declaration, carried as written (an explicit null stays), values as read.
                read = self.section(PASSTHROUGH_SCHEMAS[key], value, key)
                extra[key] = {**value, **(_section(read) if read is not None else {})}
            elif key in PASSTHROUGH_SCHEMAS:
                self.problems.append(Problem(key, f"got {describe(value)}, expected a table"))
        config = self.section(cls, data, "")
        if self.problems:
            raise error_of(self.problems)
        assert isinstance(config, cls)
        if extra or self.ignored or self.coerced:
            with attrs.validators.disabled():
                config = attrs.evolve(config, extra=extra, ignored=dict(self.ignored), coerced=dict(self.coerced))
        return config


def from_dict(data: Mapping[str, Any], *, strict: bool = True, cls: type[C] = ConfigBase) -> C:  # type: ignore[assignment]
    """Read a ds_config dict into a config of class ``cls``; raises ``ConfigError`` listing every problem."""
    return _Reader(strict).config(data, cls)


# -- writing -------------------------------------------------------------------


def _plain(value: Any) -> Any:
    """A value as JSON holds it: ``AUTO`` as ``"auto"``, tuples as lists, sections as tables, exact scalar types."""
    if value is AUTO:
        return "auto"
    if attrs.has(type(value)):
        return _section(value)
    if isinstance(value, (tuple, list)):
        return [_plain(x) for x in value]
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, float) and not math.isfinite(value):
        raise InvalidValueError(Problem("", f"{value} is not a JSON number"))
    for base in (bool, int, float, str):  # a subclass given in Python (an IntEnum) is written as the plain type
        if isinstance(value, base):
            return value if type(value) is base else base(value)
    return value


_KEYS: dict[type, tuple[tuple[str, str], ...]] = {}


def _keys(cls: type) -> tuple[tuple[str, str], ...]:
    """``(attribute name, ds key)`` of the fields of a section class that are ds keys (computed once per class)."""
    if cls not in _KEYS:
        _KEYS[cls] = tuple((a.name, key_of(a)) for a in attrs.fields(cls) if a.name not in NOT_KEYS)
    return _KEYS[cls]


def _section(obj: Any) -> dict[str, Any]:
    """A section as a table: its set fields (``None`` is unset and not written), by their ds keys."""
    return {key: _plain(value) for name, key in _keys(type(obj)) if (value := getattr(obj, name)) is not None}


def to_dict(config: ConfigFields) -> dict[str, Any]:
    """The ds_config dict of ``config``: DeepSpeed's keys, only what is set, plain JSON types."""
    out = _section(config)
    if config.extra:  # the sections carried as written come last
        out.update(_plain(dict(config.extra)))
    return out
