"""The model out of the engine: consolidated 16-bit weights in Hugging Face format (or peft adapters), and what
the model is (its fingerprints, for checkpoints)."""

from __future__ import annotations

import contextlib
import copy
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from ..outputs.manifest import fingerprint
from . import distributed

__all__ = [
    "BASE",
    "base_model",
    "built_from_config",
    "full_state_dict",
    "is_peft",
    "lora_fingerprint",
    "model_fingerprint",
    "save_hf",
    "trainable_state_dict",
]


def _partitioned(engine: Any) -> bool:
    return bool(engine.zero_optimization_partition_weights())


def full_state_dict(engine: Any) -> dict[str, torch.Tensor] | None:
    """Collective: every weight, whole, on CPU, in the training dtype, on rank 0 (``None`` elsewhere)."""
    if engine.autotp_size() > 1:  # each rank holds its tensor-parallel slice of the linear layers: DeepSpeed joins them
        tp: dict[str, torch.Tensor] | None = engine._consolidated_16bit_state_dict()
        return tp
    if _partitioned(engine):
        # Gathers one module at a time, so no device ever holds the whole model.
        sd: dict[str, torch.Tensor] | None = engine._zero3_consolidated_16bit_state_dict()
        return sd
    if distributed.rank() != 0:
        return None
    return {k: v.detach().cpu() for k, v in engine.module.state_dict().items()}


def trainable_state_dict(engine: Any) -> dict[str, torch.Tensor] | None:
    """Collective: the trainable parameters (LoRA adapters), whole, on CPU, on rank 0 (``None`` elsewhere).

    Under ZeRO-3 every rank holds a slice of each adapter (an empty tensor locally),
    so they are gathered first; reading them directly would save empty adapters.
    """
    import deepspeed

    named = [(n, p) for n, p in engine.module.named_parameters() if p.requires_grad]
    main = distributed.rank() == 0
    gather = (
        deepspeed.zero.GatheredParameters([p for _, p in named]) if _partitioned(engine) else contextlib.nullcontext()
    )
    with gather:
        return {n: p.detach().cpu().clone() for n, p in named} if main else None


@contextlib.contextmanager
def _no_hf_zero3() -> Iterator[None]:
    """Build a plain CPU model even if someone's HfDeepSpeedConfig (ZeRO-3) is alive in this process."""
    from transformers.integrations import deepspeed as hf_ds

    previous = getattr(hf_ds, "_hf_deepspeed_config_weak_ref", None)
    hf_ds._hf_deepspeed_config_weak_ref = None
    try:
        yield
    finally:
        hf_ds._hf_deepspeed_config_weak_ref = previous


def _dtype_of(sd: dict[str, torch.Tensor]) -> torch.dtype:
    for v in sd.values():
        if torch.is_floating_point(v):
            return v.dtype
    return torch.float32


def merged_model(model: Any, sd: dict[str, torch.Tensor]) -> Any:
    """A CPU copy of the peft ``model`` holding the weights ``sd``, with its adapters merged into the base weights."""
    return _cpu_copy(model, sd).merge_and_unload()


def base_model(model: Any, sd: dict[str, torch.Tensor]) -> Any:
    """A CPU copy of the peft ``model``'s base holding the weights ``sd`` (the adapters left out, not merged)."""
    return _cpu_copy(model, sd).unload()


def built_from_config(model: Any) -> bool:
    """Whether the peft ``model``'s base was built from a config (random init, saved nowhere): then its adapters
    alone cannot be loaded, and ``save_hf`` saves the base beside them."""
    config = getattr(model.get_base_model(), "config", None)
    return config is not None and not getattr(config, "_name_or_path", "")


def _cpu_copy(model: Any, sd: dict[str, torch.Tensor]) -> Any:
    """A CPU copy of the peft ``model`` (its base built anew from its config) holding the weights ``sd``."""
    from .building import apply_lora

    base = model.get_base_model()
    with _no_hf_zero3():
        fresh = type(base)._from_config(copy.deepcopy(base.config), dtype=_dtype_of(sd))
    adapter = model.active_adapter if isinstance(model.active_adapter, str) else model.active_adapter[0]
    fresh = apply_lora(fresh, copy.deepcopy(model.peft_config[adapter]))  # peft's wrapping, without its warning
    missing, unexpected = fresh.load_state_dict(sd, strict=False)
    if unexpected or any("lora_" in k or k.endswith("weight") for k in missing):
        raise RuntimeError(
            f"exporting LoRA: state dict does not fit the model (missing {missing}, unexpected {unexpected})"
        )
    return fresh


