"""dsbuild knows DeepSpeed's whole ds_config schema, measured against the installed DeepSpeed itself.

The schema is found, not listed: DeepSpeed's parser (``DeepSpeedConfig``) runs on a spying dict that
records every key it looks up, at every level; every key found is probed again as a table, as
``{"enabled": true}``, as ``true`` and as a table of its own keys, which reaches keys read only behind
a switch. A probe key ``{"__dsprobe__": 1}`` at each path names the pydantic model that refuses it,
and that model's fields are walked (names, aliases, types, bounds, choices). A DeepSpeed upgrade that
adds a key fails ``test_every_deepspeed_key_is_known`` with the key's name.
"""

from __future__ import annotations

import copy
import enum
import logging
import math
import os
import types
import typing
from collections.abc import Iterator, Mapping
from typing import Any

import attrs
import pytest

from dsbuild import Config, ConfigError
from dsbuild.config import NOT_KEYS, PASSTHROUGH_KEYS, PASSTHROUGH_SCHEMAS, ConfigFields, section_classes
from dsbuild.config.fields import check_value, coerce, key_of, spec_of
from dsbuild.config.keys import UNKNOWN_KEY_HINTS
from dsbuild.io.convert import REMOVED_KEYS, RENAMED_KEYS
from dsbuild.validate.catalogue import REMOVED_ZERO_KEYS

os.environ.setdefault("DS_ACCELERATOR", "cpu")
import deepspeed
import pydantic
from deepspeed.runtime import config as ds_config
from deepspeed.runtime.config_utils import DeepSpeedConfigModel

pytestmark = pytest.mark.train  # the training extra; tests/conftest.py skips it without

PROBE = "__dsprobe__"
BASE = {"train_micro_batch_size_per_gpu": 1}

WAIVED = {
    "tensor_parallel.dtype": "a torch.dtype object: no file can hold one (refused with that hint)",
    "tensor_parallel.injection_policy_tuple": "inference injection policy classes, passed in code",
    "tensor_parallel.tensor_parallel.mpu": "a Python object (the model-parallel unit), passed in code",
    "tensor_parallel.tensor_parallel.tp_group": "a Python object (a process group), passed in code",
    "zero_optimization.cpu_offload": "legacy boolean, read as offload_optimizer = {device = cpu}",
    "zero_optimization.cpu_offload_param": "legacy boolean, read as offload_param = {device = cpu}",
    "zero_optimization.cpu_offload_use_pin_memory": "legacy, ignored by DeepSpeed (reported by validate)",
    "zero_optimization.stage3_gather_fp16_weights_on_model_save": "legacy spelling (RENAMED_KEYS)",
    "allgather_size": "legacy: read only when zero_optimization is a boolean, as its allgather_bucket_size",
}
"""DeepSpeed keys dsbuild does not type, each with the reason."""


# -- finding DeepSpeed's schema --------------------------------------------------------------


class _Spy(dict):  # type: ignore[type-arg]
    """A ds_config table that records every key DeepSpeed's parser looks up in it."""

    def __init__(self, path: tuple[str, ...], seen: dict[tuple[str, ...], Any], data: Any = ()) -> None:
        super().__init__(data)
        self.path, self.seen = path, seen

    def _saw(self, key: Any, default: Any = None) -> None:
        if isinstance(key, str):
            self.seen.setdefault((*self.path, key), default)

    def get(self, key: Any, default: Any = None) -> Any:
        self._saw(key, default)
        return super().get(key, default)

    def __getitem__(self, key: Any) -> Any:
        self._saw(key)
        return super().__getitem__(key)

    def __contains__(self, key: Any) -> bool:
        self._saw(key)
        return super().__contains__(key)

    def keys(self) -> Any:
        spy = self

        class Keys:
            def __contains__(self, key: Any) -> bool:
                return key in spy

            def __iter__(self) -> Iterator[Any]:
                return iter(list(dict.keys(spy)))

        return Keys()

    def pop(self, key: Any, *default: Any) -> Any:
        self._saw(key, default[0] if default else None)
        return super().pop(key, *default)

    def __copy__(self) -> _Spy:
        return _Spy(self.path, self.seen, dict.items(self))

    def copy(self) -> _Spy:
        return self.__copy__()

    def __deepcopy__(self, memo: Any) -> _Spy:
        return _Spy(self.path, self.seen, copy.deepcopy(dict(dict.items(self)), memo))

    def __bool__(self) -> bool:
        return True  # `if not param_dict:` must still look inside an empty table


