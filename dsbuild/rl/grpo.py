"""GRPO's group advantages, the k3 KL and GRPO's clipped loss, as TRL 1.16 computes them: pure functions of tensors
(``losses`` says how they are held to TRL's code; ``tests/unit/test_rl_losses.py`` does it)."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any, Final

import attrs
import torch
from torch import Tensor

from ..config.fields import describe
from ..errors import InvalidValueError, Problem
from ..job.rl import GRPO_LOSS_TYPES, IMPORTANCE_SAMPLING_LEVELS, SCALE_REWARDS
from .losses import refused

__all__ = [
    "STD_EPSILON",
    "GRPOOutput",
    "advantages_and_std",
    "approx_kl",
    "gamma_weights",
    "group_advantages",
    "grpo_loss",
    "nanstd",
]

STD_EPSILON: Final = 1e-4
"""Added to the reward std before dividing (``_generate_and_score_completions``; OpenRLHF adds 1e-9)."""


def nanstd(tensor: Tensor, dim: int | None = None) -> Tensor:
    """The standard deviation ignoring NaNs, Bessel-corrected (NaN with fewer than two values): TRL's ``nanstd``
    (trl/trainer/utils.py:1021-1048)."""
    mean = torch.nanmean(tensor, dim=dim, keepdim=True)
    variance = torch.nanmean((tensor - mean) ** 2, dim=dim, keepdim=True)
    count = torch.sum(~torch.isnan(tensor), dim=dim, keepdim=True)
    correction = count / (count - 1)
    correction = torch.where(count > 1, correction, torch.full_like(correction, float("nan")))
    variance *= correction
    std = torch.sqrt(variance)
    return std.squeeze(dim) if dim is not None else std.squeeze()


def group_advantages(rewards: Tensor, num_generations: int, *, scale_rewards: str | bool = "group") -> Tensor:
    """GRPO's advantages of a generation batch's rewards, ``num_generations`` consecutive completions per prompt:
    the reward minus its group's mean, divided by ``std + 1e-4`` of the group (``"group"``, or ``True``), of the whole
    batch (``"batch"``), or not (``"none"``, or ``False``). A NaN reward (no reward function scored it) is left out
    of the means and stds and gets advantage 0.

    TRL: ``GRPOTrainer._generate_and_score_completions``, grpo_trainer.py:2760-2786 and 2808 (the default
    ``multi_objective_aggregation="sum_then_normalize"``, on the rewards already weighted and summed), with
    ``GRPOConfig.__post_init__``'s reading of ``True`` / ``False``."""
    return advantages_and_std(rewards, num_generations, scale_rewards=scale_rewards)[0]


def advantages_and_std(
    rewards: Tensor, num_generations: int, *, scale_rewards: str | bool = "group"
) -> tuple[Tensor, Tensor]:
    """``group_advantages`` and the std each reward's advantage is scaled by (the group's, or the batch's with
    ``"batch"``; TRL logs the share of zeros as ``frac_reward_zero_std``)."""
    scale = ("group" if scale_rewards else "none") if isinstance(scale_rewards, bool) else scale_rewards
    if scale not in SCALE_REWARDS:
        raise refused("grpo.scale_rewards", scale_rewards, SCALE_REWARDS)
    if rewards.dim() != 1 or num_generations < 1 or rewards.numel() % num_generations != 0:
        message = f"got {describe(num_generations)} for {tuple(rewards.shape)} rewards"
        hint = "the rewards are one per completion, num_generations consecutive ones per prompt"
        raise InvalidValueError(Problem("grpo.num_generations", message, hint))
    mean_grouped_rewards = torch.nanmean(rewards.view(-1, num_generations), dim=1)
    mean_grouped_rewards = mean_grouped_rewards.repeat_interleave(num_generations, dim=0)
    if scale in ("group", "none"):
        if num_generations > 1:
            std_rewards = nanstd(rewards.view(-1, num_generations), dim=1)
            std_rewards = std_rewards.repeat_interleave(num_generations, dim=0)
        else:
            std_rewards = torch.zeros_like(rewards)
    elif rewards.numel() > 1:
        std_rewards = nanstd(rewards).expand_as(rewards)
    else:
        std_rewards = torch.zeros_like(rewards)
    advantages = rewards - mean_grouped_rewards
    if scale != "none":
        advantages = advantages / (std_rewards + STD_EPSILON)
    return torch.nan_to_num(advantages, nan=0.0), std_rewards


