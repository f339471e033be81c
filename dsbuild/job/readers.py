"""What a job's tables declare beyond their keys' ``Spec``s: the readers of the keys read by hand (``READERS``: a path
relative to the job file, ROLL's spellings, a nested table) and each table's checks of its keys together (``CHECKS``),
both used by ``collect.Collector``. A reader is ``(collector, value or ABSENT, path, table) -> value``; a check
``(collector, values, path)`` reports what the keys cannot be together and adds what follows from them.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

import attrs

from .._util import dotted
from .._util.safe_read import real_path, special_file
from .._util.suggest import did_you_mean
from ..api import Config
from ..config.fields import describe
from ..config.walk import leaves
from ..errors import ConfigError
from ..io.config_files import config_ref, merge, read_dict, read_table, to_config
from ..io.presets import preset_path
from ..resolve.resolution import model_hidden_size
from .collect import ABSENT, BAD, Check, Collector, Reader
from .devices import parse_device_mapping
from .formats import (
    CHAT_FORMATS,
    DATA_SUFFIXES,
    FIELDS,
    TEMPLATE_KEYS,
    TEMPLATED_FORMATS,
    TEMPLATES,
    is_hub_id,
    template_problems,
)
from .functions import function_ref_problem
from .rl import (
    DPO_LOSS_TYPES,
    DPOSpec,
    GRPOSpec,
    KTOSpec,
    RewardSpec,
    RLOOSpec,
    clip_range_problem,
    loss_weights_problem,
)
from .spec import (
    ATTN_IMPLEMENTATIONS,
    BYTE_TOKENIZER,
    BYTE_VOCAB,
    STRATEGIES,
    DataSpec,
    LaunchSpec,
    LoraSpec,
    ModelSpec,
    ReferenceSpec,
    RewardsSpec,
    RolloutSpec,
    StrategySpec,
    job_keys,
)
from .tasks.base import TABLE_SPECS
from .trl_keys import not_run

__all__ = ["CHECKS", "READERS"]


# -- paths relative to the job file --------------------------------------------------------------------------------


def data_source(c: Collector, value: Any, path: str, _: Mapping[str, Any]) -> Any:
    """A data file or folder (made absolute), or a hub dataset id (kept); anything else is a problem at ``path``."""
    if value is ABSENT or (value == "" and path.endswith("eval_path")):
        return ABSENT  # an empty eval_path turns a job's evaluation off (--set data.eval_path='')
    what = "the evaluation records" if path.endswith("eval_path") else "the training records"
    if not isinstance(value, str) or not value:
        c.problem(path, f"got {describe(value)}, expected {what}: a file, a folder or a hub dataset id")
        return ABSENT
    candidate = real_path(c.base_dir / Path(value).expanduser())
    special = special_file(candidate)
    if special is not None:  # reading it would hang (a FIFO) or never end (a device)
        c.problem(path, f"{str(candidate)!r} is {special}", f"expected {what}: a data file or folder")
    elif candidate.is_file() and candidate.suffix.lower() not in DATA_SUFFIXES:
        c.problem(
            path,
            f"not a data file dsbuild reads: {str(candidate)!r}",
            f"expected {', '.join(DATA_SUFFIXES)}, a folder of them, a save_to_disk folder or a hub dataset id",
        )
    elif candidate.exists():
        return candidate
    elif is_hub_id(value):
        return value
    else:
        c.problem(path, f"no such file: {str(candidate)!r}", f"{what}, relative to the job file")
    return ABSENT


def local_or_hub(c: Collector, value: str) -> str:
    """A local directory (made absolute) or a hub id (kept)."""
    candidate = real_path(c.base_dir / Path(value).expanduser())
    return str(candidate) if candidate.exists() else value


# -- [model] ---------------------------------------------------------------------------------------------------


def model_config(c: Collector, value: Any, path: str, table: Mapping[str, Any]) -> Any:
    """``[model.config]``: a table with ``model_type`` (its fields are checked against the class at launch)."""
    if value is ABSENT:
        return None
    config = c.table(table, "config", path)
    if config is BAD:
        return None  # reported; nothing inside it to check
    model_type = config.get("model_type")
    if not isinstance(model_type, str) or not model_type:
        got = "missing" if model_type is None else f"got {describe(model_type)}, expected a string"
        c.problem(f"{path}.model_type", got, 'e.g. model_type = "llama"')
    return config


def attn_implementation(c: Collector, value: Any, path: str, _: Mapping[str, Any]) -> Any:
    if value is ABSENT:
        return ABSENT
    value = "flash_attention_2" if value == "fa2" else value  # ROLL's spelling
    if isinstance(value, str) and (value in ATTN_IMPLEMENTATIONS or "/" in value):
        return value
    hint = did_you_mean(value, ATTN_IMPLEMENTATIONS) if isinstance(value, str) else None
    c.problem(
        path,
        f"got {describe(value)}, expected one of {', '.join(map(repr, ATTN_IMPLEMENTATIONS))} or a kernels hub id",
        hint,
    )
    return ABSENT


def lora(c: Collector, value: Any, path: str, table: Mapping[str, Any]) -> Any:
    return None if value is ABSENT else c.collect(LoraSpec, c.table(table, "lora", path), path)


def target_modules(c: Collector, value: Any, path: str, _: Mapping[str, Any]) -> Any:
    """Module names: a list, ROLL's ``"o_proj,q_proj"``, or ``"all-linear"``."""
    if value is ABSENT or value == "all-linear":
        return value
    names = tuple(x.strip() for x in value.split(",") if x.strip()) if isinstance(value, str) else value
    if isinstance(names, (list, tuple)) and names and all(isinstance(x, str) and x for x in names):
        return tuple(names)
    c.problem(path, f'got {describe(value)}, expected a list of module names or "all-linear"')
    return ABSENT


