"""Reading a job file: every table read by the one collector (``collect.Collector``, from the tables' field metadata
and the readers and checks they declare in ``readers``), every problem collected under its ``section.key`` path."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

import attrs

from ..config.fields import describe
from ..errors import ConfigError, DsbuildError, Problem
from ..io.config_files import read_table
from ..resolve.training import Training
from .collect import BAD, Collector
from .complete import complete
from .readers import CHECKS, READERS
from .rl import DPOSpec, GRPOSpec, KTOSpec, RewardSpec, RLOOSpec, check_grpo_batch
from .spec import (
    JOB_TABLES,
    TASK_TABLES,
    TASKS,
    DataSpec,
    LaunchSpec,
    ModelSpec,
    ReferenceSpec,
    RewardsSpec,
    RolloutSpec,
    StrategySpec,
)

__all__ = ["is_job", "looks_like_job", "read_job", "read_job_dict"]


def read_job_dict(path: str | Path) -> dict[str, Any]:
    """The raw table of a job file (TOML; JSON or YAML by suffix); unreadable files raise ``ConfigError``."""
    path = Path(path)
    return read_table(path)


def looks_like_job(data: Mapping[str, Any]) -> bool:
    """Whether a file's table is a job (any of ``JOB_TABLES`` at the top) rather than a ds_config."""
    return any(key in data for key in JOB_TABLES)


def is_job(path: str | Path) -> bool:
    """Whether ``path`` is a readable job file."""
    try:
        return looks_like_job(read_job_dict(path))
    except DsbuildError:  # unreadable, or YAML without PyYAML
        return False


def read_job(
    data: Mapping[str, Any], *, base_dir: Path, source: str | None, name: str, output_base: Path | None = None
) -> dict[str, Any]:
    """The fields of a ``Job`` read from its table; relative paths are under ``base_dir`` (the job file's folder), a
    relative ``training.output_dir`` under ``output_base`` (default ``base_dir``). One ``ConfigError`` (``source``:
    the file) lists every problem."""
    if not isinstance(data, Mapping):
        raise ConfigError(Problem("", f"got {describe(data)}, expected a table"), source=source)
    c = Collector(base_dir, source, readers=READERS, checks=CHECKS)
    c.unknown(data, [*JOB_TABLES, "description", "task", *(t for ts in TASK_TABLES.values() for t in ts)], "")
    description = data.get("description")
    if description is not None and not isinstance(description, str):
        c.problem("description", f"got {describe(description)}, expected a string")
    task = _task(c, data)
    for key in ("model", "data", "training", "strategy"):
        if key not in data:
            c.problem(key, f"missing: a job needs a [{key}] table")
    tables = {key: c.table(data, key, key) for key in JOB_TABLES}
    model = c.collect(ModelSpec, tables["model"], "model")
    data_spec = c.collect(DataSpec, tables["data"], "data")
    training = _training(c, tables["training"])
    strategy = c.collect(StrategySpec, tables["strategy"], "strategy")
    launch = c.collect(LaunchSpec, tables["launch"], "launch")
    rl = _rl_tables(c, task, data)
    if data_spec is not None:
        _task_data(c, task, data_spec, tables["data"])
    config = done = None
    if strategy is not None and training is not None:
        try:
            done, config = complete(strategy.config, training, explicit=set(tables["training"]), name=name)
        except ConfigError as e:
            c.problems.extend(e.problems)
    checkpoint = config.checkpoint if config is not None else None
    if done is not None and done.async_save and checkpoint is not None and checkpoint.writer is not None:
        c.problem("training.async_save", "not with [strategy] checkpoint.writer: DeepSpeed's writer and dsbuild's "
                  "background save each write the files; choose one (remove checkpoint.writer, or async_save)")  # fmt: skip
    kto = rl.get("kto")
    if kto is not None and kto.loss_type == "kto" and done is not None and done.per_device_train_batch_size < 2:
        c.problem("training.per_device_train_batch_size", f"got {done.per_device_train_batch_size}: KTO's KL estimate "
                  "pairs each prompt with another completion of its micro-batch (TRL refuses 1)",
                  'set 2 or more, or kto.loss_type = "apo_zero_unpaired" (no KL)')  # fmt: skip
    if task in PROMPT_TASKS and done is not None and launch is not None and rl.get(task) is not None:
        _grpo_batch(c, rl[task], done, launch.world_size, rl.get("reference") is not None)
    if c.problems or None in (model, data_spec, done, strategy, launch, config):
        raise ConfigError(c.problems, source=source, checks=not c.unreadable)
    assert done is not None and done.output_dir is not None  # complete() sets it
    where = (output_base or base_dir) / Path(done.output_dir).expanduser()
    done = attrs.evolve(done, output_dir=os.path.abspath(where))
    return dict(model=model, data=data_spec, training=done, strategy=strategy, launch=launch, config=config,
                source=source, description=description, task=task, **rl)  # fmt: skip


