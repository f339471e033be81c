"""The parts of a job: what to train (``[model]``), on what (``[data]``), how (``[strategy]``) and where
(``[launch]``), each a frozen class the reader fills."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

import attrs

from ..api import Config
from .formats import TEMPLATES

__all__ = [
    "ATTN_IMPLEMENTATIONS",
    "BACKENDS",
    "BYTE_TOKENIZER",
    "BYTE_VOCAB",
    "DTYPES",
    "JOB_TABLES",
    "STRATEGIES",
    "DataSpec",
    "LaunchSpec",
    "LoraSpec",
    "ModelSpec",
    "StrategySpec",
]

JOB_TABLES: Final = ("model", "data", "training", "strategy", "launch")
"""The top-level tables of a job file; a file with any of them is a job, not a ds_config."""


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
    hidden_size: int | None = None
    """The model's hidden size when the reader could tell it without loading anything (from ``[model.config]`` or a
    local directory's ``config.json``); ``None`` for a hub id."""


@attrs.frozen
class DataSpec:
    """``[data]``: the training (and evaluation) data."""

    path: Path | str
    """The training records: a data file or folder (absolute once read; given relative to the job file), a folder
    written by ``datasets``' ``save_to_disk``, or a hub dataset id (``owner/name``, a ``str``)."""
    format: str
    """``"text"``, ``"alpaca"`` (instruction / input / output), ``"messages"`` (role / content turns),
    ``"sharegpt"`` (``conversations`` of from / value turns), ``"prompt_completion"`` (TRL's: ``prompt`` and
    ``completion`` strings, or lists of messages) or ``"tokenized"`` (``input_ids``, optionally ``labels`` and
    ``attention_mask``, taken as given)."""
    max_length: int = 512
    """Tokens per sample at most; longer samples are cut at the end."""
    eval_path: Path | str | None = None
    """Evaluation records in the same format (a file, folder or hub id), or none."""
    eval_split: float | str | None = None
    """Evaluation records from ``path`` itself: a fraction held out of it (``0.05``), or the name of one of its
    splits (``"test"``); none by default."""
    split: str = "train"
    """The split of a hub dataset or ``save_to_disk`` folder of several splits to train on."""
    template: str | tuple[str, str] = "alpaca"
    """Prompt template of ``"alpaca"`` records: ``"alpaca"`` (Stanford Alpaca's), ``"plain"``, or the job's own
    ``(prompt_no_input, prompt_input)``."""
    chat_template: str | None = None
    """A Jinja chat template for ``"messages"`` / ``"sharegpt"``; default the tokenizer's, else ``FALLBACK_CHAT_TEMPLATE``."""
    columns: Mapping[str, str] = attrs.field(factory=dict)
    """The file's names for the format's fields (``FIELDS``), where they differ: ``{"output": "answer"}``."""
    packing: bool = False
    """Put several samples into each ``max_length`` sequence (positions restart per sample; the model's attention
    keeps them apart where it supports packed sequences)."""
    train_on_prompt: bool = False
    """Take the loss on every token, prompts and user turns included (LLaMA-Factory's name): both
    ``assistant_only_loss`` and ``completion_only_loss`` off."""
    assistant_only_loss: bool = True
    """TRL's: in conversations, the loss on the assistant's turns only (TRL's default is off; see docs/jobs.md)."""
    completion_only_loss: bool = True
    """TRL's: in prompt / completion records (and ``"alpaca"``), the loss on the completion only."""
    packing_strategy: str = "bfd"
    """TRL's: ``"bfd"``, ``"bfd_split"`` or ``"wrapped"`` (``PACKING_STRATEGIES``)."""
    padding_free: bool = False
    """TRL's: each micro-batch as one row, its samples concatenated with restarting ``position_ids``."""
    eos_token: str | None = None
    """TRL's: the token that ends a text or completion (appended unless it ends with it); default the
    tokenizer's end-of-sequence token."""
    num_proc: int | None = None
    """Processes tokenizing the data (``datasets``' ``map``); default one."""

    @property
    def text_field(self) -> str:
        """The field holding the text of ``"text"`` records."""
        return self.field("text")

    def field(self, name: str) -> str:
        """The file's name for the format's field ``name``."""
        return self.columns.get(name, name)

    @property
    def loss_on_assistant_only(self) -> bool:
        """Whether conversations take the loss on the assistant's turns only."""
        return self.assistant_only_loss and not self.train_on_prompt

    @property
    def loss_on_completion_only(self) -> bool:
        """Whether prompt / completion and instruction records take the loss on the completion only."""
        return self.completion_only_loss and not self.train_on_prompt

    def prompts(self) -> tuple[str, str]:
        """The ``"alpaca"`` prompt templates: (without input, with input)."""
        return TEMPLATES[self.template] if isinstance(self.template, str) else self.template


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
    backend: str = "torchrun"
    """What starts the processes: ``"torchrun"`` (default) or ``"ray"`` (Ray Train's workers; docs/ray.md)."""
    max_failures: int = 0
    """Ray: restarts of the worker group after a worker fails, each from the last checkpoint (Ray's
    ``FailureConfig.max_failures``; -1: no limit)."""
    storage_path: str | None = None
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