def model_checks(c: Collector, values: dict[str, Any], path: str, table: Mapping[str, Any]) -> None:
    name, config, tokenizer = values.get("name_or_path"), values.get("config"), values.get("tokenizer")
    if name is not None and config is not None:
        c.problem(path, "both name_or_path and [model.config] are set", "keep one")
    elif name is None and config is None and "name_or_path" not in table:
        c.problem(
            f"{path}.name_or_path",
            "missing: give a model directory or hub id, or a [model.config] table with model_type",
        )
    if tokenizer is None and config is not None and name is None:
        c.problem(
            f"{path}.tokenizer",
            "missing: a model built from [model.config] needs a tokenizer",
            f'use "{BYTE_TOKENIZER}" for the built-in byte-level tokenizer, or a tokenizer directory / hub id',
        )
    vocab = config.get("vocab_size") if tokenizer == BYTE_TOKENIZER and config is not None else None
    if isinstance(vocab, int) and vocab < BYTE_VOCAB:
        c.problem(f"{path}.config.vocab_size", f"got {vocab}, expected at least {BYTE_VOCAB} for the byte tokenizer",
                  f"set vocab_size = {BYTE_VOCAB}")  # fmt: skip
    if tokenizer is not None and tokenizer != BYTE_TOKENIZER:
        values["tokenizer"] = local_or_hub(c, tokenizer)
    if name is not None:
        values["name_or_path"] = local_or_hub(c, name)
    values["hidden_size"] = _hidden_size(config, values.get("name_or_path"))


def _hidden_size(config: Mapping[str, Any] | None, name_or_path: str | None) -> int | None:
    """The model's hidden size when it can be read without loading anything: a config table or a local directory."""
    table: Any = config
    if table is None and name_or_path is not None:
        file = Path(name_or_path) / "config.json"
        if not file.is_file():
            return None
        try:
            table = read_table(file)
        except ConfigError:
            return None
    found = model_hidden_size(table) if isinstance(table, Mapping) else None
    return found if isinstance(found, int) else None


