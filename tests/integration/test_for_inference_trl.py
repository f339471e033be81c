"""``Config.for_inference`` against TRL 1.16's reference engine and against DeepSpeed itself.

The differential: TRL's real ``trl.models.utils.prepare_deepspeed(model, accelerator)``, run with a real
``accelerate.Accelerator`` (a ``DeepSpeedPlugin(hf_ds_config=training_config)``, on the CPU) and ``deepspeed.initialize``
patched to capture the config dict it is handed, is compared key by key with
``Config.from_dict(training_config).for_inference(hidden_size=H).to_dict()``. The two are equal except these rows,
dsbuild's documented fixes (each is applied to TRL's dict by ``with_dsbuilds_fixes`` before comparing, so a
difference outside them fails the test; ``test_each_row_is_a_real_difference`` shows each one on its own):

| row | TRL 1.16 | dsbuild | why |
|---|---|---|---|
| ``dotted`` | at stage 3 (model with a hidden size) writes three top-level keys ``"zero_optimization.reduce_bucket_size": H²``, ``"zero_optimization.stage3_param_persistence_threshold": 10·H``, ``"zero_optimization.stage3_prefetch_bucket_size": 0.9·H²`` | not written | DeepSpeed never reads unknown top-level keys: they are no-ops; the prefetch is a float, which DeepSpeed's integer field refuses (were it read) |
| ``auto`` | the three buckets' ``"auto"`` left in ``zero_optimization`` | filled from H: H², int(0.9·H²), 10·H (the HF Trainer's rows) | DeepSpeed drops a sub-field equal to ``"auto"``, so TRL's reference runs with DeepSpeed's defaults 5e8 / 5e7 / 1e5; below stage 3 TRL computes nothing at all |
| ``stage3-auto`` | ``"auto"`` in the stage-3 buckets kept below stage 3 | removed | nothing fills them below stage 3 and DeepSpeed reads them only at stage 3 |
| ``deepcompile`` | ``compile.deepcompile: true`` kept | ``false`` | ZeRO inference has no DeepCompile mode (OpenRLHF PR #979; DeepSpeed PR #7225) |
| ``master-weights`` | ``bf16.bf16_master_weights_and_grads``, ``bf16.bf16_optimizer_states``, ``fp16.fp16_master_weights_and_grads`` kept | removed | at stage 0 DeepSpeed's parser asserts "... is only supported with ZeRO Stage 1, 2, or 3.": TRL's reference of such a ZeRO-1/2 config does not start |
| ``grad-norm`` | ``zero_optimization.compute_grad_norm`` kept | removed | at stage 0 DeepSpeed refuses ``false`` ("compute_grad_norm=false is supported only with ZeRO Stage 1 or 2"): TRL's reference does not start |
| ``zenflow`` | ``zero_optimization.zenflow`` kept | removed | without an optimizer DeepSpeed still configures ZenFlow and sets the engine's gradient_accumulation_steps to its update_interval (0 for ``"auto"``) |
| ``managed-accumulation`` | ``managed_gradient_accumulation: false`` kept | removed | with ``overlap_comm`` at stage 0 the engine asserts "managed_gradient_accumulation=False supports ZeRO overlap_comm only with ZeRO stage 2": TRL's reference does not start |
| ``accelerate`` | ``steps_per_print: inf``; ``fp16``/``bf16`` ``{enabled: false}`` for a precision the config does not set | absent | Accelerate's ``DeepSpeedPlugin`` writes them before TRL reads the config: not TRL's rule, not compared |

Equal, always: stage 3 stays 3 and 0-2 become 0; ``optimizer``, ``scheduler`` and ``zero_optimization.offload_optimizer``
are removed; the precision, the batch sizes, ``gradient_clipping``, ``tensor_parallel`` and every other ZeRO key are
kept as written.

DeepSpeed's verdict: its parser (``deepspeed_verdict``) takes every dsbuild result and refuses TRL's exactly on the
rows that say so; ``deepspeed.initialize`` builds an engine without an optimizer on each stage's result (CPU, one
process) whose forward pass gives the model's own loss.
"""

from __future__ import annotations

import os

os.environ.setdefault("DS_ACCELERATOR", "cpu")

import copy
from collections.abc import Iterator
from contextlib import contextmanager
from types import SimpleNamespace
from typing import Any
from unittest import mock

