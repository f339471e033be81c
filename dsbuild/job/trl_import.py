"""``dsbuild import trl``: the job file that runs what ``trl sft|dpo|grpo --config CONFIG.yaml`` runs, launched with
an Accelerate config.

``trl_arguments`` reads the TRL config as ``TrlParser`` does (TRL's own parser for the task: its dataclasses, their
defaults and argparse's conversions, a YAML ``2e-5`` a float), without building the dataclasses (their
``__post_init__`` asks for the machine's devices); it is the one function here that imports TRL. ``import_job``
maps what it read, with the Accelerate config's ds_config (``accelerate_import``), onto the job's tables:
``ModelConfig`` into ``[model]``, ``ScriptArguments`` into ``[data]``, the trainer config's HF names into
``[training]`` and TRL's own into ``[data]``, ``[dpo]`` or ``[grpo]``. Each key of each file is a ``Note``: carried,
of no effect at its value, or not carried with why (``trl_keys.NOT_RUN`` for the keys a ``[dpo]`` / ``[grpo]`` table
does not run; ``resolve.training.NOT_TAKEN`` for HF's). The values the task's trainer runs at TRL's defaults where a
job's default differs (an SFT learning rate of 2e-5, ``gradient_checkpointing``, ``bf16``) are written too.
"""

from __future__ import annotations

import enum
import importlib
import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

import attrs

from ..errors import ConfigError, MissingDependencyError, Problem
from ..resolve.training import NOT_TAKEN, Training
from .accelerate_import import Note, accelerate_launch, check_settings, plugin_config, strategy_notes
from .rl import DPOSpec, GRPOSpec
from .spec import job_keys
from .tasks import TASKS
from .trl_keys import DPO_NOT_RUN, GRPO_NOT_RUN, NOT_RUN, NotRun, generation_kwargs_instead

__all__ = ["GROUPS", "NOT_READ", "Imported", "TrlArguments", "import_job", "task_fields", "task_of", "trl_arguments"]

GROUPS: Final = ("script", "trainer", "model", "mixture")
"""The dataclasses of a TRL script, in ``make_parser``'s order: ``ScriptArguments``, the trainer's config,
``ModelConfig`` and ``DatasetMixtureConfig``."""


@attrs.frozen
class TrlArguments:
    """A TRL config as ``trl <task> --config`` reads it."""

    task: str
    given: Mapping[str, Any]
    """The file's keys (``env`` apart), as written."""
    values: Mapping[str, Mapping[str, Any]]
    """By group (``GROUPS``): every field of the dataclass, with the value the script gets."""
    defaults: Mapping[str, Any]
    """Every field's default (TRL's, before the file)."""
    hf_names: frozenset[str]
    """The fields of HF ``TrainingArguments`` (the trainer's config has them too)."""
    env: Mapping[str, Any] = attrs.field(factory=dict)
    """The file's ``env``: what ``TrlParser`` sets in the environment."""

    def group_of(self, key: str) -> str | None:
        """The group whose dataclass has ``key``, or ``None`` (TRL ignores the key)."""
        return next((g for g in GROUPS if key in self.values[g]), None)

    @property
    def trainer(self) -> Mapping[str, Any]:
        """The trainer config's values (``SFTConfig``, ``DPOConfig``, ``GRPOConfig``)."""
        return self.values["trainer"]


@attrs.frozen
class Imported:
    """A job table, and a ``Note`` for each key of the files it came from."""

    job: dict[str, Any]
    notes: list[Note]

    def of(self, kind: str) -> list[Note]:
        """The notes of one kind: ``"carried"``, ``"no effect"`` or ``"not carried"``."""
        return [n for n in self.notes if n.kind == kind]


