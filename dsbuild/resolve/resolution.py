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

from collections.abc import Collection, Mapping
from typing import Any, Final, TypeVar

import attrs

from ..config import AUTO, ConfigBase
from ..config.fields import Spec, check_value
from ..config.walk import auto_paths, leaves
from ..errors import ConflictError, InvalidValueError, Problem, UnresolvedAutoError
from ..io.convert import to_dict
from .batch import Derived, Triangle, TriangleProblem, degrees, derive
from .hf_table import ACCELERATE_FILLS, BATCH_KEYS, FILLS, TOTAL_STEPS, Fact, Fill, Need, fill_of
from .training import NoneValue, Training, training_from

C = TypeVar("C", bound=ConfigBase)

__all__ = ["model_hidden_size", "resolve"]


# -- the training arguments resolve reads ---------------------------------------

_RESOLVE_READS: Final = (
    *dict.fromkeys(name for fill in FILLS for name in fill.arguments_read if name != TOTAL_STEPS),
    "save_on_each_node",
)
"""The arguments ``resolve`` reads: those the fill table's rows read (HF's DeepSpeed integration, plus
``warmup_ratio`` and ``max_steps``), and ``save_on_each_node`` (``checkpoint.use_node_local_storage``, below)."""


def _training_view(training: Any) -> Training | None:
    """The arguments ``resolve`` reads, checked; a duck-typed object's other attributes are not looked at."""
    if training is None or isinstance(training, Training):
        return training
    return training_from(training, dict.fromkeys(_RESOLVE_READS))


# -- facts of the run ------------------------------------------------------------

_NEEDS_STEPS = Need('"auto" needs the number of optimizer steps', needs=("total_steps",))
_NEEDS_HIDDEN = Need('"auto" needs the model\'s hidden size', needs=("model", "hidden_size"))


class _Run:
    """The facts ``resolve`` was given, checked once (``hf_table.RunFacts``); the hidden size is looked up when
    first needed."""

    def __init__(
        self,
        world_size: Any,
        training: Any,
        model: Any,
        hidden_size: Any,
        total_steps: Any,
        sp: int,
    ) -> None:
        _check_arguments(world_size, hidden_size, total_steps)
        # DeepSpeed's batch triangle counts data-parallel ranks: the world size over the sequence-parallel degree.
        if world_size % sp:
            raise InvalidValueError(
                Problem("sequence_parallel_size", f"{sp} does not divide the world size {world_size}")
            )
        self.world_size: int = world_size // sp
        self.world_text = (
            f"world size {world_size}"
            if sp == 1
            else f"data-parallel size {world_size // sp} (world size {world_size} / sequence_parallel_size {sp})"
        )
        self.training = _training_view(training)
        self.model = model
        self.hidden_size_arg: int | None = hidden_size
        self.total_steps: int | None = total_steps
        self._hidden: Fact | Need | None = None

    def sets(self, fill: Fill) -> bool:
        """Whether the user set an argument ``fill`` reads: only then may an explicit config value disagree."""
        if self.training is None:
            return False
        return any(
            self.total_steps is not None if name == TOTAL_STEPS else self.training.is_set(name)
            for name in fill.arguments_read
        )

    def hidden(self) -> Fact | Need:
        if self._hidden is None:
            self._hidden = self._find_hidden()
        return self._hidden

    def _find_hidden(self) -> Fact | Need:
        if self.hidden_size_arg is not None:
            return Fact(self.hidden_size_arg, "hidden_size", f"hidden_size argument {self.hidden_size_arg}")
        if self.model is None:
            return _NEEDS_HIDDEN
        found = model_hidden_size(self.model)
        if isinstance(found, str):
            return Need(f'"auto" needs the model\'s hidden size, but {found}', needs=("hidden_size",))
        return Fact(found, "hidden size", f"hidden size {found} of the model")

    def steps(self) -> Fact | Need:
        if self.total_steps is not None:
            return Fact(self.total_steps, "total_steps", "total_steps argument")
        if self.training is not None and self.training.max_steps > 0:
            return Fact(self.training.max_steps, "max_steps", "training argument max_steps")
        return _NEEDS_STEPS


_ARGUMENTS: Final = (
    ("world_size", Spec("int", gt=0, auto=False), False),
    ("hidden_size", Spec("int", gt=0, auto=False), True),
    ("total_steps", Spec("int", ge=0, auto=False), True),
)
"""``resolve``'s own arguments: name, what they take, and whether ``None`` is allowed."""


def _check_arguments(world_size: Any, hidden_size: Any, total_steps: Any) -> None:
    given = {"world_size": world_size, "hidden_size": hidden_size, "total_steps": total_steps}
    problems = []
    for name, spec, optional in _ARGUMENTS:
        value = given[name]
        if value is None and optional:
            continue
        message = check_value(spec, NoneValue() if value is None else value)
        if message is not None:
            problems.append(Problem(name, message))
    if problems:
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


