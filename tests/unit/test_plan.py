"""dsbuild.planner: sizes and counts, parameter counting, the rows, the pick, the table and the JSON."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from dsbuild import Config, InvalidValueError
from dsbuild.planner import (
    DEFAULT_HEADROOM,
    SPEED_ORDER,
    Activations,
    Headroom,
    ModelSize,
    Plan,
    Row,
    Shape,
    activations,
    count_params,
    estimate_activation_bytes,
    format_plan_table,
    layer_activation_bytes,
    model_state_bytes,
    parse_count,
    parse_headroom,
    parse_size,
    plan,
    plan_to_json,
)
from dsbuild.validate import validate

GiB = 2**30


# -- parse_size / parse_count -------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("80GiB", 80 * GiB),
        ("80Gi", 80 * GiB),
        ("80 GiB", 80 * GiB),
        ("81920MiB", 80 * GiB),
        ("512MiB", 512 * 2**20),
        ("1.5TiB", 3 * 2**39),
        ("1KiB", 1024),
        ("0.5GiB", GiB // 2),
        ("80GB", 80 * 10**9),
        ("80G", 80 * 10**9),
        ("24g", 24 * 10**9),
        ("512MB", 512 * 10**6),
        ("2T", 2 * 10**12),
        ("1K", 1000),
        ("1kB", 1000),
        ("1073741824B", GiB),
        ("1e3B", 1000),
        ("0", 0),
        ("0B", 0),
        (4096, 4096),
        (1.5 * GiB, 3 * GiB // 2),
    ],
)
def test_parse_size_tells_gb_from_gib(text: Any, expected: int) -> None:
    """GiB/MiB (or Gi/Mi) are binary, GB/MB (or G/M) decimal; B is bytes, and so is a Python number."""
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "GiB", "80XB", "-1GiB", "80 GiBs", "1.2.3G", True, -5, float("nan")])
def test_parse_size_rejects_what_is_not_a_size(text: Any) -> None:
    """A bad size fails naming the argument and an example of what is expected."""
    with pytest.raises(InvalidValueError) as info:
        parse_size(text, "gpu_memory")
    assert str(info.value) == f"gpu_memory: got {text!r}, expected a size such as '80GiB', '80GB', '512MiB' or '1024B'"


@pytest.mark.parametrize("text", ["24", "1073741824", "1e3", " 80 "])
def test_parse_size_refuses_a_number_without_its_unit(text: str) -> None:
    """'24' could be bytes or GiB: the error offers both spellings (and B), never guesses."""
    number = text.strip()
    with pytest.raises(InvalidValueError) as info:
        parse_size(text, "gpu_memory")
    assert str(info.value) == (
        f"gpu_memory: got {text!r}, expected a unit: '{number}GiB' (2**30 bytes), '{number}GB' (10**9) or '{number}B'"
    )


def test_parse_size_takes_no_unit_past_tib() -> None:
    """An exabyte unit is not one of the units sizes are written in (TiB and TB are the largest)."""
    with pytest.raises(InvalidValueError, match=r"^gpu_memory: got '2EiB', expected a size such as"):
        parse_size("2EiB", "gpu_memory")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2GiB+10%", (2 * GiB, 10.0)),
        ("2GiB + 10%", (2 * GiB, 10.0)),
        ("10%+2GiB", (2 * GiB, 10.0)),
        ("3GiB", (3 * GiB, 0.0)),
        ("12.5%", (0, 12.5)),
        ("0", (0, 0.0)),
        ("0%", (0, 0.0)),
        (GiB, (GiB, 0.0)),
    ],
)
def test_parse_headroom_reads_a_size_a_percent_or_both(text: Any, expected: tuple[int, float]) -> None:
    """The headroom is bytes, a percent of the GPU, or their sum; a Python number is bytes."""
    assert parse_headroom(text) == expected


@pytest.mark.parametrize("text", ["", "2GiB+3GiB", "10%+5%", "2", "-1%", "2GiB+", "ten%"])
def test_parse_headroom_rejects_what_is_not_a_headroom(text: str) -> None:
    """A bad headroom fails naming what is expected."""
    with pytest.raises(InvalidValueError) as info:
        parse_headroom(text)
    assert str(info.value) == (
        f"headroom: got {text!r}, expected a size with its unit, a percent of the GPU or both, "
        "such as '2GiB', '10%' or '2GiB+10%'"
    )
    with pytest.raises(InvalidValueError, match=r"^headroom: got '100%', expected a percent of the GPU below 100%$"):
        parse_headroom("100%")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("7B", 7_000_000_000),
        ("7b", 7_000_000_000),
        ("1.5B", 1_500_000_000),
        ("350M", 350_000_000),
        ("70k", 70_000),
        ("1T", 10**12),
        ("1.1T", 1_100_000_000_000),
        ("7G", 7_000_000_000),
        ("7e9", 7_000_000_000),
        ("6738415616", 6_738_415_616),
        (7e9, 7_000_000_000),
        (123, 123),
    ],
)
def test_parse_count_reads_decimal_suffixes(text: Any, expected: int) -> None:
    """Model sizes are decimal: 7B is 7e9, decimals exact (no float rounding)."""
    assert parse_count(text) == expected


@pytest.mark.parametrize("text", ["", "B", "7 billion", "7BB", "-7B", "7GiB", False])
def test_parse_count_rejects_what_is_not_a_count(text: Any) -> None:
    """A bad count fails naming the argument."""
    with pytest.raises(InvalidValueError) as info:
        parse_count(text)
    assert str(info.value) == f"params: got {text!r}, expected a count such as '7B', '1.5B', '350M' or a number"


@pytest.mark.parametrize("text", ["1e400", "1001T", "1e999999999", "1e" + "9" * 5000, 1e300, 10**400])
def test_parse_count_refuses_counts_past_1e15(text: Any) -> None:
    """A count past 1e15 is a typo that would overflow float arithmetic later: refused, naming the argument."""
    with pytest.raises(InvalidValueError) as info:
        parse_count(text)
    assert str(info.value) == f"params: got {text!r}, expected a count up to 1e15"


@pytest.mark.parametrize(
    "text", ["1e400GiB", "2000000TiB", "1e" + "9" * 5000 + "GiB", "1e99999999999999999999B", 1e300, 2**61, 10**400]
)
def test_parse_size_refuses_sizes_past_1_eib(text: Any) -> None:
    """A size past 1 EiB is a typo that would overflow float arithmetic later: refused, naming the argument."""
    with pytest.raises(InvalidValueError) as info:
        parse_size(text, "gpu_memory")
    assert str(info.value) == f"gpu_memory: got {text!r}, expected a size up to 1 EiB"


# -- counting parameters ------------------------------------------------------------

SMALL = {
    "vocab_size": 211,
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
}


def _configs() -> list[Any]:
    import transformers as t

    ids = {"pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}
    return [
        t.LlamaConfig(**SMALL, num_key_value_heads=2),
        t.LlamaConfig(**SMALL, tie_word_embeddings=True, attention_bias=True, mlp_bias=True),
        t.MistralConfig(**SMALL, num_key_value_heads=2),
        t.MistralConfig(**SMALL, num_key_value_heads=2, head_dim=32, tie_word_embeddings=True),
        t.Qwen2Config(**SMALL, num_key_value_heads=2),
        t.Qwen2Config(**SMALL, num_key_value_heads=2, tie_word_embeddings=True),
        t.Qwen3Config(**SMALL, num_key_value_heads=2, head_dim=24),
        t.Qwen3Config(**SMALL, num_key_value_heads=1, head_dim=16, tie_word_embeddings=True, attention_bias=True),
        t.GemmaConfig(**SMALL, num_key_value_heads=1, head_dim=16),
        t.Gemma2Config(**SMALL, num_key_value_heads=2, head_dim=16, tie_word_embeddings=False),
        t.Gemma3TextConfig(**SMALL, num_key_value_heads=2, head_dim=16),
        t.Phi3Config(**SMALL, num_key_value_heads=2, **ids),
        t.Phi3Config(**{**SMALL, "intermediate_size": 200}, tie_word_embeddings=True, **ids),
        t.GPT2Config(vocab_size=211, n_embd=64, n_layer=2, n_head=4, n_positions=33),
        t.GPT2Config(
            vocab_size=211, n_embd=64, n_layer=2, n_head=4, n_positions=33, n_inner=100, tie_word_embeddings=False
        ),
        t.GPT2Config(vocab_size=211, n_embd=64, n_layer=2, n_head=4, n_positions=33, add_cross_attention=True),
        t.GPTNeoXConfig(**SMALL),
        t.GPTNeoXConfig(**SMALL, tie_word_embeddings=True, attention_bias=False),
    ]


def _real_counts(config: Any) -> tuple[int, int]:
    """``sum(p.numel())`` of the model built for real, and DeepSpeed's largest layer (own parameters per module)."""
    import torch
    import transformers

    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config)
    total = sum(p.numel() for p in model.parameters())
    largest = max(sum(p.numel() for p in m.parameters(recurse=False)) for m in model.modules())
    return total, largest


