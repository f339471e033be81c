"""``"auto"`` resolution with the HF Trainer's answers, then DeepSpeed's batch triangle, with provenance.

``resolve(config, world_size=..., training=..., model=..., total_steps=...)``
fills every ``AUTO`` the way ``transformers.integrations.deepspeed.HfTrainerDeepSpeedConfig``
does in ``trainer_config_process`` and ``trainer_config_finalize`` (transformers 5):

- an ``AUTO`` in a key of the HF table takes the training argument's value;
- an explicit value that disagrees with the argument is a conflict (HF's ``fill_match``);
  every conflict is reported together, one line each, in one ``ConflictError``;
- a few keys are only ever filled, never checked (HF's ``fill_only``): ``warmup_min_lr``
  and the three hidden-size buckets.

Then DeepSpeed's batch triangle (``train_batch_size = micro x accumulation x world
size``, ``_set_batch_related_parameters`` in ``deepspeed/runtime/config.py``) derives the
batch sizes that are not set, and writes all three. Finally no ``AUTO`` may remain.

Where dsbuild knowingly differs from HF (each is tested):

- an ``AUTO`` that HF leaves in place (keys outside its table, such as
  ``stage3_gather_16bit_weights_on_model_save``, or the stage-3 buckets below stage 3)
  is an ``UnresolvedAutoError`` here; HF hands it to DeepSpeed, which silently uses its
  default. ``data_types.keep_in_fp32_modules = "auto"`` is DeepSpeed's own and is kept;
- a batch size the config does not set, derived by the triangle, must agree with the
  training arguments too (HF lets DeepSpeed train with gradient accumulation 1 while
  ``gradient_accumulation_steps`` says 8);
- ``save_on_each_node`` fills ``checkpoint.use_node_local_storage`` where it is unset or
  ``"auto"``; an explicit ``false`` is a conflict (HF overwrites it);
- ``betas`` may be half ``"auto"`` (``["auto", 0.95]``): each ``"auto"`` is filled and
  the other checked (HF reports the pair as a mismatch);
- without ``training`` nothing is compared, and an ``AUTO`` that needs a training
  argument is left for the batch triangle or reported (HF always has its arguments);
- with ``sequence_parallel_size`` set, batch sizes count data-parallel ranks (the world
  size over it), as DeepSpeed and Accelerate do (HF's config step uses the world size).

This module holds data and arithmetic only: it never imports torch, deepspeed,
transformers or peft. ``training`` and ``model`` are read by attribute name.
"""

from __future__ import annotations

import json
import keyword
import operator
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Final, NamedTuple, cast

import attrs

from .config import AUTO, Config
from .config._fields import Spec, check_value, key_of
from .errors import ConflictError, InvalidValueError, Problem, UnresolvedAutoError
from .training import SCHEDULER_TYPES, NoneValue, Training, training_from

__all__ = [
    "SCHEDULER_TYPES",
    "Explanation",
    "Training",
    "auto_paths",
    "explain",
    "model_hidden_size",
    "render_explanation",
    "resolve",
]


# -- the training arguments resolve reads ---------------------------------------

_RESOLVE_READS: Final = (
    "per_device_train_batch_size",
    "gradient_accumulation_steps",
    "max_grad_norm",
    "learning_rate",
    "adam_beta1",
    "adam_beta2",
    "adam_epsilon",
    "weight_decay",
    "save_on_each_node",
    "fp16",
    "fp16_full_eval",
    "bf16",
    "bf16_full_eval",
    "warmup_steps",
    "warmup_ratio",
    "max_steps",
)
"""The arguments ``resolve`` reads: those HF's DeepSpeed integration reads, plus ``warmup_ratio`` (HF 4) and
``max_steps`` (the run's steps when ``total_steps`` is not given)."""


def _training_view(training: Any) -> Training | None:
    """The arguments ``resolve`` reads, checked; a duck-typed object's other attributes are not looked at."""
    if training is None or isinstance(training, Training):
        return training
    return training_from(training, dict.fromkeys(_RESOLVE_READS))


# -- facts of the run ------------------------------------------------------------


class _Fact(NamedTuple):
    """A value an argument gives for a key: the value, how a conflict names it, and where it came from."""

    value: Any
    expr: str
    """The argument in a conflict message: ``learning_rate`` in ``... disagrees with learning_rate = 5e-05``."""
    origin: str
    """The provenance recorded for a filled key."""


class _Need(NamedTuple):
    """Why an ``AUTO`` could not be filled: what is missing, and how to give it."""

    message: str
    hint: str | None = None


_NEEDS_STEPS = '"auto" needs the number of optimizer steps (pass total_steps=...)'
_NEEDS_HIDDEN = '"auto" needs the model\'s hidden size (pass model= or hidden_size=)'


