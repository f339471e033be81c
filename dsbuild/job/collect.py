"""The one reader of a job's tables: ``Collector.collect(cls, table, path)`` reads a table into its spec class from the
class's field metadata (``spec.Key``: the value's ``Spec``, its other spellings) and the readers and checks the class
declares (``job.readers``), collecting every problem under its dotted path instead of stopping at the first.

A key with a ``Spec`` is coerced and checked as config values are (``config.fields``); a key read by hand has a
reader ``(collector, value, path, table) -> value``; a table's checks ``(collector, values, path)`` look at its keys
together and may add what follows from them. A table with any problem gives ``None``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from functools import cache
from pathlib import Path
from typing import Any, Final, TypeVar

import attrs

from .._util.suggest import did_you_mean
from ..config.fields import Spec, check_value, coerce, describe
from ..errors import ConfigError, Problem
from .spec import Key, job_keys, table_keys
from .trl_keys import NOT_RUN

__all__ = ["ABSENT", "BAD", "Check", "Collector", "Reader"]

T = TypeVar("T")

ABSENT: Final = object()
"""What a reader returns for a key the table leaves out and the field's default fills."""

BAD: Final[dict[str, Any]] = {}
"""Stands for a section that is not a table (already reported): its contents are not checked."""

Reader = Callable[["Collector", Any, str, Mapping[str, Any]], Any]
"""How a key read by hand is read: ``(collector, value or ABSENT, its dotted path, its table) -> value``."""
Check = Callable[["Collector", dict[str, Any], str, Mapping[str, Any]], None]
"""A table's check of its keys together: ``(collector, values read, the table's path, the table)``; it may add
values."""

HINTS: Final = {
    "": {
        "model_args": "[model]",
        "training_args": "[training]",
        "data_args": "[data]",
        "strategy_args": "[strategy]",
        "device_mapping": "launch.device_mapping",
        "infer_batch_size": "launch.infer_batch_size",
        "deepspeed": "strategy.config",
    },
    "model": {
        "model_name_or_path": "name_or_path",
        "pretrain": "name_or_path",
        "model_type": "model.config.model_type",
        "disable_gradient_checkpointing": "gradient_checkpointing (the opposite)",
        "lora_rank": "model.lora.r",
        "lora_alpha": "model.lora.alpha",
        "lora_dropout": "model.lora.dropout",
        "lora_target": "model.lora.target_modules",
        "torch_dtype": "dtype",
    },
    "model.lora": {"lora_alpha": "alpha", "lora_dropout": "dropout", "lora_target": "target_modules"},
    "data": {"file_name": "path", "train_path": "path", "validation_path": "eval_path", "max_seq_length": "max_length"},
    "strategy": {"strategy_name": "name", "strategy_config": "config"},
    "launch": {"nproc": "nproc_per_node", "num_nodes": "nnodes", "num_gpus_per_node": "gpus_per_node"},
}
"""Where a key of another spelling (ROLL's, HF's) goes: ``did you mean`` by meaning, not by letters."""