@pytest.fixture(scope="module")
def configs_and_counts() -> list[tuple[Any, tuple[int, int]]]:
    return [(c, _real_counts(c)) for c in _configs()]


@pytest.mark.train
def test_analytic_count_matches_the_real_model(configs_and_counts: list[tuple[Any, tuple[int, int]]]) -> None:
    """For every known architecture, tied and untied, the config alone gives the real numel and largest layer."""
    for config, (total, largest) in configs_and_counts:
        size = count_params(config)
        assert (size.params, size.largest_layer_params) == (total, largest), config.model_type
        assert size.source == f"{config.model_type} config, counted analytically"


@pytest.mark.train
def test_shape_comes_with_the_count(configs_and_counts: list[tuple[Any, tuple[int, int]]], tmp_path: Path) -> None:
    """Hidden size, layers, heads and vocabulary come from the config: analytic, on the meta device, or a model's."""
    import transformers

    for config, _counts in configs_and_counts:
        expected = Shape(config.hidden_size, config.num_hidden_layers, config.num_attention_heads, config.vocab_size)
        assert count_params(config).shape == expected, config.model_type
        assert count_params(config.to_dict()).shape == expected, config.model_type
    opt = transformers.OPTConfig(
        vocab_size=211, hidden_size=64, ffn_dim=96, num_hidden_layers=2, num_attention_heads=4, word_embed_proj_dim=64
    )
    assert count_params(opt).shape == Shape(64, 2, 4, 211)
    model = transformers.AutoModelForCausalLM.from_config(transformers.LlamaConfig(**SMALL))
    assert count_params(model).shape == Shape(64, 2, 4, 211)


@pytest.mark.train
def test_analytic_count_from_a_dict_a_json_file_and_a_directory(
    configs_and_counts: list[tuple[Any, tuple[int, int]]], tmp_path: Path
) -> None:
    """config.json read from disk (file or folder) or as a dict counts the same as the config object."""
    for i, (config, (total, largest)) in enumerate(configs_and_counts):
        folder = tmp_path / str(i)
        config.save_pretrained(folder)
        for source in (config.to_dict(), folder, folder / "config.json", str(folder)):
            size = count_params(source)
            assert (size.params, size.largest_layer_params) == (total, largest), (config.model_type, source)


def test_llama_2_7b_counts_its_published_size() -> None:
    """A minimal Llama-2-7B config.json (omitted keys take LlamaConfig's defaults) counts 6,738,415,616."""
    size = count_params(
        {
            "model_type": "llama",
            "vocab_size": 32000,
            "hidden_size": 4096,
            "intermediate_size": 11008,
            "num_hidden_layers": 32,
            "num_attention_heads": 32,
        }
    )
    assert size == ModelSize(
        6_738_415_616, 32000 * 4096, "llama config, counted analytically", Shape(4096, 32, 32, 32000)
    )


@pytest.mark.train
def test_defaults_for_omitted_keys_are_transformers_class_defaults() -> None:
    """What dsbuild assumes for a key a config.json leaves out is what transformers assumes."""
    import transformers

    from dsbuild.planner.count import DEFAULTS as _DEFAULTS

    classes = {
        "llama": transformers.LlamaConfig,
        "mistral": transformers.MistralConfig,
        "qwen2": transformers.Qwen2Config,
        "qwen3": transformers.Qwen3Config,
        "gemma": transformers.GemmaConfig,
        "gemma2": transformers.Gemma2Config,
        "gemma3_text": transformers.Gemma3TextConfig,
        "phi3": transformers.Phi3Config,
        "gpt2": transformers.GPT2Config,
        "gpt_neox": transformers.GPTNeoXConfig,
    }
    assert set(classes) == set(_DEFAULTS)
    for model_type, defaults in _DEFAULTS.items():
        instance = classes[model_type]()
        for key, value in defaults.items():
            assert getattr(instance, key) == value, (model_type, key)


