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
from ..config.walk import auto_paths
from ..errors import ConfigError, Problem, SessionError
from ..io.config_files import config_ref
from ..outputs.run_folder import RunFolder
from ..resolve.resolution import resolve
from ..resolve.training import REPORT_TO, Training
from ..validate import check
from ..validate.feature_table import refusals
from . import building, distributed, parallel

__all__ = [
    "DEFAULT_SEED",
    "as_config",
    "asks_deepcompile",
    "checked_digest",
    "checked_keep_last",
    "compile_engine",
    "deepcompile_refusal",
    "hf_model_or_none",
    "hf_scheduler",
    "resolve_checked",
    "seed_everything",
    "with_default_monitor",
]

DEFAULT_SEED: Final = 42
"""HF's default seed; every rank builds the same random initial weights from it."""


def checked_digest(digest: str) -> str:
    """``Session``'s ``checkpoint_digest``, one of ``manifest.DIGESTS``; else ``SessionError``."""
    from ..outputs import manifest

    if digest not in manifest.DIGESTS:
        raise SessionError(
            f"checkpoint_digest: got {digest!r}, expected one of {', '.join(map(repr, manifest.DIGESTS))}"
        )
    return digest


def checked_keep_last(keep_last: Any, training: Training | None) -> int | None:
    """``Session``'s ``keep_last``: an integer >= 1, or, unset, ``training.save_total_limit`` (``None``: keep all)."""
    if keep_last is None:
        return training.save_total_limit if training is not None else None
    if not isinstance(keep_last, int) or isinstance(keep_last, bool) or keep_last < 1:
        raise ConfigError(Problem("keep_last", f"got {keep_last!r}, expected an integer >= 1"))
    return keep_last