class _Run:
    """The facts ``resolve`` was given, checked once; the hidden size is looked up only when needed."""

    def __init__(
        self, world_size: Any, training: Any, model: Any, hidden_size: Any, total_steps: Any, sequence_parallel: Any
    ) -> None:
        if not (_is_int(world_size, 1) and _is_int(hidden_size, 1, None) and _is_int(total_steps, 0, None)):
            _raise_bad_args(world_size, hidden_size, total_steps)
        # DeepSpeed's batch triangle counts data-parallel ranks: the world size over the sequence-parallel degree.
        sp = sequence_parallel if type(sequence_parallel) is int else 1
        if world_size % sp:
            raise InvalidValueError(
                Problem("sequence_parallel_size", f"{sp} does not divide the world size {world_size}")
            )
        self.world_size: int = world_size // sp
        self.world_text = (
            f"world size {world_size}"
            if sp == 1
            else (f"data-parallel size {world_size // sp} (world size {world_size} / sequence_parallel_size {sp})")
        )
        self.training = _training_view(training)
        self.model = model
        self.hidden_size_arg: int | None = hidden_size
        self.total_steps: int | None = total_steps
        self._hidden: _Fact | _Need | None = None

    def hidden(self) -> _Fact | _Need:
        if self._hidden is None:
            self._hidden = self._find_hidden()
        return self._hidden

    def _find_hidden(self) -> _Fact | _Need:
        if self.hidden_size_arg is not None:
            return _Fact(self.hidden_size_arg, "hidden_size", f"hidden_size argument {self.hidden_size_arg}")
        if self.model is None:
            return _Need(_NEEDS_HIDDEN)
        found = model_hidden_size(self.model)
        if isinstance(found, str):
            return _Need(f'"auto" needs the model\'s hidden size, but {found}', "pass hidden_size=")
        return _Fact(found, "hidden size", f"hidden size {found} of the model")

    def steps(self) -> _Fact | _Need:
        if self.total_steps is not None:
            return _Fact(self.total_steps, "total_steps", "total_steps argument")
        if self.training is not None and self.training.max_steps > 0:
            return _Fact(self.training.max_steps, "max_steps", "training argument max_steps")
        return _Need(_NEEDS_STEPS)


def _is_int(value: Any, least: int, *allowed: None) -> bool:
    """``value`` is an integer >= ``least`` (not a bool), or ``None`` where ``None`` is allowed."""
    return (type(value) is int and value >= least) or (value is None and bool(allowed))


def _raise_bad_args(world_size: Any, hidden_size: Any, total_steps: Any) -> None:
    args = (
        ("world_size", world_size, Spec("int", gt=0, auto=False)),
        ("hidden_size", hidden_size, Spec("int", gt=0, auto=False)),
        ("total_steps", total_steps, Spec("int", ge=0, auto=False)),
    )
    problems = []
    for name, value, spec in args:
        if value is None and name != "world_size":
            continue
        message = check_value(spec, NoneValue() if value is None else value)
        if message is not None:
            problems.append(Problem(name, message))
    raise InvalidValueError(problems)


_MISSING: Final = object()


def _lookup(obj: Any, name: str) -> Any:
    """``obj.name`` or ``obj[name]``; ``_MISSING`` when there is none (``hasattr`` semantics, as HF)."""
    if isinstance(obj, Mapping):
        return obj.get(name, _MISSING)
    return getattr(obj, name, _MISSING)


def model_hidden_size(model: Any) -> int | str:
    """The hidden size of a model or model config, as HF finds it; else why not (a message).

    ``model.config.hidden_size``, else ``max(hidden_sizes)``, else the same under
    ``text_config``. ``model`` may be a model (with ``.config``), a config object or a
    config table.
    """
    config = _lookup(model, "config")
    where = "model.config"
    if config is _MISSING:
        config, where = model, "the model config"
    for sub, label in ((config, where), (_lookup(config, "text_config"), f"{where}.text_config")):
        if sub is _MISSING:
            continue
        value = _lookup(sub, "hidden_size")
        if value is not _MISSING:
            return _positive(value, f"{label}.hidden_size")
        sizes = _lookup(sub, "hidden_sizes")
        if sizes is not _MISSING:
            try:
                return _positive(max(sizes), f"max({label}.hidden_sizes)")
            except (TypeError, ValueError):
                return f"{label}.hidden_sizes is {sizes!r}"
    return f"{where} has neither hidden_size nor hidden_sizes"


def _positive(value: Any, label: str) -> int | str:
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    return f"{label} is {value!r}"


# -- the HF table ------------------------------------------------------------------

FactOf = Callable[[_Run], "_Fact | _Need"]


def _training_arg(name: str) -> FactOf:
    """The fact of one training argument, by its HF name."""

    need = _Need(f'"auto" needs the training argument {name} (pass training=...)')
    origin = f"training argument {name}"

    def fact(run: _Run) -> _Fact | _Need:
        return need if run.training is None else _Fact(getattr(run.training, name), name, origin)

    return fact