@pytest.mark.train
def test_unknown_architecture_is_built_on_the_meta_device(tmp_path: Path) -> None:
    """An architecture without an analytic counter is counted from a meta-device model: same numbers as real."""
    import transformers

    config = transformers.OPTConfig(
        vocab_size=211, hidden_size=64, ffn_dim=96, num_hidden_layers=2, num_attention_heads=4, word_embed_proj_dim=64
    )
    total, largest = _real_counts(config)
    config.save_pretrained(tmp_path)
    for source in (config, config.to_dict(), tmp_path):
        size = count_params(source)
        assert (size.params, size.largest_layer_params) == (total, largest)
        assert size.source == "opt config, built on the meta device"


@pytest.mark.train
def test_model_object_counts_shared_weights_once() -> None:
    """A model's tied embedding and lm_head count once, as DeepSpeed's model_to_params does."""
    import transformers

    config = transformers.LlamaConfig(**SMALL, tie_word_embeddings=True)
    model = transformers.AutoModelForCausalLM.from_config(config)
    size = count_params(model)
    assert size.params == sum(p.numel() for p in model.parameters())
    assert size.params == count_params(config).params
    assert size.source == "model object"


@pytest.mark.train
def test_count_errors_name_the_key(tmp_path: Path) -> None:
    """A config missing a size, a missing file, an unknown object and an unreadable file each fail with the reason."""
    with pytest.raises(InvalidValueError, match=r"^model.hidden_size: missing from the llama config$"):
        count_params({"model_type": "llama", "vocab_size": 10})
    with pytest.raises(InvalidValueError, match=r"^model.vocab_size: got '10', expected a non-negative integer"):
        count_params({**SMALL, "model_type": "llama", "vocab_size": "10"})
    with pytest.raises(
        InvalidValueError,
        match=r"^model: no such file: '/nowhere' \(give a local directory holding config.json, or the file itself; hub",
    ):
        count_params(Path("/nowhere"))
    with pytest.raises(InvalidValueError, match=r"^model: got int, expected an HF config"):
        count_params(3)
    deep = tmp_path / "config.json"
    deep.write_text("[" * 100_000)
    with pytest.raises(InvalidValueError, match=r"^model: cannot read '.*config.json': nested deeper than 64 levels$"):
        count_params(deep)
    with pytest.raises(InvalidValueError, match=r"^model.model_type: got 'nosuchthing', unknown to transformers \d"):
        count_params({"model_type": "nosuchthing", "hidden_size": 3})


# -- rows ---------------------------------------------------------------------------


def test_one_row_per_stage_and_offload_choice() -> None:
    """Stage 0 no offload; stages 1-2 optimizer none/cpu; stage 3 optimizer and params each none/cpu/nvme."""
    p = plan(params="1B")
    keys = [(r.stage, r.offload_optimizer, r.offload_param) for r in p.rows]
    assert keys == list(SPEED_ORDER)
    expected = {(0, "none", "none")}
    expected |= {(s, o, "none") for s in (1, 2) for o in ("none", "cpu")}
    expected |= {(3, o, q) for o in ("none", "cpu", "nvme") for q in ("none", "cpu", "nvme")}
    assert set(keys) == expected and len(keys) == len(expected) == 14


def test_rows_follow_the_byte_accounting() -> None:
    """20 bytes/param at stage 0; ZeRO partitions the optimizer (1), gradients (2), parameters (3)."""
    P, L, N = 10**9, 10**8, 4
    p = plan(params=P, largest_layer_params=L, gpus_per_node=N)
    assert p.row(0).gpu_bytes_per_device == 20 * P
    assert p.row(1).gpu_bytes_per_device == 4 * P + 16 * P // N
    assert p.row(2).gpu_bytes_per_device == 2 * P + 18 * P // N
    assert p.row(1, "cpu").gpu_bytes_per_device == 4 * P
    assert p.row(2, "cpu").gpu_bytes_per_device == 2 * P
    assert p.row(3).gpu_bytes_per_device == 4 * L + 18 * P // N
    assert p.row(3, "cpu").gpu_bytes_per_device == p.row(3, "nvme").gpu_bytes_per_device == 4 * L + 2 * P // N
    assert p.row(3, "none", "cpu").gpu_bytes_per_device == 4 * L + 16 * P // N
    assert p.row(3, "cpu", "cpu").gpu_bytes_per_device == p.row(3, "nvme", "nvme").gpu_bytes_per_device == 4 * L
    # what leaves the CPU for NVMe: 16 bytes/param of optimizer state, 2 of parameters, per node
    assert p.row(3, "nvme", "nvme").nvme_bytes == 18 * P
    assert p.row(3, "cpu", "nvme").nvme_bytes == 2 * P
    assert p.row(3, "nvme", "cpu").nvme_bytes == 16 * P
    assert all(r.nvme_bytes == 0 for r in p.rows if "nvme" not in (r.offload_optimizer, r.offload_param))
    # NVMe keeps only pinned swap buffers on the CPU: 4 fp32 sub groups, 5 16-bit parameter buffers per GPU
    # (and, with nothing else on the CPU, the layer zero.Init materializes per process: 4 bytes × L × GPUs × 1.5)
    assert p.row(3, "nvme", "nvme").cpu_bytes_per_node == N * 4 * (P // N) * 4 + N * 5 * 10**8 * 2 + int(
        4 * L * N * 1.5
    )
    assert p.row(3, "cpu", "nvme").cpu_bytes_per_node == int(16 * P * 1.5) + N * 5 * 10**8 * 2


def test_nvme_buffers_grow_to_hold_the_largest_layer_partition() -> None:
    """offload_param.buffer_size must hold a partition of the largest layer; the config says so when 1e8 is short."""
    p = plan(params="7B", largest_layer_params=256_000 * 4096, gpus_per_node=2)
    row = p.row(3, "cpu", "nvme")
    # a partition of the embedding is 524,288,000 elements, rounded up to 530,000,000
    assert row.cpu_bytes_per_node == int(16 * 7e9 * 1.5) + 2 * 5 * 530_000_000 * 2
    assert p.config_for(row).to_dict()["zero_optimization"]["offload_param"]["buffer_size"] == 530_000_000
    assert (
        "buffer_size"
        not in plan(params="7B", gpus_per_node=2).config_for(row).to_dict()["zero_optimization"]["offload_param"]
    )


