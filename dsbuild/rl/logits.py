"""What TRL 1.16's trainers read from the policy's logits beside the log-probs, read from the same forward.

TRL's fused head computes, for each scored token, the entropy of the next-token distribution, the mean logit and
whether the token is the argmax (``FusedCausalLMOutput.entropy`` / ``mean_logits`` / ``is_top1``), all of the logits
÷ ``temperature``. Here they come from the logits the policy's output head returns in the forward that scores the
loss (``logits_read``: a forward hook around ``Session.logprobs``), so no second forward runs and no logits are kept:
each forward's numbers are computed as its logits pass, one row at a time in fp32. ``by_token`` lays them out as the
log-probs are laid out (column ``t``: the logits at ``t - 1`` that predict token ``t``; column 0: 0).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch import Tensor

__all__ = ["Stats", "by_token", "logits_read", "logits_stats"]

Stats = tuple[Tensor, Tensor, Tensor]
"""Per position of a forward's rows: ``(entropy, mean logit, argmax)``."""


def logits_stats(logits: Tensor, temperature: float = 1.0) -> Stats:
    """``(entropy, mean logit, argmax)`` at each position of ``(rows, length, vocabulary)`` logits ÷ ``temperature``,
    fp32 (one row at a time, so the fp32 copy is one row's), detached: TRL's fused head's ``entropy``,
    ``mean_logits`` and, compared with the next token, ``is_top1`` (the first of equal maxima, as its kernel)."""
    entropy, mean, top = [], [], []
    for row in logits.detach():
        z = row.float() / temperature
        logps = torch.log_softmax(z, dim=-1)
        entropy.append(-(logps.exp() * logps).sum(dim=-1))
        mean.append(z.mean(dim=-1))
        top.append(z.argmax(dim=-1))
    return torch.stack(entropy), torch.stack(mean), torch.stack(top)


@contextlib.contextmanager
def logits_read(policy: Any, temperature: float = 1.0) -> Iterator[list[Stats]]:
    """``logits_stats`` of each forward of ``policy``'s model inside (a ``Session``: its engine's module), read from
    its output head's logits as they pass, in the order of the forwards; nothing for a model without an output head.
    Wrap only the policy's own scoring: a LoRA policy's reference is the same model, adapters disabled."""
    stats: list[Stats] = []
    model = getattr(policy.engine, "module", policy.engine)
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if head is None:
        yield stats
        return
    handle = head.register_forward_hook(lambda _m, _i, logits: stats.append(logits_stats(logits, temperature)))
    try:
        yield stats
    finally:
        handle.remove()


def by_token(stats: list[Stats], rows: int) -> Stats | None:
    """The forwards' ``stats`` of a batch of ``rows`` laid out as its log-probs: ``(rows, length)``, column ``t`` from
    the logits at ``t - 1`` (column 0: 0); ``None`` when they do not cover the batch (no output head was read)."""
    if not stats or sum(s[0].shape[0] for s in stats) != rows:
        return None
    entropy, mean, top = (torch.nn.functional.pad(torch.cat([s[i] for s in stats])[:, :-1], (1, 0)) for i in range(3))
    return entropy, mean, top
