"""dsbuild.planner against DeepSpeed's own memory estimators (the oracle): within 1%, zero_init on."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from dsbuild.planner import count_params, plan

estimators = pytest.importorskip("deepspeed.runtime.zero.stage3")
from deepspeed.runtime.zero.stage3 import (  # noqa: E402
    estimate_zero3_model_states_mem_needs,
)
from deepspeed.runtime.zero.stage3 import model_to_params as zero3_model_to_params  # noqa: E402
from deepspeed.runtime.zero.stage_1_and_2 import (  # noqa: E402
    estimate_zero2_model_states_mem_needs,
)

SIZES = [125_000_000, 1_300_000_000, 6_738_415_616, 70_000_000_000, 175_000_000_000]
CLUSTERS = [(1, 1), (2, 1), (8, 1), (8, 4), (4, 16)]  # (gpus_per_node, nodes)
LARGEST = [0, 131_072_000, 1_050_673_152]
TOLERANCE = 0.01


def _close(ours: int, theirs: int) -> bool:
    """Within 1% (both zero counts as equal)."""
    return ours == theirs or abs(ours - theirs) <= TOLERANCE * max(abs(ours), abs(theirs))


@pytest.mark.parametrize(("params", "cluster"), list(itertools.product(SIZES, CLUSTERS)))
def test_zero2_rows_match_deepspeeds_estimator(params: int, cluster: tuple[int, int]) -> None:
    """ZeRO-2 with and without CPU optimizer offload: GPU per device and CPU per node as DeepSpeed estimates."""
    gpus, nodes = cluster
    p = plan(params=params, gpus_per_node=gpus, nodes=nodes)
    for offload in (False, True):
        cpu, gpu = estimate_zero2_model_states_mem_needs(
            params, num_gpus_per_node=gpus, num_nodes=nodes, cpu_offload=offload, additional_buffer_factor=1.5
        )
        row = p.row(2, "cpu" if offload else "none")
        assert _close(row.gpu_bytes_per_device, gpu), (row, gpu)
        assert _close(row.cpu_bytes_per_node, cpu), (row, cpu)


@pytest.mark.parametrize(("params", "cluster", "largest"), list(itertools.product(SIZES, CLUSTERS, LARGEST)))
def test_zero3_rows_match_deepspeeds_estimator(params: int, cluster: tuple[int, int], largest: int) -> None:
    """ZeRO-3 with no offload, optimizer offload, optimizer and parameter offload: as DeepSpeed estimates."""
    gpus, nodes = cluster
    p = plan(params=params, largest_layer_params=largest, gpus_per_node=gpus, nodes=nodes)
    for opt, par in (("none", "none"), ("cpu", "none"), ("cpu", "cpu")):
        cpu, gpu, _largest_layer_memory = estimate_zero3_model_states_mem_needs(
            params,
            largest,
            num_gpus_per_node=gpus,
            num_nodes=nodes,
            cpu_offload=opt == "cpu",
            cpu_offload_params=par == "cpu",
            zero_init=True,
            additional_buffer_factor=1.5,
        )
        row = p.row(3, opt, par)  # type: ignore[arg-type]
        assert _close(row.gpu_bytes_per_device, gpu), (row, gpu)
        assert _close(row.cpu_bytes_per_node, cpu), (row, cpu)


@pytest.mark.parametrize("factor", [1.0, 1.5, 2.0])
def test_buffer_factor_is_deepspeeds(factor: float) -> None:
    """additional_buffer_factor scales the CPU figures exactly as in DeepSpeed."""
    p = plan(params="7B", largest_layer_params="131M", gpus_per_node=8, additional_buffer_factor=factor)
    cpu, _gpu = estimate_zero2_model_states_mem_needs(7 * 10**9, 8, 1, True, factor)
    assert _close(p.row(2, "cpu").cpu_bytes_per_node, cpu)
    cpu, _gpu, _ = estimate_zero3_model_states_mem_needs(7 * 10**9, 131 * 10**6, 8, 1, True, True, True, factor)
    assert _close(p.row(3, "cpu", "cpu").cpu_bytes_per_node, cpu)


def _tiny_models() -> list[Any]:
    import transformers as t

    small = {
        "vocab_size": 211,
        "hidden_size": 64,
        "intermediate_size": 96,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
    }
    return [
        t.LlamaConfig(**small, num_key_value_heads=2),
        t.Qwen2Config(**small, num_key_value_heads=2, tie_word_embeddings=True),
        t.GPT2Config(vocab_size=211, n_embd=64, n_layer=2, n_head=4, n_positions=33),
        t.Phi3Config(**small, pad_token_id=0, bos_token_id=1, eos_token_id=2),
    ]


def test_counts_match_deepspeeds_model_to_params() -> None:
    """Total and largest layer from the config alone equal DeepSpeed's model_to_params on the built model."""
    import transformers

    for config in _tiny_models():
        model = transformers.AutoModelForCausalLM.from_config(config)
        total, largest = zero3_model_to_params(model)
        for source in (config, model):
            size = count_params(source)
            assert (size.params, size.largest_layer_params) == (total, largest), config.model_type


def test_planning_a_model_matches_the_live_estimator() -> None:
    """plan(model=...) gives DeepSpeed's all-live figures for that model (stage 3, full CPU offload)."""
    import transformers

    config = _tiny_models()[0]
    model = transformers.AutoModelForCausalLM.from_config(config)
    total, largest = zero3_model_to_params(model)
    p = plan(model=model, gpus_per_node=2)
    cpu, gpu, _ = estimate_zero3_model_states_mem_needs(total, largest, 2, 1, True, True, True, 1.5)
    row = p.row(3, "cpu", "cpu")
    assert (row.gpu_bytes_per_device, row.cpu_bytes_per_node) == (gpu, cpu)
