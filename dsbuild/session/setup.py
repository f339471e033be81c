"""What a Session does before any process group exists: the config read, resolved against the run and checked."""

from __future__ import annotations

import os
import random
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final

import attrs
import numpy as np
import torch

from ..api import Config
from ..errors import ConfigError, Problem, UnresolvedAutoError
from ..training import REPORT_TO, Training
from ..validate import check

__all__ = [
    "DEFAULT_SEED",
    "PROBE_STEPS",
    "as_config",
    "hf_model_or_none",
    "hf_scheduler",
    "resolve_checked",
    "seed_everything",
    "with_default_monitor",
]

PROBE_STEPS: Final = 1_000_000
"""Stand-in step count used only to check a config whose schedule waits for ``fit`` to count the steps."""
DEFAULT_SEED: Final = 42
"""HF's default seed; every rank builds the same random initial weights from it."""


def as_config(config: Config | Mapping[str, Any] | str | os.PathLike[str]) -> Config:
    """A ``Config`` from one, a ds_config dict, a config file, or a preset name."""
    if isinstance(config, Config):
        return config
    if isinstance(config, Mapping):
        return Config.from_dict(config)
    if isinstance(config, (str, os.PathLike)):
        if Path(config).is_file():
            return Config.load(Path(config))
        return Config.preset(str(config))
    raise ConfigError(
        Problem("config", f"got {type(config).__name__}, expected a Config, a ds_config dict, a path or a preset name")
    )


MONITORS: Final = ("tensorboard", "csv_monitor", "wandb", "comet")
"""DeepSpeed's monitor sections."""


def with_default_monitor(config: Config, output_dir: Path | None, report_to: Sequence[str] = ()) -> Config:
    """DeepSpeed's monitors for ``report_to`` (HF's names: tensorboard, wandb, comet_ml, csv), each turned on unless
    the config has that section itself (the config's own settings win); with none named and no monitor in the
    config, the CSV monitor, so that metrics land under ``output_dir/logs``."""
    named = [REPORT_TO[name] for name in report_to if REPORT_TO.get(name)]
    if not named:
        if output_dir is None or any(getattr(config, name) is not None for name in MONITORS):
            return config
        named = ["csv_monitor"]
    changes: dict[str, Any] = {}
    for section in named:
        if getattr(config, section) is not None:
            continue
        where: dict[str, Any] = {}
        if section in ("tensorboard", "csv_monitor") and output_dir is not None:
            where = {"output_path": str(output_dir / "logs"), "job_name": "train"}
        changes[section] = attrs.fields_dict(type(config))[section].metadata["dsbuild"].section(enabled=True, **where)
    return attrs.evolve(config, **changes) if changes else config


def resolve_checked(
    given: Config,
    *,
    world_size: int,
    training: Training | None,
    model: Any,
    hidden_size: int | None,
    total_steps: int | None,
) -> tuple[Config, bool]:
    """The resolved, checked config and whether the run's step count was known.

    Without a step count, a config whose schedule needs one is checked with a
    stand-in count and resolved for real once ``fit`` counts the steps.
    """
    kwargs: dict[str, Any] = {
        "world_size": world_size,
        "training": training,
        "model": model,
        "hidden_size": hidden_size,
    }
    known = True
    try:
        resolved = given.resolve(total_steps=total_steps, **kwargs)
    except UnresolvedAutoError as error:
        if total_steps is not None or (training is not None and training.max_steps > 0):
            raise
        try:
            resolved = given.resolve(total_steps=PROBE_STEPS, **kwargs)
        except ConfigError:
            raise error from None
        known = False
    check(resolved, world_size=world_size, resolved=True)
    return resolved, known


def hf_scheduler(training: Training, total_steps: int) -> Any:
    """The HF Trainer's own scheduler for a config without one (``Trainer.create_scheduler``), as the callable
    ``deepspeed.initialize`` takes: the learning rate of every step is the HF Trainer's, warmup 0 included."""
    from transformers import get_scheduler

    warmup = training.get_warmup_steps(total_steps)

    def build(optimizer: Any) -> Any:
        return get_scheduler(
            training.lr_scheduler_type, optimizer, num_warmup_steps=warmup, num_training_steps=total_steps
        )

    return build


def hf_model_or_none(model: Any) -> Any:
    """What ``resolve`` reads the hidden size from: the model when it has a ``config``."""
    return model if getattr(model, "config", None) is not None else None


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)  # also seeds the accelerator's generators