def _spied(value: Any, path: tuple[str, ...], seen: dict[tuple[str, ...], Any]) -> Any:
    if isinstance(value, dict):
        return _Spy(path, seen, {k: _spied(v, (*path, k), seen) for k, v in value.items()})
    return value


def _run(at: tuple[str, ...], value: Any) -> tuple[dict[tuple[str, ...], Any], list[tuple[type, Any]]]:
    """Run DeepSpeed's parser with ``value`` at ``at``: the keys it looked up, and the pydantic errors raised."""
    data: dict[str, Any] = copy.deepcopy(BASE)
    node = data
    for key in at[:-1]:
        node = node.setdefault(key, {})
    node[at[-1]] = value
    seen: dict[tuple[str, ...], Any] = {}
    errors: list[tuple[type, Any]] = []
    original = DeepSpeedConfigModel.__init__

    def recording(self: Any, strict: bool = False, **kwargs: Any) -> None:
        try:
            original(self, strict=strict, **kwargs)
        except pydantic.ValidationError as error:
            errors.append((type(self), error))
            raise

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(DeepSpeedConfigModel, "__init__", recording)
        mp.setattr(ds_config.dist, "get_world_size", lambda *a, **k: 1)
        mp.setattr(ds_config.dist, "get_rank", lambda *a, **k: 0)
        try:
            ds_config.DeepSpeedConfig(_spied(data, (), seen))
        except Exception:
            pass
    return seen, errors


def _model_at(root: type, loc: tuple[Any, ...]) -> type | None:
    """The pydantic model at ``loc`` (field names or aliases) inside ``root``."""
    cls: Any = root
    for part in loc:
        if not isinstance(part, str):
            continue
        info = next((i for n, i in cls.model_fields.items() if part in (n, i.alias)), None)
        models = [] if info is None else _models_in(info.annotation)
        if not models:
            return None
        cls = models[0]
    return typing.cast(type, cls)


def _models_in(annotation: Any) -> list[type]:
    if isinstance(annotation, type) and issubclass(annotation, pydantic.BaseModel):
        return [annotation]
    return [m for arg in typing.get_args(annotation) for m in _models_in(arg)]


@attrs.frozen
class Key:
    """One key of DeepSpeed's schema."""

    path: str
    spellings: frozenset[str] = frozenset()
    """The path with each part spelt by its name or its alias (``tensor_parallel.tp``)."""
    model: type | None = None
    """The pydantic model that reads it (``None``: read by hand from the dict)."""
    field: Any = None
    """Its pydantic ``FieldInfo`` (pydantic keys only)."""


def _walk(model: type, prefix: str, prefixes: frozenset[str], out: dict[str, Key]) -> None:
    fields: Mapping[str, Any] = model.model_fields  # type: ignore[attr-defined]
    for name, info in fields.items():
        path = f"{prefix}.{name}"
        names = {name} | ({info.alias} if info.alias else set())
        spellings = frozenset(f"{p}.{n}" for p in prefixes for n in names)
        out[path] = Key(path, spellings, model, info)
        for sub in _models_in(info.annotation)[:1]:
            _walk(sub, path, spellings, out)


