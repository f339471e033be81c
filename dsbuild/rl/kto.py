"""KTO's loss as TRL 1.16's ``KTOTrainer`` computes it: pure functions of tensors.

Mirrors ``KTOTrainer._compute_loss`` (trl/trainer/kto_trainer.py:1370-1528) operation for operation: each unpaired
completion's summed log-probability under the policy and the reference; the KL estimate, the mean over the batch of
the policy's minus the reference's log-probabilities of the *mismatched* completions (each prompt with its batch
neighbour's completion, ``data.unpaired``), averaged over processes, detached and clamped at 0; then per completion

- ``kto``: desirable ``1 - σ(β · (logratio - KL))``, undesirable ``1 - σ(β · (KL - logratio))``;
- ``apo_zero_unpaired`` (no KL): desirable ``1 - σ(β · logratio)``, undesirable ``σ(β · logratio)``;

weighted by ``desirable_weight`` / ``undesirable_weight`` and averaged (``nanmean``). The rewards are
``β · logratio``, detached. ``tests/unit/test_rl_losses.py`` holds them to TRL's own method on drawn tensors.

What TRL logs of them is a sum over every process divided by every process's count (``rewards/chosen``,
``logps/chosen``, their ``rejected`` twins, ``rewards/margins``), so a batch's ``KTOOutput.sums`` are what to sum
over processes before ``kto_metrics``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

import attrs
import torch
import torch.nn.functional as F
from torch import Tensor

from ..job.rl import KTO_LOSS_TYPES, KTOSpec
from .logits import by_token, logits_read

__all__ = [
    "KTO_LOSS_TYPES", "KTO_SUMS", "KTOOutput", "kto_kl", "kto_loss", "kto_loss_fn", "kto_metrics", "kto_token_sums",
    "precompute_reference",
]  # fmt: skip

KTO_SUMS: Final = ("chosen", "chosen_rewards", "chosen_logps", "rejected", "rejected_rewards", "rejected_logps")
"""What ``KTOOutput.sums`` holds, in order: the count of desirable completions, the sums of their rewards and
log-probs, the same of the undesirable ones."""


def kto_kl(kl_logps: Tensor, ref_kl_logps: Tensor) -> Tensor:
    """This process's KL estimate: the mean of the mismatched completions' log-ratios, detached (TRL's ``kl``
    before ``gather_for_metrics(kl).mean().clamp(min=0)``, which the caller does over processes)."""
    return (kl_logps - ref_kl_logps).mean().detach()


@attrs.frozen(eq=False)
class KTOOutput:
    """KTO's loss of a batch of unpaired completions, and what TRL logs about it."""

    loss: Tensor
    """The weighted losses' ``nanmean``, as ``KTOTrainer.compute_loss`` returns it (the HF Trainer then divides it by
    the gradient accumulation steps)."""
    losses: Tensor
    """The desirable completions' weighted losses, then the undesirable ones'."""
    chosen_rewards: Tensor
    rejected_rewards: Tensor
    chosen_logps: Tensor
    rejected_logps: Tensor
    kl: Tensor
    """The KL estimate the losses used (0 for ``apo_zero_unpaired``)."""

    def sums(self) -> list[float]:
        """This process's ``KTO_SUMS`` (``nansum``, as TRL's)."""
        chosen, rejected = self.chosen_rewards, self.rejected_rewards
        return [
            float(chosen.numel()), float(chosen.nansum()), float(self.chosen_logps.detach().nansum()),
            float(rejected.numel()), float(rejected.nansum()), float(self.rejected_logps.detach().nansum()),
        ]  # fmt: skip


def kto_metrics(sums: Sequence[float], kl: float) -> dict[str, float]:
    """TRL's logged values of a batch by its names from ``KTO_SUMS`` summed over processes: ``kl``, then
    ``rewards/chosen`` and ``logps/chosen`` when there are desirable completions, the ``rejected`` ones when there are
    undesirable ones, ``rewards/margins`` when both (TRL logs nothing for a side with none)."""
    s = dict(zip(KTO_SUMS, sums, strict=True))
    out = {"kl": kl}
    if s["chosen"] > 0:
        out |= {"rewards/chosen": s["chosen_rewards"] / s["chosen"], "logps/chosen": s["chosen_logps"] / s["chosen"]}
    if s["rejected"] > 0:
        out |= {
            "rewards/rejected": s["rejected_rewards"] / s["rejected"],
            "logps/rejected": s["rejected_logps"] / s["rejected"],
        }
    if s["chosen"] > 0 and s["rejected"] > 0:
        out["rewards/margins"] = out["rewards/chosen"] - out["rewards/rejected"]
    return out


