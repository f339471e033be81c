"""``offloaded(session)`` against real DeepSpeed on CPU: DeepSpeed's offload_states/reload_states around a block, the
same training as without it, and every refusal raised before anything moves.

On DeepSpeed's CPU accelerator "offloading to CPU" copies states into new host buffers and re-links the optimizer's
and the model's tensors to them: what a reload gets wrong (a group misaligned, DeepSpeed PR #7050) shows in the
numbers; the memory an accelerator would free does not.
"""

from __future__ import annotations

import os

os.environ.setdefault("DS_ACCELERATOR", "cpu")

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from _session_common import TokenData, batch, tiny_llama

from dsbuild import Config
from dsbuild.errors import InvalidValueError, SessionError
from dsbuild.session import Session
from dsbuild.session.offload import STATES, away, checked_include, offloaded, refusal

pytestmark = pytest.mark.train  # the training extra; tests/conftest.py skips it without

ROOT = Path(__file__).resolve().parents[2]
ZERO12 = ("optim_states", "hp_params", "lp_params", "lp_grads")
"""What DeepSpeed's default moves at ZeRO stages 1-2 (they keep no contiguous gradient buffer)."""


def trained(config: Config, optimizer: Any = None) -> Session:
    """A session of the tiny Llama, one optimizer step taken (every state exists)."""
    s = Session.from_pretrained(tiny_llama(), config.batch(micro=2), optimizer=optimizer)
    s.step(batch())
    return s


def where(engine: Any) -> list[Any]:
    """Where every state DeepSpeed could move lives (storage addresses) and ZeRO-3's parameter status: unchanged
    means nothing moved."""
    params = list(engine.module.parameters())
    found: list[Any] = [getattr(p, "ds_tensor", p).data_ptr() for p in params]
    found += [str(getattr(p, "ds_status", "")) for p in params]
    zero = engine.optimizer
    for name in ("single_partition_of_fp32_groups", "fp32_partitioned_groups_flat", "bit16_groups_flat"):
        found += [t.data_ptr() for t in getattr(zero, name, None) or []]
    states = getattr(getattr(zero, "optimizer", zero), "state", {})
    found += [v.data_ptr() for state in states.values() for v in state.values() if torch.is_tensor(v)]
    return found


# -- the arguments: refused before the engine exists --------------------------------------------------------------

EXPECTED = "expected one of 'optim_states', 'hp_params', 'lp_params', 'lp_grads', 'contiguous_grad_buffer'"


@pytest.mark.parametrize(
    ("include", "kwargs", "message"),
    [
        (["optim_state"], {}, f"include: got 'optim_state', {EXPECTED} (did you mean 'optim_states'?)"),
        (
            ["hp_params", "grads", 3],
            {},
            f"2 problems:\n  include: got 'grads', {EXPECTED} (did you mean 'lp_grads'?)\n  include: got 3, {EXPECTED}",
        ),
        ([], {}, f"include: got no state names, {EXPECTED} (None offloads every state DeepSpeed moves)"),
        (None, {"device": "nvme"}, "device: got 'nvme', expected 'cpu' (DeepSpeed's offload_states refuses NVMe)"),
        (None, {"device": "none"}, "device: got 'none', expected 'cpu' ('none' would move nothing)"),
        (None, {"pin_memory": "yes"}, "pin_memory: got 'yes', expected True or False"),
    ],
)
def test_bad_arguments_are_refused_before_the_engine_is_built(include: Any, kwargs: Any, message: str) -> None:
    """Unknown state names (with a suggestion), no names, a device other than CPU and non-boolean flags fail before
    the engine exists, so nothing can have moved."""
    s = Session.from_pretrained(tiny_llama(), Config.zero(2).adamw(lr=1e-2).batch(micro=2))
    with pytest.raises(InvalidValueError) as raised, offloaded(s, include, **kwargs):
        pass
    assert str(raised.value) == message
    assert s._engine.deepspeed is None


def test_one_name_alone_and_deepspeeds_enum_members_are_states() -> None:
    """A single name is one state (not its letters), and DeepSpeed's own enum members are their names."""
    from deepspeed.runtime.zero.offload_config import OffloadStateTypeEnum

    assert checked_include("lp_grads") == ("lp_grads",)
    assert checked_include([OffloadStateTypeEnum.hp_params, "optim_states", "hp_params"]) == (
        "optim_states",
        "hp_params",
    )


