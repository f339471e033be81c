"""Completing a job's run: its training arguments and ds_config, the way the HF Trainer completes them.

The training arguments fill what the strategy config leaves unset (batch sizes, clipping, an AdamW
optimizer, bf16/fp16) as ``"auto"``; without a scheduler in the config, the run uses the HF Trainer's own for
``lr_scheduler_type`` (``Session`` builds it), so the learning rate of every step is the Trainer's (the rows of ``hf_table``
marked ``job_default``); a value the config sets explicitly is taken over by the training arguments the
``[training]`` table does not set (the rows' ``takes``), so a config and a table that each set a value once
never disagree. Values set in both must agree (``Job.validate`` reports a conflict otherwise).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs

from .._util import dotted
from ..api import Config
from ..config.walk import leaves
from ..errors import ConfigError, InvalidValueError, Problem
from ..resolve.hf_table import BATCH_KEYS, FILLS
from ..resolve.training import HF_SCHEDULERS, Training

__all__ = ["complete"]


def _taken(d: Mapping[str, Any], explicit: set[str]) -> dict[str, Any]:
    """The training arguments the config's explicit values stand for, where ``[training]`` does not set them."""
    taken: dict[str, Any] = {}
    for fill in FILLS:
        value = dotted.get(d, fill.path)
        if fill.takes is None or value is None or value == "auto":
            continue
        names = fill.takes if isinstance(fill.takes, tuple) else (fill.takes,)
        values = value if isinstance(fill.takes, tuple) else (value,)
        for name, v in zip(names, values, strict=False):
            if name not in explicit and name not in taken and v != "auto":
                taken[name] = v
    return taken


def _job_defaults(d: dict[str, Any], training: Training) -> None:
    """Write ``"auto"`` where the HF Trainer would fill a key the config leaves out (the rows' ``job_default``)."""
    batch_given = any(key in d for key in BATCH_KEYS)
    adds_optimizer = "optimizer" not in d
    if adds_optimizer:
        d["optimizer"] = {"type": "AdamW", "params": {}}
    for fill in FILLS:
        if not fill.job_default:
            continue
        section, key = fill.section, fill.key
        if not section:
            if key in BATCH_KEYS and batch_given:
                continue
            d.setdefault(key, "auto")
        elif section == ("optimizer", "params"):
            if adds_optimizer:
                d["optimizer"]["params"][key] = "auto"
        elif section in (("bf16",), ("fp16",)):
            if getattr(training, section[0]) and section[0] not in d:
                d[section[0]] = {key: "auto"}


def complete(config: Config, training: Training, *, explicit: set[str], name: str) -> tuple[Training, Config]:
    """The run's training arguments and ds_config (see the module docstring); ``ConfigError`` naming the keys."""
    d = config.to_dict()
    taken = _taken(d, explicit)
    if training.output_dir is None:
        taken["output_dir"] = str(Path("out") / name)
    try:
        done = attrs.evolve(training, **taken)
    except InvalidValueError as e:
        raise ConfigError([p.prefixed("strategy.config") for p in e.problems]) from None
    _job_defaults(d, done)
    if "scheduler" not in d and done.lr_scheduler_type not in HF_SCHEDULERS:
        raise ConfigError(
            Problem(
                "training.lr_scheduler_type",
                f"{done.lr_scheduler_type!r} needs scheduler arguments dsbuild does not take",
                f"use one of {', '.join(map(repr, HF_SCHEDULERS))}, or set [strategy.overrides.scheduler]",
            )
        )
    completed = Config.from_dict(d)
    # explain() says where the added keys came from (resolve's own provenance wins for the "auto" ones).
    given = {path for path, _ in leaves(config.to_dict())}
    origins = {
        "optimizer": "job: the HF Trainer's AdamW (the strategy config has no optimizer)",
    }
    provenance = {
        path: origins.get(path.split(".")[0], "job: filled from [training]")
        for path, _ in leaves(completed.to_dict())
        if path not in given
    }
    return done, attrs.evolve(completed, source=config.source, provenance={**config.provenance, **provenance})