def approx_kl(per_token_logps: Tensor, ref_per_token_logps: Tensor) -> Tensor:
    """Schulman's k3 estimate of KL(policy ‖ reference) per token: ``exp(ref - logp) - (ref - logp) - 1`` (≥ 0).

    TRL: ``GRPOTrainer._compute_loss``, grpo_trainer.py:3097-3100."""
    return torch.exp(ref_per_token_logps - per_token_logps) - (ref_per_token_logps - per_token_logps) - 1


@attrs.frozen(eq=False)
class GRPOOutput:
    """GRPO's loss of a micro-batch, and what TRL logs about it."""

    loss: Tensor
    """What ``GRPOTrainer._compute_loss`` returns: already scaled for gradient accumulation (TRL's
    ``loss_is_scaled_for_ga``), so the HF Trainer does not divide it again."""
    policy_loss: Tensor
    """The loss before the division by the accumulation steps, detached (TRL's ``policy_loss``)."""
    per_token_loss: Tensor
    """Per token (per sequence at ``importance_sampling_level="sequence"`` without a KL), before the mask."""
    per_token_kl: Tensor | None
    """The k3 KL per token (times the ratio with ``use_bias_correction_kl``), or ``None`` with ``beta = 0``."""
    stats: Mapping[str, Tensor]
    """TRL's logged values by its names, this process's (``metrics`` turns them into numbers): a mean as its sum and
    count (a 2-vector: TRL's ``global_masked_mean`` sums both over the processes), an extreme as a 0-dim tensor."""

    def metrics(self, *, over_processes: bool = False) -> dict[str, float]:
        """What ``GRPOTrainer._compute_loss`` logs (grpo_trainer.py:3253-3290), by its names: ``kl`` (when
        ``beta`` > 0), ``entropy`` (when given), ``clip_ratio/low_mean``, ``clip_ratio/low_min``,
        ``clip_ratio/high_mean``, ``clip_ratio/high_max``, ``clip_ratio/region_mean`` (the clipped losses),
        ``cispo_clip_ratio``, ``vespo/phi_seq_mean``. Of this process's tokens, or with ``over_processes`` (a
        collective) as TRL logs them: each mean over every process's tokens, each extreme over every process's
        sequences."""
        means = sorted(name for name, value in self.stats.items() if value.dim() == 1)
        extremes = sorted(name for name in self.stats if name not in means)
        totals = [float(v) for name in means for v in self.stats[name].tolist()]
        ends = [float(self.stats[name]) for name in extremes]
        if over_processes:
            from ..session import distributed

            totals = distributed.all_sum(totals, self.loss.device)
            ends = [_nan_pick([each[i] for each in distributed.all_objects(ends)], name)
                    for i, name in enumerate(extremes)]  # fmt: skip
        found = {name: totals[2 * i] / max(totals[2 * i + 1], 1.0) for i, name in enumerate(means)}
        return {**found, **dict(zip(extremes, ends, strict=True))}


def _nan_pick(values: list[float], name: str) -> float:
    """TRL's ``nanmin`` / ``nanmax`` (``*_min`` / ``*_max``) of the processes' extremes: NaN when all are."""
    seen = [v for v in values if not math.isnan(v)]
    return (min(seen) if name.endswith("_min") else max(seen)) if seen else math.nan


def _check_grpo(
    loss_type: str, importance_sampling_level: str, beta: float, ref: Tensor | None, max_len: int | None
) -> None:
    problems = []
    if loss_type not in GRPO_LOSS_TYPES:
        problems.append(refused("grpo.loss_type", loss_type, GRPO_LOSS_TYPES).problems[0])
    if importance_sampling_level not in IMPORTANCE_SAMPLING_LEVELS:
        problems.append(
            refused("grpo.importance_sampling_level", importance_sampling_level, IMPORTANCE_SAMPLING_LEVELS).problems[0]
        )
    if beta != 0.0 and ref is None:
        problems.append(Problem("grpo.beta", f"got {beta}: the KL needs the reference", "pass ref_per_token_logps="))
    if loss_type == "dr_grpo" and max_len is None:
        problems.append(Problem("grpo.max_completion_length", "'dr_grpo' divides by it", "pass max_completion_length="))
    if problems:
        raise InvalidValueError(problems)