# -- what DeepSpeed cannot do: refused before anything moves ------------------------------------------------------

OFFLOADED_PARAMS = (
    "zero_optimization.offload_param.device: 'cpu': the parameters already live off the accelerator, and DeepSpeed's "
    "offload_states refuses an engine whose parameters are offloaded; set it to 'none' (or remove offload_param) to "
    "keep them on the accelerator and move the states out only between phases with offloaded()"
)
OFFLOADED_OPTIMIZER = (
    "zero_optimization.offload_optimizer.device: 'cpu': the optimizer states and fp32 master weights already live "
    "there (DeepSpeed's offload_states would silently leave them out); set it to 'none' (or remove "
    "offload_optimizer) to keep them on the accelerator and move them out only between phases, or leave offloaded() "
    "out for this config (offload.refusal(session) tells a loop which)"
)
TORCH_ADAM = (
    "optimizer.params.torch_adam: ZeRO stage 3 moves optim_states and hp_params only for DeepSpeed's FusedAdam "
    "(DeepSpeed asserts it), and this run's optimizer is torch.optim.adamw.AdamW; remove optimizer.params.torch_adam "
    "(Config.adamw(...) alone), or pass include without 'optim_states' and 'hp_params' (e.g. ['lp_params', "
    "'lp_grads', 'contiguous_grad_buffer'])"
)
REFUSED = {
    "stage 0": (
        Config.zero(0).adamw(lr=1e-2),
        None,
        "zero_optimization.stage: 0 has no ZeRO optimizer, and only DeepSpeed's ZeRO optimizers (stages 1-3) can move "
        "their states (offload_states); set zero_optimization.stage to 1, 2 or 3",
    ),
    "bf16 ZeRO-1 accumulating in fp32": (
        Config.from_dict(
            {**Config.zero(1).bf16().adamw(lr=1e-2).to_dict(), "data_types": {"grad_accum_dtype": "fp32"}}
        ),
        None,
        "data_types.grad_accum_dtype: 'fp32' with bf16 at ZeRO stage 1 runs DeepSpeed's BF16_Optimizer, which cannot "
        "move its states (no offload_states); leave data_types.grad_accum_dtype unset, or use ZeRO stage 2 or 3",
    ),
    "parameters offloaded": (
        Config.zero(3).zero_options(offload_param={"device": "cpu"}).adamw(lr=1e-2),
        None,
        OFFLOADED_PARAMS,
    ),
    "optimizer offloaded": (Config.zero(2).offload_cpu().adamw(lr=1e-2), None, OFFLOADED_OPTIMIZER),
    "both offloaded at ZeRO-3": (
        Config.zero(3).offload_cpu().adamw(lr=1e-2),
        None,
        f"2 problems:\n  {OFFLOADED_PARAMS}\n  {OFFLOADED_OPTIMIZER}",
    ),
    "torch's AdamW at ZeRO-3": (Config.zero(3).adamw(lr=1e-2, torch_adam=True), None, TORCH_ADAM),
    "a client torch AdamW at ZeRO-3": (
        Config.zero(3),
        ["hp_params"],
        "optimizer: ZeRO stage 3 moves optim_states and hp_params only for DeepSpeed's FusedAdam (DeepSpeed asserts "
        "it), and this run's optimizer is torch.optim.adamw.AdamW; pass deepspeed.ops.adam.FusedAdam, or no optimizer "
        "and Config.adamw(...), or pass include without 'optim_states' and 'hp_params' (e.g. ['lp_params', 'lp_grads', "
        "'contiguous_grad_buffer'])",
    ),
    "a ZeRO-3 state at ZeRO-2": (
        Config.zero(2).adamw(lr=1e-2),
        ["optim_states", "contiguous_grad_buffer"],
        "include: 'contiguous_grad_buffer' exists only at ZeRO stage 3 (DeepSpeed's stage 1-2 offload_states has none "
        "to move); leave it out at zero_optimization.stage 2",
    ),
}


def torch_adamw(params: Any) -> Any:
    return torch.optim.AdamW(params, lr=1e-2)