def test_no_such_row_is_refused() -> None:
    """NVMe or parameter offload below stage 3, and offload at stage 0, are not rows."""
    for stage, opt, par in [(2, "nvme", "none"), (1, "none", "cpu"), (0, "cpu", "none")]:
        with pytest.raises(ValueError, match="no such row"):
            model_state_bytes(stage, opt, par, 10**9)


def test_fits_is_both_budgets() -> None:
    """A row fits when its GPU total is within gpu_memory and its CPU need within cpu_memory; no budget always fits."""
    p = plan(params="3B", largest_layer_params="100M", gpus_per_node=4, gpu_memory="16GiB", cpu_memory="128GiB")
    for r in p.rows:
        assert r.fits == (r.gpu_total_bytes <= 16 * GiB and r.cpu_bytes_per_node <= 128 * GiB)
    assert {r.fits for r in p.rows} == {True, False}
    assert all(r.fits for r in plan(params="3B").rows)
    only_gpu = plan(params="3B", gpu_memory="16GiB")
    assert all(r.fits == (r.gpu_total_bytes <= 16 * GiB) for r in only_gpu.rows)


# -- the pick -------------------------------------------------------------------------


def test_recommended_is_the_first_fitting_row_in_speed_order() -> None:
    """The pick is the fastest row that fits, for budgets tight and loose."""
    for gpu in ("8GiB", "16GiB", "24GiB", "40GiB", "80GiB", "1TiB"):
        for cpu in (None, "64GiB", "512GiB"):
            p = plan(params="7B", largest_layer_params="131M", gpus_per_node=8, gpu_memory=gpu, cpu_memory=cpu)
            fitting = [r for r in p.rows if r.fits]
            assert p.recommended_row is (fitting[0] if fitting else None)


def test_speed_order_is_deepspeeds_guidance() -> None:
    """ZeRO-0 > 1 > 2 > 2+offload > 3 > 3+optimizer offload > 3+optimizer and params offload > NVMe."""
    order = list(SPEED_ORDER)
    assert order.index((2, "none", "none")) < order.index((2, "cpu", "none")) < order.index((3, "none", "none"))
    assert order.index((3, "none", "none")) < order.index((3, "cpu", "none")) < order.index((3, "cpu", "cpu"))
    first_nvme = min(i for i, (_, o, q) in enumerate(order) if "nvme" in (o, q))
    assert all("nvme" not in (o, q) for _, o, q in order[:first_nvme])
    assert order[-1] == (3, "nvme", "nvme")


def test_no_budget_recommends_plain_data_parallel() -> None:
    """With nothing to fit, the fastest row, ZeRO-0, is the pick, and the plan says loudly that no GPU was given."""
    p = plan(params="125M")
    assert p.recommended == Config.zero(0)
    assert p.reason == (
        "ZeRO-0 is the fastest choice (no GPU memory given: pass gpu_memory, --gpu-memory, to know whether it fits); "
        "it needs 0.70 GiB CPU memory per node; activations not counted (give the model's config)"
    )
    assert p.notes[0].startswith("NO GPU MEMORY GIVEN: every row counts as fitting the GPU")


def test_7b_on_eight_24gib_gpus() -> None:
    """7B on 8 x 24 GiB (19.6 usable): ZeRO-2 needs 27.7 GiB, so ZeRO-2 with optimizer offload; with 128 GiB CPU, ZeRO-3."""
    p = plan(params=7e9, gpus_per_node=8, gpu_memory=24 * GiB)
    assert p.row(2).gpu_bytes_per_device == 2 * 7 * 10**9 + 18 * 7 * 10**9 // 8
    assert p.recommended_row is p.row(2, "cpu")
    assert p.recommended == Config.zero(2).offload_cpu(optimizer=True, params=False)
    assert p.recommended is not None
    assert p.recommended.to_dict() == {
        "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu", "pin_memory": True}}
    }
    assert p.reason == (
        "ZeRO-2, optimizer on CPU is the fastest choice that fits in 19.60 GiB usable per GPU "
        "(24.00 GiB less 4.40 GiB headroom); it needs 312.92 GiB CPU memory per node; "
        "activations not counted (give the model's config)"
    )
    with_cpu = plan(params=7e9, gpus_per_node=8, gpu_memory="24GiB", cpu_memory="128GiB")
    assert with_cpu.recommended == Config.zero(3).zero_options(stage3_gather_16bit_weights_on_model_save=True)


def test_every_row_config_validates_without_errors() -> None:
    """The config of every row (what the pick would be) passes dsbuild's validation with no error."""
    p = plan(params="70B", largest_layer_params="1B", gpus_per_node=8, nodes=2)
    for r in p.rows:
        cfg = p.config_for(r)
        assert [d for d in validate(cfg.batch(micro=1)) if d.severity == "error"] == [], r.label
        zero = cfg.to_dict()["zero_optimization"]
        assert zero["stage"] == r.stage
        assert zero.get("offload_optimizer", {}).get("device", "none") == r.offload_optimizer
        assert zero.get("offload_param", {}).get("device", "none") == r.offload_param
        assert zero.get("stage3_gather_16bit_weights_on_model_save", False) == (r.stage == 3)
        if "nvme" in (r.offload_optimizer, r.offload_param):
            nvme = zero["offload_optimizer"] if r.offload_optimizer == "nvme" else zero["offload_param"]
            assert nvme["nvme_path"] == "/local_nvme"


def test_nothing_fits_the_gpu() -> None:
    """Too little GPU memory: no config, and the reason gives the smallest need and its row."""
    p = plan(params="70B", largest_layer_params="1B", gpus_per_node=8, gpu_memory="4GiB")
    assert p.recommended is None and p.recommended_row is None
    assert p.reason == (
        "nothing fits in 1.60 GiB usable per GPU (4.00 GiB less 2.40 GiB headroom): the smallest need is 3.73 GiB "
        "(ZeRO-3, optimizer on NVMe, parameters on NVMe); add GPUs or nodes, train LoRA adapters, or split the "
        "model (tensor/pipeline parallel); activations not counted (give the model's config)"
    )
    eaten = plan(params="70B", gpu_memory="2GiB")
    assert eaten.usable_gpu_memory == 0
    assert (
        eaten.reason
        == "nothing fits: the headroom, 2.20 GiB, takes all of the 2.00 GiB per GPU; give a smaller headroom"
    )


