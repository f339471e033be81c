"""Generation from the policy a ``Session`` trains, without ZeRO-3's two hazards: ``gathered`` and ``generate``.

Under ZeRO-3 every rank holds a shard of each weight, and DeepSpeed's hooks gather a layer's weights (a collective)
each time the layer runs. HF ``generate`` runs the whole model once per new token, so:

- **it is slow**: every layer is gathered again for every token (DeepSpeedExamples #718: 72 s against 0.8 s at
  ZeRO-2; trl #3858). ``gathered(session)`` gathers the whole model once on every rank and takes DeepSpeed's hooks
  off, so the forwards inside are plain local ones, as TRL's ``unwrap_model_for_generation`` with
  ``ds3_gather_for_generation=True`` (the default). It needs memory for the whole model on every rank (trl #2250);
  without it, generation still works, layer by layer.
- **it deadlocks** when ranks stop at different lengths: a rank whose sequences all reached EOS stops calling the
  model, and the others wait forever in their next layer's gather (DeepSpeed #8262). ``generate`` passes
  ``synced_gpus=True`` under ZeRO-3 on more than one process unless the model is ``gathered``: a finished rank keeps
  running forwards (their tokens dropped) until every rank is done, HF's own answer (transformers #22242). HF chooses
  it itself only while an ``HfDeepSpeedConfig`` is alive, which a ``Session`` keeps only while it builds the model, so
  left to HF it would be off. Inside ``gathered`` the forwards need no other rank, and each rank stops when its own
  sequences are done (no sync, no wasted forwards). DeepSpeed 0.19.8's own rollout
  (``runtime/rollout``, #8264) instead generates every rank to the full length with ``eos_token_id=None``.

Both run the model in eval mode with gradient checkpointing off, at every ZeRO stage: sampling from the model as it
is (no dropout), and a KV cache (HF's layers skip the cache when they checkpoint). Each module's ``training`` and
``gradient_checkpointing`` flags are put back on exit as they were, also when the body raises; TRL leaves the mode as
it is and relies on ``disable_dropout`` instead. The tokens are the unsharded model's: the same weights, the same
arithmetic (``tests/integration/test_generation.py``).
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterator
from typing import Any, Protocol

import torch

from ..errors import SessionError
from . import distributed
from .offload import refuse_inside

__all__ = ["gathered", "generate", "is_gathered"]


class Generating(Protocol):
    """What ``gathered`` and ``generate`` read: a ``Session`` (or a ``Reference``), whose engine is built on first
    use. A ``sequence_parallel_size`` / ``tensor_parallel_size`` it lacks counts as 1."""

    @property
    def engine(self) -> Any: ...

    @property
    def model(self) -> Any: ...


_GATHERED: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()
"""The engines' modules inside ``gathered``, and how deep (an inner ``gathered`` of the same model is a no-op)."""


def is_gathered(session: Generating) -> bool:
    """Whether ``session``'s model is inside ``gathered`` now (its weights whole, ZeRO-3's hooks off)."""
    return _GATHERED.get(session.engine.module, 0) > 0


@contextlib.contextmanager
def gathered(session: Generating) -> Iterator[Any]:
    """The whole model on every rank for the duration; yields the unwrapped model. Collective: every rank enters and
    leaves together (under ZeRO-3 entering all-gathers every weight).

    Under ZeRO-3: every weight gathered (``deepspeed.zero.GatheredParameters``), DeepSpeed's forward and backward
    hooks and its start-of-forward hook removed, each parameter's ``ds_active_sub_modules`` cleared (TRL's fix
    #1617); on exit the hooks are registered again (DeepSpeed then records its prefetch trace anew) and the weights
    re-partitioned, unchanged. At every stage: eval mode and gradient checkpointing off, each module's flags put back
    on exit. Everything is put back also when the body raises. A ``gathered`` inside another of the same model does
    nothing more. Change no weight inside: the changes are dropped on exit. Refused inside ``offloaded()`` with
    ``lp_params`` away."""
    refuse_inside(session, "gathered")
    engine = session.engine
    module = engine.module
    if _GATHERED.get(module, 0) > 0:
        _GATHERED[module] += 1
        try:
            yield session.model
        finally:
            _GATHERED[module] -= 1
        return
    with distributed.quiet_old_names(), _for_generation(module), _zero3_gathered(engine):
        _GATHERED[module] = 1
        try:
            yield session.model
        finally:
            del _GATHERED[module]


