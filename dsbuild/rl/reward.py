"""Reward modelling on a ``Session``: the ``loss_fn`` of one micro-batch of pairs, as TRL 1.16's ``RewardTrainer``.

What ``dsbuild train`` runs for ``task = "reward"`` and what a loop of your own can pass to ``Session.fit`` / ``step``:
a micro-batch is ``[chosen rows; rejected rows]`` (``data.preference.collate_scored_pairs``) through a model with a
one-number head (``AutoModelForSequenceClassification``, ``num_labels=1``: the score at each row's last token that is
not padding). The loss is Bradley–Terry's, ``-log σ(r_chosen - r_rejected - margin)`` averaged over the pairs (the
``margin`` column when the batch has one), plus ``center_rewards_coefficient · mean((r_chosen + r_rejected)²)`` when
set. Beside it, TRL's metrics: ``accuracy`` (chosen scored above rejected) and ``margin`` (the mean of
``r_chosen - r_rejected``), each the mean over the processes as TRL's ``gather_for_metrics`` takes it (an uneven
epoch end's filler left out), which ``fit`` averages over the step's micro-batches, and ``min_reward`` / ``mean_reward`` / ``max_reward`` of every process's rewards together (collective:
one all-reduce each, as TRL's gather). ``evaluate`` logs them as ``eval_*``. TRL's ``num_tokens`` (its running count
of trained tokens) is ``fit``'s, as for every task.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from ..job.rl import RewardSpec

__all__ = ["reward_loss", "reward_loss_fn"]


def reward_loss(
    chosen: torch.Tensor,
    rejected: torch.Tensor,
    margin: torch.Tensor | None = None,
    center_rewards_coefficient: float | None = None,
) -> torch.Tensor:
    """TRL's ``RewardTrainer.compute_loss`` of the pairs' rewards: ``-logsigmoid(chosen - rejected [- margin])``
    averaged, plus the centring term when its coefficient is set."""
    difference = chosen - rejected if margin is None else chosen - rejected - margin.to(chosen)
    loss = -F.logsigmoid(difference).mean()
    if center_rewards_coefficient is not None:
        loss = loss + center_rewards_coefficient * torch.mean((chosen + rejected) ** 2)
    return loss


def _across(values: torch.Tensor, op: Any) -> float:
    """``values`` reduced over every process by ``op`` (collective when there are several)."""
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        values = values.detach().clone()
        dist.all_reduce(values, op=op)
    return float(values)


def reward_metrics(
    rewards: torch.Tensor, chosen: torch.Tensor, rejected: torch.Tensor, gathered: bool = True
) -> dict[str, float]:
    """TRL's metrics of a micro-batch (module docstring); the reward extremes and mean over every process; accuracy
    and margin the mean of every ``gathered`` process's (TRL's ``gather_for_metrics``: not an uneven end's filler)."""
    with torch.no_grad():
        rewards = rewards.detach().float()
        weight = float(gathered)
        accuracy = float((chosen > rejected).float().mean()) * weight
        margin = float((chosen - rejected).float().mean()) * weight
        count = torch.tensor([rewards.numel(), rewards.sum(), accuracy, margin, weight], dtype=torch.float64,
                             device=rewards.device)  # fmt: skip
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            dist.all_reduce(count, op=dist.ReduceOp.SUM)
        return {
            "accuracy": float(count[2] / count[4]),
            "margin": float(count[3] / count[4]),
            "min_reward": _across(rewards.min(), dist.ReduceOp.MIN),
            "mean_reward": float(count[1] / count[0]),
            "max_reward": _across(rewards.max(), dist.ReduceOp.MAX),
        }


def reward_loss_fn(
    spec: RewardSpec | None = None, session: Any = None
) -> Callable[[Any, Mapping[str, Any]], dict[str, Any]]:
    """``loss_fn(engine, batch)`` of reward modelling with ``spec``'s options (TRL's defaults when ``None``): the
    engine's forward on the batch's ``input_ids`` and ``attention_mask``, the loss and TRL's metrics (module
    docstring; ``session``: the one whose ``fit`` says which micro-batches TRL gathers). Collective in its metrics:
    every process calls it once a micro-batch."""
    spec = spec or RewardSpec()

    def loss_fn(engine: Any, batch: Mapping[str, Any]) -> dict[str, Any]:
        logits = engine(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], use_cache=False).logits
        rewards = logits.squeeze(-1)
        chosen, rejected = torch.chunk(rewards, chunks=2)
        loss = reward_loss(chosen, rejected, batch.get("margin"), spec.center_rewards_coefficient)
        gathered = session is None or session.position.gathered
        return {"loss": loss, **reward_metrics(logits, chosen, rejected, gathered)}

    return loss_fn