def is_peft(model: Any) -> bool:
    """Whether ``model`` is a peft model (without importing peft when nothing has: then it cannot be one)."""
    peft = sys.modules.get("peft")
    return peft is not None and isinstance(model, peft.PeftModel)


def save_hf(engine: Any, model: Any, path: str | Path, *, merge_lora: bool = False, tokenizer: Any = None) -> None:
    """Collective: rank 0 writes ``model`` to ``path`` in HF format (safetensors) with the engine's trained weights.

    A peft model writes its adapters (``adapter_model.safetensors``), or with
    ``merge_lora=True`` the base model with the adapters merged in. Adapters on a base built from a config (random
    weights that exist nowhere else) come with their base, in ``path/base``, which their ``adapter_config.json``
    names (absolute), so ``AutoPeftModelForCausalLM.from_pretrained(path)`` loads both. A plain
    ``nn.Module`` writes ``model.safetensors``.
    """
    from safetensors.torch import save_file

    path = Path(path)
    peft = is_peft(model)
    with_base = peft and not merge_lora and built_from_config(model)
    sd = trainable_state_dict(engine) if peft and not merge_lora and not with_base else full_state_dict(engine)
    if distributed.rank() == 0:
        assert sd is not None
        path.mkdir(parents=True, exist_ok=True)
        if peft and merge_lora:
            merged_model(model, sd).save_pretrained(path)
        elif with_base:
            base = path.resolve() / BASE
            base_model(model, sd).save_pretrained(base)
            _save_adapters(model, path, sd, base_name=str(base))
        elif peft or hasattr(model, "save_pretrained"):
            model.save_pretrained(path, state_dict=sd)
        else:
            # safetensors refuses tensors that share storage (tied weights): write each once, contiguous.
            save_file({k: v.contiguous().clone() for k, v in sd.items()}, str(path / "model.safetensors"))
        if tokenizer is not None:
            tokenizer.save_pretrained(path)
    distributed.barrier()


BASE = "base"
"""The folder, inside a LoRA model's export, of the base it was trained on when that was built from a config."""


def _save_adapters(model: Any, path: Path, sd: dict[str, torch.Tensor], *, base_name: str) -> None:
    """The peft ``model``'s adapters out of ``sd``, with ``base_name`` as their ``base_model_name_or_path``."""
    configs = model.peft_config
    before = {name: config.base_model_name_or_path for name, config in configs.items()}
    try:
        for config in configs.values():
            config.base_model_name_or_path = base_name
        model.save_pretrained(path, state_dict=sd)
    finally:
        for name, config in configs.items():
            config.base_model_name_or_path = before[name]


def model_fingerprint(model: Any) -> str:
    """A digest of the model's architecture: its HF config (without versions and runtime switches), else its
    parameter names and shapes."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    config = getattr(base, "config", None)
    if config is not None and hasattr(config, "to_dict"):
        skip = {"transformers_version", "use_cache", "torch_dtype", "dtype", "architectures", "name_or_path"}
        table = {k: v for k, v in config.to_dict().items() if k not in skip and not k.startswith("_")}
        return fingerprint(table)
    shapes = [(name, list(getattr(p, "ds_shape", p.shape))) for name, p in base.named_parameters()]
    return fingerprint(shapes)


def lora_fingerprint(model: Any) -> str | None:
    """A digest of the active LoRA adapter's config, or ``None`` for a model without adapters."""
    if not is_peft(model):
        return None
    adapter = model.active_adapter if isinstance(model.active_adapter, str) else model.active_adapter[0]
    table = model.peft_config[adapter].to_dict()
    skip = {"base_model_name_or_path", "revision", "inference_mode", "peft_version"}
    return fingerprint({k: v for k, v in table.items() if k not in skip})