def generate(
    session: Generating, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, **generation_kwargs: Any
) -> Any:
    """HF ``generate`` on the session's unwrapped model, under ``torch.no_grad()``, in eval mode with gradient
    checkpointing off (put back after); returns what HF returns (the token ids, prompt included). Collective under
    ZeRO-3 outside ``gathered``: every rank calls it, each with its own prompts, and ``synced_gpus=True`` keeps the
    ranks stepping together until all are done (``synced_gpus=False`` there is refused: it would deadlock). Inside
    ``gathered`` each rank generates alone and stops when its own sequences end.

    Batched prompts are left-padded (``tokenizer.padding_side = "left"``) and come with their ``attention_mask``: a
    decoder-only model continues from the last position, so a row whose mask ends in 0 (right padding) is refused.
    Without a mask HF builds one from ``pad_token_id``. Refused inside ``offloaded()`` with ``lp_params`` away."""
    refuse_inside(session, "generate")
    if getattr(session, "sequence_parallel_size", 1) > 1:
        raise SessionError(
            "generate under sequence parallelism: the model's attention is DeepSpeed's Ulysses attention, which "
            "splits a training sequence over the ranks; generate with a session or reference without "
            "sequence_parallel_size"
        )
    model = session.model
    if not callable(getattr(model, "generate", None)):
        raise SessionError(
            f"generate: {type(model).__name__} has no generate method (an HF generative model or a peft model of one)"
        )
    _check_prompts(input_ids, attention_mask)
    engine = session.engine
    needed = _needs_sync(session, engine)
    synced = generation_kwargs.pop("synced_gpus", None)
    if synced is False and needed:
        raise SessionError(
            "generate(synced_gpus=False) under ZeRO-3 (or tensor parallelism) on several processes: a rank that "
            "finishes first stops joining the other ranks' weight gathers and they wait forever; leave synced_gpus "
            "unset, or generate inside session.gathered()"
        )
    inputs = {"input_ids": input_ids.to(engine.device)}
    if attention_mask is not None:
        inputs["attention_mask"] = attention_mask.to(engine.device)
    with distributed.quiet_old_names(), _for_generation(engine.module), torch.no_grad():
        return model.generate(**inputs, synced_gpus=needed if synced is None else bool(synced), **generation_kwargs)


def _check_prompts(input_ids: Any, attention_mask: Any) -> None:
    """``SessionError`` for prompts ``generate`` cannot continue: not rows of token ids, a mask of another shape, a
    row that ends in padding (right-padded: one look at the mask's last column)."""
    if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2:
        shape = tuple(input_ids.shape) if isinstance(input_ids, torch.Tensor) else type(input_ids).__name__
        raise SessionError(f"generate: input_ids is {shape}, expected a (rows, tokens) tensor of token ids")
    if attention_mask is None:
        return
    if not isinstance(attention_mask, torch.Tensor) or attention_mask.shape != input_ids.shape:
        shape = tuple(attention_mask.shape) if isinstance(attention_mask, torch.Tensor) else attention_mask
        raise SessionError(f"generate: attention_mask is {shape}, input_ids {tuple(input_ids.shape)}")
    ends_padded = (attention_mask[:, -1] == 0).nonzero().flatten().tolist()
    if ends_padded:
        raise SessionError(
            f"generate: row(s) {', '.join(map(str, ends_padded))} end in padding (attention_mask 0 in the last "
            "column): a decoder-only model continues from the last position, so batched prompts are left-padded "
            '(tokenizer.padding_side = "left")'
        )


