"""dsbuild.planner: sizes and counts, parameter counting, the rows, the pick, the table and the JSON."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from dsbuild import Config, InvalidValueError
from dsbuild.planner import (
    SPEED_ORDER,
    ModelSize,
    Plan,
    count_params,
    estimate_activation_bytes,
    format_plan_table,
    model_state_bytes,
    parse_count,
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
        ("80GB", 80 * GiB),
        ("80 GiB", 80 * GiB),
        ("24g", 24 * GiB),
        ("512MiB", 512 * 2**20),
        ("512MB", 512 * 2**20),
        ("1.5TiB", 3 * 2**39),
        ("2T", 2 * 2**40),
        ("1K", 1024),
        ("0.5GiB", GiB // 2),
        ("1073741824", GiB),
        ("1073741824B", GiB),
        ("1e3", 1000),
        (4096, 4096),
        (1.5 * GiB, 3 * GiB // 2),
    ],
)
def test_parse_size_reads_binary_units_and_plain_bytes(text: Any, expected: int) -> None:
    """Sizes are binary (GB = GiB, as GPU memory is sized); a bare number is bytes."""
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "GiB", "80XB", "-1GiB", "80 GiBs", "1.2.3G", True, -5, float("nan")])
def test_parse_size_rejects_what_is_not_a_size(text: Any) -> None:
    """A bad size fails naming the argument and an example of what is expected."""
    with pytest.raises(InvalidValueError) as info:
        parse_size(text, "gpu_memory")
    assert (
        str(info.value) == f"gpu_memory: got {text!r}, expected a size such as '80GiB', '512MiB' or a number of bytes"
    )


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


def test_analytic_count_matches_the_real_model(configs_and_counts: list[tuple[Any, tuple[int, int]]]) -> None:
    """For every known architecture, tied and untied, the config alone gives the real numel and largest layer."""
    for config, (total, largest) in configs_and_counts:
        size = count_params(config)
        assert (size.params, size.largest_layer_params) == (total, largest), config.model_type
        assert size.source == f"{config.model_type} config, counted analytically"


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
    assert size == ModelSize(6_738_415_616, 32000 * 4096, "llama config, counted analytically")


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


def test_model_object_counts_shared_weights_once() -> None:
    """A model's tied embedding and lm_head count once, as DeepSpeed's model_to_params does."""
    import transformers

    config = transformers.LlamaConfig(**SMALL, tie_word_embeddings=True)
    model = transformers.AutoModelForCausalLM.from_config(config)
    size = count_params(model)
    assert size.params == sum(p.numel() for p in model.parameters())
    assert size.params == count_params(config).params
    assert size.source == "model object"


def test_count_errors_name_the_key() -> None:
    """A config missing a size, a missing file and an unknown object each fail with the reason."""
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
    """A row fits when its GPU need is within gpu_memory and its CPU need within cpu_memory; no budget always fits."""
    p = plan(params="3B", largest_layer_params="100M", gpus_per_node=4, gpu_memory="16GiB", cpu_memory="128GiB")
    for r in p.rows:
        assert r.fits == (r.gpu_bytes_per_device <= 16 * GiB and r.cpu_bytes_per_node <= 128 * GiB)
    assert {r.fits for r in p.rows} == {True, False}
    assert all(r.fits for r in plan(params="3B").rows)
    only_gpu = plan(params="3B", gpu_memory="16GiB")
    assert all(r.fits == (r.gpu_bytes_per_device <= 16 * GiB) for r in only_gpu.rows)


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
    """With nothing to fit, the fastest row, ZeRO-0, is the pick."""
    p = plan(params="125M")
    assert p.recommended == Config.zero(0)
    assert p.reason == "ZeRO-0 is the fastest choice; it needs 0.70 GiB CPU memory per node"


def test_7b_on_eight_24gib_gpus() -> None:
    """7B on 8 x 24 GiB: ZeRO-2 needs 27.7 GiB, so ZeRO-2 with the optimizer on CPU; with 128 GiB CPU, ZeRO-3."""
    p = plan(params=7e9, gpus_per_node=8, gpu_memory=24 * GiB)
    assert p.row(2).gpu_bytes_per_device == 2 * 7 * 10**9 + 18 * 7 * 10**9 // 8
    assert p.recommended_row is p.row(2, "cpu")
    assert p.recommended == Config.zero(2).offload_cpu(optimizer=True, params=False)
    assert p.recommended is not None
    assert p.recommended.to_dict() == {
        "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu", "pin_memory": True}}
    }
    assert p.reason == (
        "ZeRO-2, optimizer on CPU is the fastest choice that fits in 24.00 GiB per GPU; "
        "it needs 312.92 GiB CPU memory per node"
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
    p = plan(params="70B", largest_layer_params="1B", gpus_per_node=8, gpu_memory="2GiB")
    assert p.recommended is None and p.recommended_row is None
    assert p.reason == (
        "nothing fits in 2.00 GiB per GPU: the smallest need is 3.73 GiB (ZeRO-3, optimizer on NVMe, parameters on NVMe); "
        "add GPUs or nodes, or split the model (tensor/pipeline parallel)"
    )


def test_nothing_fits_the_cpu() -> None:
    """Enough GPU for offloaded rows only, too little CPU for them: the reason names the CPU need."""
    p = plan(params="70B", largest_layer_params="1B", gpus_per_node=8, gpu_memory="16GiB", cpu_memory="32GiB")
    assert p.recommended is None
    assert p.reason.startswith(
        "nothing fits in 32.00 GiB CPU memory per node: of the choices that fit 16.00 GiB per GPU,"
    )
    assert p.reason.endswith("add CPU memory or nodes")


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
        plan(gpus_per_node=0, nodes=True)
    assert str(info.value) == (
        "3 problems:\n"
        "  gpus_per_node: got 0, expected a positive integer\n"
        "  nodes: got True, expected a positive integer\n"
        "  params: missing (give params (e.g. '7B') or model (an HF config or a model))"
    )
    with pytest.raises(InvalidValueError, match=r"^gpu_memory: got '24 gigs'"):
        plan(params="7B", gpu_memory="24 gigs")


# -- activations (approximate) ------------------------------------------------------------


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


# -- rendering --------------------------------------------------------------------------


def test_table_marks_the_pick_and_says_activations_are_left_out() -> None:
    """The table has a row per choice, a '*' on the pick, GiB with 2 decimals, and the notes below."""
    p = plan(params=7e9, gpus_per_node=8, gpu_memory=24 * GiB)
    text = format_plan_table(p)
    lines = text.splitlines()
    assert lines[0] == "7.00B parameters (given; largest layer unknown), 8 GPUs per node x 1 node"
    assert lines[1] == "budgets: GPU 24.00 GiB, CPU not given; rows fastest first"
    marked = [line for line in lines if line.startswith("*")]
    assert marked == ["*  2      cpu        none     13.04 GiB  312.92 GiB           -  yes"]
    assert sum(1 for line in lines if line.endswith((" yes", " no"))) == 14
    assert "recommended (*): ZeRO-2, optimizer on CPU is the fastest choice" in text
    assert "  - activations are not included" in text


def test_table_without_a_pick_says_why() -> None:
    """No '*' row when nothing fits, and the reason instead."""
    text = format_plan_table(plan(params="70B", largest_layer_params="1B", gpu_memory="2GiB"))
    assert not any(line.startswith("*") for line in text.splitlines())
    assert "no recommendation: nothing fits in 2.00 GiB per GPU" in text


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
        "cpu_bytes_per_node": 336_000_000_000,
        "nvme_bytes": 0,
        "fits": False,
        "recommended": False,
    }
    none = plan_to_json(plan(params="70B", largest_layer_params="1B", gpu_memory="1GiB"))
    assert none["recommended"] is None and none["recommended_row"] is None


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
