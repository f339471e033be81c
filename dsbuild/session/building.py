"""Building the model: HF's ZeRO-3 construction (``zero.Init``) in a scope, gradient checkpointing, LoRA."""

from __future__ import annotations

import contextlib
import copy
import importlib
import warnings
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch

from ..errors import ConfigError, Problem

__all__ = [
    "LORA_TASK_TYPES",
    "apply_lora",
    "build_model",
    "enable_gradient_checkpointing",
    "lora_config",
    "pretrained_config",
    "ready_for_zero_init",
    "zero3_scope",
]

_DTYPES: Mapping[str, torch.dtype] = {
    "bf16": torch.bfloat16,
    "bfloat16": torch.bfloat16,
    "fp16": torch.float16,
    "float16": torch.float16,
    "half": torch.float16,
    "fp32": torch.float32,
    "float32": torch.float32,
    "float": torch.float32,
}

# The job TOML's short [model.lora] names -> peft's LoraConfig fields.
_LORA_ALIASES: Mapping[str, str] = {"rank": "r", "alpha": "lora_alpha", "dropout": "lora_dropout"}


def as_dtype(dtype: Any) -> Any:
    """``torch.dtype`` from ``"bf16"``, ``"bfloat16"``, ...; ``"auto"`` and dtypes pass through."""
    if dtype is None or isinstance(dtype, torch.dtype) or dtype == "auto":
        return dtype
    if isinstance(dtype, str) and dtype.lower() in _DTYPES:
        return _DTYPES[dtype.lower()]
    raise ConfigError(
        Problem("model.dtype", f"got {dtype!r}, expected one of {', '.join(repr(k) for k in [*_DTYPES, 'auto'])}")
    )


# Modules that building an HF model imports lazily, and that break when first imported inside ``zero.Init``:
# ``zero.Init`` replaces torch's tensor constructors, and ``torch._dynamo`` checks their signatures when it is first
# imported (transformers >= 5.24 imports it from ``generation`` -> ``masking_utils`` while the model is built:
# "TypeError: Signature mismatch ... new_tensor ... tensor_pynew"). Imported before ``zero.Init``, they are cached.
_IMPORT_BEFORE_ZERO_INIT = ("torch._dynamo", "transformers.masking_utils", "transformers.generation")


def ready_for_zero_init(model_config: Any = None) -> None:
    """Import now what building a model imports lazily, so that it is not first imported inside ``zero.Init``.

    Call it before ``with deepspeed.zero.Init(...)`` in your own code (``Session`` calls it itself). Given a
    ``PretrainedConfig``, the module of the causal-LM class it maps to is imported as well.
    """
    for name in _IMPORT_BEFORE_ZERO_INIT:
        with contextlib.suppress(ImportError):  # older transformers have no masking_utils
            importlib.import_module(name)
    if model_config is not None:
        with contextlib.suppress(Exception):  # a config without a causal-LM class fails later, with HF's message
            from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

            MODEL_FOR_CAUSAL_LM_MAPPING[type(model_config)]


@contextlib.contextmanager
def zero3_scope(ds_config: Mapping[str, Any]) -> Iterator[None]:
    """HF's ZeRO-3 switch, on only while the model is built.

    transformers builds a model inside ``deepspeed.zero.Init`` (each parameter
    partitioned as it is created, never whole on one device) while an
    ``HfDeepSpeedConfig`` is alive; HF keeps only a weak reference, so we hold it
    here. Afterwards the switch is put back as it was, so a later
    ``from_pretrained`` in the same process loads whole weights as usual.
    """
    stage = (ds_config.get("zero_optimization") or {}).get("stage", 0)
    if stage != 3:
        yield
        return
    ready_for_zero_init()
    hf_ds: Any = importlib.import_module("transformers.integrations.deepspeed")

    previous = getattr(hf_ds, "_hf_deepspeed_config_weak_ref", None)
    previous_obj = previous() if previous is not None else None
    keep_alive = hf_ds.HfDeepSpeedConfig(copy.deepcopy(dict(ds_config)))
    try:
        yield
    finally:
        if previous_obj is not None:
            hf_ds.set_hf_deepspeed_config(previous_obj)
        else:
            hf_ds.unset_hf_deepspeed_config()
        del keep_alive