# -- [data] ----------------------------------------------------------------------------------------------------


def eval_split(c: Collector, value: Any, path: str, _: Mapping[str, Any]) -> Any:
    """A fraction of the training records held out, or the name of a split of their source."""
    if value is ABSENT or (isinstance(value, str) and value):
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value < 1:
        return float(value)
    c.problem(
        path, f'got {describe(value)}, expected a fraction between 0 and 1 (0.05) or the name of a split ("test")'
    )
    return ABSENT


def template(c: Collector, value: Any, path: str, _: Mapping[str, Any]) -> Any:
    """A packaged template's name, or a table of the two prompts."""
    if value is ABSENT or (isinstance(value, str) and value in TEMPLATES):
        return value
    if not isinstance(value, Mapping):
        names = ", ".join(map(repr, TEMPLATES))
        hint = did_you_mean(value, TEMPLATES) if isinstance(value, str) else None
        c.problem(
            path, f"got {describe(value)}, expected one of {names} or a table with {' and '.join(TEMPLATE_KEYS)}", hint
        )
        return ABSENT
    c.unknown(value, TEMPLATE_KEYS, path)
    prompts = {key: value.get(key) for key in TEMPLATE_KEYS}
    for key, text in prompts.items():
        if not isinstance(text, str):
            c.problem(f"{path}.{key}", "missing" if text is None else f"got {describe(text)}, expected a string")
    written = {key: text for key, text in prompts.items() if isinstance(text, str)}
    if len(written) < len(prompts):
        return ABSENT
    for key, message in template_problems(written):
        c.problem(f"{path}.{key}", message)
    return written["prompt_no_input"], written["prompt_input"]


def columns(c: Collector, value: Any, path: str, table: Mapping[str, Any]) -> Any:
    """``[data.columns]``: the file's names for fields (``data.dataset_text_field`` / ``text_field`` is a key of
    ``DataSpec``, which ``DataSpec.names`` merges, for a job file and ``DataSpec(...)`` alike)."""
    found = c.table(table, "columns", path)
    fields = FIELDS.get(str(table.get("format", "")), ())
    if found is not BAD and fields:
        c.unknown(found, fields, path)
    named: dict[str, str] = {}
    for key, name in found.items():
        if not isinstance(name, str) or not name:
            c.problem(f"{path}.{key}", f"got {describe(name)}, expected a field name")
        elif key in fields or not fields:
            named[key] = name
    return {key: name for key, name in named.items() if name != key}


def data_checks(c: Collector, values: dict[str, Any], path: str, table: Mapping[str, Any]) -> None:
    fmt = values.get("format")
    if values.get("train_on_prompt"):
        for key in ("assistant_only_loss", "completion_only_loss"):
            if values.get(key) is True:
                c.problem(f"{path}.{key}", f"both train_on_prompt and {key} are set, and they disagree", "keep one")
    if "packing_strategy" in values and values.get("packing") is not True:
        c.problem(f"{path}.packing_strategy", "set, but packing is off", "set packing = true, or drop it")
    if values.get("eos_token") == "":
        c.problem(f"{path}.eos_token", 'empty, expected a token (e.g. "<|im_end|>")')
    if "eval_path" in table and values.get("eval_split") is not None:
        c.problem(f"{path}.eval_split", "both eval_path and eval_split are set", "keep one")
    if values.get("chat_template") is not None and fmt is not None and fmt not in TEMPLATED_FORMATS:
        chats = ", ".join(map(repr, TEMPLATED_FORMATS))
        c.problem(f"{path}.chat_template", f"only {chats} records use a chat template; the format is {fmt!r}")
    if (
        values.get("assistant_only_loss") is True
        and fmt is not None
        and fmt not in (*CHAT_FORMATS, "prompt_completion")
    ):
        c.problem(f"{path}.assistant_only_loss", f"only conversations have assistant turns; the format is {fmt!r}",
                  "leave it out (TRL refuses it for data that is not conversational)")  # fmt: skip


