"""dsbuild.planner: activations, headroom and each row's GPU total, the table and JSON showing them, imports."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from _plan_helpers import SMALL, GiB

from dsbuild import Config
from dsbuild.planner import (
    DEFAULT_HEADROOM,
    Activations,
    Headroom,
    Plan,
    Row,
    activations,
    estimate_activation_bytes,
    format_plan_table,
    layer_activation_bytes,
    plan,
    plan_to_json,
)

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
    assert lines[:5] == [
        "7.00B parameters (given; largest layer unknown), 8 GPUs per node x 1 node",
        "model states: bf16 mixed precision, AdamW; bytes per parameter: weights 2, gradients 2, optimizer 16",
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
    assert lines[1:6] == [
        "model states: bf16 mixed precision, AdamW; bytes per parameter: weights 2, gradients 2, optimizer 16",
        "GPU 80.00 GiB less headroom 10.00 GiB (2.00 GiB + 10% of the GPU) = 70.00 GiB usable",
        "activations 5.26 GiB = 80 layer inputs 2.50 + one layer recomputed 1.78 + fp32 logits 0.98 (seq 2048",
        "  x micro-batch 1, gradient checkpointing; hidden 8192, 64 heads, vocab 128256)",
        "CPU not given; sizes in GiB per GPU (CPU and NVMe per node); rows fastest first",
    ]
    header = ["stage", "optimizer", "params", "states", "+activations", "+headroom", "=GPU", "CPU", "NVMe", "fits"]
    header += ["max", "micro"]
    assert lines[7].split() == header
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
        "bytes_per_param": {"weights": 2, "gradients": 2, "optimizer": 16},
    }
    assert data["precision"] == {
        "training": "bf16", "dtype": None, "optimizer": "AdamW", "states": None, "optimizer_states": 2,
        "weight_bytes": 2,
    }  # fmt: skip
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


@pytest.mark.procs
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


def test_the_activation_note_says_the_sequence_parallel_degree_it_planned_for() -> None:
    """The plan's note on activations says what it divided them by (docs and figures agree): 1/8 of every sequence
    with sequence_parallel=8, none without."""
    from dsbuild import plan

    model = {"model_type": "llama", **SMALL}
    eight = " ".join(plan(model=model, sequence_parallel=8).notes)
    assert "each GPU holds 1/8 of every sequence (Ulysses sequence parallelism)" in eight
    assert "no sequence parallelism" not in eight
    assert "no sequence parallelism; no tensor parallelism" in " ".join(plan(model=model).notes)


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