@pytest.mark.engine
@pytest.mark.parametrize("case", list(REFUSED))
def test_what_deepspeed_cannot_move_is_refused_before_anything_moves(case: str) -> None:
    """Stage 0, BF16_Optimizer, offloaded parameters or optimizer, a non-FusedAdam optimizer at ZeRO-3 and a ZeRO-3-only
    state below it are refused naming the config key, with every state left where it was."""
    config, include, message = REFUSED[case]
    s = trained(config, torch_adamw if case.startswith("a client") else None)
    before = where(s.engine)
    with pytest.raises(SessionError) as raised, offloaded(s, include):
        pass
    assert str(raised.value) == message
    assert refusal(s, include) == message
    assert where(s.engine) == before and away(s.engine) == ()


@pytest.mark.engine
def test_an_engine_without_an_optimizer_is_refused() -> None:
    """A reference model's engine (ZeRO-3, no optimizer) is refused, pointing at parameter offload instead."""
    s = Session.from_pretrained(tiny_llama(), Config.zero(3).adamw(lr=1e-2).batch(micro=2))
    reference = s.reference()
    before = where(reference.engine)
    with pytest.raises(SessionError) as raised, offloaded(reference):
        pass
    assert str(raised.value) == (
        "optimizer: the engine has none (an inference engine, such as a reference model), and DeepSpeed's "
        "offload_states moves only a ZeRO optimizer's states; keep a frozen model's weights in CPU memory instead: "
        "zero_optimization.offload_param.device = 'cpu' at ZeRO stage 3 (session.reference(offload=True), "
        "Config.for_inference(offload=True))"
    )
    assert where(reference.engine) == before


# -- what it does ---------------------------------------------------------------------------------------------------


@pytest.mark.engine
def test_zero3_with_dsbuilds_adamw_moves_every_state() -> None:
    """Config.adamw at ZeRO-3 builds DeepSpeed's FusedAdam (the CPU op builder's on CPU), so DeepSpeed's default moves
    all five states and brings them back."""
    from deepspeed.ops.adam.fused_adam import FusedAdam

    s = trained(Config.zero(3).adamw(lr=1e-2))
    assert type(s.engine.optimizer.optimizer) is FusedAdam
    assert refusal(s) is None
    before = where(s.engine)
    with s.offloaded() as moved:  # the Session's name for it
        assert moved == STATES == away(s.engine)
        assert where(s.engine) != before  # what the refusal tests hold unchanged does change when states move
    assert away(s.engine) == ()
    assert s.step(batch(seed=2)).global_step == 2


@pytest.mark.engine
def test_zero3_with_torchs_adamw_moves_what_needs_no_fusedadam() -> None:
    """At ZeRO-3 the FusedAdam refusal covers only optim_states and hp_params: the other states still move."""
    s = trained(Config.zero(3).adamw(lr=1e-2, torch_adam=True))
    with offloaded(s, ["lp_params", "lp_grads", "contiguous_grad_buffer"]) as moved:
        assert moved == ("lp_params", "lp_grads", "contiguous_grad_buffer")
    assert away(s.engine) == ()


@pytest.fixture(scope="module")
def zero2() -> Session:
    return trained(Config.zero(2).adamw(lr=1e-2))


@pytest.mark.engine
def test_nested_offloaded_is_refused_and_the_outer_one_still_reloads(zero2: Session) -> None:
    """A second offloaded() inside the first is refused, moving nothing; the outer one brings every state back."""
    with offloaded(zero2) as moved:
        assert moved == ZERO12
        inside = where(zero2.engine)
        with pytest.raises(SessionError) as raised, offloaded(zero2, "lp_grads"):
            pass
        assert where(zero2.engine) == inside and away(zero2.engine) == ZERO12
    assert str(raised.value) == (
        "offloaded(): 'optim_states', 'hp_params', 'lp_params', 'lp_grads' already offloaded (a nested offloaded(), "
        "or engine.offload_states called directly); reload first: offload once, around the whole phase"
    )
    assert away(zero2.engine) == ()


@pytest.mark.engine
def test_an_exception_inside_still_reloads_every_state(zero2: Session) -> None:
    """The body raising does not leave the states offloaded: they come back, the error goes on, training goes on."""
    with pytest.raises(KeyError, match="from the body"), offloaded(zero2):
        assert away(zero2.engine) == ZERO12
        raise KeyError("from the body")
    assert away(zero2.engine) == ()
    assert zero2.step(batch(seed=3)).loss > 0


