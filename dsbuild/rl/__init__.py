"""RL post-training on the Session: DPO and GRPO as TRL 1.16 computes them.

``losses`` holds the pure functions of tensors: sequence log-probs, DPO's losses and rewards, GRPO's group
advantages, the k3 KL and GRPO's clipped loss, with the metrics TRL logs under TRL's names. Their options are the
torch-free specs of ``dsbuild.job.rl`` (``DPOSpec``, ``GRPOSpec``); the reference model, log-probs and generation
are Session capabilities (``dsbuild.session``).
"""

from .grpo import GRPOOutput, approx_kl, group_advantages, grpo_loss
from .losses import DPOOutput, dpo_loss, pair_logps, sequence_logps

__all__ = [
    "DPOOutput",
    "GRPOOutput",
    "approx_kl",
    "dpo_loss",
    "group_advantages",
    "grpo_loss",
    "pair_logps",
    "sequence_logps",
]