def pretrained_config(source: Any) -> Any:
    """The model's ``PretrainedConfig``: ``source`` itself, or read from a local directory or hub id."""
    from transformers import AutoConfig, PretrainedConfig

    if isinstance(source, PretrainedConfig):
        return source
    if isinstance(source, (str, Path)):
        return AutoConfig.from_pretrained(str(source))
    raise ConfigError(
        Problem(
            "model", f"got {type(source).__name__}, expected a local path, a hub id or a transformers PretrainedConfig"
        )
    )


def build_model(
    source: Any,
    ds_config: Mapping[str, Any],
    *,
    dtype: Any = None,
    attn_implementation: str | None = None,
    kind: str = "AutoModelForCausalLM",
    **more: Any,
) -> Any:
    """A causal LM (or another of transformers' ``kind`` of auto class, with ``more`` of its arguments: a reward
    model's ``AutoModelForSequenceClassification`` with ``num_labels=1``) from a path / hub id (its weights) or a
    ``PretrainedConfig`` (random init; ``more`` then set on a copy of it, as ``from_pretrained`` sets them on the
    config it reads), ZeRO-3 aware."""
    from transformers import PretrainedConfig

    auto: Any = getattr(importlib.import_module("transformers"), kind)
    kwargs: dict[str, Any] = {}
    if isinstance(source, PretrainedConfig) and more:
        source = copy.deepcopy(source)
        source.update(dict(more))
    else:
        kwargs.update(more)
    if dtype is not None:
        kwargs["dtype"] = as_dtype(dtype)
    if attn_implementation is not None:
        kwargs["attn_implementation"] = attn_implementation
    if isinstance(source, PretrainedConfig):
        ready_for_zero_init(source)
    with zero3_scope(ds_config):
        if isinstance(source, PretrainedConfig):
            if kwargs.get("dtype") == "auto":
                del kwargs["dtype"]
            return auto.from_config(source, **kwargs)
        return auto.from_pretrained(str(source), **kwargs)


def enable_gradient_checkpointing(model: Any, *, lora: bool) -> None:
    """Non-reentrant activation checkpointing (works with ZeRO-3 and frozen base weights)."""
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.x's name
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    elif hasattr(model, "gradient_checkpointing_enable"):
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    else:
        raise ConfigError(Problem("gradient_checkpointing", f"{type(model).__name__} does not support it"))
    if getattr(model, "config", None) is not None and hasattr(model.config, "use_cache"):
        model.config.use_cache = False  # the KV cache is useless in training and conflicts with checkpointing
    if lora and hasattr(model, "enable_input_require_grads"):
        # With every base weight frozen, the embeddings' output needs grad for checkpointed blocks to backpropagate.
        model.enable_input_require_grads()


LORA_TASK_TYPES: Mapping[str, str] = {"AutoModelForSequenceClassification": "SEQ_CLS"}
"""peft's ``task_type`` of a model built by each auto class other than the causal LM's (``SEQ_CLS``: the new score
head is trained and saved with the adapters, as peft's ``modules_to_save``)."""


def lora_config(lora: Any, task_type: str = "CAUSAL_LM") -> Any:
    """A peft ``LoraConfig`` from one, or from a mapping of its fields (``rank``/``alpha``/``dropout`` accepted;
    ``task_type`` unless they say it)."""
    from peft import LoraConfig, PeftConfig

    if isinstance(lora, PeftConfig):
        return lora
    if not isinstance(lora, Mapping):
        raise ConfigError(
            Problem("lora", f"got {type(lora).__name__}, expected a peft LoraConfig or a table of its fields")
        )
    fields = {_LORA_ALIASES.get(k, k): v for k, v in lora.items()}
    fields.setdefault("task_type", task_type)
    if isinstance(fields.get("target_modules"), (list, tuple)):
        fields["target_modules"] = list(fields["target_modules"])
    try:
        return LoraConfig(**fields)
    except TypeError as error:
        raise ConfigError(Problem("lora", str(error))) from None


def apply_lora(model: Any, lora: Any, task_type: str = "CAUSAL_LM") -> Any:
    """Wrap ``model`` with LoRA adapters (``lora``: a peft config or its fields, ``task_type`` unless they say it);
    only the adapters stay trainable (and a ``SEQ_CLS`` model's score head)."""
    from peft import get_peft_model

    # peft (0.21) asks the model whether to prepare it for checkpointing by the name transformers 5 deprecated
    # (is_gradient_checkpointing, now is_activation_checkpointing), which warns at every LoRA model built, checkpointing
    # on or off: the answer is the same, so that one warning of that one call is not shown (peft's choice is unchanged).
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated", category=FutureWarning)
        return get_peft_model(model, lora_config(lora, task_type))