def _train_batch_size(run: _Run) -> _Fact | _Need:
    t = run.training
    if t is None:
        return _Need('"auto" needs per_device_train_batch_size and gradient_accumulation_steps (pass training=...)')
    micro, accum = t.per_device_train_batch_size, t.gradient_accumulation_steps
    text = f"{run.world_text} × per_device_train_batch_size {micro} × gradient_accumulation_steps {accum}"
    return _Fact(run.world_size * micro * accum, text, f"training arguments: {text}")


def _betas(run: _Run) -> _Fact | _Need:
    t = run.training
    if t is None:
        return _Need('"auto" needs the training arguments adam_beta1 and adam_beta2 (pass training=...)')
    return _Fact((t.adam_beta1, t.adam_beta2), "[adam_beta1, adam_beta2]", "training arguments adam_beta1, adam_beta2")


def _precision(name: str) -> FactOf:
    def fact(run: _Run) -> _Fact | _Need:
        if run.training is None:
            return _Need(f'"auto" needs the training arguments {name} and {name}_full_eval (pass training=...)')
        value = bool(getattr(run.training, name) or getattr(run.training, f"{name}_full_eval"))
        return _Fact(value, f"{name} or {name}_full_eval", f"training arguments {name}, {name}_full_eval")

    return fact


def _warmup_min_lr(run: _Run) -> _Fact:
    return _Fact(0, "0", "the HF Trainer's 0 (not a training argument)")


def _hidden_based(formula: Callable[[int], int], text: str) -> FactOf:
    def fact(run: _Run) -> _Fact | _Need:
        hidden = run.hidden()
        if isinstance(hidden, _Need):
            return hidden
        return _Fact(formula(hidden.value), text, f"{hidden.origin} ({text})")

    return fact


def _total_num_steps(run: _Run) -> _Fact | _Need:
    return run.steps()


def _warmup_num_steps(run: _Run) -> _Fact | _Need:
    """``max(1, args.get_warmup_steps(total))``: HF 5 reads a ``warmup_steps`` below 1 as a ratio of the run."""
    t = run.training
    if t is None:
        return _Need('"auto" needs the training argument warmup_steps (pass training=...)')
    name, ratio = ("warmup_steps", t.warmup_steps) if t.warmup_steps > 0 else ("warmup_ratio", t.warmup_ratio)
    if t.warmup_steps >= 1 or ratio == 0:
        return _Fact(
            max(1, t.get_warmup_steps(0)), "max(1, warmup_steps)", "training argument warmup_steps (at least 1)"
        )
    total = run.steps()
    if isinstance(total, _Need):
        return _Need(
            f'"auto" needs the number of optimizer steps to turn {name}={ratio!r} into steps (pass total_steps=...)'
        )
    text = f"{name} {ratio!r} × {total.value} steps"
    return _Fact(
        max(1, t.get_warmup_steps(total.value)), f"max(1, ceil({text}))", f"training argument {text} (at least 1)"
    )


@attrs.frozen
class _Rule:
    """One row of the HF table: a key, the fact that fills it, and whether an explicit value must match."""

    path: str
    fact: FactOf
    must_match: bool = True
    stage3_only: bool = False

    @property
    def parts(self) -> tuple[str, ...]:
        return tuple(self.path.split("."))


RULES: Final = (
    # trainer_config_process, in HF's order (conflicts are listed in this order too)
    _Rule("train_micro_batch_size_per_gpu", _training_arg("per_device_train_batch_size")),
    _Rule("gradient_accumulation_steps", _training_arg("gradient_accumulation_steps")),
    _Rule("train_batch_size", _train_batch_size),
    _Rule("gradient_clipping", _training_arg("max_grad_norm")),
    _Rule("optimizer.params.lr", _training_arg("learning_rate")),
    _Rule("optimizer.params.betas", _betas),
    _Rule("optimizer.params.eps", _training_arg("adam_epsilon")),
    _Rule("optimizer.params.weight_decay", _training_arg("weight_decay")),
    _Rule("scheduler.params.warmup_min_lr", _warmup_min_lr, must_match=False),
    _Rule("scheduler.params.warmup_max_lr", _training_arg("learning_rate")),
    _Rule("fp16.enabled", _precision("fp16")),
    _Rule("bf16.enabled", _precision("bf16")),
    # trainer_config_finalize
    _Rule("zero_optimization.reduce_bucket_size", _hidden_based(lambda h: h * h, "hidden size²"), must_match=False),
    _Rule(
        "zero_optimization.stage3_prefetch_bucket_size",
        _hidden_based(lambda h: int(0.9 * h * h), "0.9 × hidden size²"),
        must_match=False,
        stage3_only=True,
    ),
    _Rule(
        "zero_optimization.stage3_param_persistence_threshold",
        _hidden_based(lambda h: 10 * h, "10 × hidden size"),
        must_match=False,
        stage3_only=True,
    ),
    _Rule("scheduler.params.total_num_steps", _total_num_steps),
    _Rule("scheduler.params.warmup_num_steps", _warmup_num_steps),
)
"""What the HF Trainer fills, in its order (``trainer_config_process`` then ``trainer_config_finalize``)."""