def deepspeed_schema() -> dict[str, Key]:
    """Every key the installed DeepSpeed's config parser reads, by dotted path."""
    for name in ("DeepSpeed", "deepspeed"):
        logging.getLogger(name).setLevel(logging.CRITICAL)
    found: dict[tuple[str, ...], Any] = {}
    models: dict[str, type] = {}
    seen, _ = _run(("train_micro_batch_size_per_gpu",), 1)
    queue = list(seen)
    found.update(seen)
    done: set[tuple[str, ...]] = set()
    while queue:
        path = queue.pop(0)
        if path in done or PROBE in path or len(path) > 5:
            continue
        done.add(path)
        probes: list[Any] = [{}, {"enabled": True}, True]
        for _round in range(3):  # a table of the keys found so far, until no new one appears
            children = {k[-1]: d for k, d in found.items() if len(k) == len(path) + 1 and k[:-1] == path}
            for filler in (1, "x"):  # optimizer.params is read once optimizer.type is a name
                filled = {k: (d if isinstance(d, (bool, int, float, str)) else filler) for k, d in children.items()}
                probes.append({**filled, **({"enabled": True} if "enabled" in filled else {})})
            before = len(found)
            for value in probes:
                seen, _ = _run(path, value)
                new = [k for k in seen if k not in found]
                found.update(seen)
                queue.extend(new)
            probes = []
            if len(found) == before:
                break
        _, errors = _run(path, {PROBE: 1})
        for model, error in errors:
            loc = next((tuple(e["loc"]) for e in error.errors() if e["loc"] and e["loc"][-1] == PROBE), None)
            if loc is not None:
                inner = _model_at(model, loc[:-1])
                if inner is not None:
                    models[".".join(path)] = inner
                break
    # The pipeline table is read whole (copied over its defaults), and the pipe engine reads use_reentrant.
    found.update({("pipeline", key): None for key in [*ds_config.get_pipeline_config({}), "use_reentrant"]})
    schema = {".".join(k): Key(".".join(k), frozenset({".".join(k)})) for k in found if PROBE not in k}
    for path, model in sorted(models.items()):
        schema[path] = Key(path, frozenset({path}), model)
        _walk(model, path, frozenset({path}), schema)
    return schema


# -- what dsbuild knows ------------------------------------------------------------------------


def dsbuild_keys() -> tuple[dict[str, Any], set[str]]:
    """dsbuild's typed keys (dotted path -> its attrs field, or the section class) and the prefixes of the
    tables it carries as written."""
    typed: dict[str, Any] = {}
    carried: set[str] = set(PASSTHROUGH_KEYS) - set(PASSTHROUGH_SCHEMAS) | set(REMOVED_KEYS)
    classes = dict(section_classes())
    for key, cls in PASSTHROUGH_SCHEMAS.items():
        classes[key] = cls
    for path, cls in classes.items():
        if path:
            typed[path] = cls
        renames = RENAMED_KEYS.get(cls, {})
        for a in attrs.fields(cls):
            if a.name in NOT_KEYS:
                continue
            dotted = f"{path}.{key_of(a)}" if path else key_of(a)
            typed[dotted] = a
            for old, new in renames.items():
                if new == key_of(a):
                    typed[f"{path}.{old}" if path else old] = a
            if "dsbuild" in a.metadata and spec_of(a).kind in ("mapping", "json"):
                carried.add(dotted)
    for section in ("optimizer", "scheduler"):  # the params of a named class are typed; any class takes its own
        carried.add(f"{section}.params")
    return typed, carried


def _known(key: Key, typed: Mapping[str, Any], carried: set[str]) -> str | None:
    head, dot, rest = key.path.partition(".")
    spellings = {*key.spellings, *((f"{RENAMED_KEYS[ConfigFields][head]}{dot}{rest}",) if head == "bfloat16" else ())}
    if spellings & set(typed):
        return "typed"
    if any(s == c or s.startswith(f"{c}.") for s in spellings for c in carried):
        return "carried"
    if head == "zero_optimization" and rest in REMOVED_ZERO_KEYS:
        return "refused"  # removed from DeepSpeed: dsbuild refuses it with what to do instead
    return "waived" if key.path in WAIVED else None


@pytest.fixture(scope="module")
def schema() -> dict[str, Key]:
    return deepspeed_schema()


def test_every_deepspeed_key_is_known(schema: dict[str, Key], capsys: pytest.CaptureFixture[str]) -> None:
    """Every key DeepSpeed reads is typed by dsbuild, carried as written, or waived with a reason."""
    typed, carried = dsbuild_keys()
    assert len(schema) > 250, "the spy found too little: has DeepSpeed's parser changed how it reads?"
    how = {path: _known(key, typed, carried) for path, key in schema.items()}
    unknown = sorted(path for path, kind in how.items() if kind is None)
    counts = {kind: sum(1 for k in how.values() if k == kind) for kind in ("typed", "carried", "refused", "waived")}
    with capsys.disabled():
        print(
            f"\nschema coverage: {len(schema) - len(unknown)} of {len(schema)} DeepSpeed {deepspeed.__version__} "
            f"keys known ({counts['typed']} typed, {counts['carried']} carried as written, "
            f"{counts['refused']} removed and refused, {counts['waived']} waived)"
        )
    assert unknown == [], f"keys DeepSpeed {deepspeed.__version__} reads that dsbuild does not know: {unknown}"