def trl_arguments(task: str, data: Mapping[str, Any], source: str) -> TrlArguments:
    """Read a TRL config's table (``data``) as ``trl <task> --config`` reads it; a value TRL's parser refuses is a
    ``ConfigError`` naming ``source`` and the key. Imports TRL (and so torch)."""
    import dataclasses

    parser = _script(task).make_parser()
    odd = [k for k in data if not isinstance(k, str)]
    if odd:
        raise ConfigError(Problem(str(odd[0]), "not a key TRL's parser takes (a name)"), source=source, checks=True)
    given = {k: v for k, v in data.items() if k != "env"}

    def refuse(message: str) -> None:
        named = re.match(r"argument --([\w.]+)(?:/--[\w.-]+)?: (.*)", message)
        key, said = (named.group(1), named.group(2)) if named else ("", message)
        raise ConfigError(Problem(key, f"{said} (TRL's parser refuses it)"), source=source, checks=True)

    parser.error = refuse  # argparse's error() prints and exits; a bad value here is the file's
    parser.set_defaults_with_config(**given)
    namespace, _ = parser.parse_known_args([])
    values = vars(namespace)
    groups: dict[str, dict[str, Any]] = {}
    defaults: dict[str, Any] = {}
    for group, cls in zip(GROUPS, parser.dataclass_types, strict=True):
        fields = [f for f in dataclasses.fields(cls) if f.init]
        groups[group] = {f.name: _plain(values.get(f.name)) for f in fields}
        for f in fields:
            if f.default is not dataclasses.MISSING:
                defaults[f.name] = _plain(f.default)
            elif f.default_factory is not dataclasses.MISSING:
                defaults[f.name] = _plain(f.default_factory())
    trainer = groups["trainer"]
    if trainer.get("bf16") is None:  # TRL's configs: bf16 unless fp16 (_BaseConfig.__post_init__)
        trainer["bf16"] = not trainer.get("fp16")
    from transformers import TrainingArguments

    hf = frozenset(f.name for f in dataclasses.fields(TrainingArguments))
    env = data.get("env") or {}
    if not isinstance(env, Mapping):
        raise ConfigError(
            Problem("env", "expected a table (TRL: `env` field should be a dict)"), source=source, checks=True
        )
    return TrlArguments(task, given, groups, defaults, hf, env)


def _script(task: str) -> Any:
    """TRL's script module for ``task`` (its ``make_parser``); a missing TRL says which install gives it."""
    try:
        return importlib.import_module(f"trl.scripts.{task}")
    except ImportError as e:
        raise MissingDependencyError(str(e.name or "trl").split(".")[0], "reading a TRL config") from None


def _plain(value: Any) -> Any:
    """An enum as its value; a tuple as a list."""
    if isinstance(value, enum.Enum):
        return value.value
    return list(value) if isinstance(value, tuple) else value


def import_job(
    args: TrlArguments,
    accelerate: Mapping[str, Any] | None = None,
    ds_file: Mapping[str, Any] | None = None,
    *,
    data_format: str | None = None,
    cwd: Path | None = None,
    sources: Mapping[str, str] | None = None,
) -> Imported:
    """The job table that runs what TRL runs with ``args`` under the Accelerate config ``accelerate`` (``None``: TRL
    started without one: one process, no DeepSpeed) and the ds_config ``ds_file`` (``--deepspeed``, the trainer's
    ``deepspeed`` or Accelerate's ``deepspeed_config_file``, read by the caller; ``sources`` names the files by
    ``"accelerate"`` and ``"deepspeed"``, for the errors).
    ``data_format``: the ``[data] format`` of SFT records (TRL tells it from the columns when it runs); ``cwd``:
    where TRL would run, for a local dataset path. Problems TRL would stop on are a ``ConfigError``."""
    notes: list[Note] = []
    job: dict[str, Any] = {"task": args.task} if args.task != "sft" else {}
    job["description"] = f"imported from a TRL {args.task} config"
    here = cwd or Path.cwd()
    job["model"] = _model(args, notes, here)
    job["data"] = _data(args, notes, data_format, here)
    job["training"] = _training(args, notes)
    if isinstance(job["training"].get("output_dir"), str):  # TRL writes it from where it runs; a job, from its file
        job["training"]["output_dir"] = str((here / job["training"]["output_dir"]).expanduser().absolute())
    rl = _rl(args, notes)
    job.update(rl)
    strategy, launch = _strategy(args, accelerate, ds_file, notes, sources or {})
    job["strategy"] = {"config": strategy}
    if launch:
        job["launch"] = launch
    for name, value in args.env.items():
        notes.append(Note("trl", f"env.{name}", value, "not carried", why="TrlParser sets it in the environment",
                          instead=f"set {name} in the shell that runs dsbuild train"))  # fmt: skip
    for key, value in args.given.items():
        if args.group_of(key) is None:
            why = f"not a key of trl {args.task} (TRL ignores it)"
            notes.append(Note("trl", key, value, "not carried", why=why, instead="leave it out"))
    said = {n.key for n in notes if n.file == "trl"}
    for key, value in args.given.items():  # a key no rule above names (a newer TRL's): said all the same
        if key not in said:
            notes.extend(_not_run(args, key, value, NotRun(args.defaults.get(key), NOT_READ, "leave it out")))
    mine = [n for n in notes if n.file != "trl" or n.key.startswith("env.") or n.key in args.given]
    return Imported(job, mine)