_RULE_PARTS: Final = tuple((rule, rule.parts[:-1], rule.parts[-1]) for rule in RULES)

BATCH_KEYS: Final = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")

DEEPSPEED_AUTOS: Final = frozenset({"data_types.keep_in_fp32_modules"})
"""Keys whose ``"auto"`` DeepSpeed itself understands: kept as written."""

_ACCELERATE: Final = '"auto" is filled by Accelerate\'s DeepSpeed plugin, not by the HF Trainer; DeepSpeed alone would silently use its default'
_NOT_FILLED_BY_HF: Final = {
    "zero_optimization.stage3_gather_16bit_weights_on_model_save": _Need(
        _ACCELERATE, "set true to save a usable 16-bit model at stage 3, or false"
    ),
    "zero_optimization.stage": _Need(_ACCELERATE, "set 0, 1, 2 or 3"),
    "zero_optimization.offload_optimizer.device": _Need(_ACCELERATE, "set 'cpu', 'nvme' or 'none'"),
    "zero_optimization.offload_param.device": _Need(_ACCELERATE, "set 'cpu', 'nvme' or 'none'"),
    "zero_optimization.offload_optimizer.nvme_path": _Need(_ACCELERATE, "set the NVMe directory"),
    "zero_optimization.offload_param.nvme_path": _Need(_ACCELERATE, "set the NVMe directory"),
}
"""``"auto"`` the HF Trainer leaves for Accelerate to fill from its own settings (``accelerate config``)."""


# -- reading and rewriting a config by ds keys ---------------------------------------


_ATTR_NAMES: dict[type, dict[str, str]] = {}
_SLOTS: dict[type, _Slots] = {}
_LAYOUTS: dict[type, _Layout] = {}
# Per-class tables, computed on first use (plain dicts: the cheapest lookup on this hot path).


def _attr_names(cls: type) -> dict[str, str]:
    """ds key -> attribute name of an attrs class (``fp16`` -> ``fp16_config`` on ``Config``)."""
    names = _ATTR_NAMES.get(cls)
    if names is None:
        names = _ATTR_NAMES[cls] = {key_of(a): a.name for a in attrs.fields(cls)}
    return names


def _child(obj: Any, key: str) -> Any:
    """The value under ``key`` of a section or table; ``None`` when unset or not a key there."""
    names = _ATTR_NAMES.get(type(obj))
    if names is None:
        if obj is None:
            return None
        if isinstance(obj, Mapping):
            return obj.get(key)
        names = _attr_names(type(obj))
    name = names.get(key)
    return None if name is None else getattr(obj, name)


class _Slots(NamedTuple):
    """How to copy an attrs class field by field: its attribute names, a getter of all their values at once,
    and the attribute name of each ds key."""

    names: tuple[str, ...]
    values: Callable[[Any], tuple[Any, ...]]
    attr_of: dict[str, str]


def _slots(cls: type) -> _Slots:
    slots = _SLOTS.get(cls)
    if slots is None:
        names = [a.name for a in attrs.fields(cls)]
        slots = _SLOTS[cls] = _Slots(tuple(names), _getter(names), _attr_names(cls))
    return slots


def _replaced(obj: Any, changes: Mapping[str, Any]) -> Any:
    """``obj`` with ``changes`` (by ds key): a new table, or a new attrs instance.

    Built without re-running the field validators: every value resolution writes comes
    from checked arguments and fits its field (the tests check this on every result).
    That keeps ``resolve`` at a few microseconds; ``attrs.evolve`` on ``Config`` alone
    would cost more than the whole resolution.
    """
    slots = _SLOTS.get(type(obj))
    if slots is None:
        if isinstance(obj, Mapping):
            return {**obj, **changes}
        slots = _slots(type(obj))
    new = object.__new__(type(obj))
    # Copy every slot at C speed, then set the changes: the setter returns None, so any() runs it on every slot
    # (cheaper than a deque(..., maxlen=0) to consume the map), and one bound to the new object once is cheaper to
    # call than object.__setattr__ with the object each time.
    set_slot = _OBJECT_SETATTR.__get__(new)
    any(map(set_slot, slots.names, slots.values(obj)))
    attr_of = slots.attr_of
    for key, value in changes.items():
        set_slot(attr_of.get(key, key), value)
    return new


_OBJECT_SETATTR: Final = object.__setattr__