# -- [strategy] ------------------------------------------------------------------------------------------------


def strategy_name(c: Collector, value: Any, path: str, _: Mapping[str, Any]) -> Any:
    if value is ABSENT or value in STRATEGIES:
        return value
    hint = did_you_mean(value, STRATEGIES) if isinstance(value, str) else None
    c.problem(
        path,
        f"got {describe(value)}, expected {', '.join(map(repr, STRATEGIES))} (the only strategy dsbuild runs)",
        hint,
    )
    return ABSENT


def strategy_config(c: Collector, value: Any, path: str, _: Mapping[str, Any]) -> Any:
    """What ``strategy.config`` names, as ``(the ds_config dict, what it is)``: a preset, a file next to the job, or
    an inline table; ``strategy_checks`` merges the overrides over it."""
    if isinstance(value, Mapping):
        return dict(value), "inline table"
    if not isinstance(value, str) or not value:
        c.problem(path, f"got {describe(value)}, expected a preset name, a file or a table")
        return ABSENT
    try:
        file = config_ref(value, c.base_dir)  # the rule Session and the CLI follow
        if file is not None:
            return read_dict(real_path(file))[0], f"file {value}"
        return read_dict(preset_path(value))[0], f"preset {value}"
    except ConfigError as e:
        where = f"{e.source}: " if e.source else ""
        for p in e.problems:
            c.problem(path, f"{where}{p}")
        c.unreadable = c.unreadable or not e.fails_checks
        return ABSENT


def overrides(c: Collector, value: Any, path: str, table: Mapping[str, Any]) -> Any:
    return ABSENT if value is ABSENT else c.table(table, "overrides", path)


def strategy_checks(c: Collector, values: dict[str, Any], path: str, table: Mapping[str, Any]) -> None:
    """The config with the overrides merged in, read as a ds_config; its problems under the key that set them."""
    if "config" not in values:
        return
    base, label = values["config"]
    table = values.get("overrides", {})
    where = c.source or "job"
    try:
        config = to_config(merge(base, table), source=where, label=f"{label} in {where}", cls=Config)
    except ConfigError as e:
        for p in e.problems:
            c.problems.append(p.prefixed(f"{path}.overrides" if dotted.sets(table, p.path) else f"{path}.config"))
        return
    marks = {key: f"[strategy.overrides] in {where}" for key, _ in leaves(table)}
    values["config"] = attrs.evolve(config, provenance={**config.provenance, **marks})
    values["ref"] = label


# -- [launch] --------------------------------------------------------------------------------------------------


def device_mapping(c: Collector, value: Any, path: str, _: Mapping[str, Any]) -> Any:
    if value is ABSENT:
        return ABSENT
    try:
        return parse_device_mapping(value)
    except ConfigError as e:
        c.problems.extend(p.prefixed(path) for p in e.problems)
        return ABSENT


def launch_checks(c: Collector, values: dict[str, Any], path: str, table: Mapping[str, Any]) -> None:
    """The processes per node from the device mapping (or checked against it)."""
    mapping, nnodes = values.get("device_mapping"), values.get("nnodes", 1)
    if mapping is None:
        return
    nproc = values.get("nproc_per_node")
    if nproc is None and len(mapping) % nnodes:
        c.problem(f"{path}.device_mapping", f"{len(mapping)} devices cannot be shared evenly by {nnodes} nodes",
                  "list nproc_per_node x nnodes devices")  # fmt: skip
    elif nproc is None:
        values["nproc_per_node"] = len(mapping) // nnodes
    elif len(mapping) != nproc * nnodes:
        c.problem(f"{path}.device_mapping", f"{len(mapping)} devices for {nnodes} node(s) x {nproc} process(es) per node",
                  "list one device per process, or leave nproc_per_node out")  # fmt: skip