def as_config(config: Config | Mapping[str, Any] | str | os.PathLike[str]) -> Config:
    """A ``Config`` from one, a ds_config dict, a config file, or a preset name."""
    if isinstance(config, Config):
        return config
    if isinstance(config, Mapping):
        return Config.from_dict(config)
    if isinstance(config, os.PathLike):
        return Config.load(Path(config))
    if isinstance(config, str):
        path = config_ref(config)  # a preset name, or a file: the rule the CLI and jobs follow
        return Config.preset(config) if path is None else Config.load(path)
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
            where = {"output_path": str(RunFolder(output_dir).logs), "job_name": "train"}
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

    Without a step count (and no ``max_steps``), the keys whose fill needs one stay ``"auto"`` (resolve's
    ``waiting_for``): every other key is resolved and checked now, and those are resolved once ``fit`` counts the
    steps. Nothing stands in for the count.
    """
    steps_known = total_steps is not None or (training is not None and training.max_steps > 0)
    resolved = resolve(
        given, world_size=world_size, training=training, model=model, hidden_size=hidden_size,
        total_steps=total_steps, waiting_for=() if steps_known else ("total_steps",),
    )  # fmt: skip
    waiting = auto_paths(resolved) if not steps_known else []
    check(resolved, world_size=world_size, resolved=True, waiting=waiting)
    return resolved, not waiting


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


def asks_deepcompile(ds_config: Mapping[str, Any]) -> bool:
    """Whether a ds_config turns DeepCompile on (``compile.deepcompile``)."""
    section = ds_config.get("compile")
    return isinstance(section, Mapping) and section.get("deepcompile") is True


def deepcompile_refusal(ds_config: Mapping[str, Any]) -> str | None:
    """Why DeepCompile cannot run on this machine's DeepSpeed accelerator (DeepSpeed's own words), or ``None``.

    DeepCompile needs DeepSpeed's ``DeepCompileBuilder`` op; the CPU accelerator implements none (its builder
    refuses to load), so a run would fail at ``engine.compile()``, after the engine and the model were built.
    """
    if not asks_deepcompile(ds_config):
        return None
    from deepspeed.accelerator import get_accelerator

    accelerator = get_accelerator()
    builder = accelerator.create_op_builder("DeepCompileBuilder")
    reason = None
    if builder is None:
        reason = "it has no DeepCompileBuilder op"
    elif type(builder).__name__ == "NotImplementedBuilder":  # loading it only raises, nothing is built
        try:
            builder.load()
        except Exception as e:
            reason = str(e)
    if reason is None:
        return None
    return (
        f"DeepCompile does not run on DeepSpeed's {accelerator.device_name()} accelerator (DeepSpeed: {reason}); "
        "set compile.deepcompile = false (training.torch_compile compiles with torch.compile)"
    )


def compile_engine(engine: Any, ds_config: Mapping[str, Any], training: Training | None) -> None:
    """``engine.compile()`` when the run asks for it (``training.torch_compile``, or the config's
    ``compile.deepcompile``), with ``torch_compile_backend`` / ``torch_compile_mode`` as the HF Trainer passes them
    through Accelerate."""
    if not ((training is not None and training.torch_compile) or asks_deepcompile(ds_config)):
        return
    kwargs: dict[str, Any] = {}
    if training is not None and training.torch_compile_mode:
        kwargs["mode"] = training.torch_compile_mode
    if training is not None and training.torch_compile_backend:
        engine.compile(backend=training.torch_compile_backend, compile_kwargs=kwargs)
    else:
        engine.compile(compile_kwargs=kwargs)


def start_engine(
    model: Any,
    ds_config: dict[str, Any],
    *,
    optimizer: Any,
    scheduler: Any,
    training: Training | None,
    schedule_steps: int | None,
    checkpoint_digest: str,
    sp: int = 1,
) -> Any:
    """``deepspeed.initialize`` on the resolved ``ds_config``, after the refusals a run must not pass silently.

    Without a DeepSpeed ``scheduler`` section or one given, the HF Trainer's own schedule (``lr_scheduler_type``) over
    ``schedule_steps``. The engine reads DeepSpeed's checkpoint files through the verified weights-only loader, and
    is compiled when ``training.torch_compile`` asks.
    """
    import deepspeed

    from . import weights_only, writers

    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise SessionError("the model has no trainable parameters (requires_grad is False everywhere)")
    if scheduler is None and "scheduler" not in ds_config and training is not None and schedule_steps is not None:
        # No DeepSpeed scheduler: the HF Trainer's own, from lr_scheduler_type, as the Trainer adds it.
        scheduler = hf_scheduler(training, schedule_steps)
    refused = refusals(ds_config)
    if refused:
        raise ConfigError(refused)
    refusal = deepcompile_refusal(ds_config)
    if refusal is not None:
        raise SessionError(f"compile.deepcompile: {refusal}")
    refusal = writers.fast_writer_refusal(ds_config)
    if refusal is not None:
        raise SessionError(f"checkpoint.writer.type: {refusal}")
    micro = ds_config.get("train_micro_batch_size_per_gpu")
    if sp > 1:
        mpu = parallel.register(model, sp, micro if isinstance(micro, int) else 1, distributed.world_size())
    else:
        mpu = None
        parallel.unregister(model)  # an earlier session's Ulysses attention is not this model's
    with writers.spawning(ds_config):  # DeepSpeed's decoupled checkpoint writer starts in initialize
        engine, _, _, _ = deepspeed.initialize(
            model=model,
            model_parameters=params if optimizer is None else None,
            optimizer=optimizer,
            lr_scheduler=scheduler,
            config=ds_config,
            mpu=mpu,
        )
    weights_only.install(engine, checkpoint_digest)  # DeepSpeed's files: verified, weights-only reads
    compile_engine(engine, ds_config, training)
    return engine


def pretrained_model(
    name_or_path_or_config: Any,
    config: Config,
    training: Training | None,
    *,
    lora: Any,
    dtype: Any,
    attn_implementation: str | None,
    gradient_checkpointing: bool,
    tokenizer: Any,
    hidden_size: int | None,
    total_steps: int | None,
    model_class: str = "AutoModelForCausalLM",
    model_kwargs: Mapping[str, Any] | None = None,
) -> tuple[Any, Any]:
    """The model and tokenizer of ``Session.from_pretrained`` (see there), built after the config is resolved and
    checked against the model's config, with the same seed on every rank."""
    pretrained = building.pretrained_config(name_or_path_or_config)
    # Resolved and checked against the model's config before any process group or weight exists.
    probe, _ = resolve_checked(
        config,
        world_size=distributed.world_size(),
        training=training,
        model=pretrained,
        hidden_size=hidden_size,
        total_steps=total_steps,
    )
    # Same seed on every rank: the same random init everywhere (ZeRO-3 also broadcasts rank 0's).
    seed_everything(training.seed if training is not None else DEFAULT_SEED)
    distributed.init(training.ddp_timeout if training is not None else None)  # zero.Init partitions
    model = building.build_model(
        name_or_path_or_config, probe.to_dict(), dtype=dtype, attn_implementation=attn_implementation,
        kind=model_class, **(model_kwargs or {}),
    )  # fmt: skip
    if gradient_checkpointing or (training is not None and training.gradient_checkpointing):
        building.enable_gradient_checkpointing(model, lora=lora is not None)
    if lora is not None:
        model = building.apply_lora(model, lora, task_type=building.LORA_TASK_TYPES.get(model_class, "CAUSAL_LM"))
    if isinstance(tokenizer, (str, os.PathLike)):
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(str(tokenizer))
    return model, tokenizer
