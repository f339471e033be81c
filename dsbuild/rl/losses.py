"""DPO's and GRPO's losses, GRPO's advantages and the k3 KL, as TRL 1.16 computes them: pure functions of tensors.

Each function names the TRL 1.16.0 code it mirrors (``trl/trainer/dpo_trainer.py``, ``trl/trainer/grpo_trainer.py``,
``trl/trainer/utils.py``), operation for operation, so the values and the gradients are TRL's;
``tests/unit/test_rl_losses.py`` holds each to TRL's own code on tensors Hypothesis draws. What TRL takes from a
model's forward comes in as tensors (per-token log-probs: ``Session.logprobs``). What TRL gathers across processes
for its logs is computed here from the tensors given: on one process, TRL's numbers; gather the inputs first for the
global ones. Options have TRL's names and defaults (``DPOSpec``, ``GRPOSpec`` in ``dsbuild.job.rl``); a bad one
raises ``InvalidValueError`` under its dotted key (``dpo.loss_type``).

Not here (TRL computes them from more than log-probs): DPO's WPO weighting (``use_weighting``); GRPO's entropy
bonus, entropy mask (``top_entropy_quantile``), off-policy mask and vLLM importance-sampling correction.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

import attrs
import torch
import torch.nn.functional as F
from torch import Tensor

from ..config.fields import describe
from ..errors import InvalidValueError, Problem
from ..job.rl import (
    DPO_LOSS_TYPES,
    F_DIVERGENCE_LOSS_TYPES,
    F_DIVERGENCE_TYPES,
    GRPO_LOSS_TYPES,
    IMPORTANCE_SAMPLING_LEVELS,
    SCALE_REWARDS,
)

__all__ = [
    "DPO_LOSSES",
    "STD_EPSILON",
    "DPOOutput",
    "GRPOOutput",
    "approx_kl",
    "dpo_loss",
    "gamma_weights",
    "group_advantages",
    "grpo_loss",
    "nanstd",
    "pair_logps",
    "sequence_logps",
]

STD_EPSILON: Final = 1e-4
"""Added to the reward std before dividing (``_generate_and_score_completions``; OpenRLHF adds 1e-9)."""


def _choices(names: Sequence[str]) -> str:
    return ", ".join(map(repr, names))


def _refuse(path: str, value: object, names: Sequence[str]) -> InvalidValueError:
    return InvalidValueError(Problem(path, f"got {describe(value)}, expected one of {_choices(names)}"))


# -- log-probs --------------------------------------------------------------------------------------------------------


def sequence_logps(per_token_logps: Tensor, mask: Tensor) -> Tensor:
    """Each sequence's log-probability: its per-token log-probs summed over ``mask`` (its completion's tokens).

    TRL: ``logps = per_token_logps.sum(dim=1)`` in ``DPOTrainer._compute_loss`` (dpo_trainer.py:1303), where the fused
    head's log-probs are 0 outside the completion; here ``mask`` zeroes them, so padding adds nothing whatever it
    holds."""
    return per_token_logps.masked_fill(~mask.bool(), 0.0).sum(dim=-1)


def pair_logps(per_token_logps: Tensor, mask: Tensor, *, ld_alpha: float | None = None) -> tuple[Tensor, Tensor]:
    """``(chosen_logps, rejected_logps)`` of a DPO batch stacked ``[chosen rows; rejected rows]`` (TRL's collator),
    summed over ``mask``; with LD-DPO's ``ld_alpha`` the tokens past the shorter completion of the pair count
    ``ld_alpha`` times.

    TRL: ``DPOTrainer._compute_loss``, dpo_trainer.py:1302-1315 (``ld_alpha``: the shared / tail masks) and the
    ``chunk(2)`` of line 1316."""
    tokens = per_token_logps.masked_fill(~mask.bool(), 0.0)
    if ld_alpha is None:
        logps = tokens.sum(dim=1)
    else:
        comp_pos = mask.cumsum(dim=1)
        comp_lens = mask.sum(dim=1).long()
        chosen_lens, rejected_lens = comp_lens.chunk(2, dim=0)
        shared_lens = torch.minimum(chosen_lens, rejected_lens)
        shared_lens = torch.cat([shared_lens, shared_lens], dim=0)
        shared_mask = (comp_pos > 0) & (comp_pos <= shared_lens.unsqueeze(1))
        tail_mask = comp_pos > shared_lens.unsqueeze(1)
        logps = (tokens * shared_mask).sum(dim=1) + ld_alpha * (tokens * tail_mask).sum(dim=1)
    chosen, rejected = logps.chunk(2, dim=0)
    return chosen, rejected


# -- DPO --------------------------------------------------------------------------------------------------------------


@attrs.frozen(eq=False)
class DPOOutput:
    """DPO's loss of a batch of pairs, and what TRL logs about it."""

    loss: Tensor
    """The batch's loss, as ``DPOTrainer.compute_loss`` returns it (the HF Trainer then divides it by the gradient
    accumulation steps: TRL's ``loss_is_scaled_for_ga`` is false)."""
    losses: Tensor
    """Per pair: the loss types' per-sequence losses, weighted and summed (their mean is ``loss``)."""
    chosen_rewards: Tensor
    """``beta · (chosen_logps - ref_chosen_logps)``, detached."""
    rejected_rewards: Tensor
    """``beta · (rejected_logps - ref_rejected_logps)``, detached."""
    chosen_logps: Tensor
    rejected_logps: Tensor

    def metrics(self) -> dict[str, float]:
        """What ``DPOTrainer._compute_loss`` logs about the rewards and log-probs (dpo_trainer.py:1583-1601), by its
        names; on one process the same values (TRL gathers the tensors first)."""
        chosen, rejected = self.chosen_rewards, self.rejected_rewards
        return {
            "rewards/chosen": chosen.mean().item(),
            "rewards/rejected": rejected.mean().item(),
            "rewards/accuracies": (chosen > rejected).float().mean().item(),
            "rewards/margins": (chosen - rejected).mean().item(),
            "logps/chosen": self.chosen_logps.detach().mean().item(),
            "logps/rejected": self.rejected_logps.detach().mean().item(),
        }


@attrs.frozen(eq=False)
class _Pairs:
    """What DPO's loss types are written in, by the names of ``DPOTrainer._compute_loss``."""

    beta: float
    label_smoothing: float
    discopop_tau: float
    chosen_logps: Tensor
    rejected_logps: Tensor
    ref_chosen_logps: Tensor
    ref_rejected_logps: Tensor
    chosen_logratios: Tensor
    rejected_logratios: Tensor
    chosen_scores: Tensor
    rejected_scores: Tensor
    chosen_lengths: Tensor | None
    rejected_lengths: Tensor | None
    chosen_token_logps: Tensor | None
    chosen_token_mask: Tensor | None

    @property
    def delta_score(self) -> Tensor:
        return self.chosen_scores - self.rejected_scores

    def avg_delta(self) -> Tensor:
        """The scores per completion token, chosen minus rejected (``ipo``, ``sigmoid_norm``)."""
        assert self.chosen_lengths is not None and self.rejected_lengths is not None
        chosen_avg_score = self.chosen_scores / self.chosen_lengths.clamp(min=1.0)
        rejected_avg_score = self.rejected_scores / self.rejected_lengths.clamp(min=1.0)
        return chosen_avg_score - rejected_avg_score


def _smoothed(beta: float, delta: Tensor, label_smoothing: float) -> Tensor:
    return -F.logsigmoid(beta * delta) * (1 - label_smoothing) - F.logsigmoid(-beta * delta) * label_smoothing


def _exo_pair(p: _Pairs) -> Tensor:
    epsilon = torch.tensor(p.label_smoothing, device=p.delta_score.device)
    logits = p.beta * p.delta_score
    qw, log_qw, log_pw = torch.sigmoid(logits), F.logsigmoid(logits), torch.log1p(-epsilon)
    ql, log_ql, log_pl = (
        torch.sigmoid(-p.beta * p.delta_score),
        F.logsigmoid(-p.beta * p.delta_score),
        torch.log(epsilon),
    )
    return qw * (log_qw - log_pw) + ql * (log_ql - log_pl)


def _robust(p: _Pairs) -> Tensor:
    clean_loss_term = -(1 - p.label_smoothing) * F.logsigmoid(p.beta * p.delta_score)
    flipped_loss_term = -p.label_smoothing * F.logsigmoid(-p.beta * p.delta_score)
    return (clean_loss_term - flipped_loss_term) / (1 - 2 * p.label_smoothing)


def _aot(p: _Pairs) -> Tensor:
    logratios_sorted, _ = torch.sort(p.chosen_logps - p.rejected_logps, dim=0)
    ref_logratios_sorted, _ = torch.sort(p.ref_chosen_logps - p.ref_rejected_logps, dim=0)
    return _smoothed(p.beta, logratios_sorted - ref_logratios_sorted, p.label_smoothing)


def _aot_unpaired(p: _Pairs) -> Tensor:
    chosen_sorted, _ = torch.sort(p.chosen_logratios, dim=0)
    rejected_sorted, _ = torch.sort(p.rejected_logratios, dim=0)
    return _smoothed(p.beta, chosen_sorted - rejected_sorted, p.label_smoothing)


def _discopop(p: _Pairs) -> Tensor:
    logits = p.delta_score * p.beta
    modulation = torch.sigmoid(logits / p.discopop_tau)
    return -F.logsigmoid(logits) * (1 - modulation) + torch.exp(-logits) * modulation


def _sft(p: _Pairs) -> Tensor:
    assert p.chosen_token_logps is not None and p.chosen_token_mask is not None
    batch_loss = -p.chosen_token_logps[p.chosen_token_mask.bool()].mean()
    return batch_loss.expand(p.chosen_token_logps.size(0))


DPO_LOSSES: Final[Mapping[str, Callable[[_Pairs], Tensor]]] = {
    "sigmoid": lambda p: -F.logsigmoid(p.beta * p.delta_score),
    "hinge": lambda p: torch.relu(1 - p.beta * p.delta_score),
    "ipo": lambda p: (p.avg_delta() - 1 / (2 * p.beta)) ** 2,
    "exo_pair": _exo_pair,
    "nca_pair": lambda p: (
        -F.logsigmoid(p.beta * p.chosen_logratios)
        - 0.5 * F.logsigmoid(-(p.beta * p.chosen_logratios))
        - 0.5 * F.logsigmoid(-(p.beta * p.rejected_logratios))
    ),
    "robust": _robust,
    "bco_pair": lambda p: -F.logsigmoid(p.beta * p.chosen_logratios) - F.logsigmoid(-(p.beta * p.rejected_logratios)),
    "sppo_hard": lambda p: (p.chosen_logratios - 0.5 / p.beta) ** 2 + (p.rejected_logratios + 0.5 / p.beta) ** 2,
    "aot": _aot,
    "aot_unpaired": _aot_unpaired,
    "apo_zero": lambda p: 1 - torch.sigmoid(p.beta * p.chosen_logratios) + torch.sigmoid(p.beta * p.rejected_logratios),
    "apo_down": lambda p: (
        torch.sigmoid(p.beta * p.chosen_logratios)
        + (1 - torch.sigmoid(p.beta * (p.chosen_logratios - p.rejected_logratios)))
    ),
    "discopop": _discopop,
    "sft": _sft,
    "sigmoid_norm": lambda p: -F.logsigmoid(p.beta * p.avg_delta()),
}
"""Each loss type's per-pair loss, as the branches of ``DPOTrainer._compute_loss`` (dpo_trainer.py:1386-1516)."""
assert tuple(DPO_LOSSES) == DPO_LOSS_TYPES


def _f_scores(logratios: Tensor, f_divergence_type: str, alpha: float) -> Tensor:
    """A log-ratio as its f-divergence's score (f-DPO): ``DPOTrainer._compute_loss``, dpo_trainer.py:1333-1357.

    TRL's ``alpha_divergence`` clamps per dtype and knows fp16, bf16 and fp32 only; fp64 is clamped as fp32 here."""
    if f_divergence_type == "reverse_kl" or (f_divergence_type == "alpha_divergence" and abs(alpha - 1.0) < 1e-6):
        return logratios
    if f_divergence_type == "forward_kl":
        return 1 - torch.exp(-logratios)
    if f_divergence_type == "js_divergence":
        return math.log(2) + F.logsigmoid(logratios)
    coef = 1.0 / (alpha - 1.0)
    t = (alpha - 1.0) * logratios
    clamp_max = {torch.float16: 11.0, torch.bfloat16: 80.0}.get(t.dtype, 80.0)
    return (torch.exp(torch.clamp(t.float(), max=clamp_max)) - 1.0).to(t.dtype) * coef


def _dpo_problems(
    loss_types: Sequence[str],
    loss_weights: Sequence[float] | None,
    label_smoothing: float,
    f_divergence_type: str,
    needs: Mapping[str, bool],
) -> list[Problem]:
    """What ``dpo_loss`` cannot compute as TRL would (TRL's own refusals, and the inputs a loss type needs)."""
    problems = []
    unknown = [t for t in loss_types if t not in DPO_LOSS_TYPES]
    if unknown or not loss_types:
        got = describe(unknown[0] if unknown else list(loss_types))
        problems.append(Problem("dpo.loss_type", f"got {got}, expected one of {_choices(DPO_LOSS_TYPES)}"))
    if loss_weights is not None and len(loss_weights) != len(loss_types):
        message = f"got {len(loss_weights)} weights for {len(loss_types)} loss types"
        problems.append(Problem("dpo.loss_weights", message, "give one weight per loss_type"))
    if f_divergence_type not in F_DIVERGENCE_TYPES:
        problems.append(_refuse("dpo.f_divergence_type", f_divergence_type, F_DIVERGENCE_TYPES).problems[0])
    elif f_divergence_type != "reverse_kl" and not set(loss_types) <= set(F_DIVERGENCE_LOSS_TYPES):
        message = f"{f_divergence_type!r} applies only to the loss types {_choices(F_DIVERGENCE_LOSS_TYPES)}"
        problems.append(Problem("dpo.f_divergence_type", message, "use 'reverse_kl'"))
    if "exo_pair" in loss_types and label_smoothing == 0.0:
        problems.append(Problem("dpo.label_smoothing", "must be > 0 with 'exo_pair'", "the EXO paper uses 1e-3"))
    for loss_type in loss_types:
        if loss_type in ("ipo", "sigmoid_norm") and not needs["lengths"]:
            message = f"{loss_type!r} divides by the completions' lengths"
            problems.append(Problem("dpo.loss_type", message, "pass chosen_lengths= and rejected_lengths="))
        if loss_type == "sft" and not needs["tokens"]:
            message = "'sft' takes the chosen completions' per-token log-probs"
            problems.append(Problem("dpo.loss_type", message, "pass chosen_token_logps= and chosen_token_mask="))
    return problems


def dpo_loss(
    chosen_logps: Tensor,
    rejected_logps: Tensor,
    ref_chosen_logps: Tensor,
    ref_rejected_logps: Tensor,
    *,
    beta: float = 0.1,
    loss_type: str | Sequence[str] = "sigmoid",
    loss_weights: Sequence[float] | None = None,
    label_smoothing: float = 0.0,
    f_divergence_type: str = "reverse_kl",
    f_alpha_divergence_coef: float = 0.5,
    discopop_tau: float = 0.05,
    chosen_lengths: Tensor | None = None,
    rejected_lengths: Tensor | None = None,
    chosen_token_logps: Tensor | None = None,
    chosen_token_mask: Tensor | None = None,
) -> DPOOutput:
    """DPO's loss of a batch of pairs from their sequence log-probs under the policy and the reference.

    TRL: ``DPOTrainer._compute_loss`` (dpo_trainer.py:1318-1531, TRL 1.16.0) from the log-ratios on: the
    f-divergence scores, each of ``loss_type`` (a name or a list, TRL's ``DPO_LOSS_TYPES``) summed as
    ``mean(per_pair) · weight``, and the rewards it logs. ``chosen_lengths`` / ``rejected_lengths`` are the
    completions' token counts (``completion_mask.sum(1)``), which ``ipo`` and ``sigmoid_norm`` divide by;
    ``chosen_token_logps`` / ``chosen_token_mask`` the chosen rows' per-token log-probs, which ``sft`` averages.
    ``pair_logps`` gives the sequence log-probs (with LD-DPO's ``ld_alpha``)."""
    loss_types = [loss_type] if isinstance(loss_type, str) else list(loss_type)
    needs = {"lengths": chosen_lengths is not None and rejected_lengths is not None}
    needs["tokens"] = chosen_token_logps is not None and chosen_token_mask is not None
    problems = _dpo_problems(loss_types, loss_weights, label_smoothing, f_divergence_type, needs)
    if problems:
        raise InvalidValueError(problems)
    chosen_logratios = chosen_logps - ref_chosen_logps
    rejected_logratios = rejected_logps - ref_rejected_logps
    pairs = _Pairs(
        beta=beta,
        label_smoothing=label_smoothing,
        discopop_tau=discopop_tau,
        chosen_logps=chosen_logps,
        rejected_logps=rejected_logps,
        ref_chosen_logps=ref_chosen_logps,
        ref_rejected_logps=ref_rejected_logps,
        chosen_logratios=chosen_logratios,
        rejected_logratios=rejected_logratios,
        chosen_scores=_f_scores(chosen_logratios, f_divergence_type, f_alpha_divergence_coef),
        rejected_scores=_f_scores(rejected_logratios, f_divergence_type, f_alpha_divergence_coef),
        chosen_lengths=chosen_lengths,
        rejected_lengths=rejected_lengths,
        chosen_token_logps=chosen_token_logps,
        chosen_token_mask=chosen_token_mask,
    )
    loss: Any = 0.0
    losses: Any = 0.0
    for name, weight in zip(loss_types, loss_weights or [1.0] * len(loss_types), strict=True):
        per_sequence_loss = DPO_LOSSES[name](pairs)
        loss += per_sequence_loss.mean() * weight
        losses = losses + per_sequence_loss * weight
    return DPOOutput(
        loss=loss,
        losses=losses,
        chosen_rewards=beta * chosen_logratios.detach(),
        rejected_rewards=beta * rejected_logratios.detach(),
        chosen_logps=chosen_logps,
        rejected_logps=rejected_logps,
    )


# -- GRPO -------------------------------------------------------------------------------------------------------------


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
    scale = ("group" if scale_rewards else "none") if isinstance(scale_rewards, bool) else scale_rewards
    if scale not in SCALE_REWARDS:
        raise _refuse("grpo.scale_rewards", scale_rewards, SCALE_REWARDS)
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
    return torch.nan_to_num(advantages, nan=0.0)


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
    """TRL's logged values by its names, as 0-dim tensors (``metrics`` turns them into numbers)."""

    def metrics(self) -> dict[str, float]:
        """What ``GRPOTrainer._compute_loss`` logs (grpo_trainer.py:3253-3290), by its names: ``kl`` (when
        ``beta`` > 0), ``entropy`` (when given), ``clip_ratio/low_mean``, ``clip_ratio/low_min``,
        ``clip_ratio/high_mean``, ``clip_ratio/high_max``, ``clip_ratio/region_mean`` (the clipped losses),
        ``cispo_clip_ratio``, ``vespo/phi_seq_mean``; on one process the same values (TRL reduces across processes)."""
        return {name: value.item() for name, value in self.stats.items()}


def _check_grpo(
    loss_type: str, importance_sampling_level: str, beta: float, ref: Tensor | None, max_len: int | None
) -> None:
    problems = []
    if loss_type not in GRPO_LOSS_TYPES:
        problems.append(_refuse("grpo.loss_type", loss_type, GRPO_LOSS_TYPES).problems[0])
    if importance_sampling_level not in IMPORTANCE_SAMPLING_LEVELS:
        problems.append(
            _refuse("grpo.importance_sampling_level", importance_sampling_level, IMPORTANCE_SAMPLING_LEVELS).problems[0]
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
    """TRL's ``global_masked_mean`` on one process (grpo_trainer.py:3259-3265)."""
    if x.shape[1] == 1:
        local_sum, local_count = x.sum(), torch.tensor(float(x.shape[0]), device=x.device)
    else:
        local_sum, local_count = (x * mask).sum(), mask.sum().float()
    totals = torch.stack([local_sum, local_count])
    return totals[0] / totals[1].clamp(min=1.0)


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
