"""What an Accelerate config (``accelerate launch --config_file``) gives a run of TRL's Trainer, as a job's
``[strategy]`` and ``[launch]``: the ds_config Accelerate 1.15's ``DeepSpeedPlugin`` builds from the settings
``accelerate launch`` passes it (``prepare_deepspeed_cmd_env``: ``ACCELERATE_DEEPSPEED_*``), its precision set as
``TrainingArguments`` sets it (``set_mixed_precision``), and the processes and machines.

``plugin_config`` is that ds_config; ``tests/integration/test_trl_import.py`` holds it to Accelerate's own
``DeepSpeedPlugin`` on TRL's shipped ``zero1/2/3.yaml`` and on generated settings. Every key of the file is a
``Note``: carried (to the job key it fills), of no effect at its value, or not carried, with why. Stdlib only.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any, Final, Literal

import attrs

from ..errors import ConfigError, Problem

__all__ = [
    "AT_DEFAULT",
    "DEEPSPEED_SETTINGS",
    "Note",
    "accelerate_launch",
    "check_settings",
    "plugin_config",
    "strategy_notes",
]

Kind = Literal["carried", "no effect", "not carried"]


@attrs.frozen
class Note:
    """One key of an imported file: where it went, or why it did not."""

    file: str
    """Which file: ``"trl"`` (the TRL config), ``"accelerate"`` or ``"deepspeed"``."""
    key: str
    """Its dotted key in that file."""
    value: Any
    kind: Kind
    to: str | None = None
    """The job key it fills (``kind == "carried"``)."""
    why: str = ""
    """Why it changes nothing (``"no effect"``) or is not carried."""
    instead: str | None = None
    """What to write or do instead (``"not carried"``)."""


DEEPSPEED_SETTINGS: Final = {
    "gradient_accumulation_steps": "gradient_accumulation_steps",
    "gradient_clipping": "gradient_clipping",
    "zero_stage": "zero_optimization.stage",
    "offload_optimizer_device": "zero_optimization.offload_optimizer.device",
    "offload_param_device": "zero_optimization.offload_param.device",
    "offload_param_nvme_path": "zero_optimization.offload_param.nvme_path",
    "offload_optimizer_nvme_path": "zero_optimization.offload_optimizer.nvme_path",
    "zero3_save_16bit_model": "zero_optimization.stage3_gather_16bit_weights_on_model_save",
}
"""The plugin's settings and the ds_config key each fills (``DeepSpeedPlugin.__post_init__``'s mapping)."""

_PASSED: Final = frozenset(
    {
        "gradient_accumulation_steps",
        "gradient_clipping",
        "zero_stage",
        "offload_optimizer_device",
        "offload_param_device",
        "zero3_init_flag",
        "zero3_save_16bit_model",
    }
)
"""The ``deepspeed_config`` settings ``accelerate launch`` passes to the plugin (the nvme paths it does not)."""

_NODE: Final = "dsbuild train takes it when it starts each node"
_NODE_INSTEAD: Final = "dsbuild train --nnodes N --node-rank R --master-addr HOST --master-port PORT (docs/jobs.md)"

AT_DEFAULT: Final[dict[str, tuple[Any, str, str]]] = {
    # key: (the value that changes nothing, why not carried otherwise, instead)
    "compute_environment": ("LOCAL_MACHINE", "dsbuild train runs on the machines it is started on", "leave it out"),
    "debug": (False, "Accelerate's debug checks of collectives are not run", "leave it out"),
    "downcast_bf16": ("no", "a TPU setting", "leave it out"),
    "main_training_function": ("main", "the trainer is TRL's, run by dsbuild train", "leave it out"),
    "machine_rank": (0, _NODE, _NODE_INSTEAD),
    "main_process_ip": (None, _NODE, _NODE_INSTEAD),
    "main_process_port": (None, _NODE, _NODE_INSTEAD),
    "rdzv_backend": ("static", _NODE, _NODE_INSTEAD),
    "same_network": (True, _NODE, _NODE_INSTEAD),
    "use_cpu": (False, "dsbuild train uses the accelerator it finds (the CPU without one)", "leave it out"),
    "tpu_env": ([], "a TPU setting", "leave it out"),
    "tpu_use_cluster": (False, "a TPU setting", "leave it out"),
    "tpu_use_sudo": (False, "a TPU setting", "leave it out"),
    "tpu_name": (None, "a TPU setting", "leave it out"),
    "tpu_zone": (None, "a TPU setting", "leave it out"),
    "tpu_vm": (None, "a TPU setting", "leave it out"),
    "commands": (None, "a TPU setting", "leave it out"),
    "command_file": (None, "a TPU setting", "leave it out"),
    "enable_cpu_affinity": (False, "dsbuild train does not pin processes to CPUs", "leave it out"),
    "dynamo_config": ({}, "torch.compile is [training] torch_compile", "set training.torch_compile = true"),
    "fsdp_config": ({}, "dsbuild runs DeepSpeed, not FSDP", "use a DeepSpeed config (TRL's zero3.yaml)"),
    "megatron_lm_config": ({}, "dsbuild runs DeepSpeed, not Megatron-LM", "leave it out"),
    "fp8_config": ({}, "FP8 training is not built into dsbuild train", "leave it out"),
    "mpirun_config": ({}, "dsbuild train starts processes with torchrun", "leave it out"),
    "parallelism_config": ({}, "Accelerate's parallelism is not read", "set sequence_parallel_size in the ds_config"),
}
"""Accelerate keys that change nothing of a run at one value, and why another is not carried."""

_DSAT_DEFAULT: Final[dict[str, tuple[Any, str, str]]] = {
    "deepspeed_multinode_launcher": ("standard", _NODE, _NODE_INSTEAD),
    "deepspeed_hostfile": (None, _NODE, _NODE_INSTEAD),
    "deepspeed_inclusion_filter": (None, _NODE, _NODE_INSTEAD),
    "deepspeed_exclusion_filter": (None, _NODE, _NODE_INSTEAD),
    "deepspeed_moe_layer_cls_names": (None, "DeepSpeed's MoE leaf modules are not set", "leave it out"),
}

_PRECISIONS: Final = ("no", "fp16", "bf16", "fp8")


def plugin_config(
    settings: Mapping[str, Any], mixed_precision: str, ds_file: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """The ds_config of Accelerate's ``DeepSpeedPlugin`` for the ``deepspeed_config`` ``settings`` of an Accelerate
    config (those ``accelerate launch`` passes on), then ``set_mixed_precision(mixed_precision)``; from ``ds_file``
    where one is given (its ``"auto"`` stage, offload and save settings filled from ``settings``). ``steps_per_print``
    (Accelerate sets infinity to keep DeepSpeed quiet) and ``None`` values are left out."""
    passed = {k: v for k, v in settings.items() if k in _PASSED and v is not None}
    plugin = _plugin_settings(passed)
    if ds_file is not None:
        config = copy.deepcopy(dict(ds_file))
        config.setdefault("gradient_accumulation_steps", 1)
        if "zero_optimization" not in config:
            raise ConfigError(Problem("zero_optimization", "missing: Accelerate needs the ZeRO section"), checks=True)
        for name, dotted in DEEPSPEED_SETTINGS.items():
            _fill_auto(config, dotted, plugin[name])
    else:
        config = _generated(plugin)
    _set_mixed_precision(config, mixed_precision)
    plain: dict[str, Any] = _without_none(config)
    return plain


def _plugin_settings(passed: Mapping[str, Any]) -> dict[str, Any]:
    """The plugin's fields as ``__post_init__`` reads them from the strings ``accelerate launch`` exports."""
    gas = str(passed.get("gradient_accumulation_steps", "auto"))
    clipping = str(passed["gradient_clipping"]).lower() if "gradient_clipping" in passed else "auto"
    return {
        "gradient_accumulation_steps": int(gas) if gas.isdigit() else gas,
        "gradient_clipping": clipping if clipping == "auto" else float(clipping),
        "zero_stage": int(str(passed.get("zero_stage", 2))),
        "offload_optimizer_device": str(passed.get("offload_optimizer_device", "none")).lower(),
        "offload_param_device": str(passed.get("offload_param_device", "none")).lower(),
        "offload_optimizer_nvme_path": "none",
        "offload_param_nvme_path": "none",
        "zero3_save_16bit_model": str(passed.get("zero3_save_16bit_model", "false")).lower() == "true",
    }


