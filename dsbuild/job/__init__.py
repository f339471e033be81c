"""Job files: one TOML describing a training run (ROLL's ``deepspeed_train`` worker), read into a frozen ``Job``.

A job file has five tables::

    [model]      name_or_path, or [model.config] (model_type + fields) for a model built from its config;
                 tokenizer ("byte" = ByT5's byte-level tokenizer, no files), dtype, attn_implementation,
                 gradient_checkpointing; optional [model.lora] r, alpha, dropout, target_modules
    [data]       path (a file, folder or hub id), format ("text" | "alpaca" | "messages" | "sharegpt"), max_length,
                 eval_path or eval_split, split, template, chat_template, [data.columns], packing,
                 train_on_prompt, num_proc
    [training]   the Training fields (HF TrainingArguments names)
    [strategy]   name = "deepspeed_train"; config = a preset name, a file, or an inline table;
                 [strategy.overrides] any ds_config keys, deep-merged over the config
    [launch]     nproc_per_node, nnodes, device_mapping ([0, 1], "0-15", "0,1,2", "list(range(0,16))"),
                 gpus_per_node, infer_batch_size

Every relative path in a job (``[model]``, ``[data]``, ``strategy.config`` and ``training.output_dir``, default
``out/<job file name>``) is relative to the job file. ``device_mapping`` is parsed, never evaluated.

``load_job`` reports every problem of the file at once, in one ``ConfigError``
whose ``source`` is the file, each under its ``section.key`` path. What needs the
whole run to judge (the strategy config resolved against the training arguments,
the model's hidden size and the world size) is ``Job.validate()``'s job, with the
config's diagnostics under ``strategy.config.`` (``strategy.overrides.`` for a key the overrides set).

The run's ds_config (``Job.config``) is the strategy config completed the way the
HF Trainer completes it: the training arguments fill what the config leaves unset
(batch sizes, clipping, an AdamW optimizer, a scheduler for ``lr_scheduler_type``,
bf16/fp16) as ``"auto"``; a value the config sets explicitly is taken over by the
training arguments the ``[training]`` table does not set, so a config and a table
that each set a value once never disagree. Values set in both must agree
(``validate`` reports a conflict otherwise).

The package's rooms: ``spec`` (the parts of a job, each key a field with its metadata), ``collect`` (the one
reader of a table, driven by that metadata), ``readers`` (the keys read by hand and each table's checks, declared
by table), ``tasks`` (each task as a job file states it, one module each, looked up by name), ``reader`` (a job's
tables read together), ``complete`` (the run's training arguments and config), ``devices`` (``device_mapping``),
``formats`` (the ``[data]`` formats) and ``core`` (``Job``, ``load_job``).

Nothing here imports torch, deepspeed, transformers or peft.
"""

from .core import Job, demo_job_path, load_job
from .devices import MAX_DEVICES, parse_device_mapping
from .formats import FORMATS, TEMPLATES
from .reader import is_job, looks_like_job, read_job_dict
from .spec import (
    BYTE_TOKENIZER,
    JOB_TABLES,
    STRATEGIES,
    DataSpec,
    LaunchSpec,
    LoraSpec,
    ModelSpec,
    StrategySpec,
)

__all__ = [
    "BYTE_TOKENIZER",
    "FORMATS",
    "JOB_TABLES",
    "MAX_DEVICES",
    "STRATEGIES",
    "TEMPLATES",
    "DataSpec",
    "Job",
    "LaunchSpec",
    "LoraSpec",
    "ModelSpec",
    "StrategySpec",
    "demo_job_path",
    "is_job",
    "load_job",
    "looks_like_job",
    "parse_device_mapping",
    "read_job_dict",
]