# -- reading and rewriting a config by ds keys ---------------------------------------


def _child(obj: Any, key: str) -> Any:
    """The value under ds key ``key`` of a section or free table; ``None`` when unset or not a key there."""
    if obj is None:
        return None
    if isinstance(obj, Mapping):
        return obj.get(key)
    for a in attrs.fields(type(obj)):
        if (a.alias or a.name) == key:
            return getattr(obj, a.name)
    return None


def _is_table(obj: Any) -> bool:
    """A free table (a torch optimizer's or scheduler's params), not a typed section."""
    return isinstance(obj, Mapping)


def _replaced(obj: Any, changes: Mapping[str, Any]) -> Any:
    """``obj`` with ``changes`` (by ds key): a new table, or a new section (``attrs.evolve``, validators run)."""
    if isinstance(obj, Mapping):
        return {**obj, **changes}
    return attrs.evolve(obj, **changes)  # evolve takes the fields' aliases, which are their ds keys


def _new_section(parent: Any, key: str) -> Any:
    """An empty section to write into, where the config has none (``checkpoint`` for ``save_on_each_node``)."""
    for a in attrs.fields(type(parent)):
        if (a.alias or a.name) == key:
            spec = a.metadata.get("dsbuild")
            return spec.section() if spec is not None and spec.section is not None else {}
    return {}


def _show(value: Any) -> str:
    """A value as it reads in the ds_config: ``true``, ``[0.9, 0.999]``, ``5e-05``, ``"auto"``."""
    if value is AUTO:
        return '"auto"'
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_show(x) for x in value) + "]"
    return repr(value)


class _Resolution:
    """One ``resolve`` call: the values written (by section), their provenance, and the problems found."""

    def __init__(self, config: ConfigBase, run: _Run, leave: frozenset[str]) -> None:
        self.config = config
        self.run = run
        self.leave = leave
        """The keys whose ``AUTO`` is left for the tool that fills it: neither filled nor checked."""
        self.writes: dict[tuple[str, ...], dict[str, Any]] = {}
        self.origins: dict[str, str] = {}
        self.needs: dict[str, Need] = {}
        self.conflicts: list[Problem] = []
        self.invalid: list[Problem] = []
        self.notes: dict[str, str] = {}
        """Provenance of explicit values kept over an unset training argument (not fills)."""
        self.source = config.source or "set by the user"

    def node(self, parts: tuple[str, ...]) -> Any:
        """The section (or table) of the config at ``parts``; ``None`` when it is not there."""
        node: Any = self.config
        for part in parts:
            node = _child(node, part)
        return node

    def value(self, parts: tuple[str, ...]) -> Any:
        """The value at ``parts``, as written so far."""
        written = self.writes.get(parts[:-1], {})
        return written[parts[-1]] if parts[-1] in written else self.node(parts)

    def write(self, parts: tuple[str, ...], value: Any, origin: str) -> None:
        """Write ``value`` at ``parts`` and record where it came from."""
        section = self.node(parts[:-1])
        if _is_table(section) and isinstance(value, tuple):
            value = list(value)  # a free table (a torch optimizer's params) holds lists, as read from a file
        self.writes.setdefault(parts[:-1], {})[parts[-1]] = value
        self.origins[".".join(parts)] = origin

    def conflict(self, path: str, ds_value: Any, fact: Fact, derived: str | None = None) -> None:
        given = _show(ds_value) if derived is None else f"not set, and {derived} gives {_show(ds_value)}, which"
        self.conflicts.append(
            Problem(
                path,
                f"{given} disagrees with {fact.expr} = {_show(fact.value)}",
                f'set the key to "auto" or to {_show(fact.value)}',
                kind="conflict",
            )
        )

    def result(self) -> ConfigBase:
        """The config with every write applied, rebuilt from the deepest section up."""
        changes = {section: dict(keys) for section, keys in self.writes.items()}
        for section in list(changes):  # a section rebuilt means its parents are rebuilt too
            for depth in range(len(section)):
                changes.setdefault(section[:depth], {})
        for section in sorted(changes, key=len, reverse=True):
            if not section:
                continue
            obj = self.node(section)
            if obj is None:
                obj = _new_section(self.node(section[:-1]), section[-1])
            changes[section[:-1]][section[-1]] = _replaced(obj, changes[section])
        top = changes.get((), {})
        if self.origins or self.notes:
            top["provenance"] = {**self.config.provenance, **self.notes, **self.origins}
        return attrs.evolve(self.config, **top) if top else self.config


# -- the steps of resolve -----------------------------------------------------------------


