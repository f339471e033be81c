"""Hand-offs to the other tools: a ds_config for the HF Trainer (``for_hf``), one for Accelerate
(``for_accelerate``) and the Accelerate config that points to it (``accelerate_config``)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from typing import Any, Final

import attrs

from .api import Config
from .config.fields import key_of
from .config.optim import Optimizer, optimizer_params_class, scheduler_params_class
from .resolve.hf_table import ACCELERATE_FILLED, FILLS, Fill
from .resolve.resolution import resolve
from .resolve.training import Training

__all__ = [
    "DEEPSPEED_SCHEDULERS",
    "accelerate_config",
    "for_accelerate",
    "for_hf",
    "to_yaml",
    "training_arguments",
    "with_deepspeed_scheduler",
    "zero_stage",
]


def _takes(section: Any, key: str) -> bool:
    """Whether an optimizer / scheduler section takes ``key``: its typed params class has it, or its table sets it."""
    if section is None:
        return False
    lookup = optimizer_params_class if isinstance(section, Optimizer) else scheduler_params_class
    params_class = lookup(section.type)
    if params_class is not None and key in {key_of(a) for a in attrs.fields(params_class)}:
        return True
    params = section.params
    if isinstance(params, Mapping):
        return key in params
    return params is not None and getattr(params, key, None) is not None


_WARMUP: Final = {"warmup_num_steps": "auto", "warmup_type": "linear"}

DEEPSPEED_SCHEDULERS: Final[Mapping[str, dict[str, Any]]] = {
    "linear": {
        "type": "WarmupDecayLR",
        "params": {"warmup_min_lr": "auto", "warmup_max_lr": "auto", "total_num_steps": "auto", **_WARMUP},
    },
    "cosine": {
        "type": "WarmupCosineLR",
        "params": {"total_num_steps": "auto", "warmup_min_ratio": 0.0, "cos_min_ratio": 0.0, **_WARMUP},
    },
    "constant_with_warmup": {
        "type": "WarmupLR",
        "params": {"warmup_min_lr": "auto", "warmup_max_lr": "auto", **_WARMUP},
    },
}
"""DeepSpeed's nearest scheduler for an HF ``lr_scheduler_type``, for a plain Accelerate loop: its
``DummyScheduler`` needs one in the file (the HF Trainer and ``dsbuild train`` run HF's own instead)."""


def with_deepspeed_scheduler(config: Config, lr_scheduler_type: str) -> Config:
    """``config`` with DeepSpeed's scheduler for ``lr_scheduler_type`` when it has none and one stands for it."""
    d = config.to_dict()
    if "scheduler" in d or lr_scheduler_type not in DEEPSPEED_SCHEDULERS:
        return config
    return attrs.evolve(
        Config.from_dict({**d, "scheduler": DEEPSPEED_SCHEDULERS[lr_scheduler_type]}), source=config.source
    )


def training_arguments(training: Training, *, deepspeed: str | None = None) -> dict[str, Any]:
    """``training`` as keyword arguments of HF ``TrainingArguments`` (transformers 5): ``TrainingArguments(**it)``
    runs the job's learning rate, warmup, schedule, batch sizes, precision, logging and saving, with ``deepspeed``
    pointing at the exported ds_config. HF 4's ``warmup_ratio`` becomes HF 5's fractional ``warmup_steps``."""
    values = training.to_dict()
    values.pop("async_save")  # dsbuild's own: the HF Trainer has no asynchronous save (it saves as async_save=false)
    ratio = values.pop("warmup_ratio")
    if not values["warmup_steps"] and ratio:
        values["warmup_steps"] = ratio
    values["report_to"] = list(values["report_to"])
    if deepspeed is not None:
        values["deepspeed"] = deepspeed
    return {name: value for name, value in values.items() if value is not None}


def for_hf(config: Config) -> Config:
    """``config`` with every value the HF Trainer fills set to ``"auto"``: what ``TrainingArguments(deepspeed=...)`` expects.

    Every row of the HF table (``hf_table.FILLS``) where it applies: the batch sizes, ``gradient_clipping``,
    ``fp16.enabled`` and ``bf16.enabled`` always; the optimizer's and scheduler's params where the config has
    an optimizer / scheduler taking them (without one, the Trainer creates its own from the training
    arguments); the hidden-size buckets at stage 3 (``reduce_bucket_size`` at any stage where it is set).
    """
    return _with_autos(config, FILLS)


def for_accelerate(
    config: Config,
    *,
    world_size: int = 1,
    training: Training | Any | None = None,
    hidden_size: int | None = None,
    total_steps: int | None = None,
) -> Config:
    """``config`` for Accelerate's DeepSpeed plugin and a plain loop (``accelerator.prepare`` with ``DummyOptim`` /
    ``DummyScheduler``): ``"auto"`` only where Accelerate fills it itself, every other value resolved.

    The rows of the HF table Accelerate fills from the script (``Fill.accelerate``: the DataLoader's batch size,
    ``DummyOptim``'s lr and weight decay, ``DummyScheduler``'s steps, the model's hidden size) are set to ``"auto"``
    where ``for_hf`` would set them, so script and file cannot disagree; they and Accelerate's own settings
    (``ACCELERATE_FILLS``) are left for it. Every other ``"auto"`` (``betas``, ``eps``, ``gradient_clipping``, the
    precision: Accelerate stops on them or fills a constant) is resolved from the training arguments and the
    other facts as ``resolve`` does, which raises as it does: ``UnresolvedAutoError`` names each one that cannot
    be and what would fill it, ``ConflictError`` each explicit value the arguments disagree with.
    """
    accelerate_rows = [fill for fill in FILLS if fill.accelerate is not None]
    return resolve(
        _with_autos(config, accelerate_rows),
        world_size=world_size,
        training=training,
        hidden_size=hidden_size,
        total_steps=total_steps,
        leave=ACCELERATE_FILLED,
    )


def _with_autos(config: Config, fills: Iterable[Fill]) -> Config:
    """``config`` with the key of each row of ``fills`` set to ``"auto"`` where it applies (``for_hf``'s rule)."""
    d = config.to_dict()
    stage = zero_stage(config)
    for fill in fills:
        section, key = fill.section, fill.key
        if section in (("optimizer", "params"), ("scheduler", "params")):
            owner = config.optimizer_config if section[0] == "optimizer" else config.scheduler
            if not _takes(owner, key):
                continue
        elif section == ("zero_optimization",):
            zero = d.get("zero_optimization")
            if not isinstance(zero, dict) or (stage != 3 and (fill.stage3_only or key not in zero)):
                continue
        node = d
        for part in section:
            if not isinstance(node.get(part), dict):
                node[part] = {}
            node = node[part]
        node[key] = "auto"
    return attrs.evolve(Config.from_dict(d), source=config.source)


def accelerate_config(
    ds_config_file: str,
    *,
    num_processes: int = 1,
    num_machines: int = 1,
    zero3_init: bool = False,
    sequence_parallel: int = 1,
    attn_implementation: str = "sdpa",
) -> dict[str, Any]:
    """An Accelerate config (``accelerate launch --config_file``) that runs DeepSpeed from ``ds_config_file``.

    Nothing the ds_config decides is repeated here: with a ``deepspeed_config_file``, ``accelerate launch`` refuses
    ``mixed_precision``, ``gradient_accumulation_steps``, ``gradient_clipping``, ``zero_stage``, the offload devices
    and ``zero3_save_16bit_model`` in its config (the precision is the ds_config's ``bf16`` / ``fp16`` sections).
    With ``sequence_parallel`` above 1 (the ds_config's ``sequence_parallel_size``), its ``parallelism_config``:
    Accelerate's Ulysses (``sp_backend = "deepspeed"``), which registers DeepSpeed's attention with
    ``attn_implementation`` and shards the batches, variable sequence lengths allowed.
    """
    parallelism = (
        {
            "parallelism_config": {
                "parallelism_config_sp_size": sequence_parallel,
                "parallelism_config_sp_backend": "deepspeed",
                "parallelism_config_sp_seq_length_is_variable": True,
                "parallelism_config_sp_attn_implementation": attn_implementation,
            }
        }
        if sequence_parallel > 1
        else {}
    )
    return {
        "compute_environment": "LOCAL_MACHINE",
        "distributed_type": "DEEPSPEED",
        "deepspeed_config": {"deepspeed_config_file": ds_config_file, "zero3_init_flag": zero3_init},
        "machine_rank": 0,
        "main_training_function": "main",
        "num_machines": num_machines,
        "num_processes": num_processes,
        "rdzv_backend": "static",
        "same_network": True,
        "use_cpu": False,
        **parallelism,
    }


def to_yaml(data: Mapping[str, Any]) -> str:
    """YAML text of a table of scalars and tables (PyYAML when installed, else written here)."""
    try:
        import yaml
    except ImportError:
        return "".join(_yaml_lines(data, 0))
    text: str = yaml.safe_dump(dict(data), sort_keys=False, default_flow_style=False)
    return text


def _yaml_lines(data: Mapping[str, Any], indent: int) -> list[str]:
    lines = []
    pad = "  " * indent
    for key, value in data.items():
        if isinstance(value, Mapping):
            lines.append(f"{pad}{key}:\n")
            lines.extend(_yaml_lines(value, indent + 1))
        else:
            lines.append(f"{pad}{key}: {_yaml_scalar(value)}\n")
    return lines


def _yaml_scalar(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, (int, float)):
        return repr(value)
    text = str(value)
    # Quote anything YAML would read as another type (a number, a boolean, null) or that holds punctuation.
    plain = re.fullmatch(r"[A-Za-z0-9_./-]+", text) and text.lower() not in _YAML_WORDS
    return text if plain and not re.fullmatch(r"[-+]?[\d.]+(e[-+]?\d+)?", text) else json.dumps(text)


_YAML_WORDS: Final = frozenset({"true", "false", "null", "yes", "no", "on", "off", "y", "n", "~"})


def zero_stage(config: Config) -> int:
    """The config's ZeRO stage (0 when unset or ``"auto"``)."""
    zero = config.zero_optimization
    stage = zero.stage if zero is not None else None
    return stage if isinstance(stage, int) else 0