def _new_section(parent: Any, key: str) -> Any:
    """An empty section to write into, where the config has none (``checkpoint`` for ``save_on_each_node``)."""
    field = attrs.fields_dict(type(parent))[_attr_names(type(parent))[key]]
    spec = field.metadata.get("dsbuild")
    if spec is None or spec.section is None:
        return {}
    return spec.section()


class _Resolution:
    """One ``resolve`` call: the values written (by section), their provenance, and the problems found."""

    def __init__(self, config: Config, run: _Run) -> None:
        self.config = config
        self.run = run
        self.writes: dict[tuple[str, ...], dict[str, Any]] = {}
        self.origins: dict[str, str] = {}
        self.needs: dict[str, _Need] = {}
        self.conflicts: list[Problem] = []
        self.invalid: list[Problem] = []
        self.nodes: dict[tuple[str, ...], Any] = {(): config}

    def node(self, parts: tuple[str, ...]) -> Any:
        """The section (or table) of the config at ``parts``; ``None`` when it is not there."""
        found = self.nodes.get(parts, _MISSING)
        if found is _MISSING:
            found = self.nodes[parts] = _child(self.node(parts[:-1]), parts[-1])
        return found

    def value(self, parts: tuple[str, ...]) -> Any:
        written = self.writes.get(parts[:-1])
        if written is not None and parts[-1] in written:
            return written[parts[-1]]
        return self.node(parts)

    def write(self, parts: tuple[str, ...], value: Any, origin: str) -> None:
        self.fill(parts[:-1], parts[-1], ".".join(parts), _Fact(value, "", origin), as_list=False)

    def fill(self, section: tuple[str, ...], key: str, path: str, fact: _Fact, *, as_list: bool) -> None:
        """Write ``fact``'s value at ``section.key`` (``path``) and record where it came from."""
        value = fact.value
        if as_list and type(value) is tuple:
            value = list(value)  # a free table (a torch optimizer's params) holds lists, as read from a file
        writes = self.writes.get(section)
        if writes is None:
            writes = self.writes[section] = {}
        writes[key] = value
        self.origins[path] = fact.origin

    def conflict(self, path: str, ds_value: Any, fact: _Fact, derived: str | None = None) -> None:
        given = _show(ds_value) if derived is None else f"not set, and {derived} gives {_show(ds_value)}, which"
        self.conflicts.append(
            Problem(
                path,
                f"{given} disagrees with {fact.expr} = {_show(fact.value)}",
                f'set the key to "auto" or to {_show(fact.value)}',
            )
        )

    def result(self) -> Config:
        """The config with every write applied, rebuilt once from the deepest section up."""
        changes = self.writes  # consumed: result() is the last step of a resolution
        if not changes:
            return self.config
        for section in list(changes):  # a section rebuilt means its parents are rebuilt too
            for depth in range(1, len(section)):
                changes.setdefault(section[:depth], {})
        top = changes.pop((), {})
        for section in sorted(changes, key=len, reverse=True):
            obj = self.node(section)
            if obj is None:
                obj = _new_section(self.node(section[:-1]), section[-1])
            parent = changes[section[:-1]] if len(section) > 1 else top
            parent[section[-1]] = _replaced(obj, changes[section])
        top["provenance"] = {**self.config.provenance, **self.origins}
        resolved: Config = _replaced(self.config, top)
        return resolved


def _show(value: Any) -> str:
    """A value as it reads in the ds_config: ``true``, ``[0.9, 0.999]``, ``5e-05``, ``"auto"``."""
    if value is AUTO:
        return '"auto"'
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_show(x) for x in value) + "]"
    return repr(value)


# -- the steps of resolve -----------------------------------------------------------------


def _apply_rules(res: _Resolution) -> None:
    """HF's ``fill_match`` / ``fill_only`` over the table, in HF's order."""
    run = res.run
    stage = _child(res.config.zero_optimization, "stage")
    parents = _rule_sections(res.config)
    tables = dict.fromkeys(parents, False)  # typed sections, but a torch optimizer's params are a free table
    for params in _PARAMS:
        tables[params] = _is_table(parents[params])
    for rule, section, key in _RULE_PARTS:
        parent = parents[section]
        if parent is None:
            continue
        # Every key of the table is its own attribute name; a params class without it has no such key.
        value = parent.get(key) if tables[section] else getattr(parent, key, None)
        if value is None:
            continue
        if value is AUTO:
            if rule.stage3_only and stage != 3:
                res.needs[rule.path] = _stage3_only(stage)
                continue
            fact = rule.fact(run)
            if isinstance(fact, _Need):
                res.needs[rule.path] = fact
            else:
                res.fill(section, key, rule.path, fact, as_list=tables[section])
        elif type(value) is tuple and AUTO in value:
            _fill_pair(res, rule, section, key, value)
        elif rule.must_match:
            fact = rule.fact(run)
            if isinstance(fact, _Fact) and not _same(value, fact.value):
                res.conflict(rule.path, value, fact)


