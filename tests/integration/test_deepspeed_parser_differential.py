"""``check()`` against DeepSpeed's own config parser, on generated configs, many of them broken.

Two promises are held here: nothing ``DeepSpeedConfig`` refuses passes ``check(..., resolved=True)``,
and for a config that passes, DeepSpeed reads the same stage, offload devices, precision and batch sizes
as dsbuild. ``DeepSpeedConfig(dict)`` runs standalone on CPU; other world sizes are simulated by patching
``deepspeed.comm`` as the parser sees it.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
from deepspeed.runtime import config as ds_config
from hypothesis import event, given, settings
from hypothesis import strategies as st

from dsbuild import Config, ConfigError
from dsbuild.validate import batch_triangle, check

pytestmark = pytest.mark.train  # the training extra; tests/conftest.py skips it without

AUTO = "auto"


def _maybe(draw: st.DrawFn, values: st.SearchStrategy[Any]) -> Any:
    """A value from ``values``, or ``None`` (the key is left out) about a third of the time."""
    return draw(st.one_of(st.none(), values, values))


def _rarely(draw: st.DrawFn) -> bool:
    """True about one time in six: for the broken choices, so that many configs still pass."""
    return draw(st.sampled_from([False, False, False, False, False, True]))


def _put(section: dict[str, Any], key: str, value: Any) -> None:
    if value is not None:
        section[key] = value


@st.composite
def offload(draw: st.DrawFn, *, ratio: bool) -> dict[str, Any] | None:
    if not draw(st.booleans()):
        return None
    out: dict[str, Any] = {"device": draw(st.sampled_from(["none", "cpu", "nvme"]))}
    if draw(st.booleans()):
        out["nvme_path"] = "/local_nvme"
    if ratio:
        _put(out, "ratio", draw(st.sampled_from([0.5, 0.0]) if _rarely(draw) else st.sampled_from([None, 1.0])))
    return out


@st.composite
def cases(draw: st.DrawFn) -> tuple[dict[str, Any], int]:
    """A raw ds_config (often broken) and a world size 1-8."""
    world = draw(st.integers(1, 8))
    d: dict[str, Any] = {}

    zero: dict[str, Any] = {}
    _put(zero, "stage", _maybe(draw, st.sampled_from([0, 1, 2, 3, 3, AUTO])))
    _put(zero, "offload_optimizer", draw(offload(ratio=True)))
    _put(zero, "offload_param", draw(offload(ratio=False)))
    if _rarely(draw):
        zero["compute_grad_norm"] = draw(st.booleans())
    if _rarely(draw):
        zero["overlap_com"] = True  # a typo: DeepSpeed's zero_optimization refuses unknown keys
    if zero or draw(st.booleans()):
        d["zero_optimization"] = zero

    if draw(st.booleans()):
        fp16: dict[str, Any] = {"enabled": draw(st.sampled_from([True, False, False, AUTO]))}
        _put(fp16, "loss_scale", _maybe(draw, st.sampled_from([0, 0, 128.0])))
        _put(
            fp16, "loss_scale_window", draw(st.sampled_from([-1, 0]) if _rarely(draw) else st.sampled_from([None, 100]))
        )
        _put(fp16, "min_loss_scale", draw(st.sampled_from([-1, 0]) if _rarely(draw) else st.sampled_from([None, 1, 2])))
        if _rarely(draw):
            fp16["fp16_master_weights_and_grads"] = draw(st.booleans())
        d["fp16"] = fp16
    if draw(st.booleans()):
        bf16: dict[str, Any] = {"enabled": draw(st.sampled_from([True, True, False, AUTO]))}
        if _rarely(draw):
            bf16["bf16_master_weights_and_grads"] = draw(st.booleans())
        if _rarely(draw):
            bf16["bf16_optimizer_states"] = draw(st.booleans())
        d[draw(st.sampled_from(["bf16", "bf16", "bfloat16"]))] = bf16

    micro = None if _rarely(draw) else draw(st.integers(1, 8))
    accum = _maybe(draw, st.integers(1, 8))
    if draw(st.booleans()) and micro is not None:
        train = micro * (accum or 1) * world  # a consistent triangle half the time
    else:
        train = _maybe(draw, st.integers(1, 64))
    batch = {"train_batch_size": train, "train_micro_batch_size_per_gpu": micro, "gradient_accumulation_steps": accum}
    if _rarely(draw):
        batch[draw(st.sampled_from(sorted(batch)))] = AUTO  # DeepSpeed: a bare TypeError
    for key, value in batch.items():
        _put(d, key, value)
    if _rarely(draw):
        d["sequence_parallel_size"] = draw(st.sampled_from([1, 2]))

    _put(d, "gradient_allreduce_op", draw(st.sampled_from([None, "mean", "sum"])))
    if _rarely(draw):
        d["amp"] = {"enabled": True}  # removed: DeepSpeed refuses it
    if _rarely(draw):
        d["checkpoint"] = {"tag_validation": draw(st.sampled_from(["Warn", "ignore", "FAIL", "sometimes"]))}
    return d, world


def deepspeed_reads(d: dict[str, Any], world: int) -> Any:
    """``DeepSpeedConfig(d)`` as rank 0 of ``world`` processes."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ds_config.dist, "get_world_size", lambda *args, **kwargs: world)
        mp.setattr(ds_config.dist, "get_rank", lambda *args, **kwargs: 0)
        return ds_config.DeepSpeedConfig(copy.deepcopy(d))