NOT_READ: Final = "dsbuild import does not read it"
"""Why a key of TRL's dataclasses that no rule here names is not carried (a key of a newer TRL)."""


# --- [model]: ModelConfig -----------------------------------------------------------------------------------------

_LORA: Final = {
    "lora_r": "r",
    "lora_alpha": "alpha",
    "lora_dropout": "dropout",
    "lora_target_modules": "target_modules",
}

_MODEL_NOT_RUN: Final = {
    "model_revision": NotRun("main", "[model] takes no revision", "download that revision and give its folder"),
    "lora_target_parameters": NotRun(None, "LoRA on parameters is not built into dsbuild", "use target_modules"),
    "lora_modules_to_save": NotRun(None, "a LoRA job trains only the adapters", "leave it out"),
    "lora_task_type": NotRun("CAUSAL_LM", "a job trains a causal LM", "leave it out"),
    "use_rslora": NotRun(False, "rank-stabilized LoRA is not built into dsbuild", "leave it out"),
    "use_dora": NotRun(False, "DoRA is not built into dsbuild", "leave it out"),
    "load_in_8bit": NotRun(False, "quantized training is not built into dsbuild", "train in bf16 (LoRA)"),
    "load_in_4bit": NotRun(False, "quantized training is not built into dsbuild", "train in bf16 (LoRA)"),
    "bnb_4bit_quant_type": NotRun(None, "quantized training is not built into dsbuild", "leave it out"),
    "use_bnb_nested_quant": NotRun(False, "quantized training is not built into dsbuild", "leave it out"),
    "bnb_4bit_quant_storage": NotRun(None, "quantized training is not built into dsbuild", "leave it out"),
}
"""``ModelConfig`` keys that a job runs at one value only (quantization keys at any value without a 4-bit load)."""


def _model(args: TrlArguments, notes: list[Note], cwd: Path) -> dict[str, Any]:
    model = args.values["model"]
    table: dict[str, Any] = {}
    for key, to in (("model_name_or_path", "name_or_path"), ("dtype", "dtype"), ("attn_implementation", None)):
        value = model.get(key)
        if value is not None:
            table[to or key] = value
            notes.append(_carried(args, key, value, f"model.{to or key}"))
    if model.get("use_peft"):
        table["lora"] = {to: model[key] for key, to in _LORA.items() if model.get(key) is not None}
        notes.extend(_carried(args, key, model[key], f"model.lora.{to}") for key, to in _LORA.items())
        notes.append(_carried(args, "use_peft", True, "model.lora"))
    else:
        for key in ("use_peft", *_LORA):
            if key in args.given:
                notes.append(Note("trl", key, args.given[key], "no effect", why="use_peft is false: no adapters"))
    quantized = model.get("load_in_4bit") or model.get("load_in_8bit")
    for key, row in _MODEL_NOT_RUN.items():
        if key.startswith("bnb_") and not quantized:
            row = row._replace(runs=model.get(key))
        notes.extend(_not_run(args, key, model.get(key), row))
    local = cwd / str(table.get("name_or_path", ""))
    if "name_or_path" in table and local.exists():  # a folder TRL loads from where it runs, made absolute
        table["name_or_path"] = str(local.resolve())
    if model.get("model_name_or_path") is None:
        raise ConfigError(Problem("model_name_or_path", "missing: the model TRL trains"), checks=True)
    return table