_PARAMS: Final[tuple[tuple[str, ...], ...]] = (("optimizer", "params"), ("scheduler", "params"))


def _is_table(obj: Any) -> bool:
    """A free table (a torch optimizer's or scheduler's params), not a typed section."""
    return type(obj) is dict or (obj is not None and not attrs.has(type(obj)) and isinstance(obj, Mapping))


def _rule_sections(config: Config) -> dict[tuple[str, ...], Any]:
    """The sections the HF table writes into (``None`` where the config has none)."""
    optimizer, scheduler = config.optimizer_config, config.scheduler
    return {
        (): config,
        ("optimizer", "params"): None if optimizer is None else optimizer.params,
        ("scheduler", "params"): None if scheduler is None else scheduler.params,
        ("fp16",): config.fp16_config,
        ("bf16",): config.bf16_config,
        ("zero_optimization",): config.zero_optimization,
    }


def _fill_pair(res: _Resolution, rule: _Rule, section: tuple[str, ...], key: str, value: tuple[Any, ...]) -> None:
    """A pair with one ``"auto"`` (``betas: ["auto", 0.95]``): fill that one, check the other."""
    fact = rule.fact(res.run)
    if isinstance(fact, _Need):
        res.needs[rule.path] = fact
        return
    filled = tuple(f if v is AUTO else v for v, f in zip(value, fact.value, strict=True))
    if filled != tuple(fact.value):
        res.conflict(rule.path, value, fact)
    res.fill(section, key, rule.path, fact._replace(value=filled), as_list=False)


def _same(ds_value: Any, hf_value: Any) -> bool:
    """HF's ``ds_val != hf_val`` with lists for pairs (``1 == 1.0``; ``(0.9, 0.999) == [0.9, 0.999]``)."""
    if isinstance(ds_value, tuple):
        ds_value = list(ds_value)
    if isinstance(hf_value, tuple):
        hf_value = list(hf_value)
    return bool(ds_value == hf_value)


def _stage3_only(stage: Any) -> _Need:
    at = "no stage (0)" if stage is None else f"stage {_show(stage)}"
    return _Need(
        f'"auto" is filled only at ZeRO stage 3, and this config has {at}; DeepSpeed would silently use its default',
        "set a number or remove the key",
    )


def _node_local_storage(res: _Resolution) -> None:
    """HF: ``save_on_each_node`` sets ``checkpoint.use_node_local_storage`` (dsbuild: never over a user's value)."""
    training = res.run.training
    parts = ("checkpoint", "use_node_local_storage")
    value = res.node(parts)
    if training is None:
        if value is AUTO:
            res.needs[".".join(parts)] = _Need(
                '"auto" needs the training argument save_on_each_node (pass training=...)'
            )
        return
    fact = _Fact(training.save_on_each_node, "save_on_each_node", "training argument save_on_each_node")
    if value is AUTO or (value is None and fact.value):
        res.write(parts, fact.value, fact.origin)
    elif value is False and fact.value:
        res.conflict(".".join(parts), value, fact)


_TRIANGLE_RULES: Final = {rule.path: rule for rule in RULES if rule.path in BATCH_KEYS}


def _batch_triangle(res: _Resolution) -> None:
    """DeepSpeed's ``_set_batch_related_parameters``: any two batch sizes give the third; all three are written.

    ``AUTO`` still left (no training arguments) counts as unknown: it is derived from two
    known sizes, never from DeepSpeed's default of 1 for an unset accumulation.
    """
    ws, world = res.run.world_size, res.run.world_text
    tb, micro, accum = (res.value((k,)) for k in BATCH_KEYS)
    was = {"train_batch_size": tb, "train_micro_batch_size_per_gpu": micro, "gradient_accumulation_steps": accum}
    known = {k: v for k, v in was.items() if isinstance(v, int)}
    if len(known) == 1 and accum is None and "gradient_accumulation_steps" not in known:
        accum = 1
        _derive(
            res,
            "gradient_accumulation_steps",
            1,
            "DeepSpeed's default when gradient_accumulation_steps is not set",
            was,
        )
        known["gradient_accumulation_steps"] = 1
    if len(known) == 3:
        _check_triangle(res, known["train_batch_size"], known["train_micro_batch_size_per_gpu"], accum, ws, world)
    elif len(known) == 2:
        _complete_triangle(res, tb, micro, accum, (ws, world), was)
    elif AUTO not in was.values():
        res.invalid.append(
            Problem(
                "train_micro_batch_size_per_gpu",
                "not set; DeepSpeed needs train_batch_size or train_micro_batch_size_per_gpu",
                'set it to a number, or to "auto" and pass training=...',
            )
        )


def _check_triangle(res: _Resolution, tb: int, micro: int, accum: int, ws: int, world: str) -> None:
    if tb != micro * accum * ws:
        res.invalid.append(
            Problem(
                "train_batch_size",
                f"{tb} is not micro {micro} × accumulation {accum} × {world} (= {micro * accum * ws})",
            )
        )


