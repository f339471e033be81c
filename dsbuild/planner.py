"""Memory planning: what each ZeRO stage and offload choice needs per GPU and per node, and which to use.

The figures are DeepSpeed's own model-state accounting
(``estimate_zero2_model_states_mem_needs`` and ``estimate_zero3_model_states_mem_needs``
with ``zero_init`` on), reproduced here without importing DeepSpeed and
extended to stages 0 and 1 and to NVMe offload. Mixed-precision training with
Adam keeps, per parameter:

- 2 bytes of 16-bit parameters,
- 2 bytes of 16-bit gradients,
- 16 bytes of optimizer-side state: fp32 gradients (4), fp32 master
  parameters (4), Adam momentum and variance (8).

ZeRO partitions the optimizer-side state across GPUs at stage 1, the
gradients too at stage 2 and the parameters too at stage 3; offload moves the
optimizer-side state (stages 1-3) or the 16-bit parameters (stage 3) to CPU
memory or, at stage 3, to NVMe. Activations, temporary buffers and the CUDA
context are not in these figures.

Nothing here imports torch or DeepSpeed: a parameter count, an HF config (an
object, a dict, or a local ``config.json``) or a model object in hand is
enough. Only an architecture the analytic counter does not know is built on
PyTorch's ``meta`` device (no memory allocated) to count it.
"""

from __future__ import annotations

import json
import math
import os
import re
import textwrap
from collections.abc import Callable, Iterable, Mapping
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any, Literal

import attrs

from .config import Config
from .errors import InvalidValueError, MissingDependencyError, Problem

__all__ = [
    "DEFAULT_NVME_PATH",
    "SPEED_ORDER",
    "ModelSize",
    "Plan",
    "Row",
    "count_params",
    "estimate_activation_bytes",
    "format_plan_table",
    "model_state_bytes",
    "parse_count",
    "parse_size",
    "plan",
    "plan_to_json",
]

Device = Literal["none", "cpu", "nvme"]

GiB = 2**30

DEFAULT_NVME_PATH = "/local_nvme"
"""Where the recommended NVMe config puts its swap files; replace it with a directory on a local NVMe drive."""

ADDITIONAL_BUFFER_FACTOR = 1.5
"""DeepSpeed's default head room on CPU memory figures (``additional_buffer_factor``)."""

# Bytes per parameter, mixed precision with Adam (DeepSpeed's estimator comments: 2 + 18, 18 = 2 + 4 + 4 + 8).
_P16 = 2  # 16-bit parameters
_G16 = 2  # 16-bit gradients
_OPT = 16  # fp32 gradients + fp32 master parameters + Adam momentum and variance

# DeepSpeed defaults that size the pinned NVMe swap buffers (runtime/zero/config.py, offload_config.py).
_SUB_GROUP_SIZE = 10**9  # zero_optimization.sub_group_size
_OPT_BUFFER_COUNT = 4  # offload_optimizer.buffer_count
_PARAM_BUFFER_COUNT = 5  # offload_param.buffer_count
_PARAM_BUFFER_SIZE = 10**8  # offload_param.buffer_size (elements)

SPEED_ORDER: tuple[tuple[int, Device, Device], ...] = (
    (0, "none", "none"),
    (1, "none", "none"),
    (2, "none", "none"),
    (1, "cpu", "none"),
    (2, "cpu", "none"),
    (3, "none", "none"),
    (3, "cpu", "none"),
    (3, "none", "cpu"),
    (3, "cpu", "cpu"),
    (3, "nvme", "none"),
    (3, "nvme", "cpu"),
    (3, "none", "nvme"),
    (3, "cpu", "nvme"),
    (3, "nvme", "nvme"),
)
"""Every (stage, offload_optimizer, offload_param) row, fastest first.

DeepSpeed's and the HF docs' guidance: stage 0 > 1 > 2 > 2 + CPU offload > 3 >
3 + optimizer offload > 3 + optimizer and parameter offload > NVMe. Within the
same level a lower stage comes first (less communication), optimizer offload
comes before parameter offload (the optimizer moves once per step, parameters
at every forward and backward), and parameters on NVMe come last.
"""


# -- parsing sizes and counts -------------------------------------------------------

