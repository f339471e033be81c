"""Per-token log-probabilities of a batch under a model, as TRL computes them for DPO and GRPO.

``token_logps`` is the one computation behind ``Session.logprobs`` (the policy: with gradients) and
``Reference.logprobs`` (without): the logits in fp32, divided by ``temperature`` before the log-softmax (TRL's
``_get_per_token_logps_and_entropies`` and its fused head, OpenRLHF's ``Actor.forward``), each token scored by the
positions before it. The result has the batch's shape: ``out[:, t]`` is ``log p(input_ids[:, t] | input_ids[:, :t])``,
0 where the mask is 0 and at each sequence's first token (nothing predicts it). Packed rows (one row holding several
sequences, told apart by ``position_ids`` restarting at 0, no ``attention_mask``) are scored sequence by sequence
(HF models read the packing from ``position_ids`` when there is no KV cache: the forward gets ``use_cache=False``).
Rows go through the model ``batch_size`` at a time (the session's ``infer_batch_size``).
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable, Mapping
from typing import Any

import torch

from ..errors import SessionError

__all__ = ["token_logps"]


def token_logps(
    forward: Callable[..., Any],
    batch: Mapping[str, Any],
    *,
    completion_mask: torch.Tensor | None = None,
    temperature: float = 1.0,
    batch_size: int | None = None,
    grad: bool,
    device: Any = None,
) -> torch.Tensor:
    """``(rows, length)`` fp32 log-probs of ``batch["input_ids"]`` under ``forward`` (a model or an engine), masked by
    ``completion_mask`` (else ``attention_mask``, else every token), ``batch_size`` rows per forward; with ``grad``
    the graph is kept (the policy's loss backpropagates through it). See the module docstring."""
    ids, attention, positions = _inputs(batch, completion_mask, temperature)
    mask = completion_mask if completion_mask is not None else attention
    rows = ids.shape[0]
    step = batch_size or rows
    # No KV cache (as TRL's fused head): scoring needs none, and HF reads packed rows from position_ids only without.
    no_cache = {"use_cache": False} if _takes(forward, "use_cache") else {}
    parts = []
    with contextlib.nullcontext() if grad else torch.no_grad():
        for start in range(0, rows, step):
            chunk = slice(start, start + step)
            inputs = {"input_ids": ids[chunk]}
            if attention is not None:
                inputs["attention_mask"] = attention[chunk]
            if positions is not None:
                inputs["position_ids"] = positions[chunk]
            if device is not None:
                inputs = {k: v.to(device) for k, v in inputs.items()}
            logits = _logits(forward(**inputs, **no_cache))
            parts.append(_scored(logits, inputs["input_ids"], temperature))
    out = torch.cat(parts)
    keep = torch.ones_like(out, dtype=torch.bool)
    keep[:, 0] = False
    if positions is not None:
        keep &= positions.to(out.device) != 0  # a packed sequence's first token: scored by nothing before it
    if mask is not None:
        keep &= mask.to(out.device).bool()
    return out.masked_fill(~keep, 0.0)


def _inputs(
    batch: Mapping[str, Any], completion_mask: torch.Tensor | None, temperature: float
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """The batch's ``input_ids``, ``attention_mask`` and ``position_ids``, checked against each other."""
    if not isinstance(batch, Mapping) or not isinstance(batch.get("input_ids"), torch.Tensor):
        raise SessionError("logprobs: the batch is a mapping with an input_ids tensor (rows x tokens)")
    ids = batch["input_ids"]
    if ids.dim() != 2:
        raise SessionError(f"logprobs: input_ids has shape {tuple(ids.shape)}, expected (rows, tokens)")
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not temperature > 0:
        raise SessionError(f"logprobs: temperature {temperature!r}, expected a number above 0 (TRL's default is 1.0)")
    named = {"attention_mask": batch.get("attention_mask"), "position_ids": batch.get("position_ids")}
    named["completion_mask"] = completion_mask
    for name, tensor in named.items():
        if tensor is not None and tuple(tensor.shape) != tuple(ids.shape):
            raise SessionError(f"logprobs: {name} has shape {tuple(tensor.shape)}, input_ids {tuple(ids.shape)}")
    return ids, named["attention_mask"], named["position_ids"]


def _takes(forward: Callable[..., Any], name: str) -> bool:
    """Whether the model behind ``forward`` (a model, or an engine holding one as ``module``) takes keyword ``name``."""
    model: Any = getattr(forward, "module", forward)
    try:
        parameters = inspect.signature(model.forward).parameters
    except (TypeError, ValueError, AttributeError):
        return False
    return name in parameters or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())


def _logits(output: Any) -> torch.Tensor:
    logits = output.logits if hasattr(output, "logits") else output
    if not isinstance(logits, torch.Tensor) or logits.dim() != 3:
        raise SessionError("logprobs: the model returned no (rows, tokens, vocabulary) logits")
    return logits


def _scored(logits: torch.Tensor, ids: torch.Tensor, temperature: float) -> torch.Tensor:
    """``(rows, length)``: column ``t`` the log-prob of token ``t`` from the logits at ``t - 1`` (column 0: 0).

    As TRL's ``selective_log_softmax`` in fp32: the chosen logit minus the row's logsumexp, one row at a time so the
    fp32 copy of the logits is one row's."""
    targets = ids[:, 1:].to(logits.device)
    scored = []
    for row, target in zip(logits[:, :-1], targets, strict=True):
        scaled = row.float() / temperature
        scored.append(scaled.gather(-1, target.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(scaled, dim=-1))
    return torch.nn.functional.pad(torch.stack(scored), (1, 0))