def test_nothing_fits_the_cpu() -> None:
    """Enough GPU for offloaded rows only, too little CPU for them: the reason names the CPU need (and where more
    nodes would do, those first)."""
    wider = plan(params="70B", largest_layer_params="1B", gpus_per_node=8, gpu_memory="16GiB", cpu_memory="32GiB")
    assert wider.recommended is None
    assert wider.reason.startswith(
        "nothing fits without NVMe on these nodes: ZeRO-3, parameters on CPU fits on 16 nodes"
    )
    p = plan(params="70B", largest_layer_params="1B", gpus_per_node=8, gpu_memory="16GiB", cpu_memory="1GiB")
    assert p.recommended is None
    assert p.reason.startswith(
        "nothing fits in 1.00 GiB CPU memory per node: of the choices that fit 12.40 GiB usable per GPU "
        "(16.00 GiB less 3.60 GiB headroom),"
    )
    assert p.reason.endswith("add CPU memory or nodes; activations not counted (give the model's config)")


def test_a_row_without_offload_is_not_held_to_deepspeeds_cold_host_estimate() -> None:
    """7B on 8 x 80 GiB with 256 GiB of host memory: ZeRO-1 and ZeRO-2 stay possible (DeepSpeed's estimator counts
    313 GiB for every process loading the fp32 model first), and a note says so."""
    p = plan(params="7B", largest_layer_params="0.5B", gpus_per_node=8, gpu_memory="80GiB", cpu_memory="256GiB")
    assert p.row(2).fits and p.row(2).cpu_bytes_per_node > 256 * 2**30
    assert p.recommended_row is not None and p.recommended_row.label == "ZeRO-1"
    assert any(n.startswith("DeepSpeed's estimator counts 312.92 GiB of CPU memory per node") for n in p.notes)
    # an offloaded row is held to what it offloads
    assert not plan(params="7B", gpus_per_node=8, gpu_memory="20GiB", cpu_memory="64GiB").row(2, "cpu").fits


def test_nvme_only_when_given_else_more_nodes_or_lora() -> None:
    """70B on one 8 x 80 GiB node with 1 TiB of host memory: no NVMe row without an NVMe directory; the reason
    offers the NVMe row, 2 nodes, or LoRA. Given --nvme, the NVMe row is the pick, at that path."""
    q = plan(params="70B", largest_layer_params="1B", gpus_per_node=8, gpu_memory="80GiB", cpu_memory="1TiB")
    assert q.recommended is None
    assert q.reason.startswith(
        "nothing fits without NVMe on these nodes: ZeRO-3, optimizer on NVMe fits: give a directory on a local NVMe "
        "drive (nvme_path, --nvme PATH); or ZeRO-3, optimizer on CPU fits on 2 nodes; or train LoRA adapters"
    )
    r = plan(params="70B", largest_layer_params="1B", gpus_per_node=8, gpu_memory="80GiB", cpu_memory="1TiB",
             nvme_path="/mnt/nvme0")  # fmt: skip
    assert r.recommended_row is not None and r.recommended_row.label == "ZeRO-3, optimizer on NVMe"
    assert r.recommended is not None
    assert r.recommended.to_dict()["zero_optimization"]["offload_optimizer"]["nvme_path"] == "/mnt/nvme0"


def test_largest_layer_comes_from_the_model_or_a_note() -> None:
    """A config gives the largest layer; a bare count takes it as 0 and says so."""
    cfg = {"model_type": "llama", **SMALL}
    assert plan(model=cfg).largest_layer_params == 211 * 64
    assert plan(params="1B", model=cfg).params == 10**9
    assert plan(params="1B", model=cfg).largest_layer_params == 211 * 64
    bare = plan(params="1B")
    assert bare.largest_layer_params == 0
    assert any(n.startswith("largest layer unknown (taken as 0)") for n in bare.notes)
    assert not any(n.startswith("largest layer unknown") for n in plan(model=cfg).notes)


def test_bad_arguments_are_reported_together() -> None:
    """Every bad argument of plan() is listed in one error."""
    with pytest.raises(InvalidValueError) as info:
        plan(gpus_per_node=0, nodes=True, seq_len=10**16, micro_batch=0, gradient_checkpointing=1)  # type: ignore[arg-type]
    assert str(info.value) == (
        "6 problems:\n"
        "  gpus_per_node: got 0, expected a positive integer up to 1e15\n"
        "  nodes: got True, expected a positive integer up to 1e15\n"
        "  seq_len: got 10000000000000000, expected a positive integer up to 1e15\n"
        "  micro_batch: got 0, expected a positive integer up to 1e15\n"
        "  gradient_checkpointing: got 1, expected True or False\n"
        "  params: missing (give params (e.g. '7B') or model (an HF config or a model))"
    )
    with pytest.raises(InvalidValueError, match=r"^headroom: got '5', expected a size with its unit"):
        plan(params="7B", headroom="5")
    with pytest.raises(InvalidValueError, match=r"^gpu_memory: got '24 gigs'"):
        plan(params="7B", gpu_memory="24 gigs")


# -- activations ------------------------------------------------------------------------


def test_activation_estimate_follows_korthikanti() -> None:
    """34·s·b·h bytes per layer (+5·a·s²·b with stored attention scores), 2·s·b·h with checkpointing, fp32 logits."""
    b, s, h, layers, heads, vocab = 2, 4096, 4096, 32, 32, 32000
    sbh = s * b * h
    assert estimate_activation_bytes(b, s, h, layers) == 34 * sbh * layers
    assert estimate_activation_bytes(b, s, h, layers, num_heads=heads) == (34 * sbh + 5 * heads * s * s * b) * layers
    assert estimate_activation_bytes(b, s, h, layers, checkpointing=True) == 2 * sbh * layers + 34 * sbh
    with_logits = estimate_activation_bytes(b, s, h, layers, checkpointing=True, vocab_size=vocab)
    assert with_logits - estimate_activation_bytes(b, s, h, layers, checkpointing=True) == 4 * s * b * vocab
    # checkpointing shrinks a 7B-class model's activations by an order of magnitude
    assert estimate_activation_bytes(b, s, h, layers) > 10 * estimate_activation_bytes(
        b, s, h, layers, checkpointing=True
    )