def reference_checks(c: Collector, values: dict[str, Any], path: str, table: Mapping[str, Any]) -> None:
    """A reference's path, local (made absolute) or a hub id; precompute with offload has nothing to offload."""
    if values.get("path") is not None:
        values["path"] = local_or_hub(c, values["path"])
    if values.get("precompute") and values.get("offload"):
        c.problem(f"{path}.offload", "precompute = true keeps no reference model to offload", "drop one of them")


def loss_weights(c: Collector, value: Any, path: str, _: Mapping[str, Any]) -> Any:
    """``dpo.loss_weights``: one number per loss type (TRL's), or left out."""
    if value is ABSENT:
        return ABSENT
    problem = loss_weights_problem(path, value)
    if problem is not None:
        c.problems.append(problem)
        return ABSENT
    return value


def reward_clip_range(c: Collector, value: Any, path: str, _: Mapping[str, Any]) -> Any:
    """``rloo.reward_clip_range``: ``[low, high]`` (TRL's), or left out."""
    if value is ABSENT:
        return ABSENT
    problem = clip_range_problem(path, value)
    if problem is not None:
        c.problems.append(problem)
        return ABSENT
    return value


def loss_type(c: Collector, value: Any, path: str, _: Mapping[str, Any]) -> Any:
    """``dpo.loss_type``: a list of loss types, or one as a string (TRL's ``DPOConfig`` reads ``"ipo"`` as
    ``["ipo"]``)."""
    if value is ABSENT:
        return ABSENT
    if isinstance(value, str):
        if value in DPO_LOSS_TYPES:
            return (value,)
        c.problem(path, f"got {value!r}, expected one of {', '.join(map(repr, DPO_LOSS_TYPES))} (or a list of them)")
        return ABSENT
    spec = job_keys(DPOSpec)["loss_type"].spec
    assert spec is not None
    return c.value(value, path, spec)


def trl_not_run(c: Collector, values: dict[str, Any], path: str, table: Mapping[str, Any]) -> None:
    """What ``dsbuild train`` does not run of TRL's ``DPOConfig`` / ``GRPOConfig`` / ``RLOOConfig`` /
    ``RewardConfig``, refused by key at other than the value that runs, with what to write instead
    (``trl_keys.NOT_RUN``)."""
    read = job_keys(TABLE_SPECS[path])
    c.problems.extend(not_run(path, table, values, read))


def scale_rewards(c: Collector, value: Any, path: str, _: Mapping[str, Any]) -> Any:
    """``grpo.scale_rewards``: a choice, or TRL's ``true`` / ``false`` (``"group"`` / ``"none"``)."""
    if value is ABSENT:
        return ABSENT
    if isinstance(value, bool):
        return "group" if value else "none"
    return c.value(value, path, job_keys(GRPOSpec)["scale_rewards"].spec)  # type: ignore[arg-type]


def rollout_checks(c: Collector, values: dict[str, Any], path: str, table: Mapping[str, Any]) -> None:
    """``backend = "function"`` names its function (``module:function``), and maybe a weight sink; ``"hf"`` takes
    neither."""
    backend, function = values.get("backend", "hf"), values.get("function")
    if backend == "function" and function is None:
        c.problem(
            f"{path}.function", 'missing: backend = "function" calls it', "e.g. function = 'my_rollouts:complete'"
        )
    elif backend == "hf" and function is not None:
        c.problem(f"{path}.function", 'not read with backend = "hf" (the policy generates)', 'set backend = "function"')
    elif function is not None and (problem := function_ref_problem(f"{path}.function", function)) is not None:
        c.problems.append(problem)
    sink = values.get("weight_sink")
    if sink is not None and backend == "hf":
        c.problem(f"{path}.weight_sink", 'not read with backend = "hf" (the policy generates with its own weights)',
                  'set backend = "function"')  # fmt: skip
    elif sink is not None and (problem := function_ref_problem(f"{path}.weight_sink", sink)) is not None:
        c.problems.append(problem)


