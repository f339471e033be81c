"""RL post-training on the Session: DPO and GRPO as TRL 1.16 computes them.

``losses`` holds the pure functions of tensors: sequence log-probs, DPO's losses and rewards, GRPO's group
advantages, the k3 KL and GRPO's clipped loss, with the metrics TRL logs under TRL's names. Their options are the
torch-free specs of ``dsbuild.job.rl`` (``DPOSpec``, ``GRPOSpec``); the reference model, log-probs and generation
are Session capabilities (``dsbuild.session``). The policy's full weights handed to an inference engine between
phases, ``stream_to(policy, sink)`` (a ``WeightSink``: ``sink(name, tensor)``) and ``full_parameters(policy)``, are
``dsbuild.session``'s, named here too (imported on first use: they need DeepSpeed, the losses do not).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .grpo import GRPOOutput, approx_kl, group_advantages, grpo_loss
from .losses import DPOOutput, dpo_loss, pair_logps, sequence_logps

if TYPE_CHECKING:
    from ..session.weights import WeightSink, full_parameters, stream_to

__all__ = [
    "DPOOutput",
    "GRPOOutput",
    "WeightSink",
    "approx_kl",
    "dpo_loss",
    "full_parameters",
    "group_advantages",
    "grpo_loss",
    "pair_logps",
    "sequence_logps",
    "stream_to",
]

_FROM_SESSION = frozenset({"WeightSink", "full_parameters", "stream_to"})
"""``dsbuild.session.weights``' names, imported on first use (the Session's package needs DeepSpeed)."""


def __getattr__(name: str) -> Any:
    if name not in _FROM_SESSION:
        raise AttributeError(f"module 'dsbuild.rl' has no attribute {name!r}")
    from ..session import weights

    value = getattr(weights, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