def gamma_weights(
    advantages: Tensor,
    log_ratio_per_token: Tensor,
    mask: Tensor,
    *,
    k_pos: float = 2.0,
    lambda_pos: float = 3.0,
    k_neg: float = 3.0,
    lambda_neg: float = 2.0,
) -> Tensor:
    """VESPO's sequence weights ``φ(w) = e^λ · w^k · e^(-λw)`` of the sequence ratio ``w``, detached, ``(B, 1)``.

    TRL: ``GRPOTrainer.get_gamma_weights`` (grpo_trainer.py:2971-3018) without vLLM's importance-sampling ratio."""
    with torch.no_grad():
        lower_clamp = math.log(1e-8)
        log_ratio_clamped = torch.clamp(log_ratio_per_token, -20.0, 20.0)
        seq_log_ratio = torch.sum(log_ratio_clamped * mask, dim=-1, keepdim=True)
        log_w_seq = torch.clamp(seq_log_ratio, lower_clamp, 20.0)
        w_seq = torch.exp(log_w_seq)
        is_nonneg_adv = advantages >= 0
        k_seq = torch.where(is_nonneg_adv, k_pos, k_neg)
        lambda_seq = torch.where(is_nonneg_adv, lambda_pos, lambda_neg).clamp(min=1e-4)
        log_phi = lambda_seq + k_seq * log_w_seq - lambda_seq * w_seq
        return torch.exp(log_phi).nan_to_num(nan=0.0, posinf=0.0, neginf=0.0)


@attrs.frozen(eq=False)
class _Ratio:
    """The importance ratio of a micro-batch and what the loss types read (``GRPOTrainer._compute_loss``'s names)."""

    per_token_logps: Tensor
    advantages: Tensor
    mask: Tensor
    log_ratio: Tensor
    coef_1: Tensor


def _per_token_loss(r: _Ratio, loss_type: str, options: Mapping[str, Any]) -> tuple[Tensor, Tensor, Tensor | None]:
    """``(per_token_loss, coef_1 as the metrics read it, phi_seq)``: the loss-type branches of
    ``GRPOTrainer._compute_loss`` (grpo_trainer.py:3109-3139)."""
    coef_1, advantages = r.coef_1, r.advantages
    low, high = options["epsilon_low"], options["epsilon_high"]
    if loss_type == "cispo":
        clamped_ratios = torch.clamp(coef_1, max=high).detach()
        return -clamped_ratios * advantages * r.per_token_logps, coef_1, None
    if loss_type == "sapo":
        temperatures = torch.where(advantages > 0, options["sapo_temperature_pos"], options["sapo_temperature_neg"])
        soft_coef_1 = torch.sigmoid(temperatures * (coef_1 - 1)) * 4 / temperatures
        return -soft_coef_1 * advantages, coef_1, None
    if loss_type == "vespo":
        phi_seq = gamma_weights(advantages, r.log_ratio, r.mask, **options["vespo"])
        return -phi_seq * advantages * r.per_token_logps, coef_1, phi_seq
    coef_2 = torch.clamp(coef_1, 1 - low, 1 + high)
    if options["delta"] is not None:
        coef_1 = torch.clamp(coef_1, max=options["delta"])
    per_token_loss = -torch.min(coef_1 * advantages, coef_2 * advantages)
    return per_token_loss, coef_1, None