def test_every_typed_key_is_one_deepspeed_reads(schema: dict[str, Key]) -> None:
    """The other way: no key of dsbuild's is one DeepSpeed would refuse or ignore as unknown."""
    typed, _ = dsbuild_keys()
    spellings = {s for key in schema.values() for s in key.spellings}
    read_elsewhere = {"data_parallel_size", "pipeline.use_reentrant"}  # deepspeed.initialize, the pipe engine
    stale = sorted(p for p in typed if p not in spellings and p not in read_elsewhere)
    assert stale == [], f"dsbuild keys DeepSpeed {deepspeed.__version__} does not read: {stale}"


def _pydantic_fields(schema: Mapping[str, Key]) -> Iterator[tuple[Key, Any]]:
    typed, _ = dsbuild_keys()
    for key in schema.values():
        attribute = typed.get(key.path)
        if key.field is not None and isinstance(attribute, attrs.Attribute) and "dsbuild" in attribute.metadata:
            yield key, attribute


def _bounds(info: Any) -> dict[str, float]:
    out = {}
    for meta in info.metadata:
        for name in ("gt", "ge", "lt", "le"):
            value = getattr(meta, name, None)
            if value is not None:
                out[name] = float(value)
    return out


def _probes(bounds: Mapping[str, float], integer: bool) -> list[float]:
    step = 1 if integer else 1e-6
    values = []
    for name, bound in bounds.items():
        values += [bound - step, bound, bound + step] if name in ("gt", "ge", "lt", "le") else []
    return [int(v) if integer else v for v in values if math.isfinite(v)]


def _deepspeed_takes(key: Key, value: Any) -> bool:
    name = key.path.rpartition(".")[2]
    try:
        key.model(**{name: value})  # type: ignore[misc]
    except (pydantic.ValidationError, ValueError, AssertionError):
        return False
    return True


def test_typed_pydantic_fields_refuse_what_deepspeed_refuses(schema: dict[str, Key]) -> None:
    """For every bounded number and every choice of DeepSpeed's pydantic sections, dsbuild refuses what its
    model refuses (probed at each bound), and takes each choice it offers."""
    disagreements = []
    checked = 0
    for key, attribute in _pydantic_fields(schema):
        spec = spec_of(attribute)
        if spec.kind in ("int", "float"):
            for value in _probes(_bounds(key.field), spec.kind == "int"):
                checked += 1
                ours = check_value(spec, coerce(spec, value)) is None
                if ours and not _deepspeed_takes(key, value):
                    disagreements.append(f"{key.path} = {value}: DeepSpeed refuses, dsbuild takes")
        choices = _choices(key.field.annotation)
        if spec.kind == "choice" and choices:
            for choice in choices:
                checked += 1
                if check_value(spec, coerce(spec, choice)) is not None:
                    disagreements.append(f"{key.path} = {choice!r}: DeepSpeed takes, dsbuild refuses")
            checked += 1
            if check_value(spec, coerce(spec, "not-a-choice")) is None:
                disagreements.append(f"{key.path} = 'not-a-choice': DeepSpeed refuses, dsbuild takes")
    assert checked > 50
    assert disagreements == []


def _choices(annotation: Any) -> list[Any]:
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return [m.value for m in annotation if isinstance(m.value, str)]
    if typing.get_origin(annotation) is typing.Literal:
        return [a for a in typing.get_args(annotation) if isinstance(a, str)]
    return [c for arg in typing.get_args(annotation) for c in _choices(arg)]


_KINDS = {bool: {"bool"}, int: {"int"}, float: {"float"}, str: {"str", "choice"}}