@pytest.mark.procs
def test_offload_between_every_step_trains_bitwise_as_without_it(tmp_path: Path) -> None:
    """2 processes, ZeRO-1, 2 and 3, two parameter groups: offloaded() before, between and after 3 steps leaves the
    weights and every rank's Adam states and master weights bitwise those of the same run without it."""
    env = {**os.environ, "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1"}
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
        str(Path(__file__).parent / "_offload_worker.py"), str(tmp_path),
    ]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    assert done.returncode == 0, done.stderr[-5000:]
    result = json.loads((tmp_path / "result.json").read_text())
    for stage in (1, 2, 3):
        run = result[f"stage{stage}_offloaded"]
        assert run["world_size"] == 2 and run["groups"] == 2
        assert run["moved"] == [list(STATES if stage == 3 else ZERO12)] * 4  # before, between and after 3 steps
        # On CPU a move is a copy into a new host buffer: the master and model weights were re-linked every time.
        assert all(run["changed"]["hp_params"][:1]) and all(run["changed"]["lp_params"])
        assert run["losses"] == result[f"stage{stage}_plain"]["losses"]
        for rank in (0, 1):
            plain, moved = (
                torch.load(tmp_path / f"stage{stage}_{name}_rank{rank}.pt", weights_only=True)
                for name in ("plain", "offloaded")
            )
            assert plain.keys() == moved.keys()
            assert {k for k in plain if k.startswith("group")} == {
                f"group{g}.{k}" for g in (0, 1) for k in ("hp", "exp_avg", "exp_avg_sq", "step")
            }
            assert [k for k in plain if not torch.equal(plain[k], moved[k])] == []
            assert all(plain[f"group{g}.step"].item() == 3 and plain[f"group{g}.exp_avg"].any() for g in (0, 1))


# -- the session's verbs inside offloaded(): refused before DeepSpeed runs, or correct ---------------------------------

AWAY = "'optim_states', 'hp_params', 'lp_params', 'lp_grads' are offloaded to CPU memory"
"""What DeepSpeed's default moves at ZeRO-2, as a refusal names it."""


def _training(call: str, does: str) -> str:
    return f"{call}() inside offloaded(): {AWAY}, and {call}() {does}; call {call}() after the with block, which brings them back"


def _weights(call: str, does: str) -> str:
    return (
        f"{call}() inside offloaded(): {AWAY}, and {call}() {does}; call {call}() outside the with block, or offload "
        "without 'lp_params' (offloaded(include=['optim_states', 'hp_params', 'lp_grads']))"
    )


def _gathered(s: Session) -> None:
    with s.gathered():
        pass


def _streamed(s: Session) -> int:
    from dsbuild.session import stream_to

    return stream_to(s, lambda name, tensor: None)


MISUSES: dict[str, tuple[Any, str]] = {
    "step": (lambda s, tmp: s.step(batch(seed=4)), _training("step", "trains on every state")),
    "fit": (lambda s, tmp: s.fit(TokenData(4), max_steps=1), _training("fit", "trains on every state")),
    "save_checkpoint": (
        lambda s, tmp: s.save_checkpoint(tmp),
        _training("save_checkpoint", "writes the engine's states"),
    ),
    "load_checkpoint": (
        lambda s, tmp: s.load_checkpoint(tmp),
        _training("load_checkpoint", "reads into the engine's states"),
    ),
    "evaluate": (
        lambda s, tmp: s.evaluate(TokenData(2)),
        _weights("evaluate", "runs the model on 'lp_params' (its weights)"),
    ),
    "logprobs": (
        lambda s, tmp: s.logprobs(batch()),
        _weights("logprobs", "runs the model on 'lp_params' (its weights)"),
    ),
    "gathered": (lambda s, tmp: _gathered(s), _weights("gathered", "gathers 'lp_params' (the model's weights)")),
    "generate": (
        lambda s, tmp: s.generate(batch()["input_ids"][:, :4], max_new_tokens=2),
        _weights("generate", "runs the model on 'lp_params' (its weights)"),
    ),
    "full_parameters": (
        lambda s, tmp: s.full_parameters(),
        _weights("full_parameters", "gathers 'lp_params' (the model's weights)"),
    ),
    "stream_to": (
        lambda s, tmp: _streamed(s),
        _weights("full_parameters", "gathers 'lp_params' (the model's weights)"),
    ),
    "save_model": (
        lambda s, tmp: s.save_model(tmp),
        _weights("save_model", "writes 'lp_params' (the model's weights)"),
    ),
}


