"""The reference model of an RL loop: a frozen model beside the policy a ``Session`` trains (``Session.reference``).

DPO and GRPO score every batch under the policy and under the model it started from; the reference never trains. As
TRL (``DPOTrainer``, ``GRPOTrainer`` with ``prepare_deepspeed``) and OpenRLHF (its eval engines) build it:

- **a LoRA policy** (``path=None``): the policy's own weights with the adapters disabled (peft's ``disable_adapter``),
  through the policy's engine: no second copy of the weights, nothing to offload;
- **otherwise**: a second DeepSpeed engine without an optimizer, on the same process group, built the ZeRO-3 way
  (``zero.Init`` at stage 3) from ``path``, or from what the policy was built from (``Session.from_pretrained``'s
  model: its weights, or its config and seed: the policy's starting weights), its config
  ``Config.for_inference(offload)`` of the policy's resolved config (stage 3 stays 3, stages 1-2 become 0, the
  optimizer's keys removed, the buckets from the model's hidden size), every parameter frozen, in eval mode.

Dropout is off in the reference, and in the policy too with ``disable_dropout=True`` (TRL's ``disable_dropout``,
default on for DPO and GRPO): a KL or a DPO margin is not zero at step 0 otherwise (trl #506).
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import attrs
import numpy as np
import torch

from ..errors import SessionError
from . import building, distributed
from .export import is_peft
from .logprobs import token_logps
from .offload import refuse_inside
from .setup import DEFAULT_SEED, seed_everything

if TYPE_CHECKING:
    from ..api import Config


class Policy(Protocol):
    """What a reference reads of the ``Session`` it is built beside."""

    infer_batch_size: int
    built_from: BuiltFrom | None

    @property
    def model(self) -> Any: ...

    @property
    def engine(self) -> Any: ...

    @property
    def config(self) -> Config: ...


__all__ = ["BuiltFrom", "Policy", "Reference", "disable_dropout", "frozen_engine", "reference_of"]


@attrs.frozen
class BuiltFrom:
    """What ``Session.from_pretrained`` built the policy from, so a reference can be built the same way."""

    source: Any
    """A local path or hub id (its weights), or a ``PretrainedConfig`` (random init from ``seed``)."""
    dtype: Any = None
    attn_implementation: str | None = None
    seed: int = DEFAULT_SEED


def disable_dropout(model: Any) -> None:
    """Every ``nn.Dropout`` of ``model`` set to ``p = 0`` (TRL's ``disable_dropout_in_model``)."""
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0


class Reference:
    """A frozen model beside a policy session: ``logprobs`` without gradients, ``config`` (``for_inference``'s, or the
    policy's for a LoRA policy's adapters-off reference), ``model`` and ``engine``."""

    def __init__(self, policy: Policy, model: Any, engine: Any, config: Config, *, adapters_off: bool) -> None:
        self.policy = policy
        self.model = model
        """The reference's model (the policy's own peft model for an adapters-off reference)."""
        self.engine = engine
        """Its DeepSpeed engine (the policy's for an adapters-off reference)."""
        self.config = config
        self.adapters_off = adapters_off
        """Whether this is the LoRA policy's own weights with the adapters disabled."""

    @distributed.quietly
    def logprobs(
        self, batch: Mapping[str, Any], completion_mask: torch.Tensor | None = None, temperature: float = 1.0
    ) -> torch.Tensor:
        """Per-token log-probs of ``batch`` under the reference, fp32, no gradients (``Session.logprobs``'s rules:
        ``(rows, length)``, 0 outside ``completion_mask``); ``infer_batch_size`` rows per forward. Collective under
        ZeRO-3: every rank calls it, with the same number of rows. A LoRA policy's adapters-off reference runs on the
        policy's weights: refused inside the policy's ``offloaded()`` with ``lp_params`` away."""
        if self.adapters_off:
            refuse_inside(self.policy, "logprobs")
        with self._scoring():
            return token_logps(
                self.engine, batch, completion_mask=completion_mask, temperature=temperature,
                batch_size=self.policy.infer_batch_size, grad=False, device=self.engine.device,
            )  # fmt: skip

    @contextlib.contextmanager
    def _scoring(self) -> Iterator[None]:
        """Eval mode (and the adapters disabled) for one scoring, the policy's mode put back after."""
        module = self.engine.module
        was_training = module.training
        module.eval()
        try:
            with self.model.disable_adapter() if self.adapters_off else contextlib.nullcontext():
                yield
        finally:
            module.train(was_training)


def reference_of(
    policy: Policy, path: str | Path | None = None, *, offload: bool = False, dropout_off: bool = True
) -> Reference:
    """The reference of ``policy`` (``Session.reference``; the module docstring says which). Checked before any
    weight is read: ``offload`` needs ZeRO stage 3 (``Config.for_inference``'s refusal) and a model of its own."""
    model = policy.model
    if dropout_off:
        disable_dropout(model)
    if path is None and is_peft(model):
        if offload:
            raise SessionError(
                "reference(offload=True): a LoRA policy's reference is its own weights with the adapters disabled; "
                "there is no second copy to offload (give path= for a separate reference model)"
            )
        policy.engine  # noqa: B018 - the policy's engine scores it
        return Reference(policy, model, policy.engine, policy.config, adapters_off=True)
    source = path if path is not None else _built_from(policy).source
    config = policy.config.for_inference(offload, hidden_size=_hidden_size(policy))
    return _separate(policy, source, config)


def _built_from(policy: Policy) -> BuiltFrom:
    built = policy.built_from
    if built is None:
        raise SessionError(
            "reference(): this session was given a model object, so what it started from is unknown; pass "
            "path= (the reference's weights), or build the policy with Session.from_pretrained"
        )
    return built


def _hidden_size(policy: Policy) -> int | None:
    model_config = getattr(policy.model, "config", None)
    hidden = getattr(model_config, "hidden_size", None)
    return hidden if isinstance(hidden, int) else None


def _separate(policy: Policy, source: Any, config: Config) -> Reference:
    """A second engine without an optimizer beside the policy (``frozen_engine``) for its reference."""
    engine = frozen_engine(policy, source, config)
    return Reference(policy, engine.module, engine, config, adapters_off=False)


def frozen_engine(
    policy: Policy, source: Any, config: Config, *, kind: str = "AutoModelForCausalLM", **more: Any
) -> Any:
    """A DeepSpeed engine without an optimizer on the policy's process group: the model (``building.build_model``'s
    ``kind`` and ``more``) built from ``source`` the ZeRO-3 way under ``config`` (the policy's seed, the random state
    put back after, so the policy's own run draws what it would have drawn), frozen, in eval mode, dropout off: a
    reference, or a GRPO job's reward model."""
    import deepspeed

    ds_config = config.to_dict()
    built = policy.built_from
    with _random_state_kept():
        seed_everything(built.seed if built is not None else DEFAULT_SEED)
        model = building.build_model(
            source, ds_config, dtype=built.dtype if built is not None else None,
            attn_implementation=built.attn_implementation if built is not None else None, kind=kind, **more,
        )  # fmt: skip
    model.requires_grad_(False)
    disable_dropout(model)
    model.eval()
    engine, *_ = deepspeed.initialize(model=model, config=ds_config)
    engine.eval()
    return engine


@contextlib.contextmanager
def _random_state_kept() -> Iterator[None]:
    states = random.getstate(), np.random.get_state(), torch.random.get_rng_state()
    try:
        yield
    finally:
        random.setstate(states[0])
        np.random.set_state(states[1])
        torch.random.set_rng_state(states[2])