class Collector:
    """Reads a job's tables, every problem collected; ``base_dir``: what a relative path in the job is under."""

    def __init__(
        self,
        base_dir: Path,
        source: str | None,
        *,
        readers: Mapping[tuple[type, str], Reader] | None = None,
        checks: Mapping[type, Sequence[Check]] | None = None,
    ) -> None:
        self.base_dir = base_dir
        self.source = source
        self.readers = readers or {}
        """The keys read by hand, by table class and key (``job.readers.READERS``)."""
        self.checks = checks or {}
        """Each table class's checks of its keys together (``job.readers.CHECKS``)."""
        self.problems: list[Problem] = []
        self.unreadable = False
        """Whether a file the job names (``strategy.config``) could not be read: then its error is exit 2, not 1."""

    def problem(self, path: str, message: str, hint: str | None = None) -> None:
        self.problems.append(Problem(path, message, hint))

    def table(self, data: Mapping[str, Any], key: str, path: str) -> dict[str, Any]:
        """The table at ``key`` (``{}`` when absent); one that is not a table is a problem, and ``BAD`` then."""
        value = data.get(key)
        if value is None:
            return {}
        if not isinstance(value, Mapping):
            self.problem(path, f"got {describe(value)}, expected a table")
            return BAD
        return dict(value)

    def unknown(self, table: Mapping[str, Any], known: Sequence[str], path: str) -> None:
        """A problem for each key of ``table`` not in ``known``, with the likeliest meant one."""
        hints = HINTS.get(path, {})
        for key in table:
            if key in known or key in NOT_RUN.get(path, {}):  # TRL's keys a job does not run: named by its checks
                continue
            where = f"{path}.{key}" if path else str(key)
            if key in hints:
                hint: str | None = f"did you mean {hints[key]}?"
            elif not path and key in _ds_keys():
                hint = f"ds_config keys go under [strategy.overrides]: strategy.overrides.{key}"
            elif path in NOT_RUN and key in _training_names():
                hint = f"a training argument of TRL's config: set training.{key}"
            else:
                hint = did_you_mean(str(key), known)
            self.problems.append(Problem.unknown_key(where, hint))

    def value(self, value: Any, path: str, spec: Spec) -> Any:
        """``value`` coerced and checked as ``spec`` says; ``ABSENT`` (the default) with a problem when it fails."""
        value = coerce(spec, value)
        message = check_value(spec, value)
        if message is not None:
            self.problem(path, message)
            return ABSENT
        return value

    def collect(self, cls: type[T], table: Mapping[str, Any], path: str, **derived: Any) -> T | None:
        """``table`` read into ``cls`` (``derived``: fields that are no key of the table), or ``None`` when any of its
        keys has a problem (each recorded)."""
        if table is BAD:
            return None
        before = len(self.problems)
        self.unknown(table, table_keys(cls), path)
        values: dict[str, Any] = {}
        fields = attrs.fields_dict(cls)  # type: ignore[arg-type]
        for name, key in job_keys(cls).items():
            written = _spellings(self, table, name, key, path)
            where = f"{path}.{written or name}"
            reader = self.readers.get((cls, name))
            if written is None and fields[name].default is attrs.NOTHING:
                self.problem(where, key.missing or "missing")
                values[name] = ABSENT
            elif reader is not None:
                values[name] = reader(self, table[written] if written else ABSENT, where, table)
            elif written is None:
                values[name] = ABSENT
            else:
                assert key.spec is not None, f"{cls.__name__}.{name} has neither a Spec nor a reader"
                values[name] = self.value(table[written], where, key.spec)
        values = {name: value for name, value in values.items() if value is not ABSENT}
        for check in self.checks.get(cls, ()):
            check(self, values, path, table)
        if len(self.problems) > before:
            return None
        try:
            return cls(**values, **derived)
        except ConfigError as e:  # what the class refuses of its keys together (DPOSpec: TRL's rules)
            self.problems.extend(e.problems)
            return None


def _spellings(collector: Collector, table: Mapping[str, Any], name: str, key: Key, path: str) -> str | None:
    """The spelling of the key ``table`` uses (its name, or one of its aliases), or ``None``; two is a problem."""
    written = [n for n in (name, *key.aliases) if n in table]
    if len(written) > 1:
        collector.problem(
            f"{path}.{written[1]}", f"both {written[0]} and {written[1]} are set (the same thing)", "keep one"
        )
    return written[0] if written else None


@cache
def _ds_keys() -> frozenset[str]:
    """The top-level ds_config keys (for "this goes under [strategy.overrides]")."""
    from ..api import Config
    from ..config import PASSTHROUGH_KEYS
    from ..config.fields import key_of

    return frozenset({key_of(a) for a in attrs.fields(Config) if not a.name.startswith("_")} | set(PASSTHROUGH_KEYS))


@cache
def _training_names() -> frozenset[str]:
    """The training arguments' names (for "this goes under [training]")."""
    from ..resolve.training import Training

    return frozenset(a.name for a in attrs.fields(Training) if a.name != "given")
