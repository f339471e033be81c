"""What a section does not take: the problem of an unknown key, with the best hint we have.

Used by the builder, the converter and ``validate`` alike, so a misspelt key gets
the same "did you mean" wherever it is found.
"""

from __future__ import annotations

import functools
from typing import Any

import attrs

from .._util.suggest import did_you_mean
from ..errors import Problem
from .core import NOT_KEYS, ConfigFields, section_classes
from .fields import key_of
from .optim import OPTIMIZER_PARAMS, SCHEDULER_PARAMS

__all__ = ["IGNORED_KEY_HINT", "UNKNOWN_KEY_HINTS", "key_paths", "unknown_key"]

UNKNOWN_KEY_HINTS: dict[tuple[str, str], str] = {
    ("AdamParams", "max_grad_norm"): "DeepSpeed's Adam takes no max_grad_norm; set gradient_clipping at the top level",
    ("LionParams", "max_grad_norm"): "set gradient_clipping at the top level",
    ("AdagradParams", "max_grad_norm"): "set gradient_clipping at the top level",
    (
        "WarmupCosineLRParams",
        "warmup_min_lr",
    ): "WarmupCosineLR takes ratios of the optimizer's lr: use warmup_min_ratio",
    ("WarmupCosineLRParams", "warmup_max_lr"): "WarmupCosineLR warms up to the optimizer's lr: remove warmup_max_lr",
    ("ZeroOptimization", "mics_shard_size"): "MiCS sharding was removed from DeepSpeed: remove this key",
    (
        "ZeroOptimization",
        "mics_hierarchical_params_gather",
    ): "MiCS sharding was removed from DeepSpeed: remove this key",
    ("ZeroOptimization", "zeropp_loco_param"): "LoCo-Zero++ was removed from DeepSpeed: remove this key",
    (
        "Config",
        "monitor_config",
    ): "DeepSpeed ignores it: monitors are the top-level tensorboard, wandb, csv_monitor and comet sections",
    ("Config", "comms_config"): "DeepSpeed ignores it: communication logging is the top-level comms_logger section",
    ("TensorParallel", "dtype"): (
        "DeepSpeed 0.19 takes only a torch.dtype object here, which no file can hold; remove it: "
        "bf16 or fp16 sets the precision"
    ),
    ("Compile", "disable"): "DeepSpeed 0.19 has no compile.disable: remove the compile section to not compile",
    ("Compile", "backend"): "DeepSpeed 0.19 has no compile.backend: the backend is an argument of engine.compile()",
    ("Compile", "enabled"): "DeepSpeed 0.19 has no compile.enabled: set deepcompile, or call engine.compile()",
    ("Aio", "thread_count"): (
        "renamed intra_op_parallelism in DeepSpeed, which reads only the new name; the HF docs' NVMe example still "
        "writes thread_count"
    ),
}
"""What to do about a key a section does not take, where a suggestion by spelling would mislead (by section class
name; ``"Config"`` for the top level)."""


IGNORED_KEY_HINT = "DeepSpeed ignores it; remove it"
"""The hint for a key starting with ``_`` (a comment such as ``_comment``): not a misspelling."""


def unknown_key(cls: type, path: str, key: str, names: set[str]) -> Problem:
    """The problem of ``key`` given to section ``cls`` at ``path``, with the best hint we have.

    In order: a hint written for this key (``UNKNOWN_KEY_HINTS``); for ``_comment`` and other
    ``_`` keys, that DeepSpeed ignores them; a close name in the same section; the same key in
    another section (``offload_optimizer`` at the top -> ``zero_optimization.offload_optimizer``).
    """
    name = "Config" if issubclass(cls, ConfigFields) else cls.__name__
    hint = UNKNOWN_KEY_HINTS.get((name, key))
    if hint is None and key.startswith("_"):
        hint = IGNORED_KEY_HINT
    if hint is None and attrs.has(cls):
        # The attribute name of an aliased field (Config.fp16_config is written "fp16").
        alias = next((key_of(a) for a in attrs.fields(cls) if a.name == key and key_of(a) != key), None)
        hint = f"did you mean {alias!r}?" if alias is not None else None
    if hint is None:
        hint = did_you_mean(key, names)
    if hint is None:
        elsewhere = key_paths().get(key)
        if elsewhere:
            hint = f"did you mean {elsewhere[0]!r}?"
    return Problem.unknown_key(f"{path}.{key}" if path else key, hint)


@functools.cache
def key_paths() -> dict[str, list[str]]:
    """Every ds key -> the dotted paths it sits at (sections first, then optimizer/scheduler params)."""
    classes: dict[str, type[Any]] = dict(section_classes())
    for section, table in (("optimizer", OPTIMIZER_PARAMS), ("scheduler", SCHEDULER_PARAMS)):
        for params in dict.fromkeys(table.values()):  # each class once, in the table's order
            classes[f"{section}.params[{params.__name__}]"] = params
    paths: dict[str, list[str]] = {}
    for path, cls in classes.items():
        prefix = path.split("[", 1)[0]
        for a in attrs.fields(cls):
            if a.name in NOT_KEYS:
                continue
            key = key_of(a)
            dotted = f"{prefix}.{key}" if prefix else key
            if dotted not in paths.setdefault(key, []):
                paths[key].append(dotted)
    return paths
