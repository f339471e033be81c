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
- ``target="auto"`` (the default): a config holding ``"auto"`` is judged for
  the HF Trainer (DeepSpeed itself has no ``"auto"``: the values say who the
  config is for), any other for DeepSpeed.
- ``target="deepspeed"``: an ``"auto"`` that ``resolve()`` and the HF Trainer
  fill must be resolved first: an error where DeepSpeed fails on it (a batch
  key, ``gradient_clipping``: a ``TypeError``), a warning where it silently
  reads it as unset; one that nothing fills is an error.
- ``target="hf"`` (the config goes to the HF Trainer / Accelerate): the
  ``"auto"`` values the HF Trainer fills are fine; those Accelerate fills from
  its own settings (``zero_optimization.stage``, offload devices and paths)
  are a warning, since the config then does not say what runs; any other is an
  error (Accelerate stops on it with "not found in kwargs").

A missing batch size is an error (DeepSpeed asserts that one is given), except
for ``target="hf"`` before resolution, where it is a warning.

Rules that depend on the installed DeepSpeed (features it removed) read its
version with ``importlib.metadata``, never by importing it; without DeepSpeed
installed the newest rules apply. Nothing here imports torch or DeepSpeed:
names of ``torch.optim`` classes are a static list.

The package is the rule catalogue: ``facts`` (what the rules read), ``catalogue``
(what DeepSpeed knows), and the rules by when DeepSpeed would catch the problem:
``parser`` (its config parser refuses it), ``engine`` (the engine refuses it when
it starts), ``silent`` (DeepSpeed never says), ``batch`` and ``autos``.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import cast

import attrs

from ..config import ConfigFields
from ..config.fields import describe
from ..config.walk import auto_paths
from ..env.versions import installed_tuple
from ..errors import InvalidValueError, Problem, error_of
from . import autos, batch, engine, parser, silent
from .batch import batch_triangle
from .facts import REGISTERED, Diagnostic, Facts, Rule, Target

__all__ = ["RULES", "TARGETS", "Diagnostic", "batch_triangle", "check", "deepspeed_version", "target_of", "validate"]

RULES: dict[str, Rule] = {
    name: rule
    for module in (parser, engine, silent, batch, autos)  # what DeepSpeed refuses first, then what it never says
    for name, rule in REGISTERED.items()
    if rule.__module__ == module.__name__
}
"""Every rule by its id, in the order they run (the docs' rule catalogue is built from their docstrings)."""


def deepspeed_version() -> tuple[int, ...] | None:
    """The installed DeepSpeed's version as numbers, or ``None`` when it is not installed (newest rules apply)."""
    return installed_tuple("deepspeed")


def validate(
    config: ConfigFields,
    *,
    world_size: int | None = None,
    target: str = "auto",
    resolved: bool = False,
    waiting: Collection[str] = (),
) -> list[Diagnostic]:
    """Every problem of ``config``: errors first, then warnings.

    ``world_size`` (the number of processes) enables the batch-divisibility check; ``target`` is ``"deepspeed"``
    (the config goes to DeepSpeed as is), ``"hf"`` (to the HF Trainer / Accelerate, which fill their ``"auto"``
    values) or ``"auto"`` (``"hf"`` when the config holds an ``"auto"``, else ``"deepspeed"``); ``resolved=True``
    says the config should have no ``"auto"`` left but at the keys in ``waiting``: those a run resolves once it
    knows what fills them (``resolve(waiting_for=...)``: the step count of data not counted yet, the hidden size of
    a model not loaded yet).
    """
    if target not in TARGETS:
        raise InvalidValueError(Problem("target", f"got {describe(target)}, expected one of 'auto', 'deepspeed', 'hf'"))
    target = target_of(config, target)
    if world_size is not None and (not isinstance(world_size, int) or isinstance(world_size, bool) or world_size < 1):
        raise InvalidValueError(Problem("world_size", f"got {describe(world_size)}, expected an integer >= 1"))
    facts = Facts(config, world_size, cast(Target, target), resolved, deepspeed_version(), frozenset(waiting))
    errors: list[Diagnostic] = []
    warnings: list[Diagnostic] = []
    for name, rule in RULES.items():
        facts.rule = name
        for d in rule(facts):
            if d.rule != name:
                d = attrs.evolve(d, rule=name)
            (errors if d.severity == "error" else warnings).append(d)
    return errors + warnings


TARGETS = ("auto", "deepspeed", "hf")
"""Who a config is judged for (``validate``'s ``target``)."""


def target_of(config: ConfigFields, target: str) -> str:
    """``target``, with ``"auto"`` decided by the config: ``"hf"`` when it holds an ``"auto"``, else ``"deepspeed"``."""
    if target != "auto":
        return target
    return "hf" if auto_paths(config) else "deepspeed"


def check(
    config: ConfigFields,
    *,
    world_size: int | None = None,
    target: str = "auto",
    resolved: bool = False,
    waiting: Collection[str] = (),
) -> None:
    """Raise one ``ConfigError`` listing every error of ``config`` (warnings do not raise; the arguments are
    ``validate``'s).

    The error is an ``UnresolvedAutoError`` when every problem is an ``"auto"`` left over.
    """
    found = validate(config, world_size=world_size, target=target, resolved=resolved, waiting=waiting)
    errors = [d for d in found if d.severity == "error"]
    if errors:
        raise error_of(
            Problem(d.path, d.message, d.hint, kind="unresolved-auto" if d.rule == "auto" else "rule", needs=d.needs)
            for d in errors
        )
