"""``dsbuild.rl.kto`` against TRL 1.16's ``KTOTrainer._compute_loss`` itself, on tensors nobody chose.

TRL's method runs unbound, a ``SimpleNamespace`` for ``self`` holding the config attributes it reads, the reference
log-probs given as precomputed (``ref_logps``, ``ref_KL_logps``) and a stand-in forward handing it the drawn
per-token log-probs of the batch's sequences and of its mismatched KL sequences. Hypothesis draws the batch (ragged
completions, any mix of desirable and undesirable, all of one kind included), beta, the weights and both loss types;
the loss, its gradient and TRL's logged KL, rewards and log-probs must agree to 1e-6.
"""

from __future__ import annotations

from collections import defaultdict
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays
from trl.trainer.kto_trainer import KTOTrainer

from dsbuild.rl.kto import KTO_LOSS_TYPES, kto_kl, kto_loss, kto_metrics
from dsbuild.rl.losses import sequence_logps

pytestmark = pytest.mark.train


def _close(ours: Any, theirs: Any) -> None:
    torch.testing.assert_close(ours, theirs, rtol=1e-6, atol=1e-6, equal_nan=True, check_dtype=False)


def _tensor(draw: st.DrawFn, shape: tuple[int, ...], low: float, high: float) -> torch.Tensor:
    return torch.tensor(draw(arrays(np.float64, shape, elements=st.floats(low, high, allow_nan=False))))


def _mask(draw: st.DrawFn, rows: int, length: int) -> torch.Tensor:
    """Rows of ``[0] * prompt + [1] * completion + [0] * padding``, a prompt of one token or more."""
    mask = torch.zeros(rows, length, dtype=torch.long)
    for row in range(rows):
        start = draw(st.integers(1, length - 1))
        mask[row, start : start + draw(st.integers(0, length - start))] = 1
    return mask


@st.composite
def kto_cases(draw: st.DrawFn, loss_type: str) -> dict[str, Any]:
    rows, length, kl_length = draw(st.integers(1, 6)), draw(st.integers(2, 8)), draw(st.integers(2, 8))
    return {
        "loss_type": loss_type,
        "label": torch.tensor(draw(st.lists(st.booleans(), min_size=rows, max_size=rows))),
        "mask": _mask(draw, rows, length),
        "kl_mask": _mask(draw, rows, kl_length),
        "logps": _tensor(draw, (rows, length - 1), -3.0, 0.0),
        "kl_logps": _tensor(draw, (rows, kl_length - 1), -3.0, 0.0),
        "ref_logps": _tensor(draw, (rows,), -12.0, 0.0),
        "ref_kl_logps": _tensor(draw, (rows,), -12.0, 0.0),
        "beta": draw(st.floats(0.01, 2.0)),
        "desirable_weight": draw(st.floats(0.1, 3.0)),
        "undesirable_weight": draw(st.floats(0.1, 3.0)),
    }


class _Forward:
    """Stands for the model: TRL's fused head's outputs for the sequences it is given (the batch's or the KL ones)."""

    training = True

    def __init__(self, by_ids: dict[int, torch.Tensor]) -> None:
        self.by_ids = by_ids

    def __call__(self, *, input_ids: torch.Tensor, **_: Any) -> SimpleNamespace:
        log_probs = self.by_ids[id(input_ids)]
        zeros = torch.zeros_like(log_probs.detach())
        return SimpleNamespace(log_probs=log_probs, entropy=zeros, mean_logits=zeros)


def _trl(case: dict[str, Any], leaf: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
    mask, kl_mask = case["mask"], case["kl_mask"]
    inputs = {
        "input_ids": torch.zeros_like(mask),
        "attention_mask": torch.ones_like(mask),
        "completion_mask": mask,
        "KL_input_ids": torch.zeros_like(kl_mask),
        "KL_attention_mask": torch.ones_like(kl_mask),
        "KL_completion_mask": kl_mask,
        "label": case["label"],
        "ref_logps": case["ref_logps"],
        "ref_KL_logps": case["ref_kl_logps"],
    }
    model = _Forward({
        id(inputs["input_ids"]): leaf * mask[:, 1:],
        id(inputs["KL_input_ids"]): case["kl_logps"] * kl_mask[:, 1:],
    })  # fmt: skip
    trainer = SimpleNamespace(
        model=model,
        accelerator=SimpleNamespace(device=torch.device("cpu"), gather_for_metrics=lambda t: t),
        calculate_KL=case["loss_type"] != "apo_zero_unpaired",
        aux_loss_enabled=False,
        precompute_ref_logps=True,
        loss_type=case["loss_type"],
        beta=case["beta"],
        desirable_weight=case["desirable_weight"],
        undesirable_weight=case["undesirable_weight"],
        _metrics={"train": defaultdict(list)},
        _total_train_tokens=0,
        _tp_size=1,
    )
    trainer._compute_kl_logps = lambda model, batch: KTOTrainer._compute_kl_logps(trainer, model, batch)
    loss = KTOTrainer._compute_loss(trainer, model, inputs, return_outputs=False)
    return loss, {name: values[0] for name, values in trainer._metrics["train"].items()}


@pytest.mark.parametrize("loss_type", KTO_LOSS_TYPES)
@given(data=st.data())
@settings(max_examples=40)
def test_kto_loss_is_trls(loss_type: str, data: st.DataObject) -> None:
    """kto_loss (with kto_kl over the mismatched sequences) gives TRL's KTO loss, its gradient in the policy's
    log-probs and TRL's kl, rewards and log-prob metrics, for both loss types and any mix of labels."""
    case = data.draw(kto_cases(loss_type))
    theirs_leaf = case["logps"].clone().requires_grad_(True)
    ours_leaf = case["logps"].clone().requires_grad_(True)
    theirs, their_metrics = _trl(case, theirs_leaf)
    kl = None
    if loss_type == "kto":
        kl = kto_kl(sequence_logps(case["kl_logps"], case["kl_mask"][:, 1:].bool()), case["ref_kl_logps"]).clamp(min=0)
    ours = kto_loss(
        sequence_logps(ours_leaf, case["mask"][:, 1:].bool()), case["ref_logps"], case["label"], kl,
        beta=case["beta"], desirable_weight=case["desirable_weight"],
        undesirable_weight=case["undesirable_weight"], loss_type=loss_type,
    )  # fmt: skip
    _close(ours.loss, theirs)
    if theirs.requires_grad:
        (their_grad,) = torch.autograd.grad(theirs, theirs_leaf, allow_unused=True)
        (our_grad,) = torch.autograd.grad(ours.loss, ours_leaf, allow_unused=True)
        _close(our_grad, their_grad)
    mine = kto_metrics(ours.sums(), float(ours.kl))
    wanted = {k: v for k, v in their_metrics.items() if k not in {"entropy", "num_tokens", "logits/chosen"}}
    wanted.pop("logits/rejected", None)
    assert set(mine) == set(wanted)
    _close(torch.tensor([mine[k] for k in wanted]), torch.tensor(list(wanted.values())))


def test_kto_loss_refuses_an_unknown_loss_type() -> None:
    """A loss type TRL does not know is refused with KTOConfig's list, not computed as another."""
    with pytest.raises(ValueError, match="kto, apo_zero_unpaired"):
        kto_loss(torch.zeros(2), torch.zeros(2), torch.tensor([True, False]), loss_type="sigmoid")
