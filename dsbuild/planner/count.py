"""Counting a model's parameters without building it: from an HF config (or ``config.json``), or a model in hand.

An architecture the analytic counter does not know is built on PyTorch's ``meta`` device (no memory allocated)
to count it.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import attrs

from ..errors import ConfigError, InvalidValueError, MissingDependencyError, Problem
from ..io.config_files import read_table

__all__ = ["DEFAULTS", "ModelSize", "Shape", "count_params", "count_scorer"]


@attrs.frozen
class Shape:
    """What a transformer's activation memory depends on, read from its config."""

    hidden_size: int
    """Width of the residual stream (``hidden_size``, GPT-2's ``n_embd``)."""
    num_layers: int
    """Transformer layers (``num_hidden_layers``, GPT-2's ``n_layer``)."""
    num_heads: int
    """Attention (query) heads (``num_attention_heads``, GPT-2's ``n_head``)."""
    vocab_size: int
    """Tokens in the vocabulary: the width of the logits."""


@attrs.frozen
class ModelSize:
    """How many parameters a model has, its largest layer (what ZeRO-3 gathers at once) and its shape."""

    params: int
    """Total parameters, shared (tied) ones once."""
    largest_layer_params: int
    """Parameters of the largest module, counting only its own (not its children's): DeepSpeed's ``largest_layer_params``."""
    source: str
    """Where the count came from, e.g. ``"llama config, counted analytically"``."""
    shape: Shape | None = None
    """Hidden size, layers, heads and vocabulary, for activation memory; ``None`` when no config says them."""


def count_params(model: Any) -> ModelSize:
    """Count an HF config (object, dict, ``config.json`` or its directory) or a model object.

    Decoder architectures dsbuild knows (llama, mistral, qwen2, qwen3, gemma,
    gemma2, gemma3_text, phi3, gpt2, gpt_neox) are counted from the config
    alone; any other config is built on the meta device (needs torch and
    transformers; allocates nothing).
    """
    if isinstance(model, str | os.PathLike):
        return _count_config(_read_config_json(Path(model)), source_path=Path(model))
    if isinstance(model, Mapping):
        return _count_config(dict(model))
    if callable(getattr(model, "parameters", None)) and callable(getattr(model, "modules", None)):
        return attrs.evolve(_count_module(model, "model object"), shape=_shape_of(getattr(model, "config", None)))
    if callable(getattr(model, "to_dict", None)) and hasattr(model, "model_type"):
        return _count_config(model.to_dict(), config_object=model)
    raise InvalidValueError(
        Problem(
            "model",
            f"got {type(model).__name__}, expected an HF config (object, dict, path to config.json) or a model",
        )
    )


def count_scorer(model: str | os.PathLike[str] | Mapping[str, Any], labels: int = 1) -> int:
    """Parameters of the ``AutoModelForSequenceClassification`` with ``labels`` labels built from a causal model's
    config (a dict, ``config.json`` or its folder), as TRL builds a reward model: the decoder without its LM head (the
    count with the head tied to the embeddings), and a score head of ``labels`` x hidden, without bias."""
    data = dict(model) if isinstance(model, Mapping) else _read_config_json(Path(model))
    size = _count_config({**data, "tie_word_embeddings": True})
    if size.shape is None:
        raise InvalidValueError(Problem("model", f"cannot tell the hidden size of {size.source}"))
    return size.params + labels * size.shape.hidden_size


def _read_config_json(path: Path) -> dict[str, Any]:
    file = path / "config.json" if path.is_dir() else path
    if not file.is_file():
        raise InvalidValueError(
            Problem(
                "model",
                f"no such file: {str(file)!r}",
                "give a local directory holding config.json, or the file itself; hub ids are not downloaded",
            )
        )
    try:
        return read_table(file)
    except ConfigError as err:
        reason = "; ".join(str(p) for p in err.problems)
        raise InvalidValueError(Problem("model", f"cannot read {str(file)!r}: {reason}")) from None