def kto_loss(
    logps: Tensor,
    ref_logps: Tensor,
    labels: Tensor,
    kl: Tensor | None = None,
    *,
    beta: float = 0.1,
    desirable_weight: float = 1.0,
    undesirable_weight: float = 1.0,
    loss_type: str = "kto",
) -> KTOOutput:
    """KTO's loss of completions whose summed log-probs are ``logps`` (policy) and ``ref_logps`` (reference),
    ``labels`` true where desirable; ``kl`` the KL estimate over every process, clamped (``None``: 0, as TRL without
    one: ``apo_zero_unpaired``)."""
    if loss_type not in KTO_LOSS_TYPES:
        raise ValueError(f"unknown KTO loss_type {loss_type!r}: expected one of {', '.join(KTO_LOSS_TYPES)}")
    kl = torch.zeros(1, device=logps.device) if kl is None else kl
    chosen_idx = torch.nonzero(labels.to(logps.device).bool(), as_tuple=False).view(-1)
    rejected_idx = torch.nonzero(~labels.to(logps.device).bool(), as_tuple=False).view(-1)
    chosen_logps, rejected_logps = logps.index_select(0, chosen_idx), logps.index_select(0, rejected_idx)
    chosen_logratios = chosen_logps - ref_logps.to(logps).index_select(0, chosen_idx)
    rejected_logratios = rejected_logps - ref_logps.to(logps).index_select(0, rejected_idx)
    if loss_type == "kto":
        chosen_losses = 1 - F.sigmoid(beta * (chosen_logratios - kl))
        rejected_losses = 1 - F.sigmoid(beta * (kl - rejected_logratios))
    else:
        chosen_losses = 1 - F.sigmoid(beta * chosen_logratios)
        rejected_losses = F.sigmoid(beta * rejected_logratios)
    losses = torch.cat((desirable_weight * chosen_losses, undesirable_weight * rejected_losses), 0)
    return KTOOutput(
        loss=losses.nanmean(), losses=losses, chosen_rewards=beta * chosen_logratios.detach(),
        rejected_rewards=beta * rejected_logratios.detach(), chosen_logps=chosen_logps,
        rejected_logps=rejected_logps, kl=kl,
    )  # fmt: skip


def kto_token_sums(entropy: Tensor, mean_logits: Tensor, labels: Tensor, mask: Tensor) -> list[float]:
    """The sums behind TRL's ``entropy`` and ``logits/chosen`` / ``logits/rejected`` of a batch laid out as
    ``Session.logprobs`` (column ``t``: the logits that predict token ``t``), over the completion ``mask`` (column 0
    never counted): entropy and tokens, the desirable rows' mean logits and tokens, the undesirable rows' (TRL:
    kto_trainer.py:1483-1510, summed over processes before dividing)."""
    mask = mask.bool().clone()
    mask[:, 0] = False
    good = labels.to(mask.device).bool()[:, None] & mask
    bad = ~labels.to(mask.device).bool()[:, None] & mask
    return [
        float(entropy[mask].sum()), float(mask.sum()),
        float(mean_logits[good].sum()), float(good.sum()), float(mean_logits[bad].sum()), float(bad.sum()),
    ]  # fmt: skip


def _token_metrics(sums: Sequence[float]) -> dict[str, float]:
    """``kto_token_sums`` over every process as TRL logs them: ``entropy`` (0 without tokens), each ``logits/*``
    only where it counts tokens."""
    entropy, tokens, good, good_tokens, bad, bad_tokens = sums
    out = {"entropy": entropy / tokens if tokens > 0 else 0.0}
    if good_tokens > 0:
        out["logits/chosen"] = good / good_tokens
    if bad_tokens > 0:
        out["logits/rejected"] = bad / bad_tokens
    return out


