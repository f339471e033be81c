"""``dsbuild export JOB --for trl``: the reverse of ``dsbuild import trl``. A job as TRL's scripts run it: the TRL
config (``trl sft|dpo|grpo|reward|rloo --config``: ``ModelConfig``, ``ScriptArguments`` and the trainer's config, by TRL's names),
the Accelerate config TRL is launched with and the ds_config it names (``interop.accelerate_config``). The job's
``[strategy]`` config is written as the job holds it (``"auto"`` where the run fills it: TRL's Trainer fills those
from the same arguments). What TRL's scripts have no key for is a ``Note``, not carried, with why. Stdlib only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final

import attrs

from ..errors import ConfigError, Problem
from ..resolve.training import Training
from .accelerate_import import Note
from .spec import DataSpec, job_keys
from .tasks import JOB_TASKS

if TYPE_CHECKING:
    from .core import Job

__all__ = ["trl_config"]

_SFT_DATA: Final = {
    "max_length": "max_length",
    "packing": "packing",
    "packing_strategy": "packing_strategy",
    "padding_free": "padding_free",
    "completion_only_loss": "completion_only_loss",
    "assistant_only_loss": "assistant_only_loss",
    "eos_token": "eos_token",
    "num_proc": "dataset_num_proc",
}
"""``[data]`` keys an SFT job shares with TRL's ``SFTConfig``, by TRL's name (``trl_import._SFT_DATA`` reversed)."""

_DATA_READ: Final = frozenset({"path", "format", "split", "eval_split", "columns", "dataset_text_field"})
"""``[data]`` keys the export writes otherwise (or that TRL tells from the dataset: ``format``)."""

_SKIPPED: Final = frozenset({"given", "problems", "missing", "output_dir", "warmup_ratio", "async_save"})


def trl_config(job: Job) -> tuple[dict[str, Any], list[Note]]:
    """The TRL config of ``job`` (keys by TRL's names), and a ``Note`` for each job key it cannot say."""
    if job.model.name_or_path is None:
        message = "TRL loads its model by name or path"
        hint = "save the model built from [model.config] and give its folder as model.name_or_path"
        raise ConfigError(Problem("model.config", message, hint), source=job.source)
    notes: list[Note] = []
    config: dict[str, Any] = {"model_name_or_path": str(job.model.name_or_path)}
    config.update(_model(job, notes))
    config.update(_data(job, notes))
    config.update(_training(job.training))
    config["gradient_checkpointing"] = job.training.gradient_checkpointing or job.model.gradient_checkpointing
    config.update(_rl(job, notes))
    return config, notes


def _model(job: Job, notes: list[Note]) -> dict[str, Any]:
    model = job.model
    config: dict[str, Any] = {}
    if model.dtype is not None:
        config["dtype"] = model.dtype
    if model.attn_implementation is not None:
        config["attn_implementation"] = model.attn_implementation
    if model.lora is not None:
        peft = model.lora.to_peft()
        config.update(use_peft=True, lora_r=peft["r"], lora_alpha=peft["lora_alpha"], lora_dropout=peft["lora_dropout"])
        if "target_modules" in peft:
            config["lora_target_modules"] = peft["target_modules"]
        if model.lora.merge:
            notes.append(Note("job", "model.lora.merge", True, "not carried", why="TRL saves the adapters",
                              instead="merge them after the run (peft's merge_and_unload)"))  # fmt: skip
    if model.tokenizer is not None:
        notes.append(Note("job", "model.tokenizer", model.tokenizer, "not carried",
                          why="TRL's scripts use the model's tokenizer", instead="save it with the model"))  # fmt: skip
    return config


def _data(job: Job, notes: list[Note]) -> dict[str, Any]:
    data = job.data
    config: dict[str, Any] = {"dataset_name": str(data.path)}
    if data.split != "train":
        config["dataset_train_split"] = data.split
    if isinstance(data.eval_split, str):
        config["dataset_test_split"] = data.eval_split
    if data.text_field != "text":
        config["dataset_text_field"] = data.text_field
    default = DataSpec(path="x", format=data.format)
    for key in job_keys(DataSpec):
        value = getattr(data, key)
        if job.task == "sft" and key in _SFT_DATA:
            if value != getattr(default, key):  # TRL's defaults are DataSpec's
                config[_SFT_DATA[key]] = value
        elif key not in _DATA_READ and value != getattr(default, key):
            why = "TRL's scripts have no key for it"
            notes.append(Note("job", f"data.{key}", value, "not carried", why=why, instead="prepare the data so"))
    if data.columns and set(data.columns) != {"text"}:
        notes.append(Note("job", "data.columns", dict(data.columns), "not carried", why="TRL reads its own columns",
                          instead="rename the columns in the data"))  # fmt: skip
    return config


def _training(training: Training) -> dict[str, Any]:
    """Every training argument (TRL's defaults differ from HF's: the job's values are written out)."""
    config: dict[str, Any] = {}
    for field in attrs.fields(Training):
        if field.name in _SKIPPED:
            continue
        value = getattr(training, field.name)
        if value is not None:
            config[field.name] = list(value) if isinstance(value, tuple) else value
    if training.warmup_ratio and not training.warmup_steps:  # transformers 5: a warmup_steps below 1 is the ratio
        config["warmup_steps"] = training.warmup_ratio
    return config


def _rl(job: Job, notes: list[Note]) -> dict[str, Any]:
    config: dict[str, Any] = {}
    spec = JOB_TASKS[job.task].own(job)
    if spec is not None:
        config.update(spec.to_trl())
        if config.get("generation_batch_size") is None:
            config.pop("generation_batch_size", None)
    if job.reference is not None:
        if job.reference.precompute:
            config["precompute_ref_log_probs"] = True
        if job.reference.path is not None:
            notes.append(Note("job", "reference.path", job.reference.path, "not carried",
                              why="TRL's scripts start the reference from the policy's model", instead="leave it out"))  # fmt: skip
    if job.rewards is not None:
        config["reward_funcs"] = [_reward_name(f) for f in job.rewards.functions]
        if job.rewards.weights is not None:
            config["reward_weights"] = list(job.rewards.weights)
    if job.rollout is not None and job.rollout.backend != "hf":
        notes.append(Note("job", "rollout.backend", job.rollout.backend, "not carried",
                          why=f"trl {job.task} takes no rollout function",
                          instead="pass rollout_func to GRPOTrainer" if job.task == "grpo" else "leave it out"))  # fmt: skip
    return config


def _reward_name(function: str) -> str:
    """``"module:function"`` as ``trl grpo`` names it: ``module.function``, or TRL's own by its name."""
    module, _, name = function.partition(":")
    return name if module == "trl.rewards" else f"{module}.{name}"