def _generated(plugin: Mapping[str, Any]) -> dict[str, Any]:
    """The ds_config the plugin writes without a ds_config file."""
    offload_optimizer = plugin["offload_optimizer_device"]
    offload_param = plugin["offload_param_device"]
    config: dict[str, Any] = {
        "train_batch_size": "auto",
        "train_micro_batch_size_per_gpu": "auto",
        "gradient_accumulation_steps": plugin["gradient_accumulation_steps"],
        "zero_optimization": {
            "stage": plugin["zero_stage"],
            "offload_optimizer": {
                "device": offload_optimizer,
                "nvme_path": plugin["offload_optimizer_nvme_path"] if offload_optimizer == "nvme" else None,
            },
            "offload_param": {
                "device": offload_param,
                "nvme_path": plugin["offload_param_nvme_path"] if offload_param == "nvme" else None,
            },
            "stage3_gather_16bit_weights_on_model_save": plugin["zero3_save_16bit_model"],
        },
    }
    if plugin["gradient_clipping"]:
        config["gradient_clipping"] = plugin["gradient_clipping"]
    return config


def _fill_auto(config: dict[str, Any], dotted: str, value: Any) -> None:
    """``fill_match(..., must_match=False)``: the key's ``"auto"`` becomes ``value``; any other value stays."""
    *parents, leaf = dotted.split(".")
    node: Any = config
    for part in parents:
        node = node.get(part) if isinstance(node, dict) else None
    if isinstance(node, dict) and node.get(leaf) == "auto":
        node[leaf] = value


