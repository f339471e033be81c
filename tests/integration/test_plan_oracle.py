"""dsbuild.planner against DeepSpeed's own memory estimators (the oracle): within 1%, zero_init on."""

from __future__ import annotations

import itertools
import re
from typing import Any

import pytest
from deepspeed.runtime.zero.stage3 import (
    estimate_zero3_model_states_mem_needs,
    estimate_zero3_model_states_mem_needs_all_cold,
    estimate_zero3_model_states_mem_needs_all_live,
)
from deepspeed.runtime.zero.stage3 import model_to_params as zero3_model_to_params
from deepspeed.runtime.zero.stage_1_and_2 import (
    estimate_zero2_model_states_mem_needs,
    estimate_zero2_model_states_mem_needs_all_cold,
    estimate_zero2_model_states_mem_needs_all_live,
)

from dsbuild.planner import count_params, plan

pytestmark = pytest.mark.train  # the training extra; tests/conftest.py skips it without

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


# -- the tables DeepSpeed's documented entry points print -----------------------------------------------------

_PRINTED_ROW = re.compile(r"^\s*([\d.]+)GB \|\s*([\d.]+)GB \| (.*)$")


def _printed_rows(text: str) -> dict[tuple[int, str, str], tuple[float, float]]:
    """{(stage, offload_optimizer, offload_param): (CPU GiB per node, GPU GiB per device)} of the zero_init rows.

    DeepSpeed prints "GB" for 2**30 bytes; its zero_init=0 rows (the model loaded whole in every process) are
    left out, as dsbuild plans for zero.Init.
    """
    rows: dict[tuple[int, str, str], tuple[float, float]] = {}
    for line in text.splitlines():
        match = _PRINTED_ROW.match(line)
        if match is None or "zero_init=0" in line:
            continue
        cpu, gpu, options = float(match[1]), float(match[2]), dict(o.split("=") for o in match[3].split(", "))
        opt = "cpu" if "cpu" in options["offload_optimizer"] else "none"
        par = "cpu" if "cpu" in options.get("offload_param", "none") else "none"
        rows[(3 if "zero_init" in options else 2, opt, par)] = (cpu, gpu)
    return rows


def _assert_rows_print_as(p: Any, printed: dict[tuple[int, str, str], tuple[float, float]]) -> None:
    """Each printed row equals the plan's row, to DeepSpeed's 2 decimals of GiB (one last-digit rounding apart)."""
    assert printed
    for (stage, opt, par), (cpu, gpu) in printed.items():
        row = p.row(stage, opt, par)
        assert abs(row.gpu_bytes_per_device / 2**30 - gpu) <= 0.01, (row, gpu)
        assert abs(row.cpu_bytes_per_node / 2**30 - cpu) <= 0.01, (row, cpu)


@pytest.mark.parametrize(
    ("params", "cluster", "largest"),
    [
        (6_738_415_616, (8, 1), 131_072_000),
        (70_553_706_496, (8, 2), 1_050_673_152),
        (175_000_000_000, (4, 16), 0),
    ],
)
def test_rows_match_what_the_all_cold_estimators_print(
    params: int, cluster: tuple[int, int], largest: int, capsys: pytest.CaptureFixture[str]
) -> None:
    """estimate_zero2/3_model_states_mem_needs_all_cold, the functions DeepSpeed's docs name, print our rows."""
    gpus, nodes = cluster
    p = plan(params=params, largest_layer_params=largest, gpus_per_node=gpus, nodes=nodes)
    estimate_zero2_model_states_mem_needs_all_cold(params, num_gpus_per_node=gpus, num_nodes=nodes)
    estimate_zero3_model_states_mem_needs_all_cold(params, largest, num_gpus_per_node=gpus, num_nodes=nodes)
    printed = _printed_rows(capsys.readouterr().out)
    assert set(printed) == {
        (2, "cpu", "none"),
        (2, "none", "none"),
        (3, "cpu", "cpu"),
        (3, "cpu", "none"),
        (3, "none", "none"),
    }
    _assert_rows_print_as(p, printed)


def test_rows_of_a_model_match_what_the_all_live_estimators_print(capsys: pytest.CaptureFixture[str]) -> None:
    """estimate_zero2/3_model_states_mem_needs_all_live on a built model print plan(model=...)'s rows."""
    import transformers

    for config in _tiny_models():
        model = transformers.AutoModelForCausalLM.from_config(config)
        p = plan(model=config, gpus_per_node=2, nodes=2)
        estimate_zero2_model_states_mem_needs_all_live(model, num_gpus_per_node=2, num_nodes=2)
        estimate_zero3_model_states_mem_needs_all_live(model, num_gpus_per_node=2, num_nodes=2)
        _assert_rows_print_as(p, _printed_rows(capsys.readouterr().out))


def test_the_70b_example_figures_are_deepspeeds_plus_activations_and_headroom() -> None:
    """Issue 12's example: each GPU total is DeepSpeed's model-state figure + activations + headroom, none over it."""
    size = 70_553_706_496, 1_050_673_152
    config = {
        "model_type": "llama",
        "hidden_size": 8192,
        "intermediate_size": 28672,
        "num_hidden_layers": 80,
        "num_attention_heads": 64,
        "num_key_value_heads": 8,
        "vocab_size": 128256,
    }
    p = plan(model=config, gpus_per_node=8, nodes=2, gpu_memory="80GiB")
    assert (p.params, p.largest_layer_params) == size
    for opt, par in (("none", "none"), ("cpu", "none"), ("cpu", "cpu")):
        _cpu, gpu, _ = estimate_zero3_model_states_mem_needs(
            *size, 8, 2, cpu_offload=opt == "cpu", cpu_offload_params=par == "cpu", zero_init=True
        )
        row = p.row(3, opt, par)  # type: ignore[arg-type]
        assert row.gpu_bytes_per_device == gpu
        assert row.gpu_total_bytes == gpu + p.activation_bytes + p.headroom_bytes
    assert p.recommended_row is not None and p.recommended_row.gpu_total_bytes <= 80 * 2**30
    assert not p.row(3).fits
