"""Job files: one TOML describing a training run (ROLL's ``deepspeed_train`` worker), read into a frozen ``Job``.

A job file has five tables::

    [model]      name_or_path, or [model.config] (model_type + fields) for a model built from its config;
                 tokenizer ("byte" = ByT5's byte-level tokenizer, no files), dtype, attn_implementation,
                 gradient_checkpointing; optional [model.lora] r, alpha, dropout, target_modules
    [data]       path, format ("alpaca" | "text"), max_length, eval_path, template, text_field
    [training]   the Training fields (HF TrainingArguments names), plus eval_steps
    [strategy]   name = "deepspeed_train"; config = a preset name, a file, or an inline table;
                 [strategy.overrides] any ds_config keys, deep-merged over the config
    [launch]     nproc_per_node, nnodes, device_mapping ([0, 1], "0-15", "0,1,2", "list(range(0,16))"),
                 gpus_per_node, infer_batch_size

Paths in ``[model]``, ``[data]`` and ``strategy.config`` are relative to the job file;
``training.output_dir`` is relative to the current directory, as in HF (default
``out/<job file name>``). ``device_mapping`` is parsed, never evaluated.

``load_job`` reports every problem of the file at once, in one ``ConfigError``
whose ``source`` is the file, each under its ``section.key`` path. What needs the
whole run to judge (the strategy config resolved against the training arguments,
the model's hidden size and the world size) is ``Job.validate()``'s job, with the
config's diagnostics under ``strategy.config.``.

The run's ds_config (``Job.config``) is the strategy config completed the way the
HF Trainer completes it: the training arguments fill what the config leaves unset
(batch sizes, clipping, an AdamW optimizer, a scheduler for ``lr_scheduler_type``,
bf16/fp16) as ``"auto"``; a value the config sets explicitly is taken over by the
training arguments the ``[training]`` table does not set, so a config and a table
that each set a value once never disagree. Values set in both must agree
(``validate`` reports a conflict otherwise).

Nothing here imports torch, deepspeed, transformers or peft.
"""

from __future__ import annotations

import json
import math
import re
import sys
from collections.abc import Mapping, Sequence
from functools import cache
from pathlib import Path
from typing import Any, Final

import attrs

from ._suggest import did_you_mean
from .config import PASSTHROUGH_KEYS, Config
from .config._fields import Spec, check_value, describe, key_of
from .config.optim import optimizer_params_class, scheduler_params_class
from .data import FORMATS, TEMPLATES, count_records
from .errors import ConfigError, DsbuildError, InvalidValueError, Problem
from .io import merge, read_dict, to_config
from .resolve import BATCH_KEYS, model_hidden_size
from .training import Training
from .validate import Diagnostic, validate

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

__all__ = [
    "BYTE_TOKENIZER",
    "JOB_TABLES",
    "STRATEGIES",
    "DataSpec",
    "Job",
    "LaunchSpec",
    "LoraSpec",
    "ModelSpec",
    "StrategySpec",
    "accelerate_config",
    "demo_job_path",
    "for_hf",
    "is_job",
    "load_job",
    "looks_like_job",
    "mixed_precision_of",
    "parse_device_mapping",
    "parse_set",
    "read_job_dict",
    "set_dotted",
    "to_yaml",
    "zero_stage",
]

JOB_TABLES: Final = ("model", "data", "training", "strategy", "launch")
"""The top-level tables of a job file; a file with any of them is a job, not a ds_config."""

STRATEGIES: Final = ("deepspeed_train",)
"""The ``strategy.name`` values dsbuild runs (ROLL's names)."""

BYTE_TOKENIZER: Final = "byte"
"""``model.tokenizer`` for ByT5's byte-level tokenizer, which needs no files."""
BYTE_VOCAB: Final = 384
"""Tokens of the byte-level tokenizer: 3 special, 256 bytes, 125 sentinels."""

DTYPES: Final = ("auto", "bf16", "bfloat16", "fp16", "float16", "half", "fp32", "float32", "float")
ATTN_IMPLEMENTATIONS: Final = ("eager", "sdpa", "flash_attention_2", "flash_attention_3", "flex_attention")

_STAND_IN_HIDDEN: Final = 4096
"""Hidden size used only to check a config when the model's is unknown before loading it (a hub id)."""
_STAND_IN_STEPS: Final = 1000
"""Step count used only to check a config when the data cannot be counted."""

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


# -- the sections ------------------------------------------------------------------


@attrs.frozen
class LoraSpec:
    """``[model.lora]``: LoRA adapters (peft); only they are trained."""

    r: int = 8
    """Rank of the adapters; default 8."""
    alpha: float = 16
    """Scaling numerator (``lora_alpha``); default 16."""
    dropout: float = 0.0
    """Dropout on the adapters' input (``lora_dropout``); default 0."""
    target_modules: tuple[str, ...] | str | None = None
    """Module names to adapt (``["q_proj", "v_proj"]``), ``"all-linear"``, or none for peft's default for the model."""

    def to_peft(self) -> dict[str, Any]:
        """The fields of peft's ``LoraConfig``."""
        fields: dict[str, Any] = {"r": self.r, "lora_alpha": self.alpha, "lora_dropout": self.dropout}
        if self.target_modules is not None:
            target = self.target_modules
            fields["target_modules"] = target if isinstance(target, str) else list(target)
        return fields