import deepspeed
import pytest
import torch
import trl.models.utils as trl_utils
from accelerate import Accelerator
from accelerate.state import AcceleratorState, GradientState
from accelerate.utils import DeepSpeedPlugin
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers.integrations import unset_hf_deepspeed_config

from dsbuild import Config
from dsbuild.validate.deepspeed_verdict import deepspeed_verdict

pytestmark = pytest.mark.train

BUCKETS = ("reduce_bucket_size", "stage3_prefetch_bucket_size", "stage3_param_persistence_threshold")
STAGE3_BUCKETS = BUCKETS[1:]
BATCH: dict[str, Any] = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 4}
OPTIMIZER: dict[str, Any] = {"type": "AdamW", "params": {"lr": 1e-5, "weight_decay": 0.0}}
SCHEDULER: dict[str, Any] = {"type": "WarmupLR", "params": {"warmup_num_steps": 10}}


def hf_buckets(hidden: int) -> dict[str, int]:
    """The HF Trainer's values (transformers ``trainer_config_finalize``), written out here as the test's oracle."""
    return {
        "reduce_bucket_size": hidden * hidden,
        "stage3_prefetch_bucket_size": int(0.9 * hidden * hidden),
        "stage3_param_persistence_threshold": 10 * hidden,
    }


# -- TRL's reference config -------------------------------------------------------------------------------------------


@contextmanager
def accelerate_state() -> Iterator[None]:
    """Accelerate's singletons, the environment it writes (ACCELERATE_USE_DEEPSPEED) and transformers' global
    HfDeepSpeedConfig, as they were before: nothing leaks into the next example or test."""
    environ = dict(os.environ)
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
    try:
        yield
    finally:
        AcceleratorState._reset_state(reset_partial_state=True)
        GradientState._reset_state()
        unset_hf_deepspeed_config()
        os.environ.clear()
        os.environ.update(environ)


def trl_reference_config(training: dict[str, Any], hidden: int) -> dict[str, Any]:
    """The ds_config TRL 1.16 hands ``deepspeed.initialize`` for a reference model of hidden size ``hidden``, when the
    training run's Accelerator holds ``training``."""
    captured: dict[str, Any] = {}

    def initialize(*, model: Any, config: dict[str, Any]) -> tuple[Any, None, None, None]:
        captured.update(copy.deepcopy(config))
        return SimpleNamespace(eval=lambda: None), None, None, None

    # prepare_deepspeed reads only model.config (hidden_sizes, else hidden_size) before handing the model on
    model = SimpleNamespace(config=SimpleNamespace(hidden_size=hidden))
    with accelerate_state():
        accelerator = Accelerator(deepspeed_plugin=DeepSpeedPlugin(hf_ds_config=copy.deepcopy(training)))
        assert accelerator.state.deepspeed_plugin is not None
        with mock.patch.object(deepspeed, "initialize", initialize):
            trl_utils.prepare_deepspeed(model, accelerator)
    return captured


def with_dsbuilds_fixes(trl: dict[str, Any], training: dict[str, Any], hidden: int) -> tuple[dict[str, Any], set[str]]:
    """TRL's dict with each documented row applied (the module docstring's table), and the rows that changed it."""
    out = copy.deepcopy(trl)
    fired: set[str] = set()
    zero = out["zero_optimization"]
    stage = zero["stage"]
    added: list[str] = [key for key in ("steps_per_print", "fp16", "bf16") if key in out and key not in training]
    if added:
        assert out["steps_per_print"] == float("inf")
        assert all(out[key] == {"enabled": False} for key in added if key != "steps_per_print")
        fired.add("accelerate")
        for key in added:
            del out[key]
    dotted = [f"zero_optimization.{key}" for key in BUCKETS]
    if any(key in out for key in dotted):
        assert stage == 3 and all(key in out for key in dotted)
        assert [out[key] for key in dotted] == [hidden * hidden, 0.9 * hidden * hidden, 10 * hidden]
        fired.add("dotted")
        for key in dotted:
            del out[key]
    for key, value in hf_buckets(hidden).items():
        if zero.get(key) != "auto":
            continue
        if stage != 3 and key in STAGE3_BUCKETS:
            fired.add("stage3-auto")
            del zero[key]
        else:
            fired.add("auto")
            zero[key] = value
    if out.get("compile", {}).get("deepcompile") is True:
        fired.add("deepcompile")
        out["compile"]["deepcompile"] = False
    for section, key, row in (
        ("bf16", "bf16_master_weights_and_grads", "master-weights"),
        ("bf16", "bf16_optimizer_states", "master-weights"),
        ("fp16", "fp16_master_weights_and_grads", "master-weights"),
        ("zero_optimization", "compute_grad_norm", "grad-norm"),
        ("zero_optimization", "zenflow", "zenflow"),
    ):
        if key in out.get(section, {}):
            fired.add(row)
            del out[section][key]
    if "managed_gradient_accumulation" in out:
        fired.add("managed-accumulation")
        del out["managed_gradient_accumulation"]
    return out, fired