DPO_DATA_KEYS = frozenset({"path", "eval_path", "format", "chat_template"})
"""The ``[data]`` keys a DPO or reward job reads (the pairs' length is ``[dpo]``'s / ``[reward]``'s, as TRL's
``DPOConfig`` / ``RewardConfig``)."""

PAIR_TASKS: Final = {"dpo": "a DPO job", "reward": "a reward job"}
"""The tasks that read preference pairs (``format = "preference"``), and how their messages name a job of each."""


GRPO_DATA_KEYS = frozenset({"path", "format", "chat_template"})
"""The ``[data]`` keys a GRPO or RLOO job reads (the completions' length is ``[grpo]``'s / ``[rloo]``'s, as TRL's
``GRPOConfig`` / ``RLOOConfig``)."""

PROMPT_TASKS: Final = {"grpo": "a GRPO job", "rloo": "an RLOO job"}
"""The tasks that read prompts and sample completions (``format = "prompt"``; ``[rollout]``, ``[rewards]``, a
``[reference]`` with ``beta`` > 0, the table of their name), and how their messages name a job of each."""

_TASK_SPECS: dict[str, type] = {
    "reference": ReferenceSpec, "dpo": DPOSpec, "rollout": RolloutSpec, "rewards": RewardsSpec, "grpo": GRPOSpec,
    "reward": RewardSpec, "rloo": RLOOSpec, "kto": KTOSpec,
}  # fmt: skip


def _rl_tables(c: Collector, task: str, data: Mapping[str, Any]) -> dict[str, Any]:
    """The tables of the job's task (``TASK_TABLES``), each read by the collector; a GRPO or RLOO job's
    ``[reference]`` is read only when given (``beta = 0`` builds none), its ``[rollout]`` and ``[grpo]`` / ``[rloo]``
    take their defaults."""
    tables: dict[str, Any] = {}
    for name in TASK_TABLES.get(task, ()):
        if task in PROMPT_TASKS and name == "reference" and name not in data:
            tables[name] = None
            continue
        if name == "rewards" and name not in data:
            job = PROMPT_TASKS.get(task, "this job")
            c.problem("rewards", f'missing: {job} needs [rewards] functions = ["module:function", ...]')
            tables[name] = None
            continue
        tables[name] = c.collect(_TASK_SPECS[name], c.table(data, name, name), name)
    if task == "kto" and tables.get("reference") is not None and tables["reference"].precompute:
        c.problem("reference.precompute", "a KTO job scores with its reference model at every step", "leave it out")
    return tables


def grpo_batch_problems(grpo: GRPOSpec | RLOOSpec, training: Training, world_size: int) -> list[Problem]:
    """TRL's checks of the generation batch (``check_grpo_batch``) at ``world_size`` processes: what the reader checks
    at the job's own world size and ``Job.validate`` at the run's (``--nproc-per-node``, ``--nnodes``, Slurm's and
    Ray's counts), before anything starts. ``grpo``: a GRPO or RLOO job's spec (its table names the keys)."""
    table = "rloo" if isinstance(grpo, RLOOSpec) else "grpo"
    return list(check_grpo_batch(training.per_device_train_batch_size, training.gradient_accumulation_steps,
                                 world_size, grpo.num_generations, steps_per_generation=grpo.steps_per_generation,
                                 generation_batch_size=grpo.generation_batch_size, table=table))  # fmt: skip


def _grpo_batch(
    c: Collector, grpo: GRPOSpec | RLOOSpec, training: Training, world_size: int, has_reference: bool
) -> None:
    """The generation batch's checks at the job's world size (``grpo_batch_problems``); a reference with ``beta = 0``
    is never used."""
    c.problems.extend(grpo_batch_problems(grpo, training, world_size))
    table = "rloo" if isinstance(grpo, RLOOSpec) else "grpo"
    if has_reference and grpo.beta == 0.0:
        c.problem("reference", f"not used with {table}.beta = 0 (no KL term: TRL builds no reference)",
                  f"set {table}.beta > 0, or leave [reference] out")  # fmt: skip


