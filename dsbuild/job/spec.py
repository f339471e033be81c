"""The parts of a job: what to train (``[model]``), on what (``[data]``), how (``[strategy]``) and where
(``[launch]``), each a frozen class the reader fills.

Each key a job table takes is a field with a ``Key`` in its metadata (under ``"job"``): the value's ``Spec`` (the
reader checks it with the config's coercion policy, the JSON Schema of job files is generated from it), or a JSON
Schema of its own for a key the reader reads by hand, and its other spellings. ``table_keys(cls)`` is what the
reader accepts; ``job_keys(cls)`` what each key holds.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

import attrs

from ..api import Config
from ..config.fields import Spec
from ..errors import ConfigError, Problem
from .formats import FORMATS, PACKING_STRATEGIES, TEMPLATE_KEYS, TEMPLATES

__all__ = [
    "ATTN_IMPLEMENTATIONS",
    "BACKENDS",
    "BYTE_TOKENIZER",
    "BYTE_VOCAB",
    "DTYPES",
    "JOB_TABLES",
    "ROLLOUT_BACKENDS",
    "STRATEGIES",
    "DataSpec",
    "Key",
    "LaunchSpec",
    "LoraSpec",
    "ModelSpec",
    "ReferenceSpec",
    "RewardsSpec",
    "RolloutSpec",
    "StrategySpec",
    "job_keys",
    "table_keys",
]

JOB_TABLES: Final = ("model", "data", "training", "strategy", "launch")
"""The top-level tables of a job file; a file with any of them is a job, not a ds_config."""

ROLLOUT_BACKENDS: Final = ("hf", "function")
"""``rollout.backend``: the policy's own ``generate`` (``"hf"``) or a function of the prompts (``"function"``, TRL's
``rollout_func``)."""


STRATEGIES: Final = ("deepspeed_train",)
"""The ``strategy.name`` values dsbuild runs (ROLL's names)."""


BACKENDS: Final = ("torchrun", "ray")
"""``launch.backend``: what starts a run's processes (``dsbuild train --backend``)."""


BYTE_TOKENIZER: Final = "byte"
"""``model.tokenizer`` for ByT5's byte-level tokenizer, which needs no files."""


BYTE_VOCAB: Final = 384
"""Tokens of the byte-level tokenizer: 3 special, 256 bytes, 125 sentinels."""


DTYPES: Final = ("auto", "bf16", "bfloat16", "fp16", "float16", "half", "fp32", "float32", "float")


ATTN_IMPLEMENTATIONS: Final = ("eager", "sdpa", "flash_attention_2", "flash_attention_3", "flex_attention")


@attrs.frozen
class Key:
    """How one key of a job table is read: the metadata of the field it fills."""

    spec: Spec | None = None
    """What the value takes, checked by the reader and written into the JSON Schema; ``None``: read by hand."""
    schema: Mapping[str, Any] | None = None
    """The JSON Schema of a key read by hand (``spec`` is ``None``), or of a nested table (``"$ref"`` to it)."""
    aliases: tuple[str, ...] = ()
    """Other spellings the reader takes for the same key (``rank`` for ``r``)."""
    missing: str | None = None
    """What a job that leaves out this required key is told (default ``"missing"``)."""


def _key(
    default: Any = attrs.NOTHING,
    spec: Spec | None = None,
    *,
    schema: Mapping[str, Any] | None = None,
    aliases: tuple[str, ...] = (),
    missing: str | None = None,
    **field: Any,
) -> Any:
    """A field that is a key of its job table (``Key`` in its metadata)."""
    return attrs.field(default=default, metadata={"job": Key(spec, schema, aliases, missing)}, **field)


def _typed(kind: Any, **bounds: Any) -> Spec:
    """A key's ``Spec``: job values never take ``"auto"``."""
    return Spec(kind, auto=False, **bounds)


def job_keys(cls: type) -> dict[str, Key]:
    """The keys of the job table ``cls`` reads, by name, in the order of its fields."""
    return {a.name: a.metadata["job"] for a in attrs.fields(cls) if "job" in a.metadata}


def table_keys(cls: type) -> list[str]:
    """Every key the table accepts: its keys and their other spellings."""
    keys = job_keys(cls)
    return [*keys, *(alias for key in keys.values() for alias in key.aliases)]


@attrs.frozen
class LoraSpec:
    """``[model.lora]``: LoRA adapters (peft); only they are trained."""

    r: int = _key(8, _typed("int", gt=0), aliases=("rank",))
    """Rank of the adapters; default 8."""
    alpha: float = _key(16, _typed("float", gt=0))
    """Scaling numerator (``lora_alpha``); default 16."""
    dropout: float = _key(0.0, _typed("float", ge=0, lt=1))
    """Dropout on the adapters' input (``lora_dropout``); default 0."""
    target_modules: tuple[str, ...] | str | None = _key(
        None,
        schema={
            "anyOf": [
                {"const": "all-linear"},
                {"type": "array", "items": {"type": "string", "minLength": 1}, "minItems": 1},
                {"type": "string", "minLength": 1, "description": "module names separated by commas (ROLL's)"},
            ]
        },
    )
    """Module names to adapt (``["q_proj", "v_proj"]``), ``"all-linear"``, or none for peft's default for the model."""
    merge: bool = _key(False, _typed("bool"))
    """Export the model with the adapters merged into its weights (HF format) instead of the adapters alone; default
    false (the adapters, with their base beside them when the base was built from ``[model.config]``)."""

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

    name_or_path: str | None = _key(None, _typed("str"))
    """A local model directory (absolute once read) or a hub id; ``None`` with ``config``."""
    config: Mapping[str, Any] | None = _key(
        None,
        schema={
            "type": "object",
            "properties": {"model_type": {"type": "string", "minLength": 1}},
            "required": ["model_type"],
        },
    )
    """``[model.config]``: ``model_type`` and the config fields of a model built from scratch (random init)."""
    tokenizer: str | None = _key(None, _typed("str"))
    """``"byte"``, a local directory or a hub id; default: ``name_or_path``'s tokenizer."""
    dtype: str | None = _key(None, _typed("choice", choices=DTYPES))
    """Dtype the weights are loaded in (``"bf16"``, ``"fp32"``, ``"auto"``); default transformers'."""
    attn_implementation: str | None = _key(
        None, schema={"anyOf": [{"enum": [*ATTN_IMPLEMENTATIONS, "fa2"]}, {"type": "string", "pattern": "/"}]}
    )
    """``"sdpa"``, ``"eager"``, ``"flash_attention_2"``, ...; default transformers'."""
    gradient_checkpointing: bool = _key(False, _typed("bool"))
    """Recompute activations in the backward pass (non-reentrant)."""
    lora: LoraSpec | None = _key(None, schema={"$ref": "#/$defs/job.model.lora"})
    """LoRA adapters; ``None`` trains every weight."""
    hidden_size: int | None = None
    """The model's hidden size when the reader could tell it without loading anything (from ``[model.config]`` or a
    local directory's ``config.json``); ``None`` for a hub id."""


@attrs.frozen
class DataSpec:
    """``[data]``: the training (and evaluation) data."""

    path: Path | str = _key(
        spec=_typed("str"), missing="missing: the training records (a data file or folder, or a hub dataset id)"
    )
    """The training records: a data file or folder (absolute once read; given relative to the job file), a folder
    written by ``datasets``' ``save_to_disk``, or a hub dataset id (``owner/name``, a ``str``)."""
    format: str = _key(
        spec=_typed("choice", choices=FORMATS), missing=f"missing: one of {', '.join(map(repr, FORMATS))}"
    )
    """``"text"``, ``"alpaca"`` (instruction / input / output), ``"messages"`` (role / content turns),
    ``"sharegpt"`` (``conversations`` of from / value turns), ``"prompt_completion"`` (TRL's: ``prompt`` and
    ``completion`` strings, or lists of messages) or ``"tokenized"`` (``input_ids``, optionally ``labels`` and
    ``attention_mask``, taken as given)."""
    max_length: int = _key(1024, _typed("int", ge=2))
    """Tokens per sample at most (TRL's default, 1024); longer samples are cut at the end."""
    eval_path: Path | str | None = _key(None, _typed("str"))
    """Evaluation records in the same format (a file, folder or hub id), or none."""
    eval_split: float | str | None = _key(
        None,
        schema={
            "anyOf": [
                {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1},
                {"type": "string", "minLength": 1},
            ]
        },
    )
    """Evaluation records from ``path`` itself: a fraction held out of it (``0.05``), or the name of one of its
    splits (``"test"``); none by default."""
    split: str = _key("train", _typed("str"))
    """The split of a hub dataset or ``save_to_disk`` folder of several splits to train on."""
    template: str | tuple[str, str] = _key(
        "alpaca",
        schema={
            "anyOf": [
                {"enum": list(TEMPLATES)},
                {
                    "type": "object",
                    "properties": {key: {"type": "string"} for key in TEMPLATE_KEYS},
                    "required": list(TEMPLATE_KEYS),
                    "additionalProperties": False,
                },
            ]
        },
    )
    """Prompt template of ``"alpaca"`` records: ``"alpaca"`` (Stanford Alpaca's), ``"plain"``, or the job's own
    ``(prompt_no_input, prompt_input)``."""
    chat_template: str | None = _key(None, _typed("str"))
    """A Jinja chat template for conversations (``"messages"``, ``"sharegpt"``, and the lists of messages of
    ``"prompt_completion"``, ``"preference"`` and ``"prompt"`` records); default the tokenizer's, else
    ``FALLBACK_CHAT_TEMPLATE``."""
    columns: Mapping[str, str] = _key(
        schema={"type": "object", "additionalProperties": {"type": "string", "minLength": 1}}, factory=dict
    )
    """The file's names for the format's fields (``FIELDS``), where they differ: ``{"output": "answer"}``."""
    packing: bool = _key(False, _typed("bool"))
    """Put several samples into each ``max_length`` sequence (positions restart per sample; the model's attention
    keeps them apart where it supports packed sequences)."""
    train_on_prompt: bool = _key(False, _typed("bool"))
    """Take the loss on every token, prompts and user turns included (LLaMA-Factory's name): both
    ``assistant_only_loss`` and ``completion_only_loss`` off."""
    assistant_only_loss: bool = _key(False, _typed("bool"))
    """TRL's: in conversations, the loss on the assistant's turns only; default off, as TRL. A chat template with
    ``{% generation %}`` markers says which tokens are the assistant's, as in TRL; dsbuild also finds them with a
    template without (TRL refuses that; see docs/jobs.md)."""
    completion_only_loss: bool | None = _key(None, _typed("bool"))
    """TRL's: the loss on the completion only: of prompt / completion records (and ``"alpaca"``), and of
    ``"tokenized"`` records by their ``completion_mask``; unset, as TRL: on for prompt / completion and
    ``"alpaca"`` records, off for ``"tokenized"`` ones."""
    packing_strategy: str = _key("bfd", _typed("choice", choices=PACKING_STRATEGIES))
    """TRL's: ``"bfd"``, ``"bfd_split"`` or ``"wrapped"`` (``PACKING_STRATEGIES``)."""
    padding_free: bool = _key(False, _typed("bool"))
    """TRL's: each micro-batch as one row, its samples concatenated with restarting ``position_ids``."""
    eos_token: str | None = _key(None, _typed("str"))
    """TRL's: the token that ends a text or completion (appended unless it ends with it); default the
    tokenizer's end-of-sequence token."""
    num_proc: int | None = _key(None, _typed("int", ge=1))
    """Processes tokenizing the data (``datasets``' ``map``); default one."""
    dataset_text_field: str | None = _key(None, _typed("str"), aliases=("text_field",), kw_only=True)
    """TRL's name (a job file's ``text_field`` too): the field holding the text of ``"text"`` records, the same as
    ``columns = {"text": ...}``; default ``"text"``. The job file and ``DataSpec(...)`` both set it here, and the data
    are read by ``names``."""

    def __attrs_post_init__(self) -> None:
        named = self.columns.get("text")
        if self.dataset_text_field is not None and named is not None and named != self.dataset_text_field:
            message = f"{self.dataset_text_field!r} and columns.text {named!r} name the text field twice, differently"
            raise ConfigError(Problem("data.dataset_text_field", message, "keep one"))

    @property
    def names(self) -> dict[str, str]:
        """The file's names for the format's fields where they differ from the format's (``FIELDS``): ``columns``,
        with ``dataset_text_field`` as the text's. The one mapping every reader of records uses."""
        names = dict(self.columns)
        if self.dataset_text_field is not None:
            names.setdefault("text", self.dataset_text_field)
        return {key: name for key, name in names.items() if name != key}

    @property
    def text_field(self) -> str:
        """The field holding the text of ``"text"`` records."""
        return self.field("text")

    def field(self, name: str) -> str:
        """The file's name for the format's field ``name``."""
        return self.names.get(name, name)

    @property
    def loss_on_assistant_only(self) -> bool:
        """Whether conversations take the loss on the assistant's turns only."""
        return self.assistant_only_loss and not self.train_on_prompt

    @property
    def loss_on_completion_only(self) -> bool:
        """Whether prompt / completion and instruction records (and tokenized ones, by their ``completion_mask``)
        take the loss on the completion only."""
        if self.train_on_prompt:
            return False
        if self.completion_only_loss is None:  # TRL's unset: on where the records are prompt / completion
            return self.format in ("prompt_completion", "alpaca")
        return self.completion_only_loss

    def prompts(self) -> tuple[str, str]:
        """The ``"alpaca"`` prompt templates: (without input, with input)."""
        return TEMPLATES[self.template] if isinstance(self.template, str) else self.template


@attrs.frozen
class StrategySpec:
    """``[strategy]``: how the model is trained; dsbuild runs ``deepspeed_train``."""

    name: str = _key(STRATEGIES[0], _typed("choice", choices=STRATEGIES))
    """``"deepspeed_train"`` (the default)."""
    config: Config = _key(
        kw_only=True,
        missing='missing: a preset name (e.g. "zero3"), a config file, or a table of ds_config keys',
        schema={
            "anyOf": [
                {"type": "string", "minLength": 1, "description": "a preset name, or a config file next to the job"},
                {"$ref": "#/$defs/ds_config"},
            ]
        },
    )
    """The ds_config as written: the preset, file or inline table, with the overrides merged in."""
    ref: str = attrs.field(kw_only=True)
    """What ``config`` names: ``"preset zero3"``, ``"file ds.toml"`` or ``"inline table"``."""
    overrides: Mapping[str, Any] = _key(schema={"$ref": "#/$defs/ds_config"}, factory=dict)
    """``[strategy.overrides]``: ds_config keys deep-merged over the config."""


@attrs.frozen
class LaunchSpec:
    """``[launch]``: processes, nodes and devices."""

    nproc_per_node: int = _key(1, _typed("int", gt=0))
    """Processes per node; default 1, or ``len(device_mapping) / nnodes``."""
    nnodes: int = _key(1, _typed("int", gt=0))
    """Nodes; default 1."""
    device_mapping: tuple[int, ...] | None = _key(
        None,
        schema={
            "anyOf": [
                {"type": "array", "items": {"type": "integer", "minimum": 0}, "minItems": 1},
                {"type": "string", "description": "ROLL's: list(range(0, 8)), 0-7 or 0,1,2"},
            ]
        },
    )
    """The run's devices, node after node (ROLL's ``device_mapping``); ``None``: the first ``nproc_per_node``."""
    gpus_per_node: int | None = _key(None, _typed("int", gt=0))
    """Devices per machine, to turn ``device_mapping``'s global ids into a node's local ones (default: detected)."""
    infer_batch_size: int | None = _key(None, _typed("int", gt=0))
    """Per-device batch size of evaluation (default ``training.per_device_eval_batch_size``)."""
    backend: str = _key("torchrun", _typed("choice", choices=BACKENDS))
    """What starts the processes: ``"torchrun"`` (default) or ``"ray"`` (Ray Train's workers; docs/ray.md)."""
    max_failures: int = _key(0, _typed("int", ge=-1))
    """Ray: restarts of the worker group after a worker fails, each from the last checkpoint (Ray's
    ``FailureConfig.max_failures``; -1: no limit)."""
    storage_path: str | None = _key(None, _typed("str"))
    """Ray: where Ray keeps the run's checkpoints, a folder or a URI (``s3://...``); default ``output_dir/ray``."""

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
class ReferenceSpec:
    """``[reference]`` (``task = "dpo"``, or ``"grpo"`` with ``beta`` > 0): the frozen model the policy is scored
    against (``Session.reference``)."""

    path: str | None = _key(None, _typed("str"))
    """A local model directory (absolute once read) or a hub id; default: what the policy starts from (a LoRA
    policy: its own weights with the adapters disabled)."""
    offload: bool = _key(False, _typed("bool"))
    """Its parameters in CPU memory between uses (ZeRO stage 3 only: ``Config.for_inference(offload=True)``)."""
    precompute: bool = _key(False, _typed("bool"))
    """TRL's ``precompute_ref_log_probs``: the reference scores every pair once before training (again at each start,
    a resume included: the reference is fixed) and the loss reads those values."""


@attrs.frozen
class RolloutSpec:
    """``[rollout]`` (``task = "grpo"``): where the completions come from."""

    backend: str = _key("hf", _typed("choice", choices=ROLLOUT_BACKENDS))
    """``"hf"`` (default): the policy samples them (HF ``generate``; under ZeRO-3 the whole model gathered on every
    rank with ``grpo.ds3_gather_for_generation``, else the ranks stepping together); ``"function"``: ``function``."""
    function: str | None = _key(None, _typed("str"))
    """``"module:function"`` (``backend = "function"``): called with the prompts (one per completion), it returns the
    completions, as text or token ids (TRL's ``rollout_func``); the module is imported from the job file's folder or
    the Python path. A job file that names a function runs that code."""
    weight_sink: str | None = _key(None, _typed("str"))
    """``"module:function"`` (``backend = "function"``): called as ``sink(name, tensor)`` on every process with each
    of the policy's full weights (HF names, LoRA merged), before each generation batch the policy has changed since:
    how an external inference engine the rollout function calls gets the new weights (TRL's vLLM sync)."""


@attrs.frozen
class RewardsSpec:
    """``[rewards]`` (``task = "grpo"``): the reward models and functions, scored as TRL's ``GRPOTrainer`` scores
    its ``reward_funcs``."""

    functions: tuple[str, ...] = _key((), _typed("strs"))
    """``"module:function"`` each (TRL's ``reward_funcs``), called with ``prompts``, ``completions``,
    ``completion_ids`` and the record's other columns; one number per completion (``None``: not scored). The modules
    are imported from the job file's folder or the Python path: a job file that names a function runs that code."""
    models: tuple[str, ...] = _key((), _typed("strs"))
    """Reward models (TRL's ``reward_funcs`` strings): each a local folder (relative to the job file; absolute once
    read) or a hub id of an ``AutoModelForSequenceClassification`` with one label and its tokenizer, scored as TRL
    scores it, on a DeepSpeed inference engine of its own (``Config.for_inference`` of the strategy). Scored before
    the functions, and their rewards come first: ``weights`` gives the models' first, then the functions'."""
    offload_models: bool = _key(False, _typed("bool"))
    """The reward models' parameters in CPU memory between uses (ZeRO stage 3 only: ``Config.for_inference(offload=
    True)``)."""
    zero_stage: int | None = _key(None, _typed("int", ge=0, le=3))
    """The reward models' own ZeRO stage (``Config.for_inference(stage=...)``): 0, a whole copy on every process (its
    forward is not collective); 3, partitioned over the processes; default: the strategy's rule (3 stays 3, 0-2 run
    at 0)."""
    weights: tuple[float, ...] | None = _key(
        None,
        schema={"type": "array", "items": {"type": "number"}, "minItems": 1},
        converter=lambda v: tuple(v) if isinstance(v, list) else v,
    )
    """One weight per reward model and function, models first (TRL's ``reward_weights``); default 1.0 each."""