def test_typed_fields_have_deepspeed_types(schema: dict[str, Key]) -> None:
    """Each typed key of a pydantic section holds the kind of value DeepSpeed's model declares."""
    wrong = []
    for key, attribute in _pydantic_fields(schema):
        spec = spec_of(attribute)
        annotation = key.field.annotation
        union = typing.get_origin(annotation) in (typing.Union, types.UnionType)
        args = [a for a in typing.get_args(annotation) if a is not type(None)] if union else [annotation]
        base = typing.get_origin(args[0]) or args[0]
        if _models_in(annotation):
            expected = {"section"}
        elif isinstance(base, type) and issubclass(base, enum.Enum):
            expected = {"choice", "int"}  # ZeroStageEnum is an int enum
        elif set(args) == {str, int}:
            expected = {"int"}  # "auto" (AUTO) or a number
        elif base is typing.Literal:
            expected = {"choice"}
        elif base in (list, tuple):
            expected = {"strs", "pair"}
        elif base is dict:
            expected = {"mapping"}
        else:
            expected = _KINDS.get(base, {spec.kind})  # a Union of str and int ("auto" or a number) and the like
        if spec.kind not in expected:
            wrong.append(f"{key.path}: DeepSpeed {annotation}, dsbuild {spec.kind}")
    assert wrong == [], wrong


def test_legacy_keys_are_deepspeed_spellings() -> None:
    """Each legacy spelling we read is one DeepSpeed reads too (a field name, an alias, or bfloat16)."""
    from deepspeed.runtime.tensor_parallel.config import TPTrainingConfig
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig

    for model, ours in (
        (DeepSpeedZeroConfig, section_classes()["zero_optimization"]),
        (TPTrainingConfig, section_classes()["tensor_parallel"]),
    ):
        spellings = set(model.model_fields) | {i.alias for i in model.model_fields.values() if i.alias}
        assert set(RENAMED_KEYS[ours]) <= spellings
        assert set(RENAMED_KEYS[ours].values()) <= {key_of(a) for a in attrs.fields(ours)}
    assert RENAMED_KEYS[ConfigFields] == {"bfloat16": "bf16"}


def test_removed_sections_match_deepspeed() -> None:
    """The sections DeepSpeed 0.19 refuses are exactly the ones we report as removed."""
    assert set(REMOVED_KEYS) == set(ds_config._REMOVED_TOP_LEVEL_CONFIG_KEYS)
    removed_zero = set(ds_config._REMOVED_ZERO_CONFIG_KEYS)
    assert removed_zero == set(REMOVED_ZERO_KEYS)
    assert removed_zero <= {key for cls, key in UNKNOWN_KEY_HINTS if cls == "ZeroOptimization"}


def _deepspeed_parses(path: str, value: Any) -> bool:
    data: dict[str, Any] = copy.deepcopy(BASE)
    node = data
    *parents, last = path.split(".")
    for key in parents:
        node = node.setdefault(key, {})
    node[last] = value
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ds_config.dist, "get_world_size", lambda *a, **k: 1)
        mp.setattr(ds_config.dist, "get_rank", lambda *a, **k: 0)
        try:
            ds_config.DeepSpeedConfig(data)
        except Exception:
            return False
    return True


def test_null_is_refused_where_deepspeed_refuses_it(schema: dict[str, Key]) -> None:
    """A ``null`` dsbuild reads as "unset" is one DeepSpeed's parser also takes (as its default); where DeepSpeed
    refuses it, so does dsbuild. dsbuild refuses more only for whole sections (``"bf16": null`` fails later)."""
    typed, _ = dsbuild_keys()
    disagreements = []
    for path, key in sorted(schema.items()):
        if not key.spellings & set(typed) or path in WAIVED or path.startswith(("optimizer.", "scheduler.")):
            continue  # an optimizer or scheduler without a type is refused (DeepSpeed silently builds none)
        try:
            Config.from_dict({**BASE, **_nested(path, None)})
            ours = True
        except ConfigError:
            ours = False
        theirs = _deepspeed_parses(path, None)
        if ours and not theirs:
            disagreements.append(f"{path}: null refused by DeepSpeed, taken by dsbuild")
        elif theirs and not ours and not isinstance(typed.get(path), type):
            disagreements.append(f"{path}: null taken by DeepSpeed, refused by dsbuild")
    assert disagreements == [], "\n".join(disagreements)


def _nested(path: str, value: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    node = out
    *parents, last = path.split(".")
    for key in parents:
        node = node.setdefault(key, {})
    node[last] = value
    return out