# --- [data]: ScriptArguments and the trainer's data keys ----------------------------------------------------------

_SFT_DATA: Final = {
    "max_length": "max_length",
    "packing": "packing",
    "packing_strategy": "packing_strategy",
    "padding_free": "padding_free",
    "dataset_text_field": "dataset_text_field",
    "completion_only_loss": "completion_only_loss",
    "assistant_only_loss": "assistant_only_loss",
    "eos_token": "eos_token",
    "dataset_num_proc": "num_proc",
}
"""SFTConfig keys that are ``[data]``'s, by their name there."""

_DATA_NOT_RUN: Final = {
    "dataset_config": NotRun(None, "[data] takes no dataset configuration", "save that configuration to a file"),
    "dataset_streaming": NotRun(False, "a job reads its data whole", "leave it out"),
    "ignore_bias_buffers": NotRun(False, "a DDP workaround: a DeepSpeed run has no DDP buffers", "leave it out"),
    "reward_model_name_or_path": NotRun(
        None, "a reward model is not built into dsbuild train", "score with a reward function that calls it"
    ),
    "datasets": NotRun([], "[data] takes one dataset", "write the mixture to one file and give its path"),
    "streaming": NotRun(False, "a job reads its data whole", "leave it out"),
    "test_split_size": NotRun(None, "[data] holds out a fraction as eval_split", "set data.eval_split"),
}

_SHARED_NOT_RUN: Final = {
    **{k: GRPO_NOT_RUN[k] for k in ("model_init_kwargs", "trust_remote_code", "router_aux_loss_coef")},
    "chat_template_path": NotRun(None, "[data] takes a template's text", "write it into data.chat_template"),
    "dataset_kwargs": NotRun(None, "TRL's dataset preparation arguments are not run", "leave it out"),
    "truncation_mode": NotRun("keep_start", "an SFT job cuts a sample at its end", "leave it out"),
    "shuffle_dataset": NotRun(False, "an SFT job keeps its sampler's order", "leave it out"),
    "eval_packing": NotRun(None, "evaluation data is packed as data.packing says", "leave it out"),
    "loss_type": NotRun("nll", "an SFT job trains on the negative log-likelihood", "leave it out"),
    **{k: DPO_NOT_RUN[k] for k in ("activation_offloading", "pad_token")},
    "pad_to_multiple_of": NotRun("auto", "a job pads a batch to its longest sample", "leave it out"),
    "dataset_num_proc": NotRun(None, "tokenized by the task's own preparation", "leave it out"),
}
"""Trainer keys, of TRL's configs for any task, that a job runs at one value only."""