def _task(c: Collector, data: Mapping[str, Any]) -> str:
    """``task`` (default ``"sft"``); the tables of another task than the job's are problems."""
    task = data.get("task", "sft")
    if task not in TASKS:
        c.problem("task", f"got {describe(task)}, expected one of {', '.join(map(repr, TASKS))}")
        return "sft"
    for table in dict.fromkeys(t for tables in TASK_TABLES.values() for t in tables):
        if table in data and table not in TASK_TABLES.get(task, ()):
            readers = [other for other, tables in TASK_TABLES.items() if table in tables]
            by = " or ".join(f"task = {other!r}" for other in readers)
            c.problem(table, f"[{table}] is read by {by}; this job's task is {task!r}",
                      f'set task = "{readers[0]}", or leave [{table}] out')  # fmt: skip
    return str(task)


def _task_data(c: Collector, task: str, data: DataSpec, table: Mapping[str, Any]) -> None:
    """Preference data is read by the pair tasks (DPO, reward) and they read only preference data, prompts are GRPO's
    and GRPO reads only prompts; the [data] keys these tasks do not read are problems."""
    pairs = PAIR_TASKS.get(task)
    if (pairs is not None) != (data.format == "preference"):
        wanted = 'format = "preference" (prompt / chosen / rejected)' if pairs else 'task = "dpo" or "reward"'
        reader = f"{pairs} reads pairs" if pairs else "pairs are read by a DPO or reward job"
        c.problem("data.format", f"got {data.format!r} for task = {task!r}", f"{reader}: {wanted}")
    elif (task in PROMPT_TASKS) != (data.format == "prompt"):
        wanted = 'format = "prompt" (a prompt per record)' if task in PROMPT_TASKS else 'task = "grpo" or "rloo"'
        reader = (
            f"{PROMPT_TASKS[task]} reads prompts" if task in PROMPT_TASKS else "prompts are read by a GRPO or RLOO job"
        )
        c.problem("data.format", f"got {data.format!r} for task = {task!r}", f"{reader}: {wanted}")
    if (task == "kto") != (data.format == "unpaired") and data.format not in ("preference", "prompt"):
        wanted = 'format = "unpaired" (prompt / completion / label)' if task == "kto" else 'task = "kto"'
        reader = "a KTO job reads labelled completions" if task == "kto" else "unpaired data is read by a KTO job"
        c.problem("data.format", f"got {data.format!r} for task = {task!r}", f"{reader}: {wanted}")
    if task == "kto":
        _kto_data(c, data, table)
    if task in PROMPT_TASKS:
        job = PROMPT_TASKS[task]
        if data.path is not None and not (isinstance(data.path, Path) and data.path.is_file()):
            c.problem("data.path", f"{data.path}: {job} reads a local JSON or JSON Lines file of prompts")
        config = "RLOOConfig" if task == "rloo" else "GRPOConfig"
        for key in sorted(set(table) - GRPO_DATA_KEYS):
            hint = f"[{task}] max_completion_length, as TRL's {config}" if key == "max_length" else None
            why = f'not read for task = "{task}"' + (f" ({job} does not evaluate)" if "eval" in key else "")
            c.problem(f"data.{key}", why, hint)
    if pairs is not None:
        for key, where in (("path", data.path), ("eval_path", data.eval_path)):
            if where is not None and not (isinstance(where, Path) and where.is_file()):
                c.problem(f"data.{key}", f"{where}: {pairs} reads a local JSON or JSON Lines file of pairs")
        config = "DPOConfig" if task == "dpo" else "RewardConfig"
        for key in sorted(set(table) - DPO_DATA_KEYS):
            hint = None
            if key == "max_length":
                hint = (
                    f"[{task}] max_length" + (" and truncation_mode" if task == "dpo" else "") + f", as TRL's {config}"
                )
            c.problem(f"data.{key}", f'not read for task = "{task}"', hint)


def _kto_data(c: Collector, data: DataSpec, table: Mapping[str, Any]) -> None:
    """A KTO job reads local files of labelled completions, and the [data] keys a DPO job reads."""
    for key, where in (("path", data.path), ("eval_path", data.eval_path)):
        if where is not None and not (isinstance(where, Path) and where.is_file()):
            c.problem(
                f"data.{key}", f"{where}: a KTO job reads a local JSON or JSON Lines file of labelled completions"
            )
    for key in sorted(set(table) - DPO_DATA_KEYS):
        hint = "[kto] max_length, as TRL's KTOConfig" if key == "max_length" else None
        c.problem(f"data.{key}", 'not read for task = "kto"', hint)


def _training(c: Collector, table: dict[str, Any]) -> Training | None:
    if table is BAD:
        return None
    try:
        return Training.from_dict(table)
    except ConfigError as e:
        c.problems.extend(e.problems)
        return None