REFUSED_BY_THE_PARSER = {"master-weights", "grad-norm"}
"""Rows whose TRL config DeepSpeed's parser refuses (at stage 0: a ZeRO-1/2 training config)."""


def compare(training: dict[str, Any], hidden: int) -> set[str]:
    """TRL's reference config, fixed by the documented rows, equals dsbuild's key by key; DeepSpeed's parser takes
    dsbuild's and refuses TRL's exactly on the rows that say so. Returns the rows that differed."""
    trl = trl_reference_config(training, hidden)
    ours = Config.from_dict(training).for_inference(hidden_size=hidden).to_dict()
    fixed, fired = with_dsbuilds_fixes(trl, training, hidden)
    assert fixed == ours
    assert deepspeed_verdict(ours) == []
    refused = deepspeed_verdict(trl)
    assert bool(refused) == bool(fired & REFUSED_BY_THE_PARSER and training["zero_optimization"]["stage"] != 3), refused
    return fired


# -- the grid the issue names, and random configs -------------------------------------------------------------------


GRID = [
    (stage, offload, autos)
    for stage in (0, 1, 2, 3)
    for offload in (False, True)
    for autos in (False, True)
    if not (stage == 0 and offload)  # DeepSpeed offloads an optimizer only at ZeRO 1-3
]


@pytest.mark.parametrize(("stage", "offload", "autos"), GRID)
def test_trl_and_dsbuild_agree_but_for_the_documented_rows(stage: int, offload: bool, autos: bool) -> None:
    """ZeRO 0-3 × optimizer offload × hidden-size "auto": TRL's reference config is dsbuild's but for the rows in the
    table (and exactly the expected ones)."""
    zero: dict[str, Any] = {"stage": stage, **(dict.fromkeys(BUCKETS, "auto") if autos else {})}
    if offload:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    training = {**BATCH, "bf16": {"enabled": True}, "optimizer": OPTIMIZER, "scheduler": SCHEDULER,
                "gradient_clipping": 1.0, "zero_optimization": zero}  # fmt: skip
    expected = {"accelerate"}  # fp16 {enabled: false} and steps_per_print
    if stage == 3:
        expected.add("dotted")
    if autos:
        expected |= {"auto"} if stage == 3 else {"auto", "stage3-auto"}
    assert compare(training, hidden=64) == expected


EXTRAS: dict[str, tuple[str, Any]] = {
    "master-weights": ("bf16", {"bf16_master_weights_and_grads": True}),
    "grad-norm": ("zero_optimization", {"compute_grad_norm": False}),
    "zenflow": ("zero_optimization", {"zenflow": {"topk_ratio": 0.1, "update_interval": 2}}),
    "managed-accumulation": ("", {"managed_gradient_accumulation": False}),
    "deepcompile": ("compile", {"deepcompile": True}),
}
"""Training keys a ZeRO-1/2 config may hold that the rule treats (by row name): where they go, what they are."""