def _complete_triangle(
    res: _Resolution, tb: Any, micro: Any, accum: Any, world: tuple[int, str], was: dict[str, Any]
) -> None:
    ws, text_ws = world
    if not isinstance(tb, int):
        _derive(
            res,
            "train_batch_size",
            micro * accum * ws,
            f"batch triangle: micro {micro} × accumulation {accum} × {text_ws}",
            was,
        )
        return
    if isinstance(micro, int):
        unit, text, key = micro * ws, f"micro {micro} × {text_ws}", "gradient_accumulation_steps"
    else:
        unit, text, key = accum * ws, f"accumulation {accum} × {text_ws}", "train_micro_batch_size_per_gpu"
    if tb % unit:
        res.invalid.append(Problem("train_batch_size", f"{tb} is not a multiple of {text} (= {unit})"))
        return
    _derive(res, key, tb // unit, f"batch triangle: train_batch_size {tb} / ({text})", was)


def _derive(res: _Resolution, key: str, value: int, origin: str, was: dict[str, Any]) -> None:
    """Write a batch size the triangle derived; where the config did not set it, it must agree with the training."""
    res.write((key,), value, origin)
    res.needs.pop(key, None)
    if was[key] is None and res.run.training is not None:
        fact = _TRIANGLE_RULES[key].fact(res.run)
        if isinstance(fact, _Fact) and value != fact.value:
            res.conflict(key, value, fact, derived="DeepSpeed's batch triangle")


# -- finding every "auto" -------------------------------------------------------------


class _Layout(NamedTuple):
    """Where ``AUTO`` may sit in an attrs class: its fields' ds keys and attribute names, and which of them hold
    sections (searched in turn) and pairs or lists (which may hold ``AUTO`` inside)."""

    keys: tuple[str, ...]
    names: tuple[str, ...]
    nested: tuple[int, ...]
    sequences: tuple[int, ...]


def _layout(cls: type) -> _Layout:
    layout = _LAYOUTS.get(cls)
    if layout is None:
        layout = _LAYOUTS[cls] = _layout_of(cls)
    return layout


def _layout_of(cls: type) -> _Layout:
    keys: list[str] = []
    names: list[str] = []
    nested: list[int] = []
    sequences: list[int] = []
    for a in attrs.fields(cls):
        spec = a.metadata.get("dsbuild")
        if spec is None and a.name != "params":
            continue  # Config.extra / ignored / source / provenance, Optimizer.type
        if spec is not None and spec.kind in ("mapping", "json"):
            continue  # free tables: DeepSpeed's own "auto" strings live there (zenflow)
        if spec is None or spec.kind == "section":
            nested.append(len(keys))
        elif spec.kind in ("pair", "strs"):
            sequences.append(len(keys))
        keys.append(key_of(a))
        names.append(a.name)
    return _Layout(tuple(keys), tuple(names), tuple(nested), tuple(sequences))


def _getter(names: list[str]) -> Callable[[Any], tuple[Any, ...]]:
    """All the attributes ``names`` of an object at once, always as a tuple."""
    if len(names) > 1:
        return operator.attrgetter(*names)
    return lambda obj: tuple(getattr(obj, name) for name in names)


def auto_paths(obj: Any) -> list[str]:
    """The dotted path of every ``AUTO`` in a config or section (a pair holding one counts)."""
    found: list[str] = []
    _collect_autos(obj, "", found)
    return found


def _collect_autos(obj: Any, prefix: str, found: list[str]) -> None:
    walker = _WALKERS.get(type(obj))
    if walker is None:
        if isinstance(obj, Mapping):
            found.extend([prefix + key for key, value in obj.items() if value is AUTO])
            return
        walker = _WALKERS[type(obj)] = _make_walker(type(obj))
    walker(obj, prefix, found)


_Walker = Callable[[Any, str, list[str]], None]
_WALKERS: dict[type, _Walker] = {}


def _make_walker(cls: type) -> _Walker:
    """``_collect_autos`` for the attrs class ``cls``, as straight-line code (like the ``__init__`` attrs writes):
    reading a field is then a few instructions, not a call.

    The fields that are ``AUTO``, in order, then the ``AUTO`` inside the fields that nest (sections, params), then
    the pairs and lists holding one.
    """
    keys, names, nested, sequences = _layout(cls)
    reads = [f"obj.{name}" if name.isidentifier() and not keyword.iskeyword(name) else f"getattr(obj, {name!r})"
             for name in names]  # fmt: skip
    lines = ["def walk(obj, prefix, found, AUTO=AUTO):"]
    for key, read in zip(keys, reads, strict=True):
        lines += [f"    if {read} is AUTO:", f"        found.append(prefix + {key!r})"]
    for i in nested:
        lines += [
            f"    value = {reads[i]}",
            "    if value is not None and value is not AUTO:",
            f"        collect(value, prefix + {keys[i] + '.'!r}, found)",
        ]
    for i in sequences:
        lines += [
            f"    value = {reads[i]}",
            "    if value is not None and value is not AUTO and AUTO in value:",
            f"        found.append(prefix + {keys[i]!r})",
        ]
    lines.append("    return None")
    namespace = {"AUTO": AUTO, "collect": _collect_autos}
    exec(compile("\n".join(lines), f"<auto walker of {cls.__module__}.{cls.__qualname__}>", "exec"), namespace)
    return cast(_Walker, namespace["walk"])


_NOT_FILLED: Final = _Need(
    '"auto" is not filled by the HF Trainer; DeepSpeed would silently use its default', "set a value or remove the key"
)


def _leftovers(res: _Resolution, autos: list[str]) -> list[Problem]:
    """One problem per ``AUTO`` nothing filled, saying what would fill it, in the order of the ds_config."""
    left = [path for path in autos if path not in res.origins and path not in DEEPSPEED_AUTOS]
    if not left:
        return []
    order = {path: i for i, (path, _) in enumerate(_leaves(res.config.to_dict(), ""))}
    left.sort(key=lambda path: order.get(path, len(order)))
    problems = []
    for path in left:
        need = res.needs.get(path) or _NOT_FILLED_BY_HF.get(path) or _NOT_FILLED
        problems.append(Problem(path, need.message, need.hint))
    return problems


# -- the public functions -------------------------------------------------------------


def resolve(
    config: Config,
    *,
    world_size: int = 1,
    training: Training | Any | None = None,
    model: Any | None = None,
    hidden_size: int | None = None,
    total_steps: int | None = None,
) -> Config:
    """``config`` with every ``AUTO`` filled as the HF Trainer fills it, and the batch triangle applied.

    ``training`` is a ``Training``, a ``TrainingArguments`` or any object with those
    attribute names; ``model`` a model (``.config``) or a model config, read for its
    hidden size unless ``hidden_size`` is given; ``total_steps`` the run's optimizer
    steps (else ``training.max_steps`` when positive).

    Raises ``InvalidValueError`` for a bad argument or a batch triangle that does not
    divide, ``ConflictError`` listing every explicit value that disagrees with the
    arguments, and ``UnresolvedAutoError`` naming each ``AUTO`` nothing could fill and
    the argument that would. Pure and idempotent; values the config sets are never
    changed; ``provenance`` of the result says where each filled value came from.
    """
    run = _Run(world_size, training, model, hidden_size, total_steps, config.sequence_parallel_size)
    res = _Resolution(config, run)
    autos = auto_paths(config)
    _apply_rules(res)
    _node_local_storage(res)
    _batch_triangle(res)
    if res.conflicts:
        raise ConflictError(res.conflicts)
    if res.invalid:
        raise InvalidValueError(res.invalid)
    leftovers = _leftovers(res, autos)
    if leftovers:
        raise UnresolvedAutoError(leftovers)
    return res.result()


@attrs.frozen
class Explanation:
    """One key of a config: its value as written and where it came from."""

    path: str
    """Dotted key path, e.g. ``optimizer.params.lr``."""
    value: Any
    """The value as the ds_config holds it (``"auto"`` for ``AUTO``, lists for pairs)."""
    origin: str
    """``"set by the user"``, ``"preset zero3"``, ``"training argument learning_rate"``, ``"batch triangle: ..."``."""

    def __str__(self) -> str:
        return f"{self.path} = {json.dumps(self.value)}  ({self.origin})"


def explain(config: Config) -> list[Explanation]:
    """Every key ``to_dict`` writes, in its order, with where its value came from.

    Keys ``resolve`` filled carry their recorded provenance; the others come from
    ``config.source`` (``"preset zero3"``, ``"file ds.json"``) or were set by the user.
    """
    default = config.source or "set by the user"
    provenance = config.provenance
    return [Explanation(path, value, provenance.get(path, default)) for path, value in _leaves(config.to_dict(), "")]


def _leaves(data: Mapping[str, Any], prefix: str) -> Iterator[tuple[str, Any]]:
    for key, value in data.items():
        path = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            yield from _leaves(value, f"{path}.")
        else:
            yield path, value


def render_explanation(explanations: list[Explanation]) -> str:
    """Aligned lines ``path  value  origin``, one per key (what ``dsbuild explain`` prints)."""
    rows = [(e.path, json.dumps(e.value), e.origin) for e in explanations]
    if not rows:
        return ""
    path_width = max(len(r[0]) for r in rows)
    value_width = max(len(r[1]) for r in rows)
    return "\n".join(f"{p.ljust(path_width)}  {v.ljust(value_width)}  {o}" for p, v, o in rows)