def _apply_fills(res: _Resolution) -> None:
    """HF's ``fill_match`` / ``fill_only`` over the table, in HF's order."""
    stage = _child(res.config.zero_optimization, "stage")
    for fill in FILLS:
        parent = res.node(fill.section)
        if parent is None or fill.path in res.leave:
            continue
        # A params class without the key (WarmupCosineLR has no warmup_max_lr) has no such key.
        value = _child(parent, fill.key)
        if value is None:
            continue
        if value is AUTO:
            if fill.stage3_only and stage != 3:
                res.needs[fill.path] = _stage3_only(stage)
                continue
            fact = fill.formula(res.run)
            if isinstance(fact, Need):
                res.needs[fill.path] = fact
            else:
                res.write((*fill.section, fill.key), fact.value, fact.origin)
        elif isinstance(value, (tuple, list)) and AUTO in value:
            _fill_pair(res, fill, value)
        elif fill.must_match:
            fact = fill.formula(res.run)
            if isinstance(fact, Fact) and not _same(value, fact.value):
                if res.run.sets(fill):
                    res.conflict(fill.path, value, fact)
                else:  # the argument keeps HF's default: the config's explicit value stands, and explain says why
                    names = [n for n in fill.arguments_read if n != TOTAL_STEPS]
                    unset = f"argument {names[0]} was" if len(names) == 1 else f"arguments {' and '.join(names)} were"
                    res.notes[fill.path] = f"{res.source}; the training {unset} not set"


def _fill_pair(res: _Resolution, fill: Fill, value: tuple[Any, ...] | list[Any]) -> None:
    """A pair with one ``"auto"`` (``betas: ["auto", 0.95]``): fill that one, check the other."""
    fact = fill.formula(res.run)
    if isinstance(fact, Need):
        res.needs[fill.path] = fact
        return
    filled = tuple(f if v is AUTO else v for v, f in zip(value, fact.value, strict=True))
    if filled != tuple(fact.value):
        res.conflict(fill.path, value, fact)
    res.write((*fill.section, fill.key), filled, fact.origin)


def _same(ds_value: Any, hf_value: Any) -> bool:
    """HF's ``ds_val != hf_val`` with lists for pairs (``1 == 1.0``; ``(0.9, 0.999) == [0.9, 0.999]``)."""
    if isinstance(ds_value, tuple):
        ds_value = list(ds_value)
    if isinstance(hf_value, tuple):
        hf_value = list(hf_value)
    return bool(ds_value == hf_value)