@attrs.frozen
class ModelSpec:
    """``[model]``: what to train."""

    name_or_path: str | None = None
    """A local model directory (absolute once read) or a hub id; ``None`` with ``config``."""
    config: Mapping[str, Any] | None = None
    """``[model.config]``: ``model_type`` and the config fields of a model built from scratch (random init)."""
    tokenizer: str | None = None
    """``"byte"``, a local directory or a hub id; default: ``name_or_path``'s tokenizer."""
    dtype: str | None = None
    """Dtype the weights are loaded in (``"bf16"``, ``"fp32"``, ``"auto"``); default transformers'."""
    attn_implementation: str | None = None
    """``"sdpa"``, ``"eager"``, ``"flash_attention_2"``, ...; default transformers'."""
    gradient_checkpointing: bool = False
    """Recompute activations in the backward pass (non-reentrant)."""
    lora: LoraSpec | None = None
    """LoRA adapters; ``None`` trains every weight."""

    @property
    def hidden_size(self) -> int | None:
        """The model's hidden size when it can be read without loading anything (a config table or a local directory)."""
        table: Any = self.config
        if table is None and self.name_or_path is not None:
            file = Path(self.name_or_path) / "config.json"
            if not file.is_file():
                return None
            try:
                table = json.loads(file.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                return None
        if not isinstance(table, Mapping):
            return None
        found = model_hidden_size(table)
        return found if isinstance(found, int) else None


@attrs.frozen
class DataSpec:
    """``[data]``: the training (and evaluation) data."""

    path: Path
    """The training records (absolute once read; given relative to the job file)."""
    format: str
    """``"alpaca"`` (instruction / input / output, loss on the response) or ``"text"`` (JSONL, loss on every token)."""
    max_length: int = 512
    """Tokens per sample at most; longer samples are cut at the end."""
    eval_path: Path | None = None
    """Evaluation records in the same format, or none."""
    template: str = "alpaca"
    """Prompt template of ``"alpaca"`` records: ``"alpaca"`` (Stanford Alpaca's) or ``"plain"``."""
    text_field: str = "text"
    """The field holding the text of ``"text"`` records."""


@attrs.frozen
class StrategySpec:
    """``[strategy]``: how the model is trained; dsbuild runs ``deepspeed_train``."""

    name: str
    """``"deepspeed_train"``."""
    config: Config
    """The ds_config as written: the preset, file or inline table, with the overrides merged in."""
    ref: str
    """What ``config`` names: ``"preset zero3"``, ``"file ds.toml"`` or ``"inline table"``."""
    overrides: Mapping[str, Any] = attrs.field(factory=dict)
    """``[strategy.overrides]``: ds_config keys deep-merged over the config."""


@attrs.frozen
class LaunchSpec:
    """``[launch]``: processes, nodes and devices."""

    nproc_per_node: int = 1
    """Processes per node; default 1, or ``len(device_mapping) / nnodes``."""
    nnodes: int = 1
    """Nodes; default 1."""
    device_mapping: tuple[int, ...] | None = None
    """The run's devices, node after node (ROLL's ``device_mapping``); ``None``: the first ``nproc_per_node``."""
    gpus_per_node: int | None = None
    """Devices per machine, to turn ``device_mapping``'s global ids into a node's local ones (default: detected)."""
    infer_batch_size: int | None = None
    """Per-device batch size of evaluation (default ``training.per_device_eval_batch_size``)."""

    @property
    def world_size(self) -> int:
        """Processes in the run: ``nproc_per_node * nnodes``."""
        return self.nproc_per_node * self.nnodes

    def local_devices(self, node_rank: int = 0, gpus_per_node: int | None = None) -> tuple[int, ...] | None:
        """The devices node ``node_rank`` uses (its ``CUDA_VISIBLE_DEVICES``), or ``None`` without a mapping.

        Node ``r`` takes the ``r``-th run of ``nproc_per_node`` entries; a global id
        ``d`` is device ``d % gpus_per_node`` of its machine (ROLL numbers devices
        across the cluster: ``list(range(0,16))`` on two 8-GPU nodes).
        """
        if self.device_mapping is None:
            return None
        mine = self.device_mapping[node_rank * self.nproc_per_node : (node_rank + 1) * self.nproc_per_node]
        per_node = self.gpus_per_node or gpus_per_node
        return tuple(d % per_node for d in mine) if per_node else mine


@attrs.frozen
class Job:
    """A training run: model, data, training arguments, DeepSpeed strategy and launch, all checked.

    Build it with ``load_job(path)`` (or ``Job.from_dict``). ``config`` is the ds_config the
    run uses before resolution; ``resolve()`` fills its ``"auto"`` values from the run.
    """

    model: ModelSpec
    data: DataSpec
    training: Training
    """The run's training arguments: ``[training]``, completed from the config's explicit values and with ``output_dir`` set."""
    strategy: StrategySpec
    launch: LaunchSpec
    config: Config
    """The strategy config completed for the run (see the module docstring); ``"auto"`` where the run fills it."""
    eval_steps: int | None = None
    """Evaluate every this many optimizer steps (default: at every checkpoint, and at the end)."""
    source: str | None = None
    """The job file, or ``None`` for a job built from a table."""
    description: str | None = None
    """The file's one-line ``description``."""

    @classmethod
    def from_dict(
        cls,
        data: Mapping[str, Any],
        *,
        base_dir: str | Path | None = None,
        source: str | None = None,
        name: str = "job",
    ) -> Job:
        """A ``Job`` from a job table; relative paths are relative to ``base_dir`` (default: the current directory).

        Raises one ``ConfigError`` listing every problem (``source`` names the file).
        """
        return _Reader(Path(base_dir) if base_dir is not None else Path.cwd(), source, name).job(data)

    @property
    def output_dir(self) -> Path:
        """Where the run writes (``training.output_dir``)."""
        assert self.training.output_dir is not None  # set by the reader
        return Path(self.training.output_dir)

    def total_steps(self, world_size: int | None = None) -> int | None:
        """Optimizer steps of the run: ``max_steps``, else the epochs over the records counted in the data file.

        The count is that of the file's records; tokenizing may drop a few that do not fit
        ``max_length``, so a run over epochs can be a step shorter. ``None`` when the file
        cannot be counted.
        """
        if self.training.max_steps > 0:
            return self.training.max_steps
        records = count_records(self.data.path)
        if records is None:
            return None
        world = world_size or self.launch.world_size
        micro = self.training.per_device_train_batch_size
        accum = self.training.gradient_accumulation_steps
        # What Session.fit counts: a DistributedSampler pads each rank's share to ceil(n / world).
        batches = math.ceil(math.ceil(records / world) / micro)
        if self.config.dataloader_drop_last:
            batches = math.ceil(records / world) // micro
        per_epoch = max(batches // accum, 1)
        return max(math.ceil(self.training.num_train_epochs * per_epoch), 1)

    def _counted_steps(self, world_size: int | None) -> int | None:
        """The step count to pass ``resolve``: none when ``max_steps`` says it (resolve reads it, and says so)."""
        return None if self.training.max_steps > 0 else self.total_steps(world_size)

    def resolve(
        self, *, world_size: int | None = None, hidden_size: int | None = None, total_steps: int | None = None
    ) -> Config:
        """``config`` with every ``"auto"`` filled from the run (as ``Session`` will fill it).

        The world size defaults to ``launch``'s, the hidden size to the model's when it
        can be read without loading it, the step count to ``total_steps()``.
        """
        try:
            return self.config.resolve(
                world_size=world_size or self.launch.world_size,
                training=self.training,
                hidden_size=hidden_size or self.model.hidden_size,
                total_steps=total_steps or self._counted_steps(world_size),
            )
        except ConfigError as e:
            error = e.prefixed("strategy.config")
            raise error.with_source(self.source) if self.source else error from None

    def validate(self, *, world_size: int | None = None) -> list[Diagnostic]:
        """Every problem of the run's config, errors first, paths under ``strategy.config.``.

        The config is resolved against the training arguments and the world size, then checked
        as ``Session`` checks it. Facts only the run knows (a hub model's hidden size, the
        length of data that cannot be counted) are stood in for, so they are never reported.
        """
        world = world_size or self.launch.world_size
        try:
            resolved = self.config.resolve(
                world_size=world,
                training=self.training,
                hidden_size=self.model.hidden_size or _STAND_IN_HIDDEN,
                total_steps=None if self.training.max_steps > 0 else (self.total_steps(world) or _STAND_IN_STEPS),
            )
        except ConfigError as e:
            return [Diagnostic(_config_path(p.path), "error", p.message, p.hint, rule="resolve") for p in e.problems]
        return [attrs.evolve(d, path=_config_path(d.path)) for d in validate(resolved, world_size=world, resolved=True)]

    def check(self, *, world_size: int | None = None) -> Job:
        """Raise one ``ConfigError`` (``source``: the job file) listing every error of ``validate``; else ``self``."""
        errors = [d for d in self.validate(world_size=world_size) if d.severity == "error"]
        if errors:
            raise ConfigError([Problem(d.path, d.message, d.hint) for d in errors], source=self.source)
        return self


def _config_path(path: str) -> str:
    return f"strategy.config.{path}" if path else "strategy.config"


# -- reading ---------------------------------------------------------------------------


def read_job_dict(path: str | Path) -> dict[str, Any]:
    """The raw table of a job file (TOML; JSON or YAML by suffix); unreadable files raise ``ConfigError``."""
    from .io import _parser_for, _read_text

    path = Path(path)
    parse = _parser_for(path, str(path))
    return parse(_read_text(path), path)


def looks_like_job(data: Mapping[str, Any]) -> bool:
    """Whether a file's table is a job (any of ``JOB_TABLES`` at the top) rather than a ds_config."""
    return any(key in data for key in JOB_TABLES)


def is_job(path: str | Path) -> bool:
    """Whether ``path`` is a readable job file."""
    try:
        return looks_like_job(read_job_dict(path))
    except DsbuildError:  # unreadable, or YAML without PyYAML
        return False


def load_job(path: str | Path, overrides: Mapping[str, Any] | None = None) -> Job:
    """Read and check a job file; ``overrides`` maps dotted keys to values (``{"training.max_steps": 10}``).

    Every problem is reported at once in one ``ConfigError`` naming the file.
    """
    path = Path(path)
    data = read_job_dict(path)
    for key, value in (overrides or {}).items():
        set_dotted(data, key, value)
    return Job.from_dict(data, base_dir=path.parent, source=str(path), name=path.stem)


def set_dotted(data: dict[str, Any], key: str, value: Any) -> None:
    """``data[a][b][c] = value`` for ``key`` ``"a.b.c"``, making (or replacing) tables on the way."""
    parts = key.split(".")
    if not all(parts):
        raise ConfigError(Problem(key, "expected a dotted key such as training.learning_rate"))
    node = data
    for part in parts[:-1]:
        child = node.get(part)
        if not isinstance(child, dict):
            child = node[part] = {}
        node = child
    node[parts[-1]] = value


def parse_set(text: str) -> tuple[str, Any]:
    """``--set`` text ``section.key=value`` as ``(dotted key, value)``; the value is TOML (a bare word is a string)."""
    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep or not key or not all(part.strip() for part in key.split(".")):
        raise ConfigError(f"--set {text!r}: expected KEY=VALUE, e.g. training.learning_rate=2e-5")
    try:
        value: Any = tomllib.loads(f"v = {raw.strip()}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw.strip()
    return key, value


def demo_job_path() -> Path:
    """The packaged demo job (``dsbuild train`` without a job file)."""
    return Path(__file__).resolve().parent / "demo" / "demo.toml"


_BAD: Final[dict[str, Any]] = {}
"""Stands for a section that is not a table (already reported): its contents are not checked."""


class _Reader:
    """Reads a job table, collecting every problem (each under its ``section.key`` path)."""

    def __init__(self, base_dir: Path, source: str | None, name: str) -> None:
        self.base_dir = base_dir
        self.source = source
        self.name = name
        self.problems: list[Problem] = []

    # -- helpers

    def problem(self, path: str, message: str, hint: str | None = None) -> None:
        self.problems.append(Problem(path, message, hint))

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
                self.problem(where, "unknown key", f"did you mean {hints[key]}?")
            elif not path and key in _ds_keys():
                self.problem(
                    where, "unknown key", f"ds_config keys go under [strategy.overrides]: strategy.overrides.{key}"
                )
            else:
                self.problem(where, "unknown key", did_you_mean(str(key), known))

    def value(self, table: Mapping[str, Any], key: str, path: str, spec: Spec, default: Any = None) -> Any:
        if key not in table:
            return default
        value = table[key]
        if spec.kind == "strs" and isinstance(value, list):
            value = tuple(value)
        if spec.kind in ("int",) and isinstance(value, float) and value.is_integer():
            value = int(value)
        message = check_value(spec, value)
        if message is not None:
            self.problem(f"{path}.{key}", message)
            return default
        return value

    def file(self, value: str, path: str, *, what: str) -> Path | None:
        candidate = (self.base_dir / Path(value).expanduser()).resolve()
        if candidate.is_file():
            return candidate
        note = "is a directory" if candidate.is_dir() else "no such file"
        self.problem(path, f"{note}: {str(candidate)!r}", f"{what}, relative to the job file")
        return None

    def local_or_hub(self, value: str) -> str:
        """A local directory (made absolute) or a hub id (kept)."""
        candidate = (self.base_dir / Path(value).expanduser()).resolve()
        return str(candidate) if candidate.exists() else value

    # -- the job

    def job(self, data: Mapping[str, Any]) -> Job:
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
        eval_steps = self.value(raw_training, "eval_steps", "training", Spec("int", gt=0, auto=False))
        raw_training.pop("eval_steps", None)
        training = self.training(raw_training) if tables["training"] is not _BAD else None
        strategy = self.strategy(tables["strategy"]) if tables["strategy"] is not _BAD else None
        launch = self.launch(tables["launch"]) if tables["launch"] is not _BAD else None

        config = training_done = None
        if strategy is not None and training is not None:
            training_done, config = self.complete(strategy.config, training, explicit=set(raw_training))
        if self.problems or None in (model, data_spec, training_done, strategy, launch, config):
            raise ConfigError(self.problems, source=self.source)
        assert model and data_spec and training_done and strategy and launch and config
        return Job(
            model=model,
            data=data_spec,
            training=training_done,
            strategy=strategy,
            launch=launch,
            config=config,
            eval_steps=eval_steps,
            source=self.source,
            description=description,
        )

    def model(self, t: dict[str, Any]) -> ModelSpec | None:
        known = [
            "name_or_path",
            "config",
            "tokenizer",
            "dtype",
            "attn_implementation",
            "gradient_checkpointing",
            "lora",
        ]
        self.unknown(t, known, "model")
        before = len(self.problems)
        name = self.value(t, "name_or_path", "model", Spec("str", auto=False))
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
        tokenizer = self.value(t, "tokenizer", "model", Spec("str", auto=False))
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
        dtype = self.value(t, "dtype", "model", Spec("choice", choices=DTYPES, auto=False))
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
        checkpointing = self.value(t, "gradient_checkpointing", "model", Spec("bool", auto=False), False)
        lora = self.lora(self.table(t, "lora", "model.lora")) if "lora" in t else None
        if len(self.problems) > before:
            return None
        return ModelSpec(
            name_or_path=self.local_or_hub(name) if name is not None else None,
            config=config,
            tokenizer=tokenizer,
            dtype=dtype,
            attn_implementation=attn,
            gradient_checkpointing=checkpointing,
            lora=lora,
        )

    def lora(self, t: dict[str, Any]) -> LoraSpec | None:
        known = ["r", "rank", "alpha", "dropout", "target_modules"]
        self.unknown(t, known, "model.lora")
        before = len(self.problems)
        if "r" in t and "rank" in t:
            self.problem("model.lora.rank", "both r and rank are set (the same thing)", "keep one")
        rank_key = "rank" if "rank" in t and "r" not in t else "r"
        r = self.value(t, rank_key, "model.lora", Spec("int", gt=0, auto=False), 8)
        alpha = self.value(t, "alpha", "model.lora", Spec("float", gt=0, auto=False), 16)
        dropout = self.value(t, "dropout", "model.lora", Spec("float", ge=0, auto=False), 0.0)
        if isinstance(dropout, (int, float)) and dropout >= 1:
            self.problem("model.lora.dropout", f"got {dropout!r}, expected a number >= 0 and < 1")
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
        if len(self.problems) > before:
            return None
        return LoraSpec(r=r, alpha=alpha, dropout=dropout, target_modules=target)

    def data(self, t: dict[str, Any]) -> DataSpec | None:
        known = ["path", "format", "max_length", "eval_path", "template", "text_field"]
        self.unknown(t, known, "data")
        before = len(self.problems)
        if "path" not in t:
            self.problem("data.path", "missing: the training records (a .jsonl or .json file)")
        if "format" not in t:
            self.problem("data.format", f"missing: one of {', '.join(map(repr, FORMATS))}")
        raw_path = self.value(t, "path", "data", Spec("str", auto=False))
        fmt = self.value(t, "format", "data", Spec("choice", choices=FORMATS, auto=False))
        max_length = self.value(t, "max_length", "data", Spec("int", ge=2, auto=False), 512)
        raw_eval = self.value(t, "eval_path", "data", Spec("str", auto=False))
        template = self.value(t, "template", "data", Spec("choice", choices=tuple(TEMPLATES), auto=False), "alpaca")
        text_field = self.value(t, "text_field", "data", Spec("str", auto=False), "text")
        path = self.file(raw_path, "data.path", what="the training records") if raw_path is not None else None
        eval_path = self.file(raw_eval, "data.eval_path", what="the evaluation records") if raw_eval else None
        if len(self.problems) > before or path is None:
            return None
        return DataSpec(
            path=path, format=fmt, max_length=max_length, eval_path=eval_path, template=template, text_field=text_field
        )

    def training(self, t: dict[str, Any]) -> Training | None:
        try:
            return Training.from_dict(t)
        except ConfigError as e:
            self.problems.extend(e.problems)
            return None

    def strategy(self, t: dict[str, Any]) -> StrategySpec | None:
        self.unknown(t, ["name", "config", "overrides"], "strategy")
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
            config = to_config(merged, source=self.source or "job", label=f"{label} in {self.source or 'job'}")
        except ConfigError as e:
            for p in e.problems:
                inside = _has_path(overrides, p.path)
                self.problems.append(p.prefixed("strategy.overrides" if inside else "strategy.config"))
            return None
        if len(self.problems) > before:
            return None
        return StrategySpec(name=name, config=config, ref=label, overrides=overrides)

    def config_file(self, ref: str) -> tuple[dict[str, Any] | None, str]:
        """The ds_config dict a ``strategy.config`` string names: a file next to the job, or a preset."""
        from .io import SUFFIXES
        from .presets import preset_names, preset_path

        looks_like_path = "/" in ref or "\\" in ref or Path(ref).suffix.lower() in SUFFIXES
        try:
            if looks_like_path:
                file = (self.base_dir / Path(ref).expanduser()).resolve()
                data, _ = read_dict(file)
                return data, f"file {ref}"
            if ref not in preset_names() and (self.base_dir / ref).is_file():
                data, _ = read_dict(self.base_dir / ref)
                return data, f"file {ref}"
            data, _ = read_dict(preset_path(ref))
            return data, f"preset {ref}"
        except ConfigError as e:
            where = f"{e.source}: " if e.source else ""
            for p in e.problems:
                self.problem("strategy.config", f"{where}{p}")
            return None, ""

    def launch(self, t: dict[str, Any]) -> LaunchSpec | None:
        known = ["nproc_per_node", "nnodes", "device_mapping", "gpus_per_node", "infer_batch_size"]
        self.unknown(t, known, "launch")
        before = len(self.problems)
        positive = Spec("int", gt=0, auto=False)
        nproc = self.value(t, "nproc_per_node", "launch", positive)
        nnodes = self.value(t, "nnodes", "launch", positive, 1)
        gpus = self.value(t, "gpus_per_node", "launch", positive)
        infer = self.value(t, "infer_batch_size", "launch", positive)
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
            nproc_per_node=nproc or 1, nnodes=nnodes, device_mapping=mapping, gpus_per_node=gpus, infer_batch_size=infer
        )

    # -- the run's config

    def complete(
        self, config: Config, training: Training, *, explicit: set[str]
    ) -> tuple[Training | None, Config | None]:
        """The run's training arguments and ds_config (see the module docstring)."""
        d = config.to_dict()
        taken: dict[str, Any] = {}
        for ds_key, names in _SHARED:
            value = _get_path(d, ds_key)
            if value is None or value == "auto":
                continue
            values = value if isinstance(names, tuple) else (value,)
            for name, v in zip(names if isinstance(names, tuple) else (names,), values, strict=False):
                if name not in explicit and name not in taken and v != "auto":
                    taken[name] = v
        if training.output_dir is None:
            taken["output_dir"] = str(Path("out") / self.name)
        try:
            done = attrs.evolve(training, **taken)
        except InvalidValueError as e:
            self.problems.extend(p.prefixed("strategy.config") for p in e.problems)
            return None, None

        if not any(key in d for key in BATCH_KEYS):
            d["train_micro_batch_size_per_gpu"] = "auto"
            d["gradient_accumulation_steps"] = "auto"
        d.setdefault("gradient_clipping", "auto")
        if "optimizer" not in d:
            d["optimizer"] = {
                "type": "AdamW",
                "params": {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"},
            }
        if "scheduler" not in d:
            scheduler = _SCHEDULERS.get(done.lr_scheduler_type, _NO_SCHEDULER)
            if scheduler is _NO_SCHEDULER:
                self.problem(
                    "training.lr_scheduler_type",
                    f"{done.lr_scheduler_type!r} has no DeepSpeed scheduler to stand for it",
                    f"use one of {', '.join(map(repr, _SCHEDULERS))}, or set [strategy.overrides.scheduler]",
                )
                return None, None
            if scheduler is not None:
                d["scheduler"] = scheduler
        for precision in ("bf16", "fp16"):
            if getattr(done, precision) and precision not in d:
                d[precision] = {"enabled": "auto"}
        try:
            completed = Config.from_dict(d)
        except ConfigError as e:  # pragma: no cover - built from a config that converted
            self.problems.extend(p.prefixed("strategy.config") for p in e.problems)
            return None, None
        # explain() says where the added keys came from (resolve's own provenance wins for the "auto" ones).
        given = set(_leaf_paths(config.to_dict()))
        origins = {
            "optimizer": "job: the HF Trainer's AdamW (the strategy config has no optimizer)",
            "scheduler": f"job: training.lr_scheduler_type {done.lr_scheduler_type!r} (the strategy config has no scheduler)",
        }
        provenance = {
            path: origins.get(path.split(".")[0], "job: filled from [training]")
            for path in _leaf_paths(completed.to_dict())
            if path not in given
        }
        return done, attrs.evolve(completed, source=config.source, provenance={**config.provenance, **provenance})


_SHARED: Final[tuple[tuple[str, str | tuple[str, str]], ...]] = (
    ("train_micro_batch_size_per_gpu", "per_device_train_batch_size"),
    ("gradient_accumulation_steps", "gradient_accumulation_steps"),
    ("gradient_clipping", "max_grad_norm"),
    ("optimizer.params.lr", "learning_rate"),
    ("scheduler.params.warmup_max_lr", "learning_rate"),
    ("optimizer.params.weight_decay", "weight_decay"),
    ("optimizer.params.eps", "adam_epsilon"),
    ("optimizer.params.betas", ("adam_beta1", "adam_beta2")),
    ("scheduler.params.warmup_num_steps", "warmup_steps"),
    ("bf16.enabled", "bf16"),
    ("fp16.enabled", "fp16"),
)
"""ds_config keys and the training argument that fills them: a value set in only one of the two is used by both."""

_AUTO_WARMUP: Final = {"warmup_num_steps": "auto", "warmup_type": "linear"}
_NO_SCHEDULER: Final[dict[str, Any]] = {}
_SCHEDULERS: Final[dict[str, dict[str, Any] | None]] = {
    # HF's linear: linear warmup, then linear decay to 0 at the last step.
    "linear": {
        "type": "WarmupDecayLR",
        "params": {"warmup_min_lr": "auto", "warmup_max_lr": "auto", "total_num_steps": "auto", **_AUTO_WARMUP},
    },
    # HF's cosine: linear warmup, then a half cosine down to 0.
    "cosine": {
        "type": "WarmupCosineLR",
        "params": {"total_num_steps": "auto", "warmup_min_ratio": 0.0, "cos_min_ratio": 0.0, **_AUTO_WARMUP},
    },
    "constant_with_warmup": {
        "type": "WarmupLR",
        "params": {"warmup_min_lr": "auto", "warmup_max_lr": "auto", **_AUTO_WARMUP},
    },
    "constant": None,  # the optimizer's learning rate, unscheduled
}
"""A DeepSpeed scheduler for each HF ``lr_scheduler_type`` it can stand for (HF's own when the config has none)."""


def _leaf_paths(d: Mapping[str, Any], prefix: str = "") -> list[str]:
    paths = []
    for key, value in d.items():
        if isinstance(value, Mapping) and value:
            paths.extend(_leaf_paths(value, f"{prefix}{key}."))
        else:
            paths.append(f"{prefix}{key}")
    return paths


def _get_path(d: Mapping[str, Any], dotted: str) -> Any:
    node: Any = d
    for part in dotted.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return None
        node = node[part]
    return node


def _has_path(d: Mapping[str, Any], dotted: str) -> bool:
    """Whether ``d`` sets the key at ``dotted`` (or a table above it)."""
    node: Any = d
    for part in re.split(r"\.|\[", dotted):
        part = part.rstrip("]")
        if not part:
            continue
        if not isinstance(node, Mapping):
            return True  # a list item under a key the table sets
        if part not in node:
            return False
        node = node[part]
    return bool(dotted)


@cache
def _ds_keys() -> frozenset[str]:
    """The top-level ds_config keys (for "this goes under [strategy.overrides]")."""
    return frozenset({key_of(a) for a in attrs.fields(Config) if not a.name.startswith("_")} | set(PASSTHROUGH_KEYS))


# -- device_mapping -------------------------------------------------------------------

_INT = r"\s*(\d+)\s*"
_RANGE_ARGS = rf"{_INT}(?:,{_INT}(?:,{_INT})?)?"
_RANGE = re.compile(rf"(?:list\s*\(\s*range\s*\({_RANGE_ARGS}\)\s*\)|range\s*\({_RANGE_ARGS}\))")
_SPAN = re.compile(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?")


def parse_device_mapping(value: Any) -> tuple[int, ...]:
    """Device ids from a list, ``"0-15"``, ``"0,1,2"``, ``"0-3,8-11"``, ``"[0, 1]"`` or ``"list(range(0,16))"``.

    Text is matched against these forms only; nothing is ever evaluated. Raises
    ``ConfigError`` for anything else, for duplicates and for an empty mapping.
    """
    expected = 'expected a list of device ids, "0-15", "0,1,2" or "list(range(0,16))"'
    ids: list[int]
    if isinstance(value, (list, tuple)):
        if not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in value):
            raise ConfigError(Problem("", f"got {describe(value)}, expected non-negative integers"))
        ids = list(value)
    elif isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        ids = [value]
    elif isinstance(value, str):
        parsed = _parse_mapping_text(value)
        if parsed is None:
            shown = value if len(value) <= 60 else value[:57] + "..."
            raise ConfigError(Problem("", f"cannot read {shown!r}: {expected}"))
        ids = parsed
    else:
        raise ConfigError(Problem("", f"got {describe(value)}, {expected}"))
    if not ids:
        raise ConfigError(Problem("", "empty: list at least one device"))
    seen: set[int] = set()
    twice = sorted({x for x in ids if x in seen or seen.add(x)})  # type: ignore[func-returns-value]
    if twice:
        raise ConfigError(Problem("", f"device {', '.join(map(str, twice))} listed twice"))
    return tuple(ids)


def _parse_mapping_text(text: str) -> list[int] | None:
    text = text.strip()
    match = _RANGE.fullmatch(text)
    if match is not None:
        numbers = [int(g) for g in match.groups() if g is not None]
        if len(numbers) == 1:
            numbers = [0, numbers[0]]
        start, stop, step = numbers[0], numbers[1], numbers[2] if len(numbers) == 3 else 1
        if step == 0:
            return None
        return list(range(start, stop, step))
    if text.startswith("[") and text.endswith("]"):
        text = text[1:-1]
    ids: list[int] = []
    for part in text.split(","):
        span = _SPAN.fullmatch(part)
        if span is None:
            return None
        first = int(span.group(1))
        last = int(span.group(2)) if span.group(2) is not None else first
        if last < first:
            return None
        ids.extend(range(first, last + 1))
    return ids


# -- interop: the HF Trainer and Accelerate ------------------------------------------

_HF_OPTIMIZER_KEYS: Final = ("lr", "betas", "eps", "weight_decay")
_HF_SCHEDULER_KEYS: Final = ("warmup_min_lr", "warmup_max_lr", "warmup_num_steps", "total_num_steps")


def _param_keys(cls: type | None) -> set[str] | None:
    return None if cls is None else {key_of(a) for a in attrs.fields(cls)}


def for_hf(config: Config) -> Config:
    """``config`` with every value the HF Trainer fills set to ``"auto"``: what ``TrainingArguments(deepspeed=...)`` expects.

    The batch sizes, ``gradient_clipping``, ``fp16.enabled`` and ``bf16.enabled`` always;
    the optimizer's ``lr``/``betas``/``eps``/``weight_decay`` and the scheduler's warmup
    and step counts where the config has an optimizer / scheduler taking them (without
    one, the Trainer creates its own from the training arguments); the hidden-size
    buckets at stage 3 (``reduce_bucket_size`` at any stage where it is set).
    """
    d = config.to_dict()
    for key in BATCH_KEYS:
        d[key] = "auto"
    d["gradient_clipping"] = "auto"
    for section, keys, params_class in (
        ("optimizer", _HF_OPTIMIZER_KEYS, optimizer_params_class),
        ("scheduler", _HF_SCHEDULER_KEYS, scheduler_params_class),
    ):
        table = d.get(section)
        if not isinstance(table, dict):
            continue
        params = table.setdefault("params", {})
        takes = _param_keys(params_class(str(table.get("type", ""))))
        for key in keys:
            if (takes is not None and key in takes) or key in params:
                params[key] = "auto"
    for precision in ("fp16", "bf16"):
        switch = d.get(precision)
        d[precision] = {**(switch if isinstance(switch, dict) else {}), "enabled": "auto"}
    zero = d.get("zero_optimization")
    if isinstance(zero, dict):
        if zero.get("stage") == 3:
            for key in ("reduce_bucket_size", "stage3_prefetch_bucket_size", "stage3_param_persistence_threshold"):
                zero[key] = "auto"
        elif "reduce_bucket_size" in zero:
            zero["reduce_bucket_size"] = "auto"
    return attrs.evolve(Config.from_dict(d), source=config.source)


def accelerate_config(
    ds_config_file: str,
    *,
    num_processes: int = 1,
    num_machines: int = 1,
    zero3_init: bool = False,
    mixed_precision: str = "no",
) -> dict[str, Any]:
    """An Accelerate config (``accelerate launch --config_file``) that runs DeepSpeed from ``ds_config_file``."""
    return {
        "compute_environment": "LOCAL_MACHINE",
        "distributed_type": "DEEPSPEED",
        "deepspeed_config": {"deepspeed_config_file": ds_config_file, "zero3_init_flag": zero3_init},
        "machine_rank": 0,
        "main_training_function": "main",
        "mixed_precision": mixed_precision,
        "num_machines": num_machines,
        "num_processes": num_processes,
        "rdzv_backend": "static",
        "same_network": True,
        "use_cpu": False,
    }


def to_yaml(data: Mapping[str, Any]) -> str:
    """YAML text of a table of scalars and tables (PyYAML when installed, else written here)."""
    try:
        import yaml
    except ImportError:
        return "".join(_yaml_lines(data, 0))
    text: str = yaml.safe_dump(dict(data), sort_keys=False, default_flow_style=False)
    return text


def _yaml_lines(data: Mapping[str, Any], indent: int) -> list[str]:
    lines = []
    pad = "  " * indent
    for key, value in data.items():
        if isinstance(value, Mapping):
            lines.append(f"{pad}{key}:\n")
            lines.extend(_yaml_lines(value, indent + 1))
        else:
            lines.append(f"{pad}{key}: {_yaml_scalar(value)}\n")
    return lines


def _yaml_scalar(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, (int, float)):
        return repr(value)
    text = str(value)
    # Quote anything YAML would read as another type (a number, a boolean, null) or that holds punctuation.
    plain = re.fullmatch(r"[A-Za-z0-9_./-]+", text) and text.lower() not in _YAML_WORDS
    return text if plain and not re.fullmatch(r"[-+]?[\d.]+(e[-+]?\d+)?", text) else json.dumps(text)


_YAML_WORDS: Final = frozenset({"true", "false", "null", "yes", "no", "on", "off", "y", "n", "~"})


def mixed_precision_of(config: Config, training: Training | None = None) -> str:
    """Accelerate's ``mixed_precision`` for a run: from the training arguments, else the config's explicit switches."""
    if training is not None:
        return "bf16" if training.bf16 else "fp16" if training.fp16 else "no"
    for name, attr in (("bf16", "bf16_config"), ("fp16", "fp16_config")):
        section = getattr(config, attr)
        if section is not None and section.enabled is True:
            return name
    return "no"


def zero_stage(config: Config) -> int:
    """The config's ZeRO stage (0 when unset or ``"auto"``)."""
    zero = config.zero_optimization
    stage = zero.stage if zero is not None else None
    return stage if isinstance(stage, int) else 0
