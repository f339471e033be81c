"""A policy's training states out of accelerator memory between the phases of an RL loop: ``offloaded(session)``.

A colocated RL loop (OpenRLHF's ``--ds.enable_sleep``, ROLL's offload manager) trains the policy, then hands the
accelerator to generation or to other models; meanwhile the ZeRO optimizer's Adam states, fp32 master weights and
gradient buffers sit idle. DeepSpeed moves them to CPU memory with ``engine.offload_states`` and back with
``engine.reload_states``; ``offloaded`` is that pair as a context, the states back on exit, also on an exception::

    with session.offloaded():        # DeepSpeed's default: every state it can move
        completions = generate(...)   # the accelerator's memory is free for other work
    session.step(batch)               # the states are back where training needs them

The states, by DeepSpeed's names (``OffloadStateTypeEnum``): ``optim_states`` (the optimizer's per-parameter states:
Adam's ``exp_avg``, ``exp_avg_sq``), ``hp_params`` (the fp32 master weights), ``lp_params`` (the weights the model
computes with), ``lp_grads`` (the partitioned gradients), ``contiguous_grad_buffer`` (ZeRO-3's gradient buckets:
scratch space, re-allocated empty on reload).

Where DeepSpeed cannot move what is asked, ``offloaded`` refuses before anything moves (``refusal`` says why, or
``None``), rather than fail half-way or move nothing: an engine without an optimizer (a reference model), ZeRO stage
0, parameters offloaded (``offload_param``), ``optim_states``/``hp_params`` at ZeRO-3 with an optimizer other than
DeepSpeed's ``FusedAdam``, states already offloaded (a nested ``offloaded``), a device other than ``"cpu"``. An
optimizer offloaded to CPU or NVMe (``offload_optimizer``) is refused too: its states already live there, and
DeepSpeed would silently leave them out (``_refine_include_states``) where OpenRLHF returns without offloading.

Inside ``offloaded``, the session knows which states are away (``Capabilities.offloading``), and a verb that would use
one is refused before DeepSpeed runs (``NEEDS``, ``at_home``): training and checkpoints need every state, the verbs
that only run the model need ``lp_params`` (on an accelerator the weights would be in host memory: the forward fails,
where on DeepSpeed's CPU accelerator it silently works).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Final, Literal, ParamSpec, Protocol, TypeVar

from .._util.suggest import did_you_mean
from ..errors import InvalidValueError, Problem, SessionError

__all__ = ["NEEDS", "STATES", "State", "at_home", "away", "offloaded", "refusal", "refuse_inside"]

State = Literal["optim_states", "hp_params", "lp_params", "lp_grads", "contiguous_grad_buffer"]
"""A state DeepSpeed moves (``deepspeed.runtime.zero.offload_config.OffloadStateTypeEnum``'s values)."""

STATES: Final[tuple[State, ...]] = ("optim_states", "hp_params", "lp_params", "lp_grads", "contiguous_grad_buffer")
"""Every state, in DeepSpeed's order; ``include=None`` means all of them (DeepSpeed's default)."""

ZERO3_ONLY: Final[frozenset[str]] = frozenset({"contiguous_grad_buffer"})
"""States only ZeRO-3 keeps: DeepSpeed's stage 1-2 ``offload_states`` has nothing to move for them."""

FUSED_ADAM_ONLY: Final[frozenset[str]] = frozenset({"optim_states", "hp_params"})
"""States ZeRO-3 moves only for DeepSpeed's ``FusedAdam`` (``stage3.py``'s assertion)."""


class HasEngine(Protocol):
    """What ``offloaded`` reads: a ``Session`` (or a ``Reference``), whose ``engine`` is built on first use."""

    @property
    def engine(self) -> Any: ...


def checked_include(include: Iterable[State] | State | None) -> tuple[State, ...] | None:
    """``include`` as DeepSpeed's state names in its order (one name alone is one state; enum members are their
    values); ``None`` stays ``None``. Unknown names, or none at all, raise ``InvalidValueError`` naming them."""
    if include is None:
        return None
    names = [include] if isinstance(include, str) else include
    try:
        given = [getattr(n, "value", n) for n in names]  # an OffloadStateTypeEnum member is its value
    except TypeError:
        raise InvalidValueError(Problem("include", f"got {include!r}, expected state names or None")) from None
    expected = f"expected one of {', '.join(map(repr, STATES))}"
    problems = [
        Problem("include", f"got {name!r}, {expected}", did_you_mean(name, STATES) if isinstance(name, str) else None)
        for name in given
        if name not in STATES
    ]
    if problems:
        raise InvalidValueError(problems)
    if not given:
        raise InvalidValueError(
            Problem("include", f"got no state names, {expected}", "None offloads every state DeepSpeed moves")
        )
    return tuple(s for s in STATES if s in given)


def checked_device(device: Any, pin_memory: Any, non_blocking: Any) -> None:
    """The other arguments: ``device`` is ``"cpu"`` (DeepSpeed raises for ``"nvme"`` and moves nothing for
    ``"none"``), the flags are booleans; else ``InvalidValueError``."""
    problems = []
    value = getattr(device, "value", device)  # an OffloadDeviceEnum member is its value
    if value != "cpu":
        why = {
            "nvme": "DeepSpeed's offload_states refuses NVMe",
            "none": "'none' would move nothing",
        }.get(value, "DeepSpeed's offload_states moves states to CPU memory only")
        problems.append(Problem("device", f"got {value!r}, expected 'cpu'", why))
    for name, flag in (("pin_memory", pin_memory), ("non_blocking", non_blocking)):
        if not isinstance(flag, bool):
            problems.append(Problem(name, f"got {flag!r}, expected True or False"))
    if problems:
        raise InvalidValueError(problems)


def refusal(session: HasEngine, include: Iterable[State] | State | None = None, *, device: str = "cpu") -> str | None:
    """Why ``offloaded(session, include, device=device)`` would refuse this session's engine, or ``None``: a loop
    that runs under several configs asks before it offloads. Builds the engine on first use (collective then);
    arguments that are wrong whatever the engine raise ``InvalidValueError``."""
    states = checked_include(include)
    checked_device(device, True, False)
    problems = engine_refusals(session.engine, states)
    return rendered(problems) if problems else None


@contextlib.contextmanager
def offloaded(
    session: HasEngine,
    include: Iterable[State] | State | None = None,
    *,
    device: str = "cpu",
    pin_memory: bool = True,
    non_blocking: bool = False,
) -> Iterator[tuple[State, ...]]:
    """DeepSpeed's ``engine.offload_states(include, device, pin_memory, non_blocking)`` on entry and
    ``engine.reload_states(non_blocking)`` on exit, also when the body raises; yields the states DeepSpeed moved.

    ``include``: state names (``STATES``), ``None`` for every state DeepSpeed moves by default. Refused with
    ``SessionError`` (``refusal``'s reasons) or ``InvalidValueError`` (bad arguments) before anything moves. Every
    rank enters it (the engine is built on first use); the model must not run inside (its weights and gradients
    may be away: on an accelerator it fails, on CPU it would silently work).
    """
    states = checked_include(include)
    checked_device(device, pin_memory, non_blocking)
    engine = session.engine
    problems = engine_refusals(engine, states)
    if problems:
        raise SessionError(rendered(problems))
    from deepspeed.runtime.zero.offload_config import OffloadDeviceEnum, OffloadStateTypeEnum

    names = None if states is None else [OffloadStateTypeEnum(s) for s in states]
    knows = hasattr(session, "offloading")  # a Session says which states are away; its verbs read it (at_home)
    try:
        engine.offload_states(
            include=names, device=OffloadDeviceEnum.cpu, pin_memory=pin_memory, non_blocking=non_blocking
        )
        moved = away(engine)
        if knows:
            session.offloading = moved  # type: ignore[attr-defined]
        yield moved
    finally:
        # Whatever moved comes back, also after an offload that failed half-way (DeepSpeed reloads only the states
        # its offloaded_states records).
        engine.reload_states(non_blocking=non_blocking)
        if knows:
            session.offloading = ()  # type: ignore[attr-defined]


def away(engine: Any) -> tuple[State, ...]:
    """The states DeepSpeed has offloaded now (its ZeRO optimizer's ``offloaded_states``), in ``STATES``' order."""
    moved = {getattr(s, "value", s) for s in getattr(engine.optimizer, "offloaded_states", ())}
    return tuple(s for s in STATES if s in moved)


def rendered(problems: list[str]) -> str:
    """One reason as it is; several one a line, as ``ConfigError`` reports them."""
    if len(problems) == 1:
        return problems[0]
    return "\n".join([f"{len(problems)} problems:", *(f"  {p}" for p in problems)])


# -- what a session refuses inside offloaded() --------------------------------------------------------------------

NEEDS: Final[dict[str, tuple[tuple[State, ...], str]]] = {
    "step": (STATES, "trains on every state"),
    "fit": (STATES, "trains on every state"),
    "save_checkpoint": (STATES, "writes the engine's states"),
    "load_checkpoint": (STATES, "reads into the engine's states"),
    "evaluate": (("lp_params",), "runs the model on 'lp_params' (its weights)"),
    "logprobs": (("lp_params",), "runs the model on 'lp_params' (its weights)"),
    "gathered": (("lp_params",), "gathers 'lp_params' (the model's weights)"),
    "generate": (("lp_params",), "runs the model on 'lp_params' (its weights)"),
    "full_parameters": (("lp_params",), "gathers 'lp_params' (the model's weights)"),
    "save_model": (("lp_params",), "writes 'lp_params' (the model's weights)"),
}
"""Each session verb that uses the engine's states: which it needs (a call is refused inside ``offloaded`` when one of
them is away, correct otherwise) and what it does with them (the refusal says it). docs/rl.md has it as a table."""

_P = ParamSpec("_P")
_R = TypeVar("_R")


def inside_refusal(session: Any, call: str) -> str | None:
    """Why ``call`` (a verb of ``NEEDS``) cannot run on ``session`` now, or ``None``: inside ``offloaded``, a state it
    needs is away (``session.offloading``; a reference model's engine is the policy's for a LoRA policy)."""
    moved: tuple[State, ...] = getattr(session, "offloading", ())
    needs, does = NEEDS[call]
    if not set(moved) & set(needs):
        return None
    states = ", ".join(map(repr, moved))
    are = "is" if len(moved) == 1 else "are"
    if needs == STATES:
        instead = f"call {call}() after the with block, which brings them back"
    else:
        kept = [s for s in moved if s not in needs]
        instead = f"call {call}() outside the with block, or offload without 'lp_params'" + (
            f" (offloaded(include={kept!r}))" if kept else ""
        )
    return f"{call}() inside offloaded(): {states} {are} offloaded to CPU memory, and {call}() {does}; {instead}"


def refuse_inside(session: Any, call: str) -> None:
    """``SessionError`` (``inside_refusal``'s reason) when ``call`` cannot run on ``session`` now, before DeepSpeed
    runs; nothing otherwise."""
    problem = inside_refusal(session, call)
    if problem is not None:
        raise SessionError(problem)


def at_home(method: Callable[_P, _R]) -> Callable[_P, _R]:
    """A session's verb (its name in ``NEEDS``) refused inside ``offloaded`` while a state it needs is away."""
    call = method.__name__

    @functools.wraps(method)
    def wrapper(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        refuse_inside(args[0], call)
        return method(*args, **kwargs)

    return wrapper


# -- what DeepSpeed cannot do -------------------------------------------------------------------------------------


def engine_refusals(engine: Any, states: tuple[State, ...] | None) -> list[str]:
    """Why DeepSpeed cannot move ``states`` (``None``: its default, all) of ``engine``, one reason a line; the config
    key each names is the one to change."""
    missing = without_optimizer(engine)
    if missing is not None:
        return [missing]
    stage = engine.zero_optimization_stage()
    asked: set[str] = set(STATES if states is None else states)
    problems = []
    param_device = offload_device(engine.zero_offload_param())
    if param_device != "none":
        problems.append(
            f"zero_optimization.offload_param.device: {param_device!r}: the parameters already live off the "
            "accelerator, and DeepSpeed's offload_states refuses an engine whose parameters are offloaded; set it to "
            "'none' (or remove offload_param) to keep them on the accelerator and move the states out only between "
            "phases with offloaded()"
        )
    optimizer_device = offload_device(engine.zero_offload_optimizer())
    if optimizer_device in ("cpu", "nvme"):
        problems.append(
            f"zero_optimization.offload_optimizer.device: {optimizer_device!r}: the optimizer states and fp32 master "
            "weights already live there (DeepSpeed's offload_states would silently leave them out); set it to "
            "'none' (or remove offload_optimizer) to keep them on the accelerator and move them out only between "
            "phases, or leave offloaded() out for this config (offload.refusal(session) tells a loop which)"
        )
    if stage < 3 and states is not None and asked & ZERO3_ONLY:
        problems.append(
            f"include: {', '.join(map(repr, sorted(asked & ZERO3_ONLY)))} exists only at ZeRO stage 3 "
            f"(DeepSpeed's stage 1-2 offload_states has none to move); leave it out at zero_optimization.stage {stage}"
        )
    on_accelerator = optimizer_device not in ("cpu", "nvme")  # else DeepSpeed leaves optim_states, hp_params out
    if stage == 3 and on_accelerator and asked & FUSED_ADAM_ONLY and not fused_adam(engine.optimizer.optimizer):
        problems.append(fused_adam_refusal(engine, asked))
    already = away(engine)
    if already:
        problems.append(
            f"offloaded(): {', '.join(map(repr, already))} already offloaded (a nested offloaded(), or "
            "engine.offload_states called directly); reload first: offload once, around the whole phase"
        )
    return problems


def offload_device(section: Any) -> str:
    """An offload section's device as written (DeepSpeed keeps the enum's value), ``"none"`` without a section."""
    device = getattr(section, "device", None)
    return "none" if device is None else str(getattr(device, "value", device))


def without_optimizer(engine: Any) -> str | None:
    """Why ``engine`` has nothing ``offload_states`` can move, or ``None``: no optimizer (an inference engine), or
    an optimizer wrapper without the method (ZeRO stage 0, DeepSpeed's BF16_Optimizer)."""
    from deepspeed.runtime.utils import DummyOptim
    from deepspeed.runtime.zero.parameter_offload import DeepSpeedZeRoOffload

    optimizer = engine.optimizer
    if (
        optimizer is None
        or isinstance(optimizer, (DeepSpeedZeRoOffload, DummyOptim))
        or isinstance(getattr(optimizer, "optimizer", None), DummyOptim)
    ):
        return (
            "optimizer: the engine has none (an inference engine, such as a reference model), and DeepSpeed's "
            "offload_states moves only a ZeRO optimizer's states; keep a frozen model's weights in CPU memory "
            "instead: zero_optimization.offload_param.device = 'cpu' at ZeRO stage 3 "
            "(session.reference(offload=True), Config.for_inference(offload=True))"
        )
    if hasattr(optimizer, "offload_states"):
        return None
    stage = engine.zero_optimization_stage()
    if stage == 0:
        return (
            "zero_optimization.stage: 0 has no ZeRO optimizer, and only DeepSpeed's ZeRO optimizers (stages 1-3) "
            "can move their states (offload_states); set zero_optimization.stage to 1, 2 or 3"
        )
    name = type(optimizer).__name__
    if name == "BF16_Optimizer":  # ZeRO-1, bf16 weights, fp32 gradient accumulation (engine._do_optimizer_sanity_check)
        return (
            "data_types.grad_accum_dtype: 'fp32' with bf16 at ZeRO stage 1 runs DeepSpeed's BF16_Optimizer, which "
            "cannot move its states (no offload_states); leave data_types.grad_accum_dtype unset, or use ZeRO stage "
            "2 or 3"
        )
    return (
        f"zero_optimization.stage: {stage} runs DeepSpeed's {name}, which has no offload_states (DeepSpeed has it for "
        "ZeRO stages 1-2 from 0.17.6); upgrade DeepSpeed"
    )


def fused_adam(optimizer: Any) -> bool:
    """Whether ``optimizer`` is exactly DeepSpeed's ``FusedAdam`` (its ZeRO-3 check compares classes, so a subclass
    fails it; on CPU, DeepSpeed's CPU op builder provides it)."""
    from deepspeed.ops.adam.fused_adam import FusedAdam

    return type(optimizer) is FusedAdam


def fused_adam_refusal(engine: Any, asked: set[str]) -> str:
    """ZeRO-3 moves ``optim_states`` and ``hp_params`` only for DeepSpeed's FusedAdam: what this run has instead and
    how to get it."""
    import torch

    cls = type(engine.optimizer.optimizer)
    which = f"{cls.__module__}.{cls.__qualname__}"
    if engine.client_optimizer is not None:
        key, fix = "optimizer", "pass deepspeed.ops.adam.FusedAdam, or no optimizer and Config.adamw(...)"
    elif cls in (torch.optim.Adam, torch.optim.AdamW):  # the config's Adam/AdamW gives torch's only with torch_adam
        key, fix = "optimizer.params.torch_adam", "remove optimizer.params.torch_adam (Config.adamw(...) alone)"
    else:
        key, fix = "optimizer.type", "use optimizer.type Adam or AdamW (Config.adamw(...))"
    others = [s for s in STATES if s not in FUSED_ADAM_ONLY]
    kept = [s for s in others if s in asked] or others  # what was asked that needs no FusedAdam, else all of it
    left = ", ".join(map(repr, kept))
    return (
        f"{key}: ZeRO stage 3 moves optim_states and hp_params only for DeepSpeed's FusedAdam (DeepSpeed asserts it), "
        f"and this run's optimizer is {which}; {fix}, or pass include without 'optim_states' and 'hp_params' "
        f"(e.g. [{left}])"
    )
