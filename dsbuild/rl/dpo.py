"""DPO on a ``Session``: the ``loss_fn`` of one micro-batch of pairs, and the reference's log-probs precomputed.

What ``dsbuild train`` runs for ``task = "dpo"`` (``run/worker.py``) and what a loop of your own can pass to
``Session.fit`` / ``step``: a micro-batch is TRL's ``[chosen rows; rejected rows]`` (``collate_pairs``); each
completion's log-probability under the policy (with gradients) and under the reference (without: its engine, or the
``ref_chosen_logps`` / ``ref_rejected_logps`` precomputed into the batch), then ``dpo_loss`` with the job's ``[dpo]``
options. The loss function returns TRL's metrics beside the loss, which ``fit`` logs with each step (averaged over
its micro-batches and processes) and ``evaluate`` with each evaluation: the rewards and log-probs, and what TRL reads
from the policy's logits (``entropy``, ``logits/chosen``, ``logits/rejected``, ``mean_token_accuracy``), taken from
the logits of the same forward as they leave the output head, and summed over processes before dividing, as TRL
gathers them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from ..job.rl import DPOSpec
from .logits import Stats, by_token, logits_read
from .losses import dpo_loss, pair_logps, token_metrics, token_sums

__all__ = ["dpo_loss_fn", "precompute_reference"]


def dpo_loss_fn(policy: Any, reference: Any, spec: DPOSpec | None = None) -> Callable[[Any, Any], dict[str, Any]]:
    """``loss_fn(engine, batch)`` of DPO for ``policy`` (a ``Session``) against ``reference`` (``policy.reference()``,
    or ``None`` when every batch carries precomputed reference log-probs), with ``spec``'s options (TRL's
    defaults when ``None``). Collective under ZeRO-3 as ``logprobs`` is."""
    spec = spec or DPOSpec()

    def loss_fn(_engine: Any, batch: Mapping[str, Any]) -> dict[str, Any]:
        mask = batch["completion_mask"]
        scored = _scored_mask(mask)
        with logits_read(policy) as stats:
            tokens = policy.logprobs(batch, completion_mask=mask)
        chosen, rejected = pair_logps(tokens, scored, ld_alpha=spec.ld_alpha)
        if "ref_chosen_logps" in batch:
            ref_chosen, ref_rejected = batch["ref_chosen_logps"], batch["ref_rejected_logps"]
        else:
            ref_chosen, ref_rejected = pair_logps(
                reference.logprobs(batch, completion_mask=mask), scored, ld_alpha=spec.ld_alpha
            )
        lengths = mask.sum(dim=1)  # TRL's completion mask, not shifted: what ipo and sigmoid_norm divide by
        rows = chosen.shape[0]
        out = dpo_loss(
            chosen, rejected, ref_chosen.to(chosen), ref_rejected.to(chosen), beta=spec.beta,
            loss_type=list(spec.loss_type), loss_weights=spec.loss_weights, label_smoothing=spec.label_smoothing,
            f_divergence_type=spec.f_divergence_type, f_alpha_divergence_coef=spec.f_alpha_divergence_coef,
            discopop_tau=spec.discopop_tau, chosen_lengths=lengths[:rows], rejected_lengths=lengths[rows:],
            chosen_token_logps=tokens[:rows], chosen_token_mask=scored[:rows],
        )  # fmt: skip
        return {"loss": out.loss, **out.metrics(), **_token_metrics(policy, batch, mask, stats)}

    return loss_fn


def _scored_mask(mask: torch.Tensor) -> torch.Tensor:
    """The completion tokens that have a log-prob: ``mask`` less each row's first position, which nothing predicts
    (TRL's ``shift_completion_mask``, laid out as the tokens). A completion starts there when its prompt is empty or
    cut away (``truncation_mode = "keep_end"``): LD-DPO's shared length and ``sft``'s token mean then count the
    completion's other tokens only, as TRL's; the sums over the mask are the same either way (that position's
    log-prob is 0)."""
    scored = mask.clone()
    scored[:, 0] = 0
    return scored


def _token_metrics(policy: Any, batch: Mapping[str, Any], mask: torch.Tensor, stats: list[Stats]) -> dict[str, float]:
    """TRL's ``entropy``, ``logits/*`` and ``mean_token_accuracy`` of the batch from the policy's logits
    (``logits.logits_read``), the sums over every process first (collective, as TRL's gather); none when they were
    not read."""
    from ..session import distributed

    ids = batch["input_ids"]
    laid_out = by_token(stats, ids.shape[0])
    if laid_out is None:
        return {}
    entropy, mean, top = laid_out
    top1 = top == ids.to(top.device)
    weight = float(policy.position.gathered)  # TRL's gather_for_metrics leaves an uneven epoch end's filler out
    sums = [value * weight for value in token_sums(entropy, mean, top1, mask.to(entropy.device))]
    return token_metrics(distributed.all_sum(sums, policy.engine.device))


def precompute_reference(
    reference: Any,
    samples: Sequence[Mapping[str, Any]],
    collate: Callable[[list[Any]], Mapping[str, Any]],
    batch_size: int,
    spec: DPOSpec | None = None,
) -> list[dict[str, Any]]:
    """Every pair of ``samples`` with its ``ref_chosen_logps`` / ``ref_rejected_logps`` under ``reference`` (TRL's
    ``precompute_ref_log_probs``), ``batch_size`` pairs per forward, in order. Collective under ZeRO-3: every rank
    scores the same pairs."""
    spec = spec or DPOSpec()
    out: list[dict[str, Any]] = []
    for start in range(0, len(samples), batch_size):
        chunk = [dict(s) for s in samples[start : start + batch_size]]
        batch = collate(chunk)
        mask = batch["completion_mask"]
        with torch.no_grad():
            tokens = reference.logprobs(batch, completion_mask=mask)
            chosen, rejected = pair_logps(tokens, _scored_mask(mask), ld_alpha=spec.ld_alpha)
        for sample, c, r in zip(chunk, chosen.tolist(), rejected.tolist(), strict=True):
            out.append({**sample, "ref_chosen_logps": c, "ref_rejected_logps": r})
    return out