@st.composite
def training_configs(draw: st.DrawFn) -> dict[str, Any]:
    """A training config: a stage, optimizer offload or not, each bucket absent, "auto" or set, a precision, and
    some of the keys only an optimizer step reads (each where DeepSpeed takes it for training)."""
    stage = draw(st.integers(0, 3))
    zero: dict[str, Any] = {"stage": stage}
    if stage and draw(st.booleans()):
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": draw(st.booleans())}
    for key in BUCKETS:
        value = draw(st.sampled_from([None, "auto", 1000]))
        if value is not None:
            zero[key] = value
    if draw(st.booleans()):
        zero["overlap_comm"] = True
    precision = draw(st.sampled_from(["bf16", "fp16", None]))
    training: dict[str, Any] = {**BATCH, "zero_optimization": zero}
    if precision is not None:
        training[precision] = {"enabled": True}
    if draw(st.booleans()):
        training.update(optimizer=OPTIMIZER, scheduler=SCHEDULER)
    if draw(st.booleans()):
        training["gradient_clipping"] = draw(st.sampled_from([0.0, 0.5, 1.0]))
    if draw(st.booleans()):
        training["tensor_parallel"] = {"autotp_size": 1}
    allowed = ["deepcompile"]
    if stage in (1, 2):
        allowed += ["grad-norm", "zenflow"]
        if stage == 2 and zero.get("overlap_comm"):
            allowed.append("managed-accumulation")
    if stage and precision == "bf16":
        allowed.append("master-weights")
    for row in draw(st.lists(st.sampled_from(allowed), unique=True)):
        section, keys = EXTRAS[row]
        target = training.setdefault(section, {}) if section else training
        target.update(copy.deepcopy(keys))
    return training


@settings(max_examples=40, deadline=None)
@given(training=training_configs(), hidden=st.integers(1, 8192))
def test_random_training_configs_differ_from_trl_only_by_the_documented_rows(
    training: dict[str, Any], hidden: int
) -> None:
    """Any stage, offload, "auto" buckets, precision and training-only keys: TRL's result fixed by the table's rows is
    dsbuild's, and DeepSpeed's parser agrees with the table on which of TRL's it refuses."""
    compare(training, hidden)


ROWS: list[tuple[str, dict[str, Any]]] = [
    ("dotted", {"zero_optimization": {"stage": 3, "reduce_bucket_size": 5}}),
    ("auto", {"zero_optimization": {"stage": 1, "reduce_bucket_size": "auto"}}),
    ("stage3-auto", {"zero_optimization": {"stage": 2, "stage3_prefetch_bucket_size": "auto"}}),
    ("deepcompile", {"zero_optimization": {"stage": 2}, "compile": {"deepcompile": True}}),
    (
        "master-weights",
        {"zero_optimization": {"stage": 2}, "fp16": {"enabled": True, "fp16_master_weights_and_grads": True}},
    ),
    ("grad-norm", {"zero_optimization": {"stage": 2, "compute_grad_norm": False}}),
    ("zenflow", {"zero_optimization": {"stage": 1, "zenflow": {"topk_ratio": 0.1}}}),
    (
        "managed-accumulation",
        {"zero_optimization": {"stage": 2, "overlap_comm": True}, "managed_gradient_accumulation": False},
    ),
]
"""One training config per row: the row's keys on a small fp16 ZeRO config, nothing else that differs."""


@pytest.mark.parametrize(("row", "extra"), ROWS, ids=[row for row, _ in ROWS])
def test_each_row_is_a_real_difference(row: str, extra: dict[str, Any]) -> None:
    """Each row of the table, alone, is exactly the difference between TRL's reference config and dsbuild's (besides
    Accelerate's steps_per_print)."""
    training = {**BATCH, "fp16": {"enabled": True}, "bf16": {"enabled": False}, **extra}
    assert compare(training, hidden=64) == {row, "accelerate"}


def test_trls_dotted_prefetch_is_a_float_deepspeed_would_refuse() -> None:
    """Were TRL's dotted keys read, 0.9 × H² would still fail: DeepSpeed's integer field takes no fraction."""
    trl = trl_reference_config({**BATCH, "zero_optimization": {"stage": 3}}, hidden=64)
    prefetch = trl["zero_optimization.stage3_prefetch_bucket_size"]
    assert prefetch == pytest.approx(3686.4)
    refused = deepspeed_verdict({**BATCH, "zero_optimization": {"stage": 3, "stage3_prefetch_bucket_size": prefetch}})
    assert [d.message.rpartition("ValidationError: ")[2] for d in refused] == [
        "zero_optimization.stage3_prefetch_bucket_size: Input should be a valid integer, got a number with a fractional"
        " part"
    ]


def test_the_differential_leaves_no_accelerate_state_behind() -> None:
    """TRL's run through a real Accelerator at stage 3 leaves no Accelerate state, environment or global
    HfDeepSpeedConfig behind (a later test would see ZeRO-3 enabled)."""
    from transformers.integrations import is_deepspeed_zero3_enabled

    before = dict(os.environ)
    trl_reference_config({**BATCH, "zero_optimization": {"stage": 3}}, hidden=8)
    assert dict(os.environ) == before and not is_deepspeed_zero3_enabled()
    assert AcceleratorState._shared_state == {}