def _data(args: TrlArguments, notes: list[Note], data_format: str | None, cwd: Path) -> dict[str, Any]:
    script, trainer = args.values["script"], args.trainer
    table: dict[str, Any] = {}
    name = script.get("dataset_name")
    if name is None:
        raise ConfigError(
            Problem("dataset_name", "missing: TRL needs a dataset (a hub id or a local path)"), checks=True
        )
    local = (cwd / str(name)).expanduser()
    table["path"] = str(local.resolve()) if local.exists() else str(name)
    notes.append(_carried(args, "dataset_name", name, "data.path"))
    table["format"] = _format(args, data_format, local)
    split = script.get("dataset_train_split", "train")
    if split != "train":
        table["split"] = split
        notes.append(_carried(args, "dataset_train_split", split, "data.split"))
    elif "dataset_train_split" in args.given:
        notes.append(Note("trl", "dataset_train_split", split, "no effect", why="a job's default split"))
    if "dataset_test_split" in args.given or trainer.get("eval_strategy", "no") != "no":
        notes.append(_eval_split(args, table))
    mixture = args.values["mixture"]
    for key, row in _DATA_NOT_RUN.items():
        notes.extend(_not_run(args, key, {**script, **mixture}.get(key), row))
    if args.task == "sft":
        for key, to in _SFT_DATA.items():
            notes.extend(_sft_data(args, key, to, table))
    return table


def _format(args: TrlArguments, data_format: str | None, path: Path) -> str:
    if args.task != "sft":
        return "preference" if args.task == "dpo" else "prompt"
    if data_format is not None:
        return data_format
    text_field = str(args.trainer.get("dataset_text_field") or "text")
    peeked = _peeked_format(path, text_field)
    if peeked is not None:
        return peeked
    if "dataset_text_field" in args.given:  # the config names the text field: text records
        return "text"
    message = "TRL tells an SFT dataset's format from its columns when it runs; a job names it"
    hint = "give --format text, messages, prompt_completion, alpaca, sharegpt or tokenized"
    raise ConfigError(Problem("dataset_name", message, hint), checks=False)


_PEEK: Final = 1 << 20
"""Bytes of a local JSON Lines file read to tell its format: its first record's line at most."""

_TRL_COLUMNS: Final = (("input_ids", "tokenized"), ("messages", "messages"), ("completion", "prompt_completion"))
"""The columns by which TRL's SFTTrainer tells a dataset's kind, in the order it asks, and the format of each."""


def _peeked_format(path: Path, text_field: str) -> str | None:
    """The format TRL would find in the first record of a local JSON Lines file; ``None`` when it cannot tell."""
    if path.suffix.lower() != ".jsonl" or not path.is_file():  # a regular file: never a FIFO that would not answer
        return None
    try:
        with path.open("rb") as f:
            record = json.loads(f.readline(_PEEK))
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict):
        return None
    found = next((fmt for column, fmt in _TRL_COLUMNS if column in record), None)
    return found or ("text" if text_field in record else None)


def _eval_split(args: TrlArguments, table: dict[str, Any]) -> Note:
    split = args.values["script"].get("dataset_test_split", "test")
    if args.trainer.get("eval_strategy", "no") == "no":
        return Note("trl", "dataset_test_split", split, "no effect", why="eval_strategy is 'no': TRL does not evaluate")
    if args.task == "grpo":
        return Note("trl", "dataset_test_split", split, "not carried", why="a GRPO job does not evaluate",
                    instead="set training.eval_strategy = 'no'")  # fmt: skip
    if args.task == "dpo":
        return Note("trl", "dataset_test_split", split, "not carried", why="a DPO job evaluates from data.eval_path",
                    instead="write that split to a JSON Lines file and set data.eval_path")  # fmt: skip
    table["eval_split"] = split
    return _carried(args, "dataset_test_split", split, "data.eval_split")


def _sft_data(args: TrlArguments, key: str, to: str, table: dict[str, Any]) -> list[Note]:
    value = args.trainer.get(key)
    given = key in args.given
    if key == "max_length" and value is None:
        return [Note("trl", key, None, "not carried", why="a job cuts every sample at data.max_length",
                     instead="set a length")]  # fmt: skip
    if key == "packing_strategy" and not args.trainer.get("packing"):
        return [Note("trl", key, value, "no effect", why="packing is off")] if given else []
    if value is None or (value == args.defaults.get(key) and key != "max_length"):
        return [Note("trl", key, args.given[key], "no effect", why="TRL's default, a job's too")] if given else []
    table[to] = value
    return [_carried(args, key, value, f"data.{to}")]


