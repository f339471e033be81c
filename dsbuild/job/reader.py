"""Reading a job file: every table checked, every problem collected under its ``section.key`` path."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from functools import cache
from pathlib import Path
from typing import Any, Final

import attrs

from .._util import dotted
from .._util.safe_read import real_path, special_file
from .._util.suggest import did_you_mean
from ..api import Config
from ..config import PASSTHROUGH_KEYS
from ..config.fields import Spec, check_value, coerce, describe, key_of
from ..config.walk import leaves
from ..errors import ConfigError, DsbuildError, Problem
from ..io.config_files import config_ref, merge, read_dict, read_table, to_config
from ..io.presets import preset_path
from ..resolve.resolution import model_hidden_size
from ..resolve.training import Training
from .complete import complete
from .devices import parse_device_mapping
from .formats import (
    DATA_SUFFIXES,
    FIELDS,
    FORMATS,
    TEMPLATE_KEYS,
    TEMPLATED_FORMATS,
    TEMPLATES,
    is_hub_id,
    template_problems,
)
from .spec import (
    ALSO_READ,
    ATTN_IMPLEMENTATIONS,
    BYTE_TOKENIZER,
    BYTE_VOCAB,
    JOB_TABLES,
    STRATEGIES,
    DataSpec,
    LaunchSpec,
    LoraSpec,
    ModelSpec,
    StrategySpec,
    job_keys,
    table_keys,
)

__all__ = ["JobReader", "is_job", "looks_like_job", "read_job_dict"]

_HINTS: Final = {
    "": {
        "model_args": "[model]",
        "training_args": "[training]",
        "data_args": "[data]",
        "strategy_args": "[strategy]",
        "device_mapping": "launch.device_mapping",
        "infer_batch_size": "launch.infer_batch_size",
        "deepspeed": "strategy.config",
    },
    "model": {
        "model_name_or_path": "name_or_path",
        "pretrain": "name_or_path",
        "model_type": "model.config.model_type",
        "disable_gradient_checkpointing": "gradient_checkpointing (the opposite)",
        "lora_rank": "model.lora.r",
        "lora_alpha": "model.lora.alpha",
        "lora_dropout": "model.lora.dropout",
        "lora_target": "model.lora.target_modules",
        "torch_dtype": "dtype",
    },
    "model.lora": {"lora_alpha": "alpha", "lora_dropout": "dropout", "lora_target": "target_modules"},
    "data": {"file_name": "path", "train_path": "path", "validation_path": "eval_path", "max_seq_length": "max_length"},
    "strategy": {"strategy_name": "name", "strategy_config": "config"},
    "launch": {"nproc": "nproc_per_node", "num_nodes": "nnodes", "num_gpus_per_node": "gpus_per_node"},
}
"""Where a key of another spelling (ROLL's, HF's) goes: ``did you mean`` by meaning, not by letters."""


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


_FIELD_DEFAULT: Final = object()
"""``JobReader.field``'s default: the field's own."""

_BAD: Final[dict[str, Any]] = {}
"""Stands for a section that is not a table (already reported): its contents are not checked."""


class JobReader:
    """Reads a job table into the fields of a ``Job``, collecting every problem (each under its ``section.key`` path)."""

    def __init__(self, base_dir: Path, source: str | None, name: str, output_base: Path | None = None) -> None:
        self.base_dir = base_dir
        self.output_base = output_base if output_base is not None else base_dir
        """What a relative ``training.output_dir`` (and the default ``out/<name>``) is under: the job file's folder."""
        self.source = source
        self.name = name
        self.problems: list[Problem] = []
        self.unreadable = False
        """Whether a file the job names (``strategy.config``) could not be read: then its error is exit 2, not 1."""

    # -- helpers

    def problem(self, path: str, message: str, hint: str | None = None) -> None:
        self.problems.append(Problem(path, message, hint))

    def unknown_key(self, path: str, hint: str | None) -> None:
        self.problems.append(Problem.unknown_key(path, hint))

    def table(self, data: Mapping[str, Any], key: str, path: str) -> dict[str, Any]:
        """The table at ``key`` (``{}`` when absent); one that is not a table is a problem, and ``BAD`` then."""
        value = data.get(key)
        if value is None:
            return {}
        if not isinstance(value, Mapping):
            self.problem(path, f"got {describe(value)}, expected a table")
            return _BAD
        return dict(value)

    def unknown(self, table: Mapping[str, Any], known: Sequence[str], path: str) -> None:
        hints = _HINTS.get(path, {})
        for key in table:
            if key in known:
                continue
            where = f"{path}.{key}" if path else str(key)
            if key in hints:
                self.unknown_key(where, f"did you mean {hints[key]}?")
            elif not path and key in _ds_keys():
                self.unknown_key(where, f"ds_config keys go under [strategy.overrides]: strategy.overrides.{key}")
            else:
                self.unknown_key(where, did_you_mean(str(key), known))

    def value(self, table: Mapping[str, Any], key: str, path: str, spec: Spec, default: Any = None) -> Any:
        if key not in table:
            return default
        value = coerce(spec, table[key])
        message = check_value(spec, value)
        if message is not None:
            self.problem(f"{path}.{key}", message)
            return default
        return value

    def field(self, table: Mapping[str, Any], cls: type, name: str, path: str, default: Any = _FIELD_DEFAULT) -> Any:
        """The key ``name`` of the table at ``path``, read as its field of ``cls`` says (``job_keys``); the field's
        default (or ``default``) where it is absent or wrong (then a problem)."""
        key = job_keys(cls)[name]
        assert key.spec is not None, f"{cls.__name__}.{name} is read by hand"
        if default is _FIELD_DEFAULT:
            value = attrs.fields_dict(cls)[name].default
            default = None if value is attrs.NOTHING or isinstance(value, attrs.Factory) else value  # type: ignore[arg-type]
        return self.value(table, name, path, key.spec, default)

    def data_source(self, value: str, path: str, *, what: str) -> Path | str | None:
        """A data file or folder (made absolute), or a hub dataset id (kept); anything else is a problem at ``path``."""
        candidate = real_path(self.base_dir / Path(value).expanduser())
        special = special_file(candidate)
        if special is not None:  # reading it would hang (a FIFO) or never end (a device)
            self.problem(path, f"{str(candidate)!r} is {special}", f"expected {what}: a data file or folder")
            return None
        if candidate.is_file():
            if candidate.suffix.lower() in DATA_SUFFIXES:
                return candidate
            self.problem(
                path,
                f"not a data file dsbuild reads: {str(candidate)!r}",
                f"expected {', '.join(DATA_SUFFIXES)}, a folder of them, a save_to_disk folder or a hub dataset id",
            )
            return None
        if candidate.is_dir():
            return candidate
        if is_hub_id(value):
            return value
        self.problem(path, f"no such file: {str(candidate)!r}", f"{what}, relative to the job file")
        return None

    def local_or_hub(self, value: str) -> str:
        """A local directory (made absolute) or a hub id (kept)."""
        candidate = real_path(self.base_dir / Path(value).expanduser())
        return str(candidate) if candidate.exists() else value

    # -- the job

    def job(self, data: Mapping[str, Any]) -> dict[str, Any]:
        """The fields of a ``Job``; one ``ConfigError`` (``source``: the file) listing every problem."""
        if not isinstance(data, Mapping):
            raise ConfigError(Problem("", f"got {describe(data)}, expected a table"), source=self.source)
        self.unknown(data, [*JOB_TABLES, "description"], "")
        description = data.get("description")
        if description is not None and not isinstance(description, str):
            self.problem("description", f"got {describe(description)}, expected a string")
            description = None
        for key in ("model", "data", "training", "strategy"):
            if key not in data:
                self.problem(key, f"missing: a job needs a [{key}] table")
        tables = {key: self.table(data, key, key) for key in JOB_TABLES}
        model = self.model(tables["model"]) if tables["model"] is not _BAD else None
        data_spec = self.data(tables["data"]) if tables["data"] is not _BAD else None
        raw_training = dict(tables["training"])
        training = self.training(raw_training) if tables["training"] is not _BAD else None
        strategy = self.strategy(tables["strategy"]) if tables["strategy"] is not _BAD else None
        launch = self.launch(tables["launch"]) if tables["launch"] is not _BAD else None

        config = training_done = None
        if strategy is not None and training is not None:
            try:
                training_done, config = complete(strategy.config, training, explicit=set(raw_training), name=self.name)
                assert training_done.output_dir is not None  # complete() sets it
                where = self.output_base / Path(training_done.output_dir).expanduser()
                training_done = attrs.evolve(training_done, output_dir=str(Path(os.path.abspath(where))))
            except ConfigError as e:
                self.problems.extend(e.problems)
        if self.problems or None in (model, data_spec, training_done, strategy, launch, config):
            raise ConfigError(self.problems, source=self.source, checks=not self.unreadable)
        return dict(
            model=model,
            data=data_spec,
            training=training_done,
            strategy=strategy,
            launch=launch,
            config=config,
            source=self.source,
            description=description,
        )

    def model(self, t: dict[str, Any]) -> ModelSpec | None:
        self.unknown(t, table_keys(ModelSpec), "model")
        before = len(self.problems)
        name = self.field(t, ModelSpec, "name_or_path", "model")
        config = self.table(t, "config", "model.config") if "config" in t else None
        if name is not None and config is not None:
            self.problem("model", "both name_or_path and [model.config] are set", "keep one")
        elif name is None and config is None and "name_or_path" not in t:
            self.problem(
                "model.name_or_path",
                "missing: give a model directory or hub id, or a [model.config] table with model_type",
            )
        if config is _BAD:
            config = None  # reported; nothing inside it to check
        elif config is not None:
            model_type = config.get("model_type")
            if not isinstance(model_type, str) or not model_type:
                got = "missing" if model_type is None else f"got {describe(model_type)}, expected a string"
                self.problem("model.config.model_type", got, 'e.g. model_type = "llama"')
        tokenizer = self.field(t, ModelSpec, "tokenizer", "model")
        if tokenizer is None and config is not None and name is None and "tokenizer" not in t:
            self.problem(
                "model.tokenizer",
                "missing: a model built from [model.config] needs a tokenizer",
                f'use "{BYTE_TOKENIZER}" for the built-in byte-level tokenizer, or a tokenizer directory / hub id',
            )
        if tokenizer == BYTE_TOKENIZER and config is not None:
            vocab = config.get("vocab_size")
            if isinstance(vocab, int) and vocab < BYTE_VOCAB:
                self.problem(
                    "model.config.vocab_size",
                    f"got {vocab}, expected at least {BYTE_VOCAB} for the byte tokenizer",
                    f"set vocab_size = {BYTE_VOCAB}",
                )
        if tokenizer is not None and tokenizer != BYTE_TOKENIZER:
            tokenizer = self.local_or_hub(tokenizer)
        dtype = self.field(t, ModelSpec, "dtype", "model")
        attn = t.get("attn_implementation")
        if attn == "fa2":  # ROLL's spelling
            attn = "flash_attention_2"
        if attn is not None and not (isinstance(attn, str) and (attn in ATTN_IMPLEMENTATIONS or "/" in attn)):
            choices = ", ".join(map(repr, ATTN_IMPLEMENTATIONS))
            self.problem(
                "model.attn_implementation",
                f"got {describe(attn)}, expected one of {choices} or a kernels hub id",
                did_you_mean(attn, ATTN_IMPLEMENTATIONS) if isinstance(attn, str) else None,
            )
            attn = None
        checkpointing = self.field(t, ModelSpec, "gradient_checkpointing", "model")
        lora = self.lora(self.table(t, "lora", "model.lora")) if "lora" in t else None
        if len(self.problems) > before:
            return None
        name_or_path = self.local_or_hub(name) if name is not None else None
        return ModelSpec(
            name_or_path=name_or_path,
            config=config,
            tokenizer=tokenizer,
            dtype=dtype,
            attn_implementation=attn,
            gradient_checkpointing=checkpointing,
            lora=lora,
            hidden_size=_hidden_size(config, name_or_path),
        )

    def lora(self, t: dict[str, Any]) -> LoraSpec | None:
        self.unknown(t, table_keys(LoraSpec), "model.lora")
        before = len(self.problems)
        if "r" in t and "rank" in t:
            self.problem("model.lora.rank", "both r and rank are set (the same thing)", "keep one")
        rank_key = "rank" if "rank" in t and "r" not in t else "r"
        spec = job_keys(LoraSpec)["r"].spec
        assert spec is not None
        r = self.value(t, rank_key, "model.lora", spec, 8)  # reported under the name written (r or rank)
        alpha = self.field(t, LoraSpec, "alpha", "model.lora")
        dropout = self.field(t, LoraSpec, "dropout", "model.lora")
        target = t.get("target_modules")
        if isinstance(target, str) and target != "all-linear":
            target = tuple(x.strip() for x in target.split(",") if x.strip())  # ROLL's "o_proj,q_proj"
        elif isinstance(target, list):
            target = tuple(target)
        if target is not None and not (
            target == "all-linear"
            or (isinstance(target, tuple) and target and all(isinstance(x, str) and x for x in target))
        ):
            self.problem(
                "model.lora.target_modules",
                f'got {describe(t.get("target_modules"))}, expected a list of module names or "all-linear"',
            )
        merge = self.field(t, LoraSpec, "merge", "model.lora")
        if len(self.problems) > before:
            return None
        return LoraSpec(r=r, alpha=alpha, dropout=dropout, target_modules=target, merge=merge)

    def data(self, t: dict[str, Any]) -> DataSpec | None:
        self.unknown(t, table_keys(DataSpec), "data")
        before = len(self.problems)
        if "path" not in t:
            self.problem("data.path", "missing: the training records (a data file or folder, or a hub dataset id)")
        if "format" not in t:
            self.problem("data.format", f"missing: one of {', '.join(map(repr, FORMATS))}")
        raw_path = self.field(t, DataSpec, "path", "data")
        fmt = self.field(t, DataSpec, "format", "data")
        max_length = self.field(t, DataSpec, "max_length", "data")
        raw_eval = self.field(t, DataSpec, "eval_path", "data")
        eval_split = self.eval_split(t.get("eval_split"))
        split = self.field(t, DataSpec, "split", "data")
        template = self.prompt_template(t.get("template", "alpaca"))
        chat_template = self.field(t, DataSpec, "chat_template", "data")
        columns = self.columns(t, fmt)
        packing = self.field(t, DataSpec, "packing", "data")
        train_on_prompt = self.field(t, DataSpec, "train_on_prompt", "data")
        strategy = self.field(t, DataSpec, "packing_strategy", "data")
        padding_free = self.field(t, DataSpec, "padding_free", "data")
        assistant_only = self.field(t, DataSpec, "assistant_only_loss", "data")
        completion_only = self.field(t, DataSpec, "completion_only_loss", "data")
        eos_token = self.field(t, DataSpec, "eos_token", "data")
        if train_on_prompt:
            for key in ("assistant_only_loss", "completion_only_loss"):
                if t.get(key) is True:
                    self.problem(
                        f"data.{key}", f"both train_on_prompt and {key} are set, and they disagree", "keep one"
                    )
        if "packing_strategy" in t and packing is False:
            self.problem("data.packing_strategy", "set, but packing is off", "set packing = true, or drop it")
        if eos_token == "":
            self.problem("data.eos_token", 'empty, expected a token (e.g. "<|im_end|>")')
        num_proc = self.field(t, DataSpec, "num_proc", "data")
        if raw_eval and eval_split is not None:
            self.problem("data.eval_split", "both eval_path and eval_split are set", "keep one")
        if chat_template is not None and fmt is not None and fmt not in TEMPLATED_FORMATS:
            chats = ", ".join(map(repr, TEMPLATED_FORMATS))
            self.problem("data.chat_template", f"only {chats} records use a chat template; the format is {fmt!r}")
        path = self.data_source(raw_path, "data.path", what="the training records") if raw_path is not None else None
        eval_path = self.data_source(raw_eval, "data.eval_path", what="the evaluation records") if raw_eval else None
        if len(self.problems) > before or path is None:
            return None
        return DataSpec(
            path=path,
            format=fmt,
            max_length=max_length,
            eval_path=eval_path,
            eval_split=eval_split,
            split=split,
            template=template,
            chat_template=chat_template,
            columns=columns,
            packing=packing,
            train_on_prompt=train_on_prompt,
            assistant_only_loss=assistant_only,
            completion_only_loss=completion_only,
            packing_strategy=strategy,
            padding_free=padding_free,
            eos_token=eos_token,
            num_proc=num_proc,
        )

    def eval_split(self, value: Any) -> float | str | None:
        """``data.eval_split``: a fraction of the training records, or the name of a split of their source."""
        if value is None or (isinstance(value, str) and value):
            return value
        if isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value < 1:
            return float(value)
        self.problem(
            "data.eval_split",
            f'got {describe(value)}, expected a fraction between 0 and 1 (0.05) or the name of a split ("test")',
        )
        return None

    def prompt_template(self, value: Any) -> str | tuple[str, str]:
        """``data.template``: a packaged template's name, or a table of the two prompts."""
        if isinstance(value, str) and value in TEMPLATES:
            return value
        if not isinstance(value, Mapping):
            names = ", ".join(map(repr, TEMPLATES))
            self.problem(
                "data.template",
                f"got {describe(value)}, expected one of {names} or a table with {' and '.join(TEMPLATE_KEYS)}",
                did_you_mean(value, TEMPLATES) if isinstance(value, str) else None,
            )
            return "alpaca"
        self.unknown(value, TEMPLATE_KEYS, "data.template")
        prompts = {}
        for key in TEMPLATE_KEYS:
            text = value.get(key)
            if isinstance(text, str):
                prompts[key] = text
            else:
                got = "missing" if text is None else f"got {describe(text)}, expected a string"
                self.problem(f"data.template.{key}", got)
        for key, message in template_problems(prompts):
            self.problem(f"data.template.{key}", message)
        if len(prompts) < len(TEMPLATE_KEYS):
            return "alpaca"
        return prompts["prompt_no_input"], prompts["prompt_input"]

    def columns(self, t: Mapping[str, Any], fmt: str | None) -> dict[str, str]:
        """``[data.columns]`` (and ``data.text_field``): the file's names for the format's fields."""
        table = self.table(t, "columns", "data.columns")
        if table is _BAD:
            return {}
        fields = FIELDS.get(fmt or "", ())
        if fields:
            self.unknown(table, fields, "data.columns")
        columns = {}
        for key, name in table.items():
            if not isinstance(name, str) or not name:
                self.problem(f"data.columns.{key}", f"got {describe(name)}, expected a field name")
            elif key in fields or not fields:
                columns[key] = name
        for key in ("text_field", "dataset_text_field"):  # dsbuild's name and TRL's
            also = ALSO_READ[DataSpec][key]
            assert also.spec is not None
            text_field = self.value(t, key, "data", also.spec)
            if text_field is not None:
                if columns.get("text", text_field) != text_field:
                    self.problem(f"data.{key}", "the text field is named twice, differently", "keep one")
                columns["text"] = text_field
        return {key: name for key, name in columns.items() if name != key}

    def training(self, t: dict[str, Any]) -> Training | None:
        try:
            return Training.from_dict(t)
        except ConfigError as e:
            self.problems.extend(e.problems)
            return None

    def strategy(self, t: dict[str, Any]) -> StrategySpec | None:
        self.unknown(t, table_keys(StrategySpec), "strategy")
        before = len(self.problems)
        name = t.get("name", STRATEGIES[0])
        if name not in STRATEGIES:
            listing = ", ".join(map(repr, STRATEGIES))
            self.problem(
                "strategy.name",
                f"got {describe(name)}, expected {listing} (the only strategy dsbuild runs)",
                did_you_mean(name, STRATEGIES) if isinstance(name, str) else None,
            )
        overrides = self.table(t, "overrides", "strategy.overrides")
        ref = t.get("config")
        base: dict[str, Any] | None
        if ref is None:
            self.problem(
                "strategy.config",
                'missing: a preset name (e.g. "zero3"), a config file, or a table of ds_config keys',
            )
            base, label = None, ""
        elif isinstance(ref, Mapping):
            base, label = dict(ref), "inline table"
        elif isinstance(ref, str) and ref:
            base, label = self.config_file(ref)
        else:
            self.problem("strategy.config", f"got {describe(ref)}, expected a preset name, a file or a table")
            base, label = None, ""
        if base is None:
            return None
        merged = merge(base, overrides)
        try:
            config = to_config(
                merged, source=self.source or "job", label=f"{label} in {self.source or 'job'}", cls=Config
            )
        except ConfigError as e:
            for p in e.problems:
                inside = dotted.sets(overrides, p.path)
                self.problems.append(p.prefixed("strategy.overrides" if inside else "strategy.config"))
            return None
        if len(self.problems) > before:
            return None
        where = f"[strategy.overrides] in {self.source or 'job'}"
        marks = {path: where for path, _ in leaves(overrides)}
        config = attrs.evolve(config, provenance={**config.provenance, **marks})
        return StrategySpec(name=name, config=config, ref=label, overrides=overrides)

    def config_file(self, ref: str) -> tuple[dict[str, Any] | None, str]:
        """The ds_config dict a ``strategy.config`` string names: a file next to the job, or a preset."""
        try:
            file = config_ref(ref, self.base_dir)  # the rule Session and the CLI follow
            if file is not None:
                data, _ = read_dict(real_path(file))
                return data, f"file {ref}"
            data, _ = read_dict(preset_path(ref))
            return data, f"preset {ref}"
        except ConfigError as e:
            where = f"{e.source}: " if e.source else ""
            for p in e.problems:
                self.problem("strategy.config", f"{where}{p}")
            self.unreadable = self.unreadable or not e.fails_checks
            return None, ""

    def launch(self, t: dict[str, Any]) -> LaunchSpec | None:
        self.unknown(t, table_keys(LaunchSpec), "launch")
        before = len(self.problems)
        nproc = self.field(t, LaunchSpec, "nproc_per_node", "launch", default=None)  # None: from device_mapping
        nnodes = self.field(t, LaunchSpec, "nnodes", "launch")
        gpus = self.field(t, LaunchSpec, "gpus_per_node", "launch")
        infer = self.field(t, LaunchSpec, "infer_batch_size", "launch")
        backend = self.field(t, LaunchSpec, "backend", "launch")
        failures = self.field(t, LaunchSpec, "max_failures", "launch")
        storage = self.field(t, LaunchSpec, "storage_path", "launch")
        mapping: tuple[int, ...] | None = None
        if "device_mapping" in t:
            try:
                mapping = parse_device_mapping(t["device_mapping"])
            except ConfigError as e:
                self.problems.extend(p.prefixed("launch.device_mapping") for p in e.problems)
        if len(self.problems) > before:
            return None
        if mapping is not None:
            if nproc is None:
                if len(mapping) % nnodes:
                    self.problem(
                        "launch.device_mapping",
                        f"{len(mapping)} devices cannot be shared evenly by {nnodes} nodes",
                        "list nproc_per_node x nnodes devices",
                    )
                    return None
                nproc = len(mapping) // nnodes
            elif len(mapping) != nproc * nnodes:
                self.problem(
                    "launch.device_mapping",
                    f"{len(mapping)} devices for {nnodes} node(s) x {nproc} process(es) per node",
                    "list one device per process, or leave nproc_per_node out",
                )
                return None
        return LaunchSpec(
            nproc_per_node=nproc or 1,
            nnodes=nnodes,
            device_mapping=mapping,
            gpus_per_node=gpus,
            infer_batch_size=infer,
            backend=backend,
            max_failures=failures,
            storage_path=storage,
        )


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
    if not isinstance(table, Mapping):
        return None
    found = model_hidden_size(table)
    return found if isinstance(found, int) else None


@cache
def _ds_keys() -> frozenset[str]:
    """The top-level ds_config keys (for "this goes under [strategy.overrides]")."""
    return frozenset({key_of(a) for a in attrs.fields(Config) if not a.name.startswith("_")} | set(PASSTHROUGH_KEYS))
