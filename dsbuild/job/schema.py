"""The JSON Schema (draft 2020-12) of a job file, generated from the same field metadata the job reader follows.

Each table's keys are its spec class's fields with a ``Key`` (``spec.job_keys``): a ``Spec`` gives the type, bounds
and choices as it does for a ds_config, a key read by hand carries its own schema, and the attribute docstring is
the description. ``[training]`` comes from ``Training``'s metadata (the HF argument names), ``strategy.config`` and
``[strategy.overrides]`` from the ds_config schema (``io.schema``). What it cannot say (both ``name_or_path`` and
``[model.config]``, rules between keys, files that must exist) is ``dsbuild validate``'s.
"""

from __future__ import annotations

from typing import Any

import attrs

from .._util.docstrings import attribute_docs, one_line
from ..io.schema import DIALECT, json_schema, value_schema
from ..resolve.training import Training
from ..version import VERSION
from .spec import DataSpec, LaunchSpec, LoraSpec, ModelSpec, StrategySpec, job_keys
from .tasks import JOB_TASKS, TABLE_SPECS

__all__ = ["job_schema"]

_TABLES: dict[str, type] = {
    "model": ModelSpec, "data": DataSpec, "strategy": StrategySpec, "launch": LaunchSpec, **TABLE_SPECS,
}  # fmt: skip
_REQUIRED: dict[type, list[str]] = {DataSpec: ["path", "format"], StrategySpec: ["config"]}


def _tasks_text() -> str:
    """``task``'s description: each task, TRL's trainer it equals and the tables it reads."""
    said = []
    for task in JOB_TASKS.values():
        tables = ", ".join(f"[{t}]" for t in task.tables)
        trainer = task.config.removesuffix("Config") + "Trainer"
        said.append(f'"{task.name}" (TRL\'s {trainer}' + (f": {tables} are read)" if tables else ")"))
    return f"What the job trains: {', '.join(said[:-1])} or {said[-1]}."


def job_schema() -> dict[str, Any]:
    """The JSON Schema of a job file, TOML or JSON (a new dict on each call)."""
    ds_config = json_schema()
    defs: dict[str, Any] = ds_config.pop("$defs")
    ds_config.pop("$schema")
    defs["ds_config"] = ds_config
    defs["job.model.lora"] = _table(LoraSpec)
    properties: dict[str, Any] = {
        "description": {"type": "string", "description": "A one-line description of the job."},
        "task": {
            "enum": list(JOB_TASKS),
            "default": "sft",
            "description": _tasks_text(),
        },
        "training": _training(),
    }
    for name, cls in _TABLES.items():
        properties[name] = _table(cls)
    model = properties["model"]
    model["anyOf"] = [{"required": ["name_or_path"]}, {"required": ["config"]}]
    properties["rewards"]["anyOf"] = [{"required": ["functions"]}, {"required": ["models"]}]  # either, as the reader
    return {
        "$schema": DIALECT,
        "title": "dsbuild job file",
        "description": f"A training job as dsbuild {VERSION} reads it (docs/jobs.md), generated from its spec classes "
        "(rules between keys, and the files it names, are `dsbuild validate`'s).",
        "type": "object",
        "properties": {
            key: properties[key]
            for key in ("description", "task", "model", "data", "training", "strategy", "launch", *_TABLES)
            if key in properties
        },
        "required": ["model", "data", "training", "strategy"],
        "additionalProperties": False,
        "$defs": defs,
    }


def _table(cls: type) -> dict[str, Any]:
    """The object schema of the job table ``cls`` reads: its keys, their other spellings, nothing else."""
    docs = attribute_docs(cls)
    properties: dict[str, Any] = {}
    for name, key in job_keys(cls).items():
        schema = dict(value_schema(key.spec)) if key.spec is not None else dict(key.schema or {})
        doc = one_line(docs.get(name))
        if doc and "$ref" not in schema:
            schema["description"] = doc
        properties[name] = schema
        for alias in key.aliases:
            properties[alias] = {**schema, "description": f"The same as {name}."}
    table: dict[str, Any] = {"type": "object", "properties": properties, "additionalProperties": False}
    if cls.__doc__:
        table["description"] = one_line(cls.__doc__)
    if cls in _REQUIRED:
        table["required"] = _REQUIRED[cls]
    return table


def _training() -> dict[str, Any]:
    """``[training]``: the HF Trainer's argument names dsbuild takes, each as ``Training`` checks it."""
    docs = attribute_docs(Training)
    properties: dict[str, Any] = {}
    for a in attrs.fields(Training):
        if "training" not in a.metadata:
            continue
        spec, optional = a.metadata["training"]
        schema = value_schema(spec)
        if optional:
            schema = {"anyOf": [schema, {"type": "null"}]}
        doc = one_line(docs.get(a.name))
        properties[a.name] = {**schema, "description": doc} if doc else schema
    return {
        "type": "object",
        "description": "The HF Trainer's training arguments, by their names (TrainingArguments).",
        "properties": properties,
        "additionalProperties": False,
    }
