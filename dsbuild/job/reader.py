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
from .spec import JOB_TABLES, DataSpec, LaunchSpec, ModelSpec, StrategySpec
from .tasks import JOB_TASKS, JobTask, Reading, claims, task_tables

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
    c.unknown(data, [*JOB_TABLES, "description", "task", *(t for ts in task_tables().values() for t in ts)], "")
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
    rl = task.read_tables(c, data)
    if data_spec is not None:
        task.check_data(c, data_spec, tables["data"], claims(JOB_TASKS))
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
    task.checks(Reading(c, rl, done, launch))
    if c.problems or None in (model, data_spec, done, strategy, launch, config):
        raise ConfigError(c.problems, source=source, checks=not c.unreadable)
    assert done is not None and done.output_dir is not None  # complete() sets it
    where = (output_base or base_dir) / Path(done.output_dir).expanduser()
    done = attrs.evolve(done, output_dir=os.path.abspath(where))
    return dict(model=model, data=data_spec, training=done, strategy=strategy, launch=launch, config=config,
                source=source, description=description, task=task.name, **rl)  # fmt: skip


def _task(c: Collector, data: Mapping[str, Any]) -> JobTask:
    """``task`` (default ``"sft"``); the tables of another task than the job's are problems."""
    name = data.get("task", "sft")
    if name not in JOB_TASKS:
        c.problem("task", f"got {describe(name)}, expected one of {', '.join(map(repr, JOB_TASKS))}")
        return JOB_TASKS["sft"]
    task = JOB_TASKS[name]
    by_task = task_tables()
    for table in dict.fromkeys(t for tables in by_task.values() for t in tables):
        if table in data and table not in task.tables:
            readers = [other for other, tables in by_task.items() if table in tables]
            by = " or ".join(f"task = {other!r}" for other in readers)
            c.problem(table, f"[{table}] is read by {by}; this job's task is {name!r}",
                      f'set task = "{readers[0]}", or leave [{table}] out')  # fmt: skip
    return task


def _training(c: Collector, table: dict[str, Any]) -> Training | None:
    if table is BAD:
        return None
    try:
        return Training.from_dict(table)
    except ConfigError as e:
        c.problems.extend(e.problems)
        return None