# --- [training]: the HF names -------------------------------------------------------------------------------------

_TRAINING: Final = frozenset(a.name for a in attrs.fields(Training) if a.name not in ("given", "problems", "missing"))
_DEFAULT: Final = Training()


def _training(args: TrlArguments, notes: list[Note]) -> dict[str, Any]:
    """The trainer's HF arguments: those ``[training]`` takes, written where given or where TRL's value is not the
    job's default; the others named when set."""
    table: dict[str, Any] = {}
    for key, value in args.trainer.items():
        if key in _TRAINING:
            default = getattr(_DEFAULT, key)
            if value is None and default is not None and key not in args.given:
                continue
            if key in args.given or _differs(value, default):
                table[key] = value
                if key in args.given:
                    notes.append(_carried(args, key, args.given[key], f"training.{key}"))
        elif key in args.hf_names and key in args.given and key != "deepspeed":
            why = "an HF TrainingArguments argument dsbuild does not take"
            row = NotRun(args.defaults.get(key), why, NOT_TAKEN.get(key, "leave it out"))
            notes.extend(_not_run(args, key, value, row))
    if isinstance(table.get("report_to"), str):
        table["report_to"] = [table["report_to"]]
    return table


def _differs(value: Any, default: Any) -> bool:
    if isinstance(default, tuple):
        default = list(default)
        value = [value] if isinstance(value, str) else value
    return bool(value != default)


# --- [dpo], [grpo], [reference], [rewards] ------------------------------------------------------------------------


def _rl(args: TrlArguments, notes: list[Note]) -> dict[str, Any]:
    """The task's table from the trainer's TRL keys; every other trainer key that is not HF's is named."""
    trainer = args.trainer
    tables: dict[str, Any] = {}
    spec: type | None = {"dpo": DPOSpec, "grpo": GRPOSpec}.get(args.task)
    keys = job_keys(spec) if spec is not None else {}
    rows = NOT_RUN.get(args.task, {})
    table: dict[str, Any] = {}
    default = spec() if spec is not None else None
    for key, value in trainer.items():
        if key in args.hf_names or (args.task == "sft" and key in _SFT_DATA):
            continue
        if key == "precompute_ref_log_probs" and value:
            tables["reference"] = {"precompute": True}
            notes.append(_carried(args, key, value, "reference.precompute"))
        elif key == "reward_weights" and value is not None:
            tables.setdefault("rewards", {})["weights"] = list(value)
            notes.append(_carried(args, key, value, "rewards.weights"))
        elif key in rows:
            notes.extend(_not_run(args, key, value, rows[key]))
        elif key in keys:
            if key == "generation_batch_size" and value is None:
                continue
            if key in args.given or _differs(_plain(value), _plain(getattr(default, key))):
                table[key] = value
                if key in args.given:
                    notes.append(_carried(args, key, args.given[key], f"{args.task}.{key}"))
        else:
            row = _SHARED_NOT_RUN.get(key, NotRun(args.defaults.get(key), f"not a key of a {args.task} job", ""))
            notes.extend(_not_run(args, key, value, row))
    if args.task == "grpo":
        tables.setdefault("rewards", {})["functions"] = _reward_functions(args, notes)
    if spec is not None:
        tables[args.task] = table
    return tables


_TRL_REWARDS: Final = ("accuracy_reward", "reasoning_accuracy_reward", "think_format_reward")
"""The reward functions ``trl grpo`` knows by name (``get_soft_overlong_punishment`` is made with TRL's arguments)."""


def _reward_functions(args: TrlArguments, notes: list[Note]) -> list[str]:
    names = args.values["script"].get("reward_funcs") or []
    functions = []
    for name in names:
        if name in _TRL_REWARDS:
            functions.append(f"trl.rewards:{name}")
        elif "." in name:
            module, _, function = name.rpartition(".")
            functions.append(f"{module}:{function}")
        else:
            raise ConfigError(Problem("reward_funcs", f"{name!r}: not one of TRL's nor an import path",
                                      f"one of {', '.join(_TRL_REWARDS)} or module.function"), checks=True)  # fmt: skip
    if names:
        notes.append(_carried(args, "reward_funcs", names, "rewards.functions"))
    return functions