def _count_module(model: Any, source: str) -> ModelSize:
    """DeepSpeed's ``model_to_params``: shared parameters once; largest module by its own parameters.

    A parameter partitioned by ``zero.Init`` has ``numel() == 0``; its full
    size is ``ds_numel``.
    """

    def numel(p: Any) -> int:
        return int(getattr(p, "ds_numel", None) or p.numel())

    total = sum(numel(p) for p in model.parameters())
    largest = max((sum(numel(p) for p in m.parameters(recurse=False)) for m in model.modules()), default=0)
    return ModelSize(total, largest, source)


DEFAULTS: dict[str, dict[str, Any]] = {
    "llama": {"attention_bias": False, "mlp_bias": False, "tie_word_embeddings": False},
    "mistral": {"tie_word_embeddings": False},
    "qwen2": {"tie_word_embeddings": False},
    "qwen3": {"attention_bias": False, "tie_word_embeddings": False},
    "gemma": {"attention_bias": False, "tie_word_embeddings": True, "head_dim": 256},
    "gemma2": {"attention_bias": False, "tie_word_embeddings": True, "head_dim": 256},
    "gemma3_text": {"attention_bias": False, "tie_word_embeddings": True, "head_dim": 256},
    "phi3": {"tie_word_embeddings": False},
    "gpt2": {"tie_word_embeddings": True, "n_positions": 1024, "add_cross_attention": False},
    "gpt_neox": {"attention_bias": True, "tie_word_embeddings": False},
}


class _Modules:
    """The modules of a model, by their own parameter counts; tied weights counted once in the total."""

    def __init__(self) -> None:
        self.total = 0
        self.largest = 0

    def add(self, numel: int, *, repeat: int = 1, shared: bool = False) -> None:
        self.largest = max(self.largest, numel)
        if not shared:
            self.total += numel * repeat


def _count_config(data: dict[str, Any], *, source_path: Path | None = None, config_object: Any = None) -> ModelSize:
    model_type = data.get("model_type")
    counter = _COUNTERS.get(model_type) if isinstance(model_type, str) else None
    if counter is None:
        return _count_on_meta(data, source_path=source_path, config_object=config_object)
    values = {**DEFAULTS[str(model_type)], **{k: v for k, v in data.items() if v is not None}}
    modules = _Modules()
    shape = counter(_Reader(values, str(model_type)), modules)
    return ModelSize(modules.total, modules.largest, f"{model_type} config, counted analytically", shape)


class _Reader:
    """Typed reads from a config dict, each failure naming the key."""

    def __init__(self, values: Mapping[str, Any], model_type: str) -> None:
        self.values = values
        self.model_type = model_type

    def int(self, *keys: str, default: int | None = None) -> int:
        for key in keys:
            value = self.values.get(key)
            if value is not None:
                if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                    raise InvalidValueError(
                        Problem(
                            f"model.{key}", f"got {value!r}, expected a non-negative integer ({self.model_type} config)"
                        )
                    )
                return value
        if default is not None:
            return default
        raise InvalidValueError(Problem(f"model.{keys[0]}", f"missing from the {self.model_type} config"))

    def flag(self, key: str) -> bool:
        return bool(self.values.get(key, False))