def test_activations_of_a_hand_computed_case() -> None:
    """s=4, b=2, h=8, a=2, 3 layers, V=10, worked by hand: s·b·h = 64, 5·a·s/h = 5, so 64 × 39 = 2496 per layer."""
    assert layer_activation_bytes(2, 4, 8, 2) == 2496
    assert layer_activation_bytes(2, 4, 8, None) == 34 * 64
    assert activations(2, 4, 8, 3, num_heads=2, vocab_size=10) == Activations(0, 3 * 2496, 320)
    # full recomputation: 3 layer inputs of 2·64 bytes, one layer rebuilt at a time
    checkpointed = activations(2, 4, 8, 3, num_heads=2, checkpointing=True, vocab_size=10)
    assert checkpointed == Activations(384, 2496, 320)
    assert checkpointed.total == 3200


def test_activations_of_the_papers_gpt3_and_mt_nlg_without_tensor_parallelism() -> None:
    """Korthikanti et al.'s GPT-3 175B and MT-NLG 530B at t=1: eq. 1, and its tensor-parallel form at t=1."""
    s, b = 2048, 1
    # GPT-3 175B: a=96, h=12288, 96 layers; 5·a·s/h = 80
    a, h, layers = 96, 12288, 96
    sbh = s * b * h
    assert 5 * a * s / h == 80
    per_layer = layer_activation_bytes(b, s, h, a)
    assert per_layer == sbh * (34 + 80) == 2_868_903_936
    t = 1  # the paper's tensor-parallel baseline, s·b·h·(10 + 24/t + 5·a·s/(h·t)), is eq. 1 at t=1
    assert per_layer == sbh * (10 + 24 // t) + 5 * a * s * s * b // t
    # what selective recomputation (the attention scores only) saves: 80/114, 70% for GPT-3
    assert round(1 - layer_activation_bytes(b, s, h, None) / per_layer, 2) == 0.70
    assert estimate_activation_bytes(b, s, h, layers, num_heads=a) == 96 * 2_868_903_936
    # full recomputation keeps 2·s·b·h per layer, plus the one layer being rebuilt
    assert estimate_activation_bytes(b, s, h, layers, num_heads=a, checkpointing=True) == 2 * sbh * 96 + per_layer
    # MT-NLG 530B: a=128, h=20480; 5·a·s/h = 64, so selective recomputation saves 64/98, 65%
    a, h = 128, 20480
    assert layer_activation_bytes(b, s, h, a) == s * b * h * (34 + 64) == 4_110_417_920
    assert round(1 - layer_activation_bytes(b, s, h, None) / layer_activation_bytes(b, s, h, a), 2) == 0.65


LLAMA_3_70B = {
    "model_type": "llama",
    "hidden_size": 8192,
    "intermediate_size": 28672,
    "num_hidden_layers": 80,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "vocab_size": 128256,
    "tie_word_embeddings": False,
}


def test_plan_counts_activations_from_the_model_shape() -> None:
    """A plan's activations are Korthikanti's for the model's shape and the seq/micro-batch/checkpointing given."""
    p = plan(model=LLAMA_3_70B, gpu_memory="80GiB")
    assert (p.seq_len, p.micro_batch, p.gradient_checkpointing, p.flash_attention) == (2048, 1, True, False)
    sbh = 2048 * 8192
    assert p.activations == Activations(2 * sbh * 80, 34 * sbh + 5 * 64 * 2048**2, 4 * 2048 * 128256)
    longer = plan(model=LLAMA_3_70B, seq_len=4096, micro_batch=2, gradient_checkpointing=False, flash_attention=True)
    assert longer.activations == activations(2, 4096, 8192, 80, checkpointing=False, vocab_size=128256)
    for r in p.rows:
        assert r.gpu_total_bytes == r.gpu_bytes_per_device + p.activation_bytes + p.headroom_bytes
    bare = plan(params="70B", gpu_memory="80GiB")
    assert bare.activations is None and bare.activation_bytes == 0
    assert bare.notes[0].startswith("activations are NOT counted")


def test_headroom_is_2gib_plus_10_percent_unless_told() -> None:
    """The default headroom is 2 GiB + 10% of the GPU; a size, a percent or both replace it; without a GPU, the size."""
    assert DEFAULT_HEADROOM == Headroom(2 * GiB, 10.0)
    assert plan(params="7B", gpu_memory="80GiB").headroom_bytes == 10 * GiB
    assert plan(params="7B", gpu_memory="80GiB").usable_gpu_memory == 70 * GiB
    assert plan(params="7B").headroom_bytes == 2 * GiB
    assert plan(params="7B").usable_gpu_memory is None
    assert plan(params="7B", gpu_memory="80GiB", headroom="4GiB").headroom_bytes == 4 * GiB
    assert plan(params="7B", gpu_memory="80GiB", headroom="5%").headroom_bytes == 4 * GiB
    assert plan(params="7B", gpu_memory="80GiB", headroom="1GiB+5%").headroom_bytes == 5 * GiB
    assert plan(params="7B", gpu_memory="80GiB", headroom="0").headroom_bytes == 0


def test_no_recommended_row_exceeds_the_usable_memory() -> None:
    """Whatever the GPU, cluster, sequence and headroom: the pick's states + activations fit the usable memory."""
    grid = itertools.product(
        ("16GiB", "24GB", "40GiB", "80GiB", "141GB"),
        (1, 8, 64),
        (512, 8192),
        (1, 4),
        (True, False),
        (None, "0", "1GiB+5%"),
    )
    for gpu, gpus, seq, micro, checkpointing, headroom in grid:
        p = plan(
            model=LLAMA_3_70B,
            gpus_per_node=gpus,
            gpu_memory=gpu,
            seq_len=seq,
            micro_batch=micro,
            gradient_checkpointing=checkpointing,
            headroom=headroom,
        )
        assert p.usable_gpu_memory is not None and p.gpu_memory is not None
        for r in p.rows:
            assert r.fits == (r.gpu_bytes_per_device + p.activation_bytes <= p.usable_gpu_memory)
        if p.recommended_row is not None:
            chosen = p.recommended_row
            assert chosen.gpu_bytes_per_device + p.activation_bytes <= p.usable_gpu_memory
            assert chosen.gpu_total_bytes <= p.gpu_memory
            assert chosen is next(r for r in p.rows if r.fits)


def test_llama_70b_on_two_nodes_of_eight_80gib_gpus_is_not_planned_to_run_out() -> None:
    """Issue 12: ZeRO-3 was picked at 77.8 of 80 GiB; with activations and headroom it needs 93.1, so offload."""
    p = plan(model=LLAMA_3_70B, gpus_per_node=8, nodes=2, gpu_memory="80GiB")
    zero3 = p.row(3)
    assert round(zero3.gpu_bytes_per_device / GiB, 2) == 77.84
    assert round(zero3.gpu_total_bytes / GiB, 2) == 93.10 and not zero3.fits
    assert p.recommended_row is p.row(3, "cpu")
    assert round(p.recommended_row.gpu_total_bytes / GiB, 2) == 27.39
    assert p.recommended == Config.zero(3).offload_cpu(optimizer=True, params=False).zero_options(
        stage3_gather_16bit_weights_on_model_save=True
    )
    assert p.reason == (
        "ZeRO-3, optimizer on CPU is the fastest choice that fits in 70.00 GiB usable per GPU "
        "(80.00 GiB less 10.00 GiB headroom); it needs 788.50 GiB CPU memory per node"
    )
    # with no headroom and no activations (a bare count), the old pick comes back: the figures moved, not the rows
    old = plan(
        params=p.params,
        largest_layer_params=p.largest_layer_params,
        gpus_per_node=8,
        nodes=2,
        gpu_memory="80GiB",
        headroom="0",
    )
    assert old.recommended_row == Row(
        3, "none", "none", zero3.gpu_bytes_per_device, zero3.gpu_bytes_per_device, zero3.cpu_bytes_per_node, 0, True
    )


def test_a_gpu_memory_in_gb_is_read_as_gb_and_said() -> None:
    """'80GB' is 80e9 bytes, 74.51 GiB: the plan says so, and that a GPU sold as 80GB holds 80 GiB."""
    p = plan(params="7B", gpu_memory="80GB")
    assert p.gpu_memory == 80 * 10**9
    note = next(n for n in p.notes if n.startswith("gpu_memory"))
    assert note == (
        "gpu_memory '80GB' is read as 80,000,000,000 bytes (74.51 GiB): GB are 10**9 bytes. A GPU sold as '80GB' "
        "has about 80 GiB: nvidia-smi shows MiB (81920MiB on an A100 80GB); give that figure or '80GiB'"
    )
    assert not any(n.startswith("gpu_memory") for n in plan(params="7B", gpu_memory="81920MiB").notes)


# -- rendering --------------------------------------------------------------------------


def test_table_marks_the_pick_and_says_activations_are_left_out() -> None:
    """The table has a row per choice, a '*' on the pick, GiB with 2 decimals, and the notes below."""
    p = plan(params=7e9, gpus_per_node=8, gpu_memory=24 * GiB)
    text = format_plan_table(p)
    lines = text.splitlines()
    assert lines[:4] == [
        "7.00B parameters (given; largest layer unknown), 8 GPUs per node x 1 node",
        "GPU 24.00 GiB less headroom 4.40 GiB (2.00 GiB + 10% of the GPU) = 19.60 GiB usable",
        "activations not counted: the model's shape is unknown (give its config)",
        "CPU not given; sizes in GiB per GPU (CPU and NVMe per node); rows fastest first",
    ]
    marked = [line for line in lines if line.startswith("*")]
    assert marked == [
        "*  2      cpu        none     13.04             ?       4.40   17.44  312.92       -  yes           -"
    ]
    assert sum(1 for line in lines if line.split()[-2:-1] in (["yes"], ["no"])) == 14
    assert "recommended (*): ZeRO-2, optimizer on CPU is the fastest choice" in text
    assert "  - activations are NOT counted" in text


def test_table_shows_states_activations_headroom_and_the_total() -> None:
    """Each row reads: model states + activations + headroom = GPU total; the assumptions are printed above."""
    text = format_plan_table(plan(model=LLAMA_3_70B, gpus_per_node=8, nodes=2, gpu_memory="80GiB"))
    lines = text.splitlines()
    assert lines[1:5] == [
        "GPU 80.00 GiB less headroom 10.00 GiB (2.00 GiB + 10% of the GPU) = 70.00 GiB usable",
        "activations 5.26 GiB = 80 layer inputs 2.50 + one layer recomputed 1.78 + fp32 logits 0.98 (seq 2048",
        "  x micro-batch 1, gradient checkpointing; hidden 8192, 64 heads, vocab 128256)",
        "CPU not given; sizes in GiB per GPU (CPU and NVMe per node); rows fastest first",
    ]
    header = ["stage", "optimizer", "params", "states", "+activations", "+headroom", "=GPU", "CPU", "NVMe", "fits"]
    header += ["max", "micro"]
    assert lines[6].split() == header
    assert (
        "   3      none       none      77.84          5.26      10.00    93.10    46.97       -  no            0"
        in lines
    )
    assert (
        "*  3      cpu        none      12.13          5.26      10.00    27.39   788.50       -  yes          11"
        in lines
    )


def test_table_without_a_pick_says_why() -> None:
    """No '*' row when nothing fits, and the reason instead."""
    text = format_plan_table(plan(params="70B", largest_layer_params="1B", gpu_memory="4GiB"))
    assert not any(line.startswith("*") for line in text.splitlines())
    assert "no recommendation: nothing fits in 1.60 GiB usable per GPU" in text


def test_plan_to_json_is_json() -> None:
    """plan_to_json holds only JSON types and round-trips through json."""
    p = plan(params="7B", gpus_per_node=8, gpu_memory="24GiB", cpu_memory="512GiB")
    data = plan_to_json(p)
    assert json.loads(json.dumps(data)) == data
    assert data["recommended"] == {
        "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu", "pin_memory": True}}
    }
    assert data["rows"][data["recommended_row"]]["recommended"] is True
    assert data["rows"][0] == {
        "stage": 0,
        "offload_optimizer": "none",
        "offload_param": "none",
        "gpu_bytes_per_device": 140_000_000_000,
        "gpu_total_bytes": 140_000_000_000 + 2 * GiB + 24 * GiB // 10,
        "cpu_bytes_per_node": 336_000_000_000,
        "nvme_bytes": 0,
        "max_micro_batch": None,
        "fits": False,
        "recommended": False,
    }
    assert (data["headroom_bytes"], data["usable_gpu_memory"]) == (
        2 * GiB + 24 * GiB // 10,
        24 * GiB - 2 * GiB - 24 * GiB // 10,
    )
    assert (data["seq_len"], data["micro_batch"], data["gradient_checkpointing"], data["flash_attention"]) == (
        2048,
        1,
        True,
        False,
    )
    assert data["shape"] is None and data["activations"] is None
    none = plan_to_json(plan(params="70B", largest_layer_params="1B", gpu_memory="1GiB"))
    assert none["recommended"] is None and none["recommended_row"] is None
    shaped = plan_to_json(plan(model={"model_type": "llama", **SMALL}))
    assert shaped["shape"] == {"hidden_size": 64, "num_layers": 2, "num_heads": 4, "vocab_size": 211}
    acts = shaped["activations"]
    assert acts["total"] == acts["layer_inputs"] + acts["layers"] + acts["logits"] > 0