# -- DeepSpeed builds the engine ------------------------------------------------------------------------------------


def engine_of(config: dict[str, Any]) -> tuple[Any, float]:
    """A tiny Llama's DeepSpeed engine for ``config`` (no optimizer passed), and the model's own fp32 loss on a batch
    computed before DeepSpeed touched it."""
    from _session_common import batch, tiny_llama
    from transformers import AutoModelForCausalLM

    from dsbuild.session import distributed

    distributed.init()  # the pytest process's one-process group (gloo on the CPU), made once and reused
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(tiny_llama())
    model.eval()
    with torch.no_grad():
        expected = float(model(**batch()).loss)
    engine, *_ = deepspeed.initialize(model=model, config=config)
    return engine, expected


def forward_loss(engine: Any) -> float:
    from _session_common import batch

    engine.eval()
    with torch.no_grad():
        return float(engine(**batch()).loss)


ENGINES = [
    (0, False, None, "NoneType"),
    (1, False, None, "NoneType"),
    (2, False, "bf16", "BF16_Optimizer"),
    (3, False, None, "DeepSpeedZeRoOffload"),
    (3, True, "bf16", "DeepSpeedZeRoOffload"),
]


@pytest.mark.engine
@pytest.mark.slow
@pytest.mark.parametrize(("stage", "offload", "precision", "wrapper"), ENGINES)
def test_deepspeed_builds_an_engine_without_an_optimizer(
    stage: int, offload: bool, precision: str | None, wrapper: str
) -> None:
    """The inference config of a ZeRO-0..3 training config (AdamW, a schedule, optimizer offload, "auto" buckets)
    starts an engine with no optimizer of its own, whose forward pass gives the model's loss (exactly, in fp32)."""
    zero: dict[str, Any] = {"stage": stage, **dict.fromkeys(BUCKETS, "auto")}
    if stage:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    training = {**BATCH, "optimizer": OPTIMIZER, "scheduler": SCHEDULER, "gradient_clipping": 1.0,
                "zero_optimization": zero, **({precision: {"enabled": True}} if precision else {})}  # fmt: skip
    config = Config.from_dict(training).for_inference(offload, hidden_size=64).to_dict()
    engine, expected = engine_of(config)
    assert type(engine.optimizer).__name__ == wrapper and engine.client_optimizer is None
    assert engine.lr_scheduler is None and engine.zero_optimization_stage() == (3 if stage == 3 else 0)
    if stage == 3:
        assert engine._config.zero_config.prefetch_bucket_size == int(0.9 * 64 * 64)
        assert engine._config.zero_config.param_persistence_threshold == 640
    loss = forward_loss(engine)
    assert loss == pytest.approx(expected, rel=0 if precision is None else 0.05)


@pytest.mark.engine
@pytest.mark.slow
def test_deepspeeds_engine_fails_on_what_the_rule_removes() -> None:
    """The engine-level rows: TRL's reference of a ZeRO-2 config with managed_gradient_accumulation=false does not
    start; with ZenFlow it starts with the engine's gradient accumulation rewritten; dsbuild's starts, as written."""
    base = {**BATCH, "optimizer": OPTIMIZER}
    managed = {**base, "zero_optimization": {"stage": 2, "overlap_comm": True}, "managed_gradient_accumulation": False}
    with pytest.raises(AssertionError, match="supports ZeRO overlap_comm only with ZeRO stage 2"):
        engine_of(trl_reference_config(managed, hidden=64))
    engine, _ = engine_of(Config.from_dict(managed).for_inference().to_dict())
    assert engine.gradient_accumulation_steps() == 4
    zenflow = {**base, "zero_optimization": {"stage": 1, "zenflow": {"topk_ratio": 0.1, "update_interval": 2}}}
    trl = trl_reference_config(zenflow, hidden=64)
    engine, _ = engine_of(trl)
    assert engine.gradient_accumulation_steps() == 2
    engine, _ = engine_of(Config.from_dict(zenflow).for_inference().to_dict())
    assert engine.gradient_accumulation_steps() == 4