def _stage3_only(stage: Any) -> Need:
    at = "no stage (0)" if stage is None else f"stage {_show(stage)}"
    return Need(
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
            res.needs[".".join(parts)] = Need(
                '"auto" needs the training argument save_on_each_node', needs=("training",)
            )
        return
    fact = Fact(training.save_on_each_node, "save_on_each_node", "training argument save_on_each_node")
    if value is AUTO or (value is None and fact.value):
        res.write(parts, fact.value, fact.origin)
    elif value is False and fact.value:
        res.conflict(".".join(parts), value, fact)


_NOT_SET: Final = Problem(
    "train_micro_batch_size_per_gpu",
    "not set; DeepSpeed needs train_batch_size or train_micro_batch_size_per_gpu",
    'set it to a number, or to "auto" and give the training arguments',
)


def _batch_triangle(res: _Resolution) -> None:
    """DeepSpeed's batch triangle (``batch.derive``): any two batch sizes give the third; all three are written.

    An ``AUTO`` still left (no training arguments) counts as unknown: it is derived from two
    known sizes, never from DeepSpeed's default of 1 for an unset accumulation.
    """
    was = {key: res.value((key,)) for key in BATCH_KEYS}
    if any(was[key] is AUTO and key in res.leave for key in BATCH_KEYS):
        return  # the tool that fills the batch sizes derives them, and DeepSpeed checks them then
    if AUTO in was.values() and sum(isinstance(v, int) for v in was.values()) + (was[BATCH_KEYS[2]] is None) < 2:
        return  # not enough to derive from: the "auto" left is reported with what would fill it
    known = {key: value if isinstance(value, int) else None for key, value in was.items()}
    train, micro, accum = (known[key] for key in BATCH_KEYS)
    found = derive(train, micro, accum, res.run.world_size, res.run.world_text)
    if found is None:
        if AUTO not in was.values():
            res.invalid.append(_NOT_SET)
        return
    if isinstance(found, TriangleProblem):
        res.invalid.append(Problem("train_batch_size", found.message, found.hint))
        return
    _write_triangle(res, found, was)


def _write_triangle(res: _Resolution, found: Triangle, was: dict[str, Any]) -> None:
    """Write the sizes the triangle derived; one the config did not set must agree with the training arguments."""
    derived: list[Derived | _Default] = list(found.derived)
    if found.default_accumulation:  # DeepSpeed takes its default before it derives the rest
        reason = "DeepSpeed's default when gradient_accumulation_steps is not set"
        derived.insert(0, _Default("gradient_accumulation_steps", 1, reason))
    for item in derived:
        origin = item.how if isinstance(item, _Default) else f"batch triangle: {item.how}"
        res.write((item.key,), item.value, origin)
        res.needs.pop(item.key, None)
        if was[item.key] is None and res.run.training is not None:
            fill = fill_of(item.key)
            assert fill is not None
            fact = fill.formula(res.run)
            if isinstance(fact, Fact) and item.value != fact.value and res.run.sets(fill):
                res.conflict(item.key, item.value, fact, derived="DeepSpeed's batch triangle")


@attrs.frozen
class _Default:
    """A size DeepSpeed takes by default (not derived): its accumulation of 1."""

    key: str
    value: int
    how: str


# -- what is left ---------------------------------------------------------------------

_NOT_FILLED: Final = Need(
    '"auto" is not filled by the HF Trainer; DeepSpeed would silently use its default', "set a value or remove the key"
)
_ACCELERATE: Final = (
    '"auto" is filled by Accelerate\'s DeepSpeed plugin, not by the HF Trainer; DeepSpeed alone would silently use its'
    " default"
)
_NOT_FILLED_BY_HF: Final = {fill.path: Need(_ACCELERATE, fill.hint) for fill in ACCELERATE_FILLS}


def _leftovers(res: _Resolution, autos: list[str], waiting_for: Collection[str]) -> list[Problem]:
    """One problem per ``AUTO`` nothing filled, saying what would fill it, in the order of the ds_config; not one
    whose fill needs a fact in ``waiting_for`` (it stays ``AUTO``)."""
    left = [path for path in autos if path not in res.origins and path not in res.leave]
    if not left:
        return []
    order = {path: i for i, (path, _) in enumerate(leaves(to_dict(res.config)))}
    left.sort(key=lambda path: order.get(path, len(order)))
    problems = []
    for path in left:
        need = res.needs.get(path) or _NOT_FILLED_BY_HF.get(path) or _NOT_FILLED
        if not set(need.needs) & set(waiting_for):
            problems.append(Problem(path, need.message, need.hint, kind="unresolved-auto", needs=need.needs))
    return problems


# -- the public functions -------------------------------------------------------------


def resolve(
    config: C,
    *,
    world_size: int = 1,
    training: Training | Any | None = None,
    model: Any | None = None,
    hidden_size: int | None = None,
    total_steps: int | None = None,
    leave: Collection[str] = (),
    waiting_for: Collection[str] = (),
) -> C:
    """``config`` with every ``AUTO`` filled as the HF Trainer fills it, and the batch triangle applied.

    ``training`` is a ``Training``, a ``TrainingArguments`` or any object with those
    attribute names; ``model`` a model (``.config``) or a model config, read for its
    hidden size unless ``hidden_size`` is given; ``total_steps`` the run's optimizer
    steps (else ``training.max_steps`` when positive). ``leave`` names ds keys whose ``AUTO``
    stays for the tool that fills it (``interop.for_accelerate``: what Accelerate fills); their
    rows are neither filled nor checked, and the batch triangle waits for the tool when it
    fills a batch size. ``waiting_for`` names facts the run learns later (``"total_steps"``: data not counted
    yet; ``"hidden_size"``: a model not loaded yet): an ``AUTO`` whose fill needs one stays ``AUTO`` instead of being
    an error (``auto_paths`` of the result lists them; ``validate(waiting=...)`` accepts them), to be resolved again
    once the fact is known. The one "not known yet" state: nothing stands in for the fact.

    Raises ``InvalidValueError`` for a bad argument or a batch triangle that does not
    divide, ``ConflictError`` listing every explicit value that disagrees with the
    arguments, and ``UnresolvedAutoError`` naming each ``AUTO`` nothing could fill and
    the argument that would. Pure and idempotent; values the config sets are never
    changed; ``provenance`` of the result says where each filled value came from.
    """
    run = _Run(world_size, training, model, hidden_size, total_steps, degrees(config)[0])
    res = _Resolution(config, run, frozenset(leave))
    autos = auto_paths(config)
    _apply_fills(res)
    _node_local_storage(res)
    _batch_triangle(res)
    if res.conflicts:
        raise ConflictError(res.conflicts)
    if res.invalid:
        raise InvalidValueError(res.invalid)
    leftovers = _leftovers(res, autos, waiting_for)
    if leftovers:
        raise UnresolvedAutoError(leftovers)
    resolved = res.result()
    assert isinstance(resolved, type(config))  # attrs.evolve keeps the class
    return resolved