_NUMBER = r"(\d+(?:\.\d*)?|\.\d+)(?:e([+-]?\d+))?"
_SIZE_RE = re.compile(rf"^\s*{_NUMBER}\s*(?:([kmgt])(i?)b?|b?)\s*$", re.IGNORECASE)
_COUNT_RE = re.compile(rf"^\s*{_NUMBER}\s*([kmbgt]?)\s*$", re.IGNORECASE)
_SIZE_UNITS = {"k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}
_COUNT_UNITS = {"": 1, "k": 10**3, "m": 10**6, "b": 10**9, "g": 10**9, "t": 10**12}


def _decimal(mantissa: str, exponent: str | None) -> Decimal:
    value = Decimal(mantissa)
    return value.scaleb(int(exponent)) if exponent else value


def parse_size(text: str | int | float, name: str = "size") -> int:
    """Bytes in ``"80GiB"``, ``"80GB"``, ``"512MiB"``, ``"1.5T"``, ``"24g"`` or a plain number of bytes.

    Units are binary whether or not they carry the ``i`` (``GB`` = ``GiB`` =
    2**30), as GPU memory is sized and as DeepSpeed's estimator prints it.
    ``name`` is the argument the text came from, for the error message.
    """
    if isinstance(text, bool):
        raise _bad(name, text, "a size such as '80GiB', '512MiB' or a number of bytes")
    if isinstance(text, int | float):
        if not math.isfinite(text) or text < 0:
            raise _bad(name, text, "a size such as '80GiB', '512MiB' or a number of bytes")
        return int(text)
    match = _SIZE_RE.match(text) if isinstance(text, str) else None
    if match is None:
        raise _bad(name, text, "a size such as '80GiB', '512MiB' or a number of bytes")
    mantissa, exponent, unit, _binary = match.groups()
    try:
        value = _decimal(mantissa, exponent) * _SIZE_UNITS.get((unit or "").lower(), 1)
    except InvalidOperation:
        raise _bad(name, text, "a size such as '80GiB', '512MiB' or a number of bytes") from None
    return int(value.to_integral_value())


def parse_count(text: str | int | float, name: str = "params") -> int:
    """A count in ``"7B"``, ``"1.5B"``, ``"350M"``, ``"70k"``, ``"1T"``, ``"7e9"`` or a plain number.

    ``K``/``M``/``B`` (or ``G``)/``T`` are 10**3/10**6/10**9/10**12, as model
    sizes are named.
    """
    if isinstance(text, bool):
        raise _bad(name, text, "a count such as '7B', '1.5B', '350M' or a number")
    if isinstance(text, int | float):
        if not math.isfinite(text) or text < 0:
            raise _bad(name, text, "a count such as '7B', '1.5B', '350M' or a number")
        return round(text)
    match = _COUNT_RE.match(text) if isinstance(text, str) else None
    if match is None:
        raise _bad(name, text, "a count such as '7B', '1.5B', '350M' or a number")
    mantissa, exponent, unit = match.groups()
    value = _decimal(mantissa, exponent) * _COUNT_UNITS[unit.lower()]
    return int(value.to_integral_value())


def _bad(name: str, value: object, expected: str) -> InvalidValueError:
    return InvalidValueError(Problem(name, f"got {value!r}, expected {expected}"))


# -- counting parameters ------------------------------------------------------------


@attrs.frozen
class ModelSize:
    """How many parameters a model has, and its largest layer (what ZeRO-3 gathers at once)."""

    params: int
    """Total parameters, shared (tied) ones once."""
    largest_layer_params: int
    """Parameters of the largest module, counting only its own (not its children's): DeepSpeed's ``largest_layer_params``."""
    source: str
    """Where the count came from, e.g. ``"llama config, counted analytically"``."""


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
        return _count_module(model, "model object")
    if callable(getattr(model, "to_dict", None)) and hasattr(model, "model_type"):
        return _count_config(model.to_dict(), config_object=model)
    raise InvalidValueError(
        Problem(
            "model",
            f"got {type(model).__name__}, expected an HF config (object, dict, path to config.json) or a model",
        )
    )


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
        data = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise InvalidValueError(Problem("model", f"cannot read {str(file)!r}: {err}")) from None
    if not isinstance(data, dict):
        raise InvalidValueError(Problem("model", f"{str(file)!r} does not hold a JSON object"))
    return data


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


# Class defaults of transformers' config classes for keys a config.json may omit
# (tests check these against the installed transformers).
_DEFAULTS: dict[str, dict[str, Any]] = {
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
    values = {**_DEFAULTS[str(model_type)], **{k: v for k, v in data.items() if v is not None}}
    modules = _Modules()
    counter(_Reader(values, str(model_type)), modules)
    return ModelSize(modules.total, modules.largest, f"{model_type} config, counted analytically")


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


def _llama_like(c: _Reader, m: _Modules) -> None:
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


def _gpt2(c: _Reader, m: _Modules) -> None:
    """GPT-2: learned positions, LayerNorm with bias, Conv1D projections with bias."""
    vocab, hidden = c.int("vocab_size"), c.int("n_embd", "hidden_size")
    layers = c.int("n_layer", "num_hidden_layers")
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


def _gpt_neox(c: _Reader, m: _Modules) -> None:
    """GPT-NeoX (Pythia): fused QKV, LayerNorm with bias, plain MLP with bias."""
    vocab, hidden, inter = c.int("vocab_size"), c.int("hidden_size"), c.int("intermediate_size")
    layers = c.int("num_hidden_layers")
    bias = c.flag("attention_bias")

    m.add(vocab * hidden)  # embed_in
    m.add(2 * hidden, repeat=2 * layers)  # input/post-attention LayerNorm
    m.add(hidden * 3 * hidden + (3 * hidden if bias else 0), repeat=layers)  # query_key_value
    m.add(hidden * hidden + (hidden if bias else 0), repeat=layers)  # dense
    m.add(hidden * inter + inter, repeat=layers)  # dense_h_to_4h
    m.add(inter * hidden + hidden, repeat=layers)  # dense_4h_to_h
    m.add(2 * hidden)  # final_layer_norm
    m.add(vocab * hidden, shared=c.flag("tie_word_embeddings"))  # lm_head (embed_out)


_COUNTERS: dict[str, Callable[[_Reader, _Modules], None]] = {
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
    return _count_module(model, f"{model_type} config, built on the meta device")


# -- the plan -------------------------------------------------------------------


_DEVICE_NAMES = {"none": "GPU", "cpu": "CPU", "nvme": "NVMe"}


@attrs.frozen
class Row:
    """One ZeRO stage and offload choice, with the memory its model states need."""

    stage: int
    """ZeRO stage, 0-3."""
    offload_optimizer: Device
    """Where optimizer states live off the GPU: ``"none"``, ``"cpu"`` or ``"nvme"``."""
    offload_param: Device
    """Where 16-bit parameters live off the GPU (stage 3 only): ``"none"``, ``"cpu"`` or ``"nvme"``."""
    gpu_bytes_per_device: int
    """Model states on each GPU."""
    cpu_bytes_per_node: int
    """CPU memory on each node (with DeepSpeed's 1.5x head room; pinned NVMe swap buffers included)."""
    nvme_bytes: int
    """Bytes on the NVMe drive of each node (0 without NVMe offload)."""
    fits: bool
    """Within the GPU and CPU budgets given (a budget not given always fits)."""

    @property
    def label(self) -> str:
        """``"ZeRO-3, optimizer on CPU, parameters on NVMe"``."""
        parts = [f"ZeRO-{self.stage}"]
        if self.offload_optimizer != "none":
            parts.append(f"optimizer on {_DEVICE_NAMES[self.offload_optimizer]}")
        if self.offload_param != "none":
            parts.append(f"parameters on {_DEVICE_NAMES[self.offload_param]}")
        return ", ".join(parts)


@attrs.frozen
class Plan:
    """Memory needs of every ZeRO stage and offload choice for one model on one cluster, and the pick."""

    params: int
    """Total model parameters."""
    largest_layer_params: int
    """Parameters of the largest layer (ZeRO-3 gathers one at a time); 0 when unknown."""
    gpus_per_node: int
    """GPUs on each node."""
    nodes: int
    """Nodes."""
    gpu_memory: int | None
    """GPU memory budget per device, bytes; ``None``: not given."""
    cpu_memory: int | None
    """CPU memory budget per node, bytes; ``None``: not given."""
    rows: tuple[Row, ...]
    """Every stage and offload choice, fastest first (``SPEED_ORDER``)."""
    recommended: Config | None
    """The config of the fastest row that fits, built with the builder; ``None`` when nothing fits."""
    recommended_row: Row | None
    """The row ``recommended`` was built from."""
    reason: str
    """Why this row was recommended, or why none was."""
    notes: tuple[str, ...]
    """What the figures include and leave out."""
    source: str
    """Where the parameter count came from."""
    nvme_path: str = DEFAULT_NVME_PATH
    """The NVMe directory configs of NVMe rows use."""

    @property
    def world_size(self) -> int:
        """GPUs in all: ``gpus_per_node × nodes``."""
        return self.gpus_per_node * self.nodes

    def row(self, stage: int, offload_optimizer: Device = "none", offload_param: Device = "none") -> Row:
        """The row of one stage and offload choice."""
        for r in self.rows:
            if (r.stage, r.offload_optimizer, r.offload_param) == (stage, offload_optimizer, offload_param):
                return r
        raise KeyError((stage, offload_optimizer, offload_param))

    def config_for(self, row: Row) -> Config:
        """The config of any row, built as ``recommended`` is (``Config.zero(...)`` plus offload verbs)."""
        return _config_for(row, self.largest_layer_params, self.world_size, self.nvme_path)


def plan(
    params: int | float | str | None = None,
    model: Any = None,
    largest_layer_params: int | float | str | None = None,
    gpus_per_node: int = 1,
    nodes: int = 1,
    gpu_memory: int | float | str | None = None,
    cpu_memory: int | float | str | None = None,
    *,
    nvme_path: str = DEFAULT_NVME_PATH,
    additional_buffer_factor: float = ADDITIONAL_BUFFER_FACTOR,
) -> Plan:
    """Model-state memory of every ZeRO stage × offload choice, and the fastest config that fits.

    Give ``params`` (a number or ``"7B"``) or ``model``: an HF config (object,
    dict, ``config.json`` or its directory) or a model object. With both,
    ``params`` is the total and ``model`` still gives the largest layer.
    Budgets are bytes or sizes such as ``"80GiB"``; one not given always fits.
    """
    problems: list[Problem] = []
    for name, value in (("gpus_per_node", gpus_per_node), ("nodes", nodes)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            problems.append(Problem(name, f"got {value!r}, expected a positive integer"))
    if not isinstance(additional_buffer_factor, int | float) or additional_buffer_factor < 1:
        problems.append(
            Problem("additional_buffer_factor", f"got {additional_buffer_factor!r}, expected a number >= 1")
        )
    if params is None and model is None:
        problems.append(Problem("params", "missing", "give params (e.g. '7B') or model (an HF config or a model)"))
    if problems:
        raise InvalidValueError(problems)

    size = count_params(model) if model is not None else None
    total = parse_count(params, "params") if params is not None else size.params if size is not None else 0
    if total <= 0:
        raise InvalidValueError(Problem("params", f"got {total!r}, expected a positive count"))
    notes: list[str] = []
    if largest_layer_params is not None:
        largest = parse_count(largest_layer_params, "largest_layer_params")
    elif size is not None:
        largest = size.largest_layer_params
    else:
        largest = 0
        notes.append(
            "largest layer unknown (taken as 0): ZeRO-3 rows leave out the layer gathered on each GPU "
            "(4 bytes per parameter of the largest layer); pass largest_layer_params (usually vocab × hidden) "
            "or the model's config"
        )
    gpu_budget = parse_size(gpu_memory, "gpu_memory") if gpu_memory is not None else None
    cpu_budget = parse_size(cpu_memory, "cpu_memory") if cpu_memory is not None else None
    source = size.source if params is None and size is not None else "given"

    factor = float(additional_buffer_factor)
    rows = tuple(
        _row(stage, opt, par, total, largest, gpus_per_node, nodes, factor, gpu_budget, cpu_budget)
        for stage, opt, par in SPEED_ORDER
    )
    chosen = next((r for r in rows if r.fits), None)
    recommended = _config_for(chosen, largest, gpus_per_node * nodes, nvme_path) if chosen else None

    notes[:0] = [
        "activations are not included: add them (they grow with micro-batch size × sequence length, "
        "activation checkpointing shrinks them; estimate_activation_bytes gives an approximate figure), "
        "plus temporary buffers and the CUDA context",
        "model states of mixed-precision training with Adam: 2 bytes/param 16-bit weights, 2 bytes 16-bit "
        "gradients, 16 bytes fp32 gradients + master weights + Adam moments; stage 3 with zero.Init",
        f"CPU figures carry DeepSpeed's {additional_buffer_factor:g}x head room; NVMe rows include the pinned "
        "swap buffers at DeepSpeed's defaults (a smaller sub_group_size shrinks the optimizer's)",
    ]
    if cpu_budget is None:
        notes.append("no CPU budget given: every row's CPU need counts as fitting (pass cpu_memory to check it)")
    return Plan(
        params=total,
        largest_layer_params=largest,
        gpus_per_node=gpus_per_node,
        nodes=nodes,
        gpu_memory=gpu_budget,
        cpu_memory=cpu_budget,
        rows=rows,
        recommended=recommended,
        recommended_row=chosen,
        reason=_reason(rows, chosen, gpu_budget, cpu_budget),
        notes=tuple(notes),
        source=source,
        nvme_path=nvme_path,
    )


def _row(
    stage: int,
    opt: Device,
    par: Device,
    params: int,
    largest: int,
    gpus_per_node: int,
    nodes: int,
    factor: float,
    gpu_budget: int | None,
    cpu_budget: int | None,
) -> Row:
    gpu, cpu, nvme = model_state_bytes(stage, opt, par, params, largest, gpus_per_node, nodes, factor)
    fits = (gpu_budget is None or gpu <= gpu_budget) and (cpu_budget is None or cpu <= cpu_budget)
    return Row(stage, opt, par, gpu, cpu, nvme, fits)


def model_state_bytes(
    stage: int,
    offload_optimizer: Device,
    offload_param: Device,
    params: int,
    largest_layer_params: int = 0,
    gpus_per_node: int = 1,
    nodes: int = 1,
    additional_buffer_factor: float = ADDITIONAL_BUFFER_FACTOR,
) -> tuple[int, int, int]:
    """(GPU bytes per device, CPU bytes per node, NVMe bytes per node) of the model states.

    Stages 2 and 3 without NVMe are DeepSpeed's estimators term for term,
    ``zero_init`` on, including their choices: a process loads the fp32 model
    on the CPU before ZeRO partitions it (``4 × params`` per GPU on the node,
    or per GPU in the job with stage 1-2 CPU offload, as DeepSpeed writes it),
    and offloaded optimizer states are counted per node as ``16 × params``
    at stages 1-2 and ``16 × params / nodes`` at stage 3.
    """
    p, n_gpus, g, f = params, gpus_per_node * nodes, gpus_per_node, additional_buffer_factor
    loaded_fp32 = 4 * p * g * f  # each process on the node holds the full fp32 model before partitioning
    if stage < 3:
        if offload_param != "none" or offload_optimizer == "nvme" or (stage == 0 and offload_optimizer != "none"):
            raise ValueError(f"no such row: stage {stage}, optimizer {offload_optimizer}, params {offload_param}")
        if offload_optimizer == "cpu":
            gpu = (_P16 + (_G16 if stage == 1 else 0)) * p
            cpu = p * max(4 * n_gpus, _OPT) * f
        else:
            replicated = {0: _P16 + _G16 + _OPT, 1: _P16 + _G16, 2: _P16}[stage]
            gpu = replicated * p + int((_P16 + _G16 + _OPT - replicated) * p / n_gpus)
            cpu = loaded_fp32
        return int(gpu), int(cpu), 0

    on_gpu = (_P16 if offload_param == "none" else 0) + (_OPT if offload_optimizer == "none" else 0)
    on_cpu = (_P16 if offload_param == "cpu" else 0) + (_OPT if offload_optimizer == "cpu" else 0)
    on_nvme = (_P16 if offload_param == "nvme" else 0) + (_OPT if offload_optimizer == "nvme" else 0)
    gpu = 4 * largest_layer_params + int(on_gpu * p / n_gpus)
    # With nothing kept on the CPU, zero.Init still materializes one layer per process there.
    cpu = on_cpu * p / nodes * f if on_cpu else 4 * largest_layer_params * g * f
    if offload_optimizer == "nvme":  # pinned fp32 swap buffers, one sub group each, per process
        cpu += g * _OPT_BUFFER_COUNT * min(_SUB_GROUP_SIZE, math.ceil(p / n_gpus)) * 4
    if offload_param == "nvme":  # pinned 16-bit parameter swap buffers, per process
        cpu += g * _PARAM_BUFFER_COUNT * _param_buffer_size(largest_layer_params, n_gpus) * 2
    return int(gpu), int(cpu), int(on_nvme * p / nodes)


def _param_buffer_size(largest_layer_params: int, world_size: int) -> int:
    """``offload_param.buffer_size``: DeepSpeed's 1e8 elements, or a layer's partition when that is larger."""
    needed = math.ceil(largest_layer_params / world_size)
    return _PARAM_BUFFER_SIZE if needed <= _PARAM_BUFFER_SIZE else -(-needed // 10**7) * 10**7


def _config_for(row: Row, largest: int, world_size: int, nvme_path: str) -> Config:
    """The row as a config, built with the builder verbs."""
    cfg = Config.zero(row.stage)
    opt, par = row.offload_optimizer, row.offload_param
    if "nvme" in (opt, par):
        buffer_size = _param_buffer_size(largest, world_size)
        cfg = cfg.offload_nvme(
            nvme_path,
            optimizer=opt == "nvme",
            params=par == "nvme",
            buffer_size=buffer_size if par == "nvme" and buffer_size != _PARAM_BUFFER_SIZE else None,
        )
    if "cpu" in (opt, par):
        cfg = cfg.offload_cpu(optimizer=opt == "cpu", params=par == "cpu")
    if row.stage == 3:
        cfg = cfg.zero_options(stage3_gather_16bit_weights_on_model_save=True)
    return cfg


def _gib(n: int | float) -> str:
    return f"{n / GiB:.2f} GiB"


def _reason(rows: tuple[Row, ...], chosen: Row | None, gpu: int | None, cpu: int | None) -> str:
    budget = " and ".join(
        part
        for part in (
            f"{_gib(gpu)} per GPU" if gpu is not None else "",
            f"{_gib(cpu)} CPU memory per node" if cpu is not None else "",
        )
        if part
    )
    if chosen is not None:
        text = f"{chosen.label} is the fastest choice" + (f" that fits in {budget}" if budget else "")
        if cpu is None and chosen.cpu_bytes_per_node:
            text += f"; it needs {_gib(chosen.cpu_bytes_per_node)} CPU memory per node"
        return text
    gpu_fits = [r for r in rows if gpu is None or r.gpu_bytes_per_device <= gpu]
    if not gpu_fits:
        least = min(rows, key=lambda r: (r.gpu_bytes_per_device, r.cpu_bytes_per_node))
        return (
            f"nothing fits in {_gib(gpu or 0)} per GPU: the smallest need is {_gib(least.gpu_bytes_per_device)} "
            f"({least.label}); add GPUs or nodes, or split the model (tensor/pipeline parallel)"
        )
    least = min(gpu_fits, key=lambda r: (r.cpu_bytes_per_node, r.gpu_bytes_per_device))
    within = f" of the choices that fit {_gib(gpu)} per GPU," if gpu is not None else ""
    return (
        f"nothing fits in {_gib(cpu or 0)} CPU memory per node:{within} the smallest CPU need is "
        f"{_gib(least.cpu_bytes_per_node)} ({least.label}); add CPU memory or nodes"
    )


# -- activations (approximate) ---------------------------------------------------


def estimate_activation_bytes(
    micro_batch: int,
    seq_len: int,
    hidden_size: int,
    num_layers: int,
    *,
    num_heads: int | None = None,
    checkpointing: bool = False,
    vocab_size: int | None = None,
) -> int:
    """APPROXIMATE activation memory per GPU of one micro-batch, in bytes (16-bit training, no tensor parallel).

    Korthikanti et al., "Reducing Activation Recomputation in Large Transformer
    Models" (2022): a transformer layer keeps ``s·b·h·(34 + 5·a·s/h)`` bytes;
    with ``num_heads=None`` the attention scores are taken as never stored
    (FlashAttention / SDPA), leaving ``34·s·b·h``. With activation
    checkpointing each layer keeps only its 16-bit input (``2·s·b·h``) plus one
    layer recomputed at a time. ``vocab_size`` adds the fp32 logits
    (``4·s·b·V``). Real use varies with the architecture (gated MLPs, GQA),
    the attention kernel and the framework's temporaries: treat it as a
    starting point, not a bound.
    """
    sbh = seq_len * micro_batch * hidden_size
    per_layer = 34 * sbh + (5 * num_heads * seq_len * seq_len * micro_batch if num_heads else 0)
    total = 2 * sbh * num_layers + per_layer if checkpointing else per_layer * num_layers
    if vocab_size:
        total += 4 * seq_len * micro_batch * vocab_size
    return int(total)


# -- rendering ------------------------------------------------------------------


def format_plan_table(plan: Plan) -> str:
    """A fixed-width table of every row (GiB, 2 decimals), the recommended one marked ``*``, notes below."""
    nodes = f"{plan.nodes} node" + ("s" if plan.nodes != 1 else "")
    gpus = f"{plan.gpus_per_node} GPU" + ("s" if plan.gpus_per_node != 1 else "") + " per node"
    largest = f"{_count(plan.largest_layer_params)}" if plan.largest_layer_params else "unknown"
    budgets = ", ".join(
        (
            f"GPU {_gib(plan.gpu_memory)}" if plan.gpu_memory is not None else "GPU not given",
            f"CPU {_gib(plan.cpu_memory)} per node" if plan.cpu_memory is not None else "CPU not given",
        )
    )
    lines = [
        f"{_count(plan.params)} parameters ({plan.source}; largest layer {largest}), {gpus} x {nodes}",
        f"budgets: {budgets}; rows fastest first",
        "",
    ]
    header = ("", "stage", "optimizer", "params", "GPU/device", "CPU/node", "NVMe/node", "fits")
    table = [header]
    for r in plan.rows:
        table.append(
            (
                "*" if r is plan.recommended_row else "",
                str(r.stage),
                r.offload_optimizer,
                r.offload_param,
                _gib(r.gpu_bytes_per_device),
                _gib(r.cpu_bytes_per_node),
                _gib(r.nvme_bytes) if r.nvme_bytes else "-",
                "yes" if r.fits else "no",
            )
        )
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    right = {4, 5, 6}
    for row in table:
        cells = [
            cell.rjust(w) if i in right else cell.ljust(w) for i, (cell, w) in enumerate(zip(row, widths, strict=True))
        ]
        lines.append("  ".join(cells).rstrip())
    lines.append("")
    verdict = ("recommended (*): " if plan.recommended_row else "no recommendation: ") + plan.reason
    lines.append(textwrap.fill(verdict, width=_WIDTH, subsequent_indent="  ", break_on_hyphens=False))
    lines.append("notes:")
    for note in plan.notes:
        lines.append(
            textwrap.fill(note, width=_WIDTH, initial_indent="  - ", subsequent_indent="    ", break_on_hyphens=False)
        )
    return "\n".join(lines)


_WIDTH = 100
"""Footer lines wrap here; the table itself is narrower."""


def _count(n: int) -> str:
    for unit, scale in (("T", 10**12), ("B", 10**9), ("M", 10**6), ("K", 10**3)):
        if n >= scale:
            return f"{n / scale:.2f}{unit}"
    return str(n)


def plan_to_json(plan: Plan) -> dict[str, Any]:
    """The plan as JSON types only: rows as objects, the recommended config as its ds_config dict."""
    rows: list[dict[str, Any]] = [
        {
            "stage": r.stage,
            "offload_optimizer": r.offload_optimizer,
            "offload_param": r.offload_param,
            "gpu_bytes_per_device": r.gpu_bytes_per_device,
            "cpu_bytes_per_node": r.cpu_bytes_per_node,
            "nvme_bytes": r.nvme_bytes,
            "fits": r.fits,
            "recommended": r is plan.recommended_row,
        }
        for r in plan.rows
    ]
    return {
        "params": plan.params,
        "largest_layer_params": plan.largest_layer_params,
        "source": plan.source,
        "gpus_per_node": plan.gpus_per_node,
        "nodes": plan.nodes,
        "gpu_memory": plan.gpu_memory,
        "cpu_memory": plan.cpu_memory,
        "rows": rows,
        "recommended": plan.recommended.to_dict() if plan.recommended is not None else None,
        "recommended_row": _index(plan.rows, plan.recommended_row),
        "reason": plan.reason,
        "notes": list(plan.notes),
    }


def _index(rows: Iterable[Row], row: Row | None) -> int | None:
    for i, r in enumerate(rows):
        if r is row:
            return i
    return None
