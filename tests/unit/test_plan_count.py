"""dsbuild.planner: counting parameters (analytically, on the meta device, of a model) and LoRA's counts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from _plan_helpers import SMALL

from dsbuild import InvalidValueError
from dsbuild.planner import ModelSize, Shape, count_params

# -- counting parameters ------------------------------------------------------------


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