def test_plan_is_a_frozen_value() -> None:
    """A Plan is data: frozen, comparable."""
    p = plan(params="1B")
    assert isinstance(p, Plan)
    assert p == plan(params="1B")
    with pytest.raises(AttributeError):
        p.params = 2  # type: ignore[misc]


# -- imports ----------------------------------------------------------------------------


def test_planning_imports_neither_torch_nor_deepspeed(tmp_path: Path) -> None:
    """Planning from a number, a config dict and a config.json leaves torch, deepspeed and transformers unimported."""
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen2", **SMALL}))
    script = textwrap.dedent(
        f"""
        import sys
        import dsbuild.planner as p
        p.plan(params="7B", gpus_per_node=8, gpu_memory="24GiB")
        p.plan(model={{"model_type": "llama", **{SMALL!r}}}, gpu_memory="1GiB")
        text = p.format_plan_table(p.plan(model={str(tmp_path)!r}))
        p.plan_to_json(p.plan(model={str(tmp_path / "config.json")!r}))
        print(sorted(m for m in ("torch", "deepspeed", "transformers", "peft") if m in sys.modules))
        """
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_sequence_parallelism_divides_every_activation_part() -> None:
    """Ulysses cuts the sequence (and, in attention, the heads) sp ways: each GPU holds 1/sp of every part."""
    from dsbuild.planner.memory import activations

    one = activations(1, 8192, 4096, 32, num_heads=32, vocab_size=128256)
    two = activations(1, 8192, 4096, 32, num_heads=32, vocab_size=128256, sequence_parallel=2)
    assert (two.layer_inputs, two.layers, two.logits) == (one.layer_inputs // 2, one.layers // 2, one.logits // 2)


def test_each_row_gives_the_largest_micro_batch_that_fits_the_gpu(tmp_path: Path) -> None:
    """A row's max_micro_batch is the most sequences whose activations fit beside its states and the headroom:
    planned at that micro-batch the row's GPU total fits, one more does not."""
    import json

    from dsbuild import plan

    config = tmp_path / "config.json"
    config.write_text(json.dumps({
        "model_type": "llama", "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
        "num_attention_heads": 32, "num_key_value_heads": 32, "vocab_size": 32000,
    }))  # fmt: skip
    base = plan(model=config, gpus_per_node=8, gpu_memory="80GiB", seq_len=4096)
    assert [r.max_micro_batch for r in base.rows][:3] == [0, 7, 9]
    for i, row in enumerate(base.rows):
        m = row.max_micro_batch
        assert m is not None
        if m:
            assert (
                plan(model=config, gpus_per_node=8, gpu_memory="80GiB", seq_len=4096, micro_batch=m)
                .rows[i]
                .gpu_total_bytes
                <= 80 * 2**30
            )
        wider = plan(model=config, gpus_per_node=8, gpu_memory="80GiB", seq_len=4096, micro_batch=m + 1)
        assert wider.rows[i].gpu_total_bytes > 80 * 2**30
    assert all(r.max_micro_batch is None for r in plan(model=config, gpus_per_node=8, seq_len=4096).rows)


LLAMA_7B = {
    "model_type": "llama", "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": 32, "vocab_size": 32000,
}  # fmt: skip


@pytest.mark.train
def test_a_lora_run_counts_its_frozen_base_once_in_16_bits() -> None:
    """LoRA r=8 on q_proj and v_proj of a 7B Llama: peft's 4.19M adapters carry the training states (DeepSpeed's
    figures for that many parameters) and the 6.74B frozen base adds 2 bytes a parameter, on each GPU below
    stage 3, partitioned at stage 3, offloaded with the parameters."""
    from dsbuild import plan
    from dsbuild.planner.memory import model_state_bytes

    lora = {"r": 8, "target_modules": ["q_proj", "v_proj"]}
    full = plan(model=LLAMA_7B, gpus_per_node=8, gpu_memory="80GiB")
    tuned = plan(model=LLAMA_7B, gpus_per_node=8, gpu_memory="80GiB", lora=lora)
    adapters = 32 * 2 * 8 * (4096 + 4096)
    assert tuned.params == full.params and any(f"{adapters / 1e6:.2f}M trainable" in n for n in tuned.notes)
    base, largest = full.params, full.largest_layer_params
    for row in tuned.rows:
        gpu, _, _ = model_state_bytes(row.stage, row.offload_optimizer, row.offload_param, adapters, largest, 8, 1)
        frozen_on_gpu = 2 * base if row.stage < 3 else (2 * base // 8 if row.offload_param == "none" else 0)
        assert row.gpu_bytes_per_device == gpu + frozen_on_gpu, row.label
    assert tuned.row(0).gpu_bytes_per_device < full.row(2).gpu_bytes_per_device  # no optimizer states for the base


@pytest.mark.train
def test_the_lora_count_is_peft_s_own_on_a_real_model() -> None:
    """count_lora (on the meta device) equals the trainable parameters of the same peft model built for real."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, LlamaConfig

    from dsbuild.planner.count import count_lora

    small = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
             "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 384}  # fmt: skip
    for lora in ({"r": 4}, {"r": 8, "target_modules": "all-linear"}, {"r": 2, "target_modules": ["o_proj"]}):
        real = get_peft_model(
            AutoModelForCausalLM.from_config(LlamaConfig(**{k: v for k, v in small.items() if k != "model_type"})),
            LoraConfig(**lora),
        )
        expected = sum(p.numel() for p in real.parameters() if p.requires_grad)
        assert count_lora(small, lora) == expected, lora
        assert expected > 0 and torch.is_tensor(next(real.parameters()))