def _needs_sync(session: Generating, engine: Any) -> bool:
    """Whether the ranks must step together: a forward that is collective (ZeRO-3's gathers outside ``gathered``,
    AutoTP's all-reduces always) on more than one process."""
    if distributed.world_size() < 2:
        return False
    if getattr(session, "tensor_parallel_size", 1) > 1:
        return True
    return bool(engine.zero_optimization_stage() == 3 and not is_gathered(session))


@contextlib.contextmanager
def _for_generation(module: Any) -> Iterator[None]:
    """Eval mode and gradient checkpointing off for every module of ``module``; each one's ``training`` and
    ``gradient_checkpointing`` flags put back on exit (HF's layers check the flag; eval mode alone already stops them
    checkpointing, the flag is for models whose code reads it alone, as TRL turns it off)."""
    modules = list(module.modules())
    modes = [m.training for m in modules]
    checkpointing = [m for m in modules if getattr(m, "gradient_checkpointing", False) is True]
    module.eval()
    for m in checkpointing:
        m.gradient_checkpointing = False
    try:
        yield
    finally:
        for m in checkpointing:
            m.gradient_checkpointing = True
        for m, training in zip(modules, modes, strict=True):
            m.training = training


@contextlib.contextmanager
def _zero3_gathered(engine: Any) -> Iterator[None]:
    """Under ZeRO-3: every weight of the engine's model gathered and DeepSpeed's hooks off, both put back on exit;
    below ZeRO-3 nothing (each rank holds every weight)."""
    if engine.zero_optimization_stage() != 3:
        yield
        return
    import deepspeed

    offload = _parameter_offload(engine)
    with deepspeed.zero.GatheredParameters(list(offload.module.parameters())):
        start_hook = _remove_hooks(offload)
        try:
            yield
        finally:
            _add_hooks(offload, start_hook)


def _parameter_offload(engine: Any) -> Any:
    """DeepSpeed's ``DeepSpeedZeRoOffload`` of a ZeRO-3 engine: the object that holds the module hooks (the ZeRO-3
    optimizer's ``parameter_offload``; an engine without an optimizer holds it as its ``optimizer``)."""
    optimizer = engine.optimizer
    offload = getattr(optimizer, "parameter_offload", optimizer)
    if not hasattr(offload, "forward_hooks") or not hasattr(offload, "backward_hooks"):
        raise SessionError(
            f"gathered: this ZeRO-3 engine's optimizer ({type(optimizer).__name__}) holds no DeepSpeed module hooks "
            "to take off; DeepSpeed's ZeRO-3 optimizer or an engine without an optimizer is expected"
        )
    return offload


def _remove_hooks(offload: Any) -> Any:
    """DeepSpeed's ZeRO-3 module hooks off (as TRL's ``remove_hooks``, ``ds_active_sub_modules`` cleared, #1617), and
    its start-of-forward hook too: that one resets the prefetch trace each forward, with a collective while the trace
    is not complete (a fresh engine, or after the hooks came back), so ranks that stop generating after different
    numbers of forwards would pair their collectives wrongly. Returns the start hook, to register again."""
    for param in offload.module.parameters():
        active = getattr(param, "ds_active_sub_modules", None)
        if active is not None:
            active.clear()
    for hook in [*offload.forward_hooks, *offload.backward_hooks]:
        hook.remove()
    offload.forward_hooks, offload.backward_hooks = [], []
    handle = getattr(offload, "fwd_pre_hook", None)
    start_hook = offload.module._forward_pre_hooks.get(handle.id) if handle is not None else None
    if handle is not None and start_hook is not None:
        handle.remove()
    return start_hook


def _add_hooks(offload: Any, start_hook: Any) -> None:
    """The hooks back, in their order: the start-of-forward hook first (DeepSpeed registers it before the others).
    Registering the module hooks again invalidates the prefetch trace (DeepSpeed #8043's fix, in 0.19.8)."""
    offload._register_deepspeed_module(offload.module)
    if start_hook is not None:
        offload.fwd_pre_hook = offload.module.register_forward_pre_hook(start_hook, prepend=True)