def _set_mixed_precision(config: dict[str, Any], mixed_precision: str) -> None:
    """``DeepSpeedPlugin.set_mixed_precision`` (not on ROCm, where Accelerate also sets an fp32 reduction)."""
    if mixed_precision == "fp16":
        config.setdefault("fp16", {"enabled": True, "auto_cast": True})
    elif mixed_precision in ("bf16", "fp8"):
        config.setdefault("bf16", {"enabled": True})
    if mixed_precision != "no":
        other = "bf16" if mixed_precision == "fp16" else "fp16"
        if str(config.get(other, {}).get("enabled", "False")).lower() == "true":
            message = f"mixed precision {mixed_precision} with {other} enabled in the ds_config (Accelerate refuses it)"
            raise ConfigError(Problem(f"{other}.enabled", message, "keep one precision"), checks=True)
    for dtype in ("fp16", "bf16"):
        config.setdefault(dtype, {"enabled": False})
    _fill_auto(config, "fp16.enabled", mixed_precision == "fp16")
    _fill_auto(config, "bf16.enabled", mixed_precision in ("bf16", "fp8"))


def _without_none(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_none(v) for k, v in value.items() if v is not None and k != "steps_per_print"}
    return value


def accelerate_launch(settings: Mapping[str, Any], trainer_precision: str | None) -> tuple[dict[str, Any], list[Note]]:
    """The ``[launch]`` of an Accelerate config, with a ``Note`` for each of its keys except ``deepspeed_config``,
    ``mixed_precision`` and ``distributed_type`` (``strategy_notes``); ``trainer_precision``: ``"bf16"`` / ``"fp16"``
    when the trainer's own ``bf16`` / ``fp16`` decide the precision (``TrainingArguments``: they win)."""
    notes: list[Note] = []
    launch: dict[str, Any] = {}
    processes = settings.get("num_processes", 1)
    machines = settings.get("num_machines", 1)
    for key, value in settings.items():
        if key in ("deepspeed_config", "distributed_type"):
            continue
        if key == "mixed_precision":
            notes.append(_precision_note(value, trainer_precision))
        elif key in ("num_processes", "num_machines"):
            notes.append(_count_note(key, value, processes, machines))
        elif key == "gpu_ids":
            notes.append(_gpu_ids_note(value, machines))
        elif key in AT_DEFAULT:
            notes.append(_at_default("accelerate", key, value, AT_DEFAULT[key]))
        else:
            notes.append(Note("accelerate", key, value, "not carried", why="not a key of Accelerate's config"))
    if isinstance(processes, int) and isinstance(machines, int) and machines > 0 and processes % machines == 0:
        launch = {"nproc_per_node": max(processes // machines, 1), "nnodes": machines}
    if any(n.to == "launch.device_mapping" for n in notes):
        launch["device_mapping"] = [int(x) for x in str(settings["gpu_ids"]).split(",")]
    return launch, notes


def _count_note(key: str, value: Any, processes: Any, machines: Any) -> Note:
    ok = all(isinstance(x, int) and not isinstance(x, bool) and x > 0 for x in (processes, machines))
    if not ok or processes % machines:
        why = f"num_processes {processes!r} over num_machines {machines!r} is not a whole number of processes a node"
        return Note("accelerate", key, value, "not carried", why=why, instead="give whole counts")
    return Note(
        "accelerate", key, value, "carried", to="launch.nproc_per_node" if key == "num_processes" else "launch.nnodes"
    )


def _gpu_ids_note(value: Any, machines: Any) -> Note:
    if value in (None, "all"):
        return Note("accelerate", "gpu_ids", value, "no effect", why="every device of the machine, as a job's default")
    ids = str(value).split(",")
    if machines == 1 and all(x.strip().isdigit() for x in ids):
        return Note("accelerate", "gpu_ids", value, "carried", to="launch.device_mapping")
    return Note("accelerate", "gpu_ids", value, "not carried", why="not a list of device numbers on one machine",
                instead="set launch.device_mapping")  # fmt: skip


def _precision_note(value: Any, trainer_precision: str | None) -> Note:
    if trainer_precision is not None:
        why = f"the trainer's {trainer_precision} = true decides the precision (TrainingArguments sets it)"
        return Note("accelerate", "mixed_precision", value, "no effect", why=why)
    return Note("accelerate", "mixed_precision", value, "carried", to="strategy.config.bf16 / fp16")


def _at_default(file: str, key: str, value: Any, row: tuple[Any, str, str]) -> Note:
    runs, why, instead = row
    if value == runs or (runs in ({}, []) and not value):
        return Note(file, key, value, "no effect", why="Accelerate's default")
    return Note(file, key, value, "not carried", why=why, instead=instead)


def strategy_notes(settings: Mapping[str, Any], stage: int) -> list[Note]:
    """A ``Note`` for ``distributed_type`` and each ``deepspeed_config`` setting (``stage``: the ds_config's)."""
    notes = []
    kind = settings.get("distributed_type", "NO")
    if kind == "DEEPSPEED":
        notes.append(Note("accelerate", "distributed_type", kind, "carried", to="strategy.config"))
    elif kind in ("NO", "MULTI_GPU", "MULTI_CPU"):
        why = "without DeepSpeed: the job trains with ZeRO stage 0 (data parallel, the same updates)"
        notes.append(Note("accelerate", "distributed_type", kind, "carried", to="strategy.config", why=why))
    else:
        notes.append(Note("accelerate", "distributed_type", kind, "not carried", why="dsbuild runs DeepSpeed",
                          instead="use a DeepSpeed config (TRL's zero1/2/3.yaml); the job trains at ZeRO stage 0"))  # fmt: skip
    deepspeed = settings.get("deepspeed_config") or {}
    for key, value in deepspeed.items() if isinstance(deepspeed, Mapping) else ():
        notes.append(_deepspeed_note(key, value, stage, kind == "DEEPSPEED"))
    return notes


def _deepspeed_note(key: str, value: Any, stage: int, used: bool) -> Note:
    dotted = f"deepspeed_config.{key}"
    if not used:
        return Note("accelerate", dotted, value, "no effect", why="distributed_type is not DEEPSPEED")
    if key in _PASSED and key != "zero3_init_flag":
        return Note("accelerate", dotted, value, "carried", to=f"strategy.config.{DEEPSPEED_SETTINGS[key]}")
    if key == "zero3_init_flag":
        if stage != 3:
            return Note("accelerate", dotted, value, "no effect", why="below stage 3 Accelerate ignores it")
        if value in (True, "true"):
            why = "dsbuild builds a ZeRO-3 model inside zero.Init, as this asks"
            return Note("accelerate", dotted, value, "no effect", why=why)
        why = "dsbuild builds a ZeRO-3 model inside zero.Init (the same weights, each process holding its part)"
        return Note("accelerate", dotted, value, "not carried", why=why, instead="leave it out")
    if key in ("offload_optimizer_nvme_path", "offload_param_nvme_path"):
        why = "accelerate launch does not pass it to the plugin: the ds_config gets nvme_path 'none'"
        return Note("accelerate", dotted, value, "not carried", why=why,
                    instead=f"set strategy.config.{DEEPSPEED_SETTINGS[key]} in the job")  # fmt: skip
    if key == "deepspeed_config_file":
        return Note("accelerate", dotted, value, "carried", to="strategy.config")
    if key in _DSAT_DEFAULT:
        return _at_default("accelerate", dotted, value, _DSAT_DEFAULT[key])
    return Note("accelerate", dotted, value, "not carried", why="not a key of Accelerate's deepspeed_config")


def check_settings(settings: Mapping[str, Any]) -> list[Problem]:
    """What in an Accelerate config cannot be read as Accelerate reads it (named by its dotted key)."""
    problems = []
    precision = settings.get("mixed_precision", "no")
    if precision is not None and str(precision).lower() not in _PRECISIONS:
        problems.append(Problem("mixed_precision", f"got {precision!r}, expected one of {', '.join(_PRECISIONS)}"))
    deepspeed = settings.get("deepspeed_config", {})
    if deepspeed is not None and not isinstance(deepspeed, Mapping):
        problems.append(Problem("deepspeed_config", "expected a table"))
    elif deepspeed:
        stage = deepspeed.get("zero_stage")
        if stage is not None and str(stage) not in ("0", "1", "2", "3"):
            problems.append(Problem("deepspeed_config.zero_stage", f"got {stage!r}, expected 0, 1, 2 or 3"))
        for key in ("gradient_accumulation_steps", "gradient_clipping"):
            value = deepspeed.get(key)
            if value is not None and not _number_or_auto(value):
                problems.append(Problem(f"deepspeed_config.{key}", f"got {value!r}, expected a number or 'auto'"))
    return problems


def _number_or_auto(value: Any) -> bool:
    text = str(value).lower()
    try:
        float(text)
    except ValueError:
        return text == "auto"
    return not isinstance(value, bool)