def kto_loss_fn(policy: Any, reference: Any, spec: KTOSpec | None = None) -> Callable[[Any, Any], dict[str, Any]]:
    """``loss_fn(engine, batch)`` of KTO for ``policy`` (a ``Session``) against ``reference``
    (``policy.reference()``, or ``None`` when every batch carries the reference's log-probs: ``precompute_reference``)
    with ``spec``'s options (TRL's defaults when ``None``): the mismatched ``KL_*`` rows scored by both without
    gradients, the batch's rows by the policy (with) and the reference (without), the loss and TRL's metrics (the KL
    estimate and every logged mean over every process: collective, every process calls it once a micro-batch)."""
    from ..session import distributed

    spec = spec or KTOSpec()

    def loss_fn(_engine: Any, batch: Mapping[str, Any]) -> dict[str, Any]:
        device = policy.engine.device
        weight = float(policy.position.gathered)  # 0: this micro-batch is left out of what TRL gathers
        kl = None
        if spec.loss_type == "kto":
            rows = {"input_ids": batch["KL_input_ids"], "attention_mask": batch["KL_attention_mask"]}
            mask = batch["KL_completion_mask"]
            with torch.no_grad():
                mine = policy.logprobs(rows, completion_mask=mask).sum(dim=1)
            theirs = _reference_logps(reference, batch, rows, mask, "ref_KL_logps")
            local = kto_kl(mine, theirs.to(mine))
            # TRL's gather_for_metrics(kl).mean(): over the processes whose micro-batch is not an uneven end's filler
            total, kept = distributed.all_sum([float(local) * weight, weight], device)
            kl = torch.tensor(total / kept, device=device).to(local).clamp(min=0)
        mask = batch["completion_mask"]
        with logits_read(policy) as stats:
            tokens = policy.logprobs(batch, completion_mask=mask)
        ref = _reference_logps(reference, batch, batch, mask, "ref_logps")
        labels = batch["label"].to(tokens.device)
        out = kto_loss(tokens.sum(dim=1), ref.to(tokens), labels, kl, beta=spec.beta, loss_type=spec.loss_type,
                       desirable_weight=spec.desirable_weight, undesirable_weight=spec.undesirable_weight)  # fmt: skip
        sums = out.sums()
        laid_out = by_token(stats, tokens.shape[0])
        if laid_out is not None:
            sums += kto_token_sums(laid_out[0], laid_out[1], labels, mask.to(laid_out[0].device))
        summed = distributed.all_sum([value * weight for value in sums], device)
        metrics = kto_metrics(summed[: len(KTO_SUMS)], float(out.kl))
        if laid_out is not None:
            metrics |= _token_metrics(summed[len(KTO_SUMS) :])
        return {"loss": out.loss, **metrics}

    return loss_fn


def _reference_logps(reference: Any, batch: Mapping[str, Any], rows: Mapping[str, Any], mask: Any, key: str) -> Tensor:
    """The reference's summed log-probs of ``rows``' completions: precomputed into ``batch[key]`` when ``reference``
    is ``None``."""
    if reference is None:
        return torch.as_tensor(batch[key])
    logps: Tensor = reference.logprobs(rows, completion_mask=mask).sum(dim=1)
    return logps


def precompute_reference(
    reference: Any,
    samples: Sequence[Mapping[str, Any]],
    collate: Callable[[list[Any]], Mapping[str, Any]],
    batch_size: int,
) -> list[dict[str, Any]]:
    """Every record of ``samples`` with the reference's summed log-probs of its completion (``ref_logps``) and, when
    it has one, of its KL completion (``ref_KL_logps``): TRL's ``precompute_ref_log_probs`` of a KTO job, ``batch_size``
    records per forward, in order. Collective under ZeRO-3: every rank scores the same records."""
    out: list[dict[str, Any]] = []
    for start in range(0, len(samples), batch_size):
        chunk = [dict(s) for s in samples[start : start + batch_size]]
        batch = collate(chunk)
        with torch.no_grad():
            scored = {"ref_logps": reference.logprobs(batch, completion_mask=batch["completion_mask"]).sum(dim=1)}
            if "KL_input_ids" in batch:
                rows = {"input_ids": batch["KL_input_ids"], "attention_mask": batch["KL_attention_mask"]}
                scored["ref_KL_logps"] = reference.logprobs(rows, completion_mask=batch["KL_completion_mask"]).sum(1)
        values = {key: column.tolist() for key, column in scored.items()}
        out.extend({**sample, **{key: values[key][i] for key in values}} for i, sample in enumerate(chunk))
    return out
