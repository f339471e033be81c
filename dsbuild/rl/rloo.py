"""RLOO's rewards, leave-one-out advantages and clipped sequence loss, as TRL 1.16's ``RLOOTrainer`` computes them:
pure functions of tensors (``tests/unit/test_rloo_losses.py`` holds them to TRL's own methods).

RLOO takes GRPO's generation and rewards (``dsbuild.rl.rollouts``) and differs in three places: the KL to the
reference is a penalty on each completion's reward (the first-order estimate summed over its tokens, not GRPO's k3
per token in the loss); the baseline of a completion is the mean reward of its group's other scorable completions
(not the group's mean, and no division by the group's std); the importance ratio is one per sequence, of the summed
log-probs, and the loss the mean over the micro-batch's sequences, which the trainer divides by the accumulation
steps (TRL's ``loss_is_scaled_for_ga = False``).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from ..errors import InvalidValueError, Problem
from .grpo import STD_EPSILON, GRPOOutput, nanstd
from .losses import sequence_logps

__all__ = ["penalized_rewards", "rloo_advantages", "rloo_loss", "sequence_kl"]


def sequence_kl(old_per_token_logps: Tensor, ref_per_token_logps: Tensor, completion_mask: Tensor) -> Tensor:
    """Each completion's KL to the reference, first order: ``Σ_t (old - ref)`` over its tokens (negative where the
    reference likes it better; GRPO's k3 never is).

    TRL: ``RLOOTrainer._generate_and_score_completions``, rloo_trainer.py:1664-1672 (the policy's log-probs when it
    generated, the reference's)."""
    return ((old_per_token_logps - ref_per_token_logps) * completion_mask).sum(-1)


def penalized_rewards(
    rewards: Tensor,
    *,
    reward_clip_range: Sequence[float] | None = None,
    beta: float = 0.0,
    kl: Tensor | None = None,
) -> Tensor:
    """The rewards the baseline is taken of: clipped to ``reward_clip_range`` (when given), minus ``beta`` times each
    completion's ``sequence_kl`` (when ``beta`` ≠ 0). A NaN reward (no reward function scored it) stays NaN.

    TRL: rloo_trainer.py:1659-1673, on the rewards of every process already weighted and summed."""
    if reward_clip_range:
        low, high = reward_clip_range
        rewards = rewards.clamp(min=low, max=high)
    if beta != 0.0:
        if kl is None:
            raise InvalidValueError(Problem("rloo.beta", f"got {beta}: the KL penalty needs the reference", "pass kl="))
        rewards = rewards - beta * kl
    return rewards


def rloo_advantages(
    rewards: Tensor, num_generations: int, *, normalize_advantages: bool = False
) -> tuple[Tensor, Tensor]:
    """``(advantages, std)`` of a generation batch's rewards, ``num_generations`` consecutive completions per prompt:
    each reward minus the mean of its group's other scorable rewards (leave-one-out), normalised over the scorable
    ones of the whole batch with ``normalize_advantages`` (``(a - mean) / (std + 1e-4)``), 0 for a completion no
    reward function scored and for the only scorable one of its group; and each group's reward std (Bessel; TRL
    logs the share of zeros as ``frac_reward_zero_std``).

    TRL: ``RLOOTrainer._generate_and_score_completions``, rloo_trainer.py:1675-1703."""
    if rewards.dim() != 1 or num_generations < 1 or rewards.numel() % num_generations != 0:
        message = f"got {num_generations} for {tuple(rewards.shape)} rewards"
        hint = "the rewards are one per completion, num_generations consecutive ones per prompt"
        raise InvalidValueError(Problem("rloo.num_generations", message, hint))
    grouped_rewards = rewards.view(-1, num_generations)
    if num_generations > 1:
        std_rewards = nanstd(grouped_rewards, dim=1)
    else:
        std_rewards = torch.zeros(grouped_rewards.shape[0], dtype=rewards.dtype)
    scorable_counts = (~torch.isnan(grouped_rewards)).sum(dim=1, keepdim=True)
    grouped_sum = torch.nansum(grouped_rewards, dim=1, keepdim=True)
    if num_generations > 1:
        baselines = (grouped_sum - grouped_rewards) / (scorable_counts - 1)
        advantages = rewards - baselines.view(-1)
    else:
        advantages = torch.zeros_like(rewards)
    if normalize_advantages:
        advantages = (advantages - torch.nanmean(advantages)) / (nanstd(advantages) + STD_EPSILON)
    return torch.nan_to_num(advantages, nan=0.0), std_rewards


def rloo_loss(
    per_token_logps: Tensor,
    old_logps: Tensor,
    advantages: Tensor,
    completion_mask: Tensor,
    *,
    epsilon_low: float = 0.2,
    epsilon_high: float = 0.2,
) -> GRPOOutput:
    """RLOO's clipped loss of a micro-batch of completions and what TRL logs of it: the ratio of each sequence's
    probability (``exp(Σ logp - old_logps)``, ``old_logps`` the sums when it was generated, ``(B,)``) clipped to
    ``[1 - epsilon_low, 1 + epsilon_high]``, ``-min(ratio · A, clipped · A)`` averaged over the sequences. The stats
    (``GRPOOutput.metrics``) are TRL's ``clip_ratio/low_mean``, ``low_min``, ``high_mean``, ``high_max`` and
    ``region_mean``, each over the sequences (of every process with ``over_processes``, as TRL gathers them).

    TRL: ``RLOOTrainer._compute_loss``, rloo_trainer.py:1794-1863, from the per-token log-probs on; unscaled (the HF
    Trainer divides it by the accumulation steps; ``Session.fit`` too)."""
    logps = sequence_logps(per_token_logps, completion_mask)
    coef_1 = torch.exp(logps - old_logps)
    coef_2 = torch.clamp(coef_1, 1 - epsilon_low, 1 + epsilon_high)
    per_sequence_loss = -torch.min(coef_1 * advantages, coef_2 * advantages)
    loss = per_sequence_loss.mean()
    is_low_clipped = ((coef_1 < 1 - epsilon_low) & (advantages < 0)).float().detach()
    is_high_clipped = ((coef_1 > 1 + epsilon_high) & (advantages > 0)).float().detach()
    is_region_clipped = torch.maximum(is_low_clipped, is_high_clipped)
    count = torch.tensor(float(is_low_clipped.numel()), device=loss.device)
    nan = torch.tensor(float("nan"), device=loss.device)
    stats = {
        "clip_ratio/low_mean": torch.stack([is_low_clipped.sum(), count]),
        "clip_ratio/high_mean": torch.stack([is_high_clipped.sum(), count]),
        "clip_ratio/region_mean": torch.stack([is_region_clipped.sum(), count]),
        "clip_ratio/low_min": is_low_clipped.min() if is_low_clipped.numel() else nan,
        "clip_ratio/high_max": is_high_clipped.max() if is_high_clipped.numel() else nan,
    }
    return GRPOOutput(loss, loss.detach(), per_sequence_loss.unsqueeze(1), None, stats)