def dsbuild_reads(d: dict[str, Any], world: int) -> Config | ConfigError:
    """The checked config, or the error that refused it (at load or in ``check``)."""
    try:
        config = Config.from_dict(d, strict=False)
        check(config, world_size=world, resolved=True)
    except ConfigError as error:
        return error
    return config


def _device(section: Any) -> str | None:
    return None if section is None else str(section.device or "none")


@given(case=cases())
@settings(max_examples=150, deadline=None)
def test_check_refuses_what_deepspeed_refuses_and_agrees_on_the_rest(case: tuple[dict[str, Any], int]) -> None:
    """A config DeepSpeed's parser refuses never passes check; one that passes reads the same in both."""
    event(compare(*case))


def compare(d: dict[str, Any], world: int) -> str:
    """Assert the two promises for one config; say which way it went."""
    ours = dsbuild_reads(d, world)
    try:
        theirs = deepspeed_reads(d, world)
    except Exception as error:  # AssertionError, ValueError, pydantic's ValidationError, TypeError, ...
        assert isinstance(ours, ConfigError), f"DeepSpeed refuses {d} at world size {world} ({error!r}), check passes"
        return "DeepSpeed refuses"
    if isinstance(ours, ConfigError):
        return "only dsbuild refuses"
    zero = ours.zero_optimization
    assert theirs.zero_optimization_stage == (zero.stage if zero and zero.stage is not None else 0)
    assert _device(theirs.zero_config.offload_optimizer) == _device(zero and zero.offload_optimizer)
    assert _device(theirs.zero_config.offload_param) == _device(zero and zero.offload_param)
    assert theirs.float16_config.enabled == bool(ours.fp16_config and ours.fp16_config.enabled)
    assert theirs.bfloat16_config.enabled == bool(ours.bf16_config and ours.bf16_config.enabled)
    assert theirs.gradient_allreduce_op == (ours.gradient_allreduce_op or "mean")
    batch = (theirs.train_batch_size, theirs.train_micro_batch_size_per_gpu, theirs.gradient_accumulation_steps)
    assert batch == batch_triangle(ours, world)
    return "both accept"


@pytest.mark.parametrize(
    ("d", "world"),
    [
        ({"train_batch_size": 32, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2}, 4),
        ({"train_batch_size": 32, "train_micro_batch_size_per_gpu": 4}, 8),
        ({"train_batch_size": 48, "gradient_accumulation_steps": 3}, 4),
        ({"train_batch_size": 24}, 6),
        ({"train_micro_batch_size_per_gpu": 3, "gradient_accumulation_steps": 5}, 7),
        ({"train_micro_batch_size_per_gpu": 3}, 5),
        ({"train_batch_size": 16, "train_micro_batch_size_per_gpu": 2, "sequence_parallel_size": 2}, 8),
    ],
)
def test_batch_triangle_matches_deepspeed(d: dict[str, Any], world: int) -> None:
    """dsbuild derives the missing batch sizes exactly as DeepSpeed does, for each pair of given sizes."""
    theirs = deepspeed_reads(d, world)
    ours = Config.from_dict(d)
    check(ours, world_size=world, resolved=True)
    assert batch_triangle(ours, world) == (
        theirs.train_batch_size,
        theirs.train_micro_batch_size_per_gpu,
        theirs.gradient_accumulation_steps,
    )