def rewards_checks(c: Collector, values: dict[str, Any], path: str, table: Mapping[str, Any]) -> None:
    """One or more reward models (local folders made absolute, or hub ids) and ``module:function`` references, and
    one weight per model and function when weights are given."""
    functions, models = values.get("functions", ()), values.get("models", ())
    if not functions and not models:
        c.problem(f"{path}.functions", "got no reward function and no reward model, expected one or more",
                  'e.g. functions = ["my_rewards:length"], or models = ["path/to/reward_model"]')  # fmt: skip
    for i, ref in enumerate(functions):
        if (problem := function_ref_problem(f"{path}.functions[{i}]", ref)) is not None:
            c.problems.append(problem)
    values["models"] = tuple(_reward_model(c, ref, f"{path}.models[{i}]") for i, ref in enumerate(models))
    weights, scored = values.get("weights"), len(functions) + len(models)
    if weights is not None:
        if (problem := loss_weights_problem(f"{path}.weights", weights)) is not None:
            c.problems.append(problem)
        elif scored and len(weights) != scored:
            scoring = (
                f"{len(models)} models and {len(functions)} functions" if models else f"{len(functions)} functions"
            )
            c.problem(f"{path}.weights", f"got {len(weights)} weights for {scoring}",
                      "give one weight per reward model and function, the models' first" if models
                      else "give one weight per function")  # fmt: skip


def _reward_model(c: Collector, value: str, path: str) -> str:
    """A reward model: a local folder with a ``config.json`` (made absolute), or a hub id (kept)."""
    candidate = real_path(c.base_dir / Path(value).expanduser())
    if candidate.is_dir() and (candidate / "config.json").is_file():
        return str(candidate)
    if candidate.exists():
        c.problem(path, f"{str(candidate)!r} is not a model folder (no config.json)",
                  "a folder save_pretrained wrote: an AutoModelForSequenceClassification with one label")  # fmt: skip
    elif not is_hub_id(value):
        c.problem(path, f"no such folder: {str(candidate)!r}", "a reward model's folder, relative to the job file")
    return value


READERS: Final[dict[tuple[type, str], Reader]] = {
    (DPOSpec, "loss_type"): loss_type,
    (DPOSpec, "loss_weights"): loss_weights,
    (RewardsSpec, "weights"): loss_weights,
    (GRPOSpec, "scale_rewards"): scale_rewards,
    (RLOOSpec, "reward_clip_range"): reward_clip_range,
    (ModelSpec, "config"): model_config,
    (ModelSpec, "attn_implementation"): attn_implementation,
    (ModelSpec, "lora"): lora,
    (LoraSpec, "target_modules"): target_modules,
    (DataSpec, "path"): data_source,
    (DataSpec, "eval_path"): data_source,
    (DataSpec, "eval_split"): eval_split,
    (DataSpec, "template"): template,
    (DataSpec, "columns"): columns,
    (StrategySpec, "name"): strategy_name,
    (StrategySpec, "config"): strategy_config,
    (StrategySpec, "overrides"): overrides,
    (LaunchSpec, "device_mapping"): device_mapping,
}
"""The keys read by hand, by table and key."""

CHECKS: Final[dict[type, tuple[Check, ...]]] = {
    ModelSpec: (model_checks,),
    DataSpec: (data_checks,),
    StrategySpec: (strategy_checks,),
    LaunchSpec: (launch_checks,),
    ReferenceSpec: (reference_checks,),
    DPOSpec: (trl_not_run,),
    RolloutSpec: (rollout_checks,),
    RewardsSpec: (rewards_checks,),
    GRPOSpec: (trl_not_run,),
    RLOOSpec: (trl_not_run,),
    KTOSpec: (trl_not_run,),
    RewardSpec: (trl_not_run,),
}
"""Each table's checks of its keys together, in order."""
