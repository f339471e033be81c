"""A LoRA model is built without transformers' FutureWarning about ``is_gradient_checkpointing`` (peft reads that
deprecated name when it wraps the model, checkpointing on or off; issue 41): a LoRA job printed it with checkpointing
off. Other warnings still show."""

from __future__ import annotations

import warnings

import pytest

pytestmark = pytest.mark.train  # peft and transformers; tests/conftest.py skips it without the training extra


@pytest.mark.parametrize("checkpointing", [False, True], ids=["checkpointing off", "checkpointing on"])
def test_wrapping_a_model_with_lora_warns_nothing_about_checkpointing(checkpointing: bool) -> None:
    """peft's get_peft_model through apply_lora, on a tiny Llama with checkpointing as a job sets it: no warning that
    names gradient checkpointing, and peft prepared the model as it would (its answer unchanged)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from dsbuild.session import building

    config = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
                         num_key_value_heads=4, vocab_size=64)  # fmt: skip
    model = LlamaForCausalLM(config)
    if checkpointing:
        building.enable_gradient_checkpointing(model, lora=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        peft_model = building.apply_lora(model, {"r": 4, "alpha": 8, "target_modules": ["q_proj"]})
        warnings.warn("still shown", FutureWarning, stacklevel=1)  # nothing else is hidden
    said = [str(w.message) for w in caught if issubclass(w.category, FutureWarning)]
    assert [m for m in said if "checkpointing" in m] == [] and said[-1] == "still shown"
    assert peft_model.base_model.model.is_activation_checkpointing is checkpointing