def _llama_like(c: _Reader, m: _Modules) -> Shape:
    """llama, mistral, qwen2, qwen3, gemma, gemma2, gemma3_text, phi3: RMSNorm decoders with gated MLPs."""
    kind = c.model_type
    vocab, hidden, inter = c.int("vocab_size"), c.int("hidden_size"), c.int("intermediate_size")
    layers, heads = c.int("num_hidden_layers"), c.int("num_attention_heads")
    kv_heads = c.int("num_key_value_heads", default=heads)
    head_dim = c.int("head_dim", default=hidden // heads if heads else 0)
    q_out, kv_out = heads * head_dim, kv_heads * head_dim

    if kind == "qwen2":
        qkv_bias, o_bias = True, False
    elif kind in ("mistral", "phi3"):
        qkv_bias = o_bias = False
    else:
        qkv_bias = o_bias = c.flag("attention_bias")
    mlp_bias = kind == "llama" and c.flag("mlp_bias")
    norms = 4 if kind in ("gemma2", "gemma3_text") else 2

    m.add(vocab * hidden)  # embed_tokens
    if kind == "phi3":
        m.add(hidden * (q_out + 2 * kv_out), repeat=layers)  # qkv_proj
        m.add(hidden * 2 * inter, repeat=layers)  # gate_up_proj
    else:
        m.add(hidden * q_out + (q_out if qkv_bias else 0), repeat=layers)  # q_proj
        m.add(hidden * kv_out + (kv_out if qkv_bias else 0), repeat=2 * layers)  # k_proj, v_proj
        m.add(hidden * inter + (inter if mlp_bias else 0), repeat=2 * layers)  # gate_proj, up_proj
    m.add(q_out * hidden + (hidden if o_bias else 0), repeat=layers)  # o_proj
    m.add(inter * hidden + (hidden if mlp_bias else 0), repeat=layers)  # down_proj
    if kind in ("qwen3", "gemma3_text"):
        m.add(head_dim, repeat=2 * layers)  # q_norm, k_norm
    m.add(hidden, repeat=norms * layers)  # input/post-attention (and pre/post-feedforward) norms
    m.add(hidden)  # final norm
    m.add(vocab * hidden, shared=c.flag("tie_word_embeddings"))  # lm_head
    return Shape(hidden, layers, heads, vocab)


def _gpt2(c: _Reader, m: _Modules) -> Shape:
    """GPT-2: learned positions, LayerNorm with bias, Conv1D projections with bias."""
    vocab, hidden = c.int("vocab_size"), c.int("n_embd", "hidden_size")
    layers, heads = c.int("n_layer", "num_hidden_layers"), c.int("n_head", "num_attention_heads")
    inter = c.int("n_inner", default=4 * hidden)
    positions = c.int("n_positions", "max_position_embeddings")
    layer_norm = 2 * hidden

    m.add(vocab * hidden)  # wte
    m.add(positions * hidden)  # wpe
    m.add(layer_norm, repeat=2 * layers)  # ln_1, ln_2
    m.add(hidden * 3 * hidden + 3 * hidden, repeat=layers)  # attn.c_attn
    m.add(hidden * hidden + hidden, repeat=layers)  # attn.c_proj
    m.add(hidden * inter + inter, repeat=layers)  # mlp.c_fc
    m.add(inter * hidden + hidden, repeat=layers)  # mlp.c_proj
    if c.flag("add_cross_attention"):
        m.add(hidden * 2 * hidden + 2 * hidden, repeat=layers)  # crossattention.c_attn
        m.add(hidden * hidden + hidden, repeat=2 * layers)  # crossattention.q_attn, c_proj
        m.add(layer_norm, repeat=layers)  # ln_cross_attn
    m.add(layer_norm)  # ln_f
    m.add(vocab * hidden, shared=c.flag("tie_word_embeddings"))  # lm_head
    return Shape(hidden, layers, heads, vocab)


def _gpt_neox(c: _Reader, m: _Modules) -> Shape:
    """GPT-NeoX (Pythia): fused QKV, LayerNorm with bias, plain MLP with bias."""
    vocab, hidden, inter = c.int("vocab_size"), c.int("hidden_size"), c.int("intermediate_size")
    layers, heads = c.int("num_hidden_layers"), c.int("num_attention_heads")
    bias = c.flag("attention_bias")

    m.add(vocab * hidden)  # embed_in
    m.add(2 * hidden, repeat=2 * layers)  # input/post-attention LayerNorm
    m.add(hidden * 3 * hidden + (3 * hidden if bias else 0), repeat=layers)  # query_key_value
    m.add(hidden * hidden + (hidden if bias else 0), repeat=layers)  # dense
    m.add(hidden * inter + inter, repeat=layers)  # dense_h_to_4h
    m.add(inter * hidden + hidden, repeat=layers)  # dense_4h_to_h
    m.add(2 * hidden)  # final_layer_norm
    m.add(vocab * hidden, shared=c.flag("tie_word_embeddings"))  # lm_head (embed_out)
    return Shape(hidden, layers, heads, vocab)


_COUNTERS: dict[str, Callable[[_Reader, _Modules], Shape]] = {
    **dict.fromkeys(("llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3_text", "phi3"), _llama_like),
    "gpt2": _gpt2,
    "gpt_neox": _gpt_neox,
}


def _count_on_meta(data: dict[str, Any], *, source_path: Path | None, config_object: Any) -> ModelSize:
    """Build the model on PyTorch's meta device (shapes only, no memory) and count it."""
    model_type = data.get("model_type")
    if not model_type and config_object is None:
        raise InvalidValueError(
            Problem("model.model_type", "missing: cannot tell the architecture", "pass params= instead")
        )
    try:
        import torch
        import transformers
    except ImportError as err:
        package = "transformers" if "transformers" in str(err) else "torch"
        raise MissingDependencyError(package, f"counting the parameters of a {model_type} config") from None
    if config_object is None:
        fields = {k: v for k, v in data.items() if k != "model_type"}
        try:
            config_object = transformers.AutoConfig.for_model(str(model_type), **fields)
        except (ValueError, KeyError):  # a model type this transformers does not know
            where = f" in {str(source_path)!r}" if source_path is not None else ""
            raise InvalidValueError(
                Problem(
                    "model.model_type",
                    f"got {model_type!r}{where}, unknown to transformers {transformers.__version__}",
                    "pass params= (and largest_layer_params=) instead",
                )
            ) from None
    auto_model: Any = transformers.AutoModelForCausalLM
    with torch.device("meta"):
        model = auto_model.from_config(config_object)
    size = _count_module(model, f"{model_type} config, built on the meta device")
    return attrs.evolve(size, shape=_shape_of(config_object))


_SHAPE_KEYS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size")
"""The ``PretrainedConfig`` attributes of a ``Shape``; each class maps its own names to them (GPT-2's ``n_embd``...)."""


def _shape_of(config: Any) -> Shape | None:
    """The shape an HF config object states (its text model's, for a multimodal one), or ``None``."""
    text = config.get_text_config() if callable(getattr(config, "get_text_config", None)) else config
    values: list[int] = []
    for key in _SHAPE_KEYS:
        value = getattr(text, key, None)
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            return None
        values.append(value)
    return Shape(*values)


def count_lora(model: Any, lora: Mapping[str, Any]) -> int:
    """The parameters LoRA adds to ``model`` (an HF config, as ``count_params`` takes it): peft's own adapters on a
    model built on the meta device, so ``target_modules`` (a list, ``"all-linear"``, or peft's default for the
    architecture) match exactly as they will in training. ``lora``: peft ``LoraConfig`` fields (``r``,
    ``target_modules``, ...). Needs torch, transformers and peft; allocates nothing."""
    try:
        import torch
        import transformers
        from peft import LoraConfig, get_peft_model
    except ImportError as err:
        raise MissingDependencyError(str(err.name or "peft"), "planning a LoRA run") from None
    data = _read_config_json(Path(model)) if isinstance(model, str | os.PathLike) else model
    try:
        config = (
            transformers.AutoConfig.for_model(
                str(data["model_type"]), **{k: v for k, v in data.items() if k != "model_type"}
            )
            if isinstance(data, Mapping)
            else getattr(data, "config", data)  # a model object: its config
        )
    except (KeyError, TypeError, ValueError) as e:
        raise InvalidValueError(Problem("model", f"cannot read the model's config to count LoRA: {e}")) from None
    auto_model: Any = transformers.AutoModelForCausalLM
    with torch.device("meta"), warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # transformers' renamings, as peft calls them
        try:
            base = auto_model.from_config(config)
        except (AttributeError, KeyError, TypeError, ValueError) as e:
            raise InvalidValueError(Problem("model", f"cannot build a causal LM from it to count LoRA: {e}")) from None
        try:
            wrapped = get_peft_model(base, LoraConfig(**dict(lora)))
        except (TypeError, ValueError) as e:
            raise InvalidValueError(Problem("model.lora", f"peft refuses it: {e}")) from None
    return sum(p.numel() for p in wrapped.parameters() if p.requires_grad)