def _model_weights(s: Session) -> list[torch.Tensor]:
    return [p.detach().clone() for p in s.engine.module.parameters()]


@pytest.mark.engine
@pytest.mark.parametrize("call", list(MISUSES))
def test_a_verb_that_uses_an_offloaded_state_is_refused_inside_and_the_engine_trains_after(
    zero2: Session, call: str, tmp_path: Path
) -> None:
    """Inside offloaded() (every state away), each verb that would use an away state raises SessionError naming the
    call, the states and what to do, before DeepSpeed runs (no state moved, no step taken, nothing written); after the
    block a step changes the weights."""
    verb, message = MISUSES[call]
    steps = zero2.engine.global_steps
    with offloaded(zero2):
        inside = where(zero2.engine)
        with pytest.raises(SessionError) as raised:
            verb(zero2, tmp_path / "out")
        assert where(zero2.engine) == inside and zero2.offloading == ZERO12
    assert str(raised.value) == message
    assert zero2.engine.global_steps == steps and not (tmp_path / "out").exists()
    assert zero2.offloading == () and away(zero2.engine) == ()
    before = _model_weights(zero2)
    assert zero2.step(batch(seed=5)).global_step == steps + 1
    assert any(not torch.equal(a, b) for a, b in zip(before, _model_weights(zero2), strict=True))


@pytest.fixture(scope="module")
def zero3() -> Session:
    return trained(Config.zero(3).adamw(lr=1e-2))


KEEPS_WEIGHTS = ["optim_states", "hp_params", "lp_grads", "contiguous_grad_buffer"]
"""Every ZeRO-3 state but the weights the model computes with."""


def _full(s: Session) -> dict[str, torch.Tensor]:
    return {name: tensor.clone() for name, tensor in s.full_parameters()}


def _saved(s: Session, tmp: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(s.save_model(tmp) / "model.safetensors"))


CORRECT: dict[str, Any] = {
    "logprobs": lambda s, tmp: s.logprobs(batch()).detach(),
    "evaluate": lambda s, tmp: s.evaluate(TokenData(2)),
    "generate": lambda s, tmp: s.generate(batch()["input_ids"][:, :4], max_new_tokens=3),
    "full_parameters": lambda s, tmp: _full(s),
    "save_model": _saved,
}


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return bool(torch.equal(a, b)) if torch.is_tensor(a) else bool(a == b)


@pytest.mark.engine
@pytest.mark.parametrize("call", list(CORRECT))
def test_a_verb_that_only_runs_the_model_is_correct_inside_while_the_weights_stay(
    zero3: Session, call: str, tmp_path: Path
) -> None:
    """ZeRO-3, every state offloaded but lp_params: the verbs that only run or gather the model give exactly what they
    give outside offloaded(), and training goes on after."""
    verb = CORRECT[call]
    outside = verb(zero3, tmp_path / "outside")
    with offloaded(zero3, KEEPS_WEIGHTS) as moved:
        assert moved == tuple(KEEPS_WEIGHTS) == zero3.offloading
        inside = verb(zero3, tmp_path / "inside")
    assert _same(inside, outside)
    assert zero3.step(batch(seed=6)).loss > 0


@pytest.mark.engine
def test_a_lora_policys_own_reference_is_refused_inside_and_a_second_engines_is_correct() -> None:
    """A LoRA policy's reference runs on the policy's weights: refused inside the policy's offloaded() as logprobs is;
    a reference of its own engine (a full policy's) scores inside exactly as outside."""
    lora = {"r": 4, "lora_alpha": 8, "lora_dropout": 0.0, "target_modules": ["q_proj", "v_proj"]}
    policy = Session.from_pretrained(tiny_llama(), Config.zero(2).adamw(lr=1e-2).batch(micro=2), lora=lora)
    policy.step(batch())
    own = policy.reference()
    with offloaded(policy), pytest.raises(SessionError) as raised:
        own.logprobs(batch())
    assert str(raised.value) == _weights("logprobs", "runs the model on 'lp_params' (its weights)")
    assert own.logprobs(batch()).shape == (2, 16)

    full = trained(Config.zero(2).adamw(lr=1e-2))
    separate = full.reference()
    outside = separate.logprobs(batch())
    with offloaded(full):
        inside = separate.logprobs(batch())
    assert torch.equal(inside, outside)
