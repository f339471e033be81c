"""DPO's losses and the sequence log-probs they take, as TRL 1.16 computes them: pure functions of tensors (GRPO's:
``grpo``).

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
)

__all__ = [
    "DPO_LOSSES",
    "TOKEN_SUMS",
    "DPOOutput",
    "dpo_loss",
    "pair_logps",
    "refused",
    "sequence_logps",
    "token_metrics",
    "token_sums",
]


def _choices(names: Sequence[str]) -> str:
    return ", ".join(map(repr, names))


def refused(path: str, value: object, names: Sequence[str]) -> InvalidValueError:
    """The error for an option of ``path`` that is none of ``names`` (DPO's and GRPO's choices)."""
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


# -- what TRL logs of the policy's logits ---------------------------------------------------------------------------


TOKEN_SUMS: Final = (
    "entropy",
    "tokens",
    "chosen_logits",
    "chosen_tokens",
    "rejected_logits",
    "rejected_tokens",
    "correct",
)
"""The sums behind TRL's token metrics of a DPO batch (``token_sums``), in the order they are summed over processes."""


def token_sums(entropy: Tensor, mean_logits: Tensor, top1: Tensor, mask: Tensor) -> list[float]:
    """``TOKEN_SUMS`` of a batch ``[chosen rows; rejected rows]``: the per-token ``entropy``, ``mean_logits`` and
    ``top1`` (whether the token is the logits' argmax) of the token each column holds, over ``mask`` (the completion
    mask; column 0 is predicted by nothing and never counted).

    TRL: ``DPOTrainer._compute_loss`` (dpo_trainer.py:1537-1579) sums these over the shifted completion mask and
    gathers them over processes before dividing (``token_metrics``)."""
    mask = mask.bool().clone()
    mask[:, 0] = False
    chosen, rejected = mask.chunk(2, dim=0)
    chosen_logits, rejected_logits = mean_logits.chunk(2, dim=0)
    chosen_top1, _ = top1.chunk(2, dim=0)
    return [
        float(entropy[mask].sum()),
        float(mask.sum()),
        float(chosen_logits[chosen].sum()),
        float(chosen.sum()),
        float(rejected_logits[rejected].sum()),
        float(rejected.sum()),
        float((chosen_top1 & chosen).sum()),
    ]


def token_metrics(sums: Sequence[float]) -> dict[str, float]:
    """TRL's ``entropy``, ``logits/chosen``, ``logits/rejected`` and ``mean_token_accuracy`` of a batch from its
    ``token_sums`` (summed over processes first, as TRL gathers them); each 0 where it counts no token, as TRL."""
    s = dict(zip(TOKEN_SUMS, sums, strict=True))

    def ratio(total: float, count: float) -> float:
        return total / count if count > 0 else 0.0

    return {
        "entropy": ratio(s["entropy"], s["tokens"]),
        "logits/chosen": ratio(s["chosen_logits"], s["chosen_tokens"]),
        "logits/rejected": ratio(s["rejected_logits"], s["rejected_tokens"]),
        "mean_token_accuracy": ratio(s["correct"], s["chosen_tokens"]),
    }


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
        problems.append(refused("dpo.f_divergence_type", f_divergence_type, F_DIVERGENCE_TYPES).problems[0])
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