def _aggregate(
    per_token_loss: Tensor, mask: Tensor, loss_type: str, options: Mapping[str, Any]
) -> tuple[Tensor, Tensor]:
    """``(loss, policy_loss)``: the aggregation branches of ``GRPOTrainer._compute_loss`` (grpo_trainer.py:3147-3183),
    in train mode (``gradient_accumulation_steps`` 1 and ``steps_per_generation`` 1 give eval's)."""
    accumulation = options["gradient_accumulation_steps"]
    if loss_type in ("grpo", "sapo"):
        loss = ((per_token_loss * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).mean()
    elif loss_type == "bnpo":
        loss = (per_token_loss * mask).sum() / mask.sum().clamp(min=1.0)
    elif loss_type == "dr_grpo":
        loss = (per_token_loss * mask).sum() / (per_token_loss.size(0) * options["max_completion_length"])
    elif loss_type == "luspo":
        loss = (per_token_loss * mask).sum(-1).mean()
    else:  # dapo, cispo, vespo: over the generation batch's tokens, per accumulation window
        items = options["num_items_in_batch"]
        items = mask.sum() if items is None else torch.as_tensor(items, device=mask.device)
        normalizer = items.clamp(min=1.0) / options["num_processes"]
        normalizer = normalizer * accumulation / options["steps_per_generation"]
        loss = (per_token_loss * mask).sum() / normalizer
        return loss, loss.detach()
    return loss / accumulation, loss.detach()


def _masked_mean(x: Tensor, mask: Tensor) -> Tensor:
    """The sum and count of TRL's ``global_masked_mean`` on this process (grpo_trainer.py:3259-3265)."""
    if x.shape[1] == 1:
        local_sum, local_count = x.sum(), torch.tensor(float(x.shape[0]), device=x.device)
    else:
        local_sum, local_count = (x * mask).sum(), mask.sum().float()
    return torch.stack([local_sum, local_count.to(local_sum.dtype)])


def _seq_mean(x: Tensor, mask: Tensor) -> Tensor:
    """TRL's ``masked_seq_mean`` (grpo_trainer.py:3254-3257): NaN for a sequence without tokens."""
    return x.squeeze(1) if x.shape[1] == 1 else (x * mask).sum(-1) / mask.sum(-1)


def _nan_extreme(x: Tensor, pick: Callable[[Tensor], Tensor]) -> Tensor:
    """TRL's ``nanmin`` / ``nanmax`` (trl/trainer/utils.py:1124-1155)."""
    if torch.isnan(x).all():
        return torch.tensor(float("nan"), dtype=x.dtype, device=x.device)
    return pick(x[~torch.isnan(x)])


def _stats(
    r: _Ratio, coef_1: Tensor, phi_seq: Tensor | None, kl: Tensor | None, loss_type: str, options: Mapping[str, Any]
) -> dict[str, Tensor]:
    """What ``GRPOTrainer._compute_loss`` logs (grpo_trainer.py:3267-3289), detached."""
    mask, advantages = r.mask, r.advantages
    stats = {}
    if kl is not None:
        stats["kl"] = _masked_mean(kl, mask)
    if options["entropies"] is not None:
        stats["entropy"] = _masked_mean(options["entropies"], mask)
    if loss_type in ("grpo", "bnpo", "dr_grpo", "dapo", "luspo"):
        is_low_clipped = (coef_1 < 1 - options["epsilon_low"]) & (advantages < 0)
        is_high_clipped = (coef_1 > 1 + options["epsilon_high"]) & (advantages > 0)
        is_region_clipped = is_low_clipped | is_high_clipped
        stats["clip_ratio/low_mean"] = _masked_mean(is_low_clipped.float(), mask)
        stats["clip_ratio/high_mean"] = _masked_mean(is_high_clipped.float(), mask)
        stats["clip_ratio/region_mean"] = _masked_mean(is_region_clipped.float(), mask)
        stats["clip_ratio/low_min"] = _nan_extreme(_seq_mean(is_low_clipped.float(), mask), torch.min)
        stats["clip_ratio/high_max"] = _nan_extreme(_seq_mean(is_high_clipped.float(), mask), torch.max)
    elif loss_type == "cispo":
        stats["cispo_clip_ratio"] = _masked_mean(((coef_1 > options["epsilon_high"]) & (advantages > 0)).float(), mask)
    elif loss_type == "vespo":
        assert phi_seq is not None
        stats["vespo/phi_seq_mean"] = _masked_mean(phi_seq, mask)
    return {name: value.detach() for name, value in stats.items()}


def grpo_loss(
    per_token_logps: Tensor,
    old_per_token_logps: Tensor | None,
    advantages: Tensor,
    completion_mask: Tensor,
    *,
    ref_per_token_logps: Tensor | None = None,
    beta: float = 0.0,
    epsilon_low: float = 0.2,
    epsilon_high: float = 0.2,
    delta: float | None = None,
    loss_type: str = "dapo",
    importance_sampling_level: str = "token",
    use_bias_correction_kl: bool = True,
    max_completion_length: int | None = None,
    gradient_accumulation_steps: int = 1,
    num_items_in_batch: int | Tensor | None = None,
    num_processes: int = 1,
    steps_per_generation: int | None = None,
    sapo_temperature_pos: float = 1.0,
    sapo_temperature_neg: float = 1.05,
    vespo: Mapping[str, float] | None = None,
    entropies: Tensor | None = None,
) -> GRPOOutput:
    """GRPO's clipped policy loss of a micro-batch of completions ``(B, T)`` (with ``beta`` > 0, plus the k3 KL to
    the reference), aggregated as ``loss_type`` says, and what TRL logs about it.

    TRL: ``GRPOTrainer._compute_loss`` (grpo_trainer.py:3020-3292, TRL 1.16.0) from the per-token log-probs on,
    with TRL's defaults (``loss_type="dapo"``, ``beta=0``, ε = 0.2, ``use_bias_correction_kl=True``). The options
    are ``GRPOConfig``'s (``epsilon_low`` is its ``epsilon``; ``epsilon_high`` what the trainer makes of its
    ``epsilon_high``) and the trainer state's: ``old_per_token_logps`` ``None`` is the on-policy case
    (``per_token_logps.detach()``); ``advantages`` one per sequence ``(B,)`` or per token; ``max_completion_length``
    is ``dr_grpo``'s constant; ``num_items_in_batch`` the completion tokens of the whole generation batch over
    all ``num_processes`` (``dapo``, ``cispo``, ``vespo``), default this micro-batch's, and then
    ``steps_per_generation`` defaults to 1 (the micro-batch is its generation batch), else to
    ``gradient_accumulation_steps`` (TRL's default). For evaluation pass ``gradient_accumulation_steps=1`` and
    ``steps_per_generation=1``. ``vespo`` takes ``k_pos``, ``lambda_pos``, ``k_neg``, ``lambda_neg``."""
    _check_grpo(loss_type, importance_sampling_level, beta, ref_per_token_logps, max_completion_length)
    mask = completion_mask
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(1)
    old = per_token_logps.detach() if old_per_token_logps is None else old_per_token_logps
    log_ratio = per_token_logps - old
    if importance_sampling_level == "token":
        log_importance_weights = log_ratio
    else:
        log_importance_weights = (log_ratio * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)
        log_importance_weights = log_importance_weights.unsqueeze(-1)
    coef_1 = torch.exp(log_importance_weights)
    per_token_kl = None
    if beta != 0.0:
        assert ref_per_token_logps is not None
        per_token_kl = approx_kl(per_token_logps, ref_per_token_logps)
        if use_bias_correction_kl:
            per_token_kl = per_token_kl * coef_1
    options = {
        "epsilon_low": epsilon_low,
        "epsilon_high": epsilon_high,
        "delta": delta,
        "sapo_temperature_pos": sapo_temperature_pos,
        "sapo_temperature_neg": sapo_temperature_neg,
        "vespo": dict(vespo or {}),
        "max_completion_length": max_completion_length,
        "gradient_accumulation_steps": gradient_accumulation_steps,
        "num_items_in_batch": num_items_in_batch,
        "num_processes": num_processes,
        "steps_per_generation": steps_per_generation
        or (1 if num_items_in_batch is None else gradient_accumulation_steps),
        "entropies": entropies,
    }
    ratio = _Ratio(per_token_logps, advantages, mask, log_ratio, coef_1)
    per_token_loss, clipped_coef, phi_seq = _per_token_loss(ratio, loss_type, options)
    if per_token_kl is not None:
        per_token_loss = per_token_loss + beta * per_token_kl
    loss, policy_loss = _aggregate(per_token_loss, mask, loss_type, options)
    stats = _stats(ratio, clipped_coef, phi_seq, per_token_kl, loss_type, options)
    return GRPOOutput(loss, policy_loss, per_token_loss, per_token_kl, stats)
