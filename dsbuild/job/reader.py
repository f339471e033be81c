"""Reading a job file: every table read by the one collector (``collect.Collector``, from the tables' field metadata
and the readers and checks they declare in ``readers``), every problem collected under its ``section.key`` path."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs

from ..config.fields import describe
from ..errors import ConfigError, DsbuildError, Problem
from ..io.config_files import read_table
from ..resolve.training import Training
from .collect import BAD, Collector
from .complete import complete
from .readers import CHECKS, READERS
from .rl import DPOSpec
from .spec import JOB_TABLES, TASK_TABLES, TASKS, DataSpec, LaunchSpec, ModelSpec, ReferenceSpec, StrategySpec

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
    reference = (
        c.collect(ReferenceSpec, c.table(data, "reference", "reference"), "reference") if task == "dpo" else None
    )
    dpo = c.collect(DPOSpec, c.table(data, "dpo", "dpo"), "dpo") if task == "dpo" else None
    if data_spec is not None:
        _task_data(c, task, data_spec, tables["data"])
    config = done = None
    if strategy is not None and training is not None:
        try:
            done, config = complete(strategy.config, training, explicit=set(tables["training"]), name=name)
        except ConfigError as e:
            c.problems.extend(e.problems)
    if c.problems or None in (model, data_spec, done, strategy, launch, config):
        raise ConfigError(c.problems, source=source, checks=not c.unreadable)
    assert done is not None and done.output_dir is not None  # complete() sets it
    where = (output_base or base_dir) / Path(done.output_dir).expanduser()
    done = attrs.evolve(done, output_dir=os.path.abspath(where))
    return dict(model=model, data=data_spec, training=done, strategy=strategy, launch=launch, config=config,
                source=source, description=description, task=task, reference=reference, dpo=dpo)  # fmt: skip


DPO_DATA_KEYS = frozenset({"path", "eval_path", "format", "chat_template"})
"""The ``[data]`` keys a DPO job reads (the pairs' length and truncation are ``[dpo]``'s, as TRL's ``DPOConfig``)."""


def _task(c: Collector, data: Mapping[str, Any]) -> str:
    """``task`` (default ``"sft"``); the tables of another task than the job's are problems."""
    task = data.get("task", "sft")
    if task not in TASKS:
        c.problem("task", f"got {describe(task)}, expected one of {', '.join(map(repr, TASKS))}")
        return "sft"
    for other, tables in TASK_TABLES.items():
        for table in tables:
            if other != task and table in data:
                c.problem(table, f"[{table}] is read by task = {other!r}; this job's task is {task!r}",
                          f'set task = "{other}", or leave [{table}] out')  # fmt: skip
    return str(task)


def _task_data(c: Collector, task: str, data: DataSpec, table: Mapping[str, Any]) -> None:
    """Preference data is DPO's and DPO reads only preference data; the [data] keys DPO does not read are problems."""
    if (task == "dpo") != (data.format == "preference"):
        wanted = 'format = "preference" (prompt / chosen / rejected)' if task == "dpo" else 'task = "dpo"'
        c.problem("data.format", f"got {data.format!r} for task = {task!r}", f"a DPO job reads pairs: {wanted}")
    if task == "dpo":
        for key, where in (("path", data.path), ("eval_path", data.eval_path)):
            if where is not None and not (isinstance(where, Path) and where.is_file()):
                c.problem(f"data.{key}", f"{where}: a DPO job reads a local JSON or JSON Lines file of pairs")
        for key in sorted(set(table) - DPO_DATA_KEYS):
            hint = "[dpo] max_length and truncation_mode, as TRL's DPOConfig" if key == "max_length" else None
            c.problem(f"data.{key}", 'not read for task = "dpo"', hint)


def _training(c: Collector, table: dict[str, Any]) -> Training | None:
    if table is BAD:
        return None
    try:
        return Training.from_dict(table)
    except ConfigError as e:
        c.problems.extend(e.problems)
        return None