# --- [strategy] and [launch] --------------------------------------------------------------------------------------


def _strategy(
    args: TrlArguments,
    accelerate: Mapping[str, Any] | None,
    ds_file: Mapping[str, Any] | None,
    notes: list[Note],
    sources: Mapping[str, str],
) -> tuple[dict[str, Any], dict[str, Any]]:
    trainer = args.trainer
    chosen = "fp16" if trainer.get("fp16") else "bf16" if trainer.get("bf16") else None
    settings = dict(accelerate or {})
    problems = check_settings(settings)
    if problems:
        raise ConfigError(problems, source=sources.get("accelerate"), checks=True)
    deepspeed = settings.get("distributed_type") == "DEEPSPEED" or ds_file is not None
    precision = chosen or str(settings.get("mixed_precision") or "no").lower()
    # Without DeepSpeed TRL trains plain data parallel: the plugin's config at stage 0 trains the same.
    plugin = (settings.get("deepspeed_config") or {}) if deepspeed else {"zero_stage": 0}
    try:
        config = plugin_config(plugin, precision, ds_file)
    except ConfigError as e:
        where = sources.get("deepspeed") if ds_file is not None else sources.get("accelerate")
        raise e.with_source(where) if where else e from None
    stage = config.get("zero_optimization", {}).get("stage", 0)
    if args.given.get("deepspeed") is not None:
        notes.append(_carried(args, "deepspeed", args.given["deepspeed"], "strategy.config"))
    if accelerate is None:
        return config, {}
    notes.extend(strategy_notes(settings, stage if isinstance(stage, int) else 0))
    launch, launch_notes = accelerate_launch(settings, chosen)
    notes.extend(launch_notes)
    return config, launch


# --- notes --------------------------------------------------------------------------------------------------------


def _carried(args: TrlArguments, key: str, value: Any, to: str) -> Note:
    return Note("trl", key, args.given.get(key, value), "carried", to=to)


def _not_run(args: TrlArguments, key: str, value: Any, row: NotRun) -> list[Note]:
    """A note for a key the file sets: no effect at the value that runs, else not carried with why."""
    if key not in args.given:
        return []
    given = args.given[key]
    if _same(_plain(value), _plain(row.runs)) or (row.runs == [] and not value):
        return [Note("trl", key, given, "no effect", why="runs as TRL runs it at this value")]
    instead = generation_kwargs_instead(value) if key == "generation_kwargs" else row.instead
    instead = instead.replace("{value}", str(value))
    return [Note("trl", key, given, "not carried", why=row.why, instead=instead or None)]


def _same(value: Any, runs: Any) -> bool:
    if isinstance(value, bool) or isinstance(runs, bool):
        return value is runs
    return bool(value == runs)


def task_fields() -> dict[str, frozenset[str]]:
    """The keys each of TRL's scripts takes (its dataclasses' fields), by task. Imports TRL."""
    import dataclasses

    fields = {}
    for task in TASKS:
        parser = _script(task).make_parser()
        fields[task] = frozenset(f.name for cls in parser.dataclass_types for f in dataclasses.fields(cls))
    return fields


def task_of(data: Mapping[str, Any], fields: Mapping[str, frozenset[str]]) -> str:
    """The task whose trainer config takes the most of ``data``'s keys that the others' do not (``fields``: each
    task's field names); ``"sft"`` on a tie."""
    scores = {task: len(set(data) & (names - frozenset().union(*(fields[t] for t in fields if t != task))))
              for task, names in fields.items()}  # fmt: skip
    best = max(TASKS, key=lambda t: (scores.get(t, 0), t == "sft"))
    return best
