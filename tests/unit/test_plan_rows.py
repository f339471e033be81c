"""dsbuild.planner: the rows (one per ZeRO stage and offload, their bytes and budgets) and the pick."""

from __future__ import annotations

import pytest
from _plan_helpers import SMALL, GiB

from dsbuild import Config, InvalidValueError
from dsbuild.planner import SPEED_ORDER, Precision, StateBytes, model_state_bytes, plan
from dsbuild.planner.precision import DTYPE_BYTES
from dsbuild.validate import validate

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


# -- precision, model dtype and optimizer ------------------------------------------------


def test_fp32_rows_keep_what_deepspeed_allocates_for_fp32_training() -> None:
    """fp32 AdamW: 4-byte weights and gradients; stage 0 adds only the 2 moments, stages 1-2 ZeRO's fp32 clone and
    fp32 gradients, stage 3 no clone (its fp32 partition is updated in place) unless offloaded."""
    P, L, N = 10**9, 10**8, 4
    fp32, bf16 = (plan(params=P, largest_layer_params=L, gpus_per_node=N, precision=p) for p in ("fp32", "bf16"))
    assert fp32.row(0).gpu_bytes_per_device == 16 * P  # 4 weights + 4 gradients + 8 moments
    assert fp32.row(1).gpu_bytes_per_device == 8 * P + 16 * P // N
    assert fp32.row(2).gpu_bytes_per_device == 4 * P + 20 * P // N
    assert fp32.row(1, "cpu").gpu_bytes_per_device == 8 * P
    assert fp32.row(3).gpu_bytes_per_device == 8 * L + 16 * P // N  # the gathered layer: 4 + 4 bytes
    assert fp32.row(3, "cpu").gpu_bytes_per_device == 8 * L + 4 * P // N
    assert fp32.row(3, "cpu").cpu_bytes_per_node == int(16 * P * 1.5)  # the clone offloaded with the moments
    assert fp32.row(3, "cpu", "cpu").cpu_bytes_per_node == int(20 * P * 1.5)
    assert [r.gpu_bytes_per_device for r in fp32.rows] != [r.gpu_bytes_per_device for r in bf16.rows]
    assert (bf16.row(0).gpu_bytes_per_device, bf16.row(3).gpu_bytes_per_device) == (20 * P, 4 * L + 18 * P // N)


def test_the_model_dtype_counts_only_in_fp32_training_and_the_optimizer_its_states() -> None:
    """Mixed precision casts the model to 16 bits whatever its dtype; fp32 training keeps the dtype it was loaded in
    (a bf16 model: 2-byte weights, ZeRO's master copy in fp32); Lion keeps 1 state, SGD without momentum none."""
    assert Precision("bf16", "fp32").per_param(2) == Precision("bf16").per_param(2) == StateBytes(2, 2, 16)
    assert Precision("fp32", "bf16").per_param(2) == StateBytes(2, 2, 16)
    assert Precision("fp32", "bf16").per_param(3) == StateBytes(2, 2, 16)  # a bf16 partition: an fp32 copy
    assert Precision("fp32", "bf16").per_param(0) == StateBytes(2, 2, 4)  # torch's moments in the weights' dtype
    assert Precision("fp16", optimizer="Lion").per_param(2) == StateBytes(2, 2, 12)
    assert Precision("fp32", optimizer="SGD", states=0).per_param(3) == StateBytes(4, 4, 4)
    assert Precision(optimizer="Muon").optimizer_states == 2  # not listed: counted as Adam
    lion = plan(params=10**9, precision=Precision("bf16", optimizer="Lion"))
    assert lion.row(0).gpu_bytes_per_device == 16 * 10**9
    with pytest.raises(InvalidValueError, match="precision: got 'fp8', expected 'bf16', 'fp16', 'fp32'"):
        plan(params="1B", precision="fp8")


def test_precision_of_a_config_is_its_enabled_section_and_optimizer() -> None:
    """Precision.of reads a resolved config as DeepSpeed does: bf16 or fp16 enabled, else fp32; the optimizer's
    type, an SGD without momentum keeping no state."""
    assert Precision.of(Config.zero(3).bf16()) == Precision("bf16", None, "AdamW")
    assert Precision.of(Config.zero(2).fp16().lion(lr=1e-4)) == Precision("fp16", None, "Lion")
    assert Precision.of(Config.zero(2), "bf16") == Precision("fp32", "bf16", "AdamW")
    sgd = Precision.of(Config.zero(1).optimizer("SGD", lr=0.1))
    assert (sgd.optimizer, sgd.optimizer_states) == ("SGD", 0)
    assert Precision.of(Config.zero(1).optimizer("SGD", lr=0.1, momentum=0.9)).optimizer_states == 1


def test_dtype_bytes_name_every_job_dtype() -> None:
    """The planner knows the bytes of every [model] dtype a job may give."""
    from dsbuild.job.spec import DTYPES

    assert {*DTYPE_BYTES, "auto"} == set(DTYPES)
