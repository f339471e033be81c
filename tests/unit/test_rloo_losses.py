"""``dsbuild.rl.rloo`` against TRL 1.16's ``RLOOTrainer`` itself, on tensors nobody chose.

Each property runs TRL's own method (``RLOOTrainer._generate_and_score_completions``, ``RLOOTrainer._compute_loss``)
called unbound, with a ``SimpleNamespace`` for ``self`` that holds the config attributes the method reads and hands
it the drawn tensors where a model would (the policy's and the reference's log-probs, the completions, the reward
functions' scores). Hypothesis draws the shapes, ragged completions, log-probs, rewards (unscored ones included) and
RLOOConfig's options; advantages, loss, gradient and TRL's logged metrics must agree to 1e-6 (test_rl_losses.py's
rule for DPO and GRPO).
"""

from __future__ import annotations

import math
from collections import defaultdict
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from trl.trainer.rloo_trainer import RLOOTrainer

from dsbuild.errors import InvalidValueError
from dsbuild.rl.grpo import nanstd
from dsbuild.rl.rloo import penalized_rewards, rloo_advantages, rloo_loss, sequence_kl

pytestmark = pytest.mark.train

EXAMPLES = 60
"""Examples per property: each builds a few small tensors and runs TRL's method once."""

EOS = 1


def _close(ours: Any, theirs: Any) -> None:
    torch.testing.assert_close(ours, theirs, rtol=1e-6, atol=1e-6, equal_nan=True, check_dtype=False)


def _floats(draw: st.DrawFn, shape: tuple[int, ...], low: float, high: float) -> torch.Tensor:
    count = math.prod(shape)
    values = draw(st.lists(st.floats(low, high, allow_nan=False, width=32), min_size=count, max_size=count))
    return torch.tensor(values, dtype=torch.float32).reshape(shape)


@st.composite
def generation_cases(draw: st.DrawFn) -> dict[str, Any]:
    """A generation batch: whole groups of ragged completions (some ending with EOS), the old and reference
    log-probs of their tokens, each reward function's score or ``None`` (NaN), and RLOOConfig's options."""
    generations = draw(st.integers(1, 4))
    rows = generations * draw(st.integers(1, 3))
    functions = draw(st.integers(1, 2))
    lengths = draw(st.lists(st.integers(1, 5), min_size=rows, max_size=rows))
    completions = [[5 + (i + j) % 7 for j in range(n - 1)] + [draw(st.sampled_from([EOS, 9]))] for i, n in
                   enumerate(lengths)]  # fmt: skip
    reward = st.floats(-4.0, 4.0, allow_nan=False, width=32) | st.just(math.nan)
    scores = draw(st.lists(reward, min_size=rows * functions, max_size=rows * functions))
    clip = draw(st.none() | st.tuples(st.floats(-3.0, 0.0, width=32), st.floats(0.0, 3.0, width=32)))
    return {
        "num_generations": generations,
        "completions": completions,
        "old": _floats(draw, (rows, max(lengths)), -6.0, 0.0),
        "ref": _floats(draw, (rows, max(lengths)), -6.0, 0.0),
        "rewards_per_func": torch.tensor(scores, dtype=torch.float32).reshape(rows, functions),
        "weights": _floats(draw, (functions,), -2.0, 2.0),
        "beta": draw(st.sampled_from([0.0, 0.05, 0.5])),
        "reward_clip_range": clip,
        "normalize_advantages": draw(st.booleans()),
        "mask_truncated_completions": draw(st.booleans()),
    }


def _trl_generation(case: dict[str, Any]) -> tuple[dict[str, Any], dict[str, float]]:
    """TRL's ``_generate_and_score_completions`` of the drawn batch: its output and the metrics it logged."""
    completions, rows = case["completions"], len(case["completions"])
    ref_model = object()

    def logps(model: Any, *_: Any, **__: Any) -> tuple[torch.Tensor, None, None]:
        return (case["ref"] if model is ref_model else case["old"]).clone(), None, None

    trainer = SimpleNamespace(
        accelerator=SimpleNamespace(device=torch.device("cpu"), process_index=0, reduce=lambda t, reduction: t),
        model=SimpleNamespace(training=True, is_gradient_checkpointing=False),
        ref_model=ref_model,
        _generate=lambda prompts: ([[3, 4]] * rows, [list(c) for c in completions], ["c"] * rows),
        _get_per_token_logps_and_entropies=logps,
        _calculate_rewards=lambda *_: case["rewards_per_func"].clone(),
        _tokenizer=SimpleNamespace(pad_token_id=0),
        eos_token_ids=[EOS],
        pad_to_multiple_of=None,
        mask_truncated_completions=case["mask_truncated_completions"],
        args=SimpleNamespace(per_device_train_batch_size=rows, gradient_checkpointing_kwargs=None),
        beta=case["beta"],
        num_generations=case["num_generations"],
        reward_weights=case["weights"],
        reward_clip_range=case["reward_clip_range"],
        normalize_advantages=case["normalize_advantages"],
        reward_func_names=[f"f{j}" for j in range(case["rewards_per_func"].shape[1])],
        _metrics={"train": defaultdict(list)},
        _logs={"prompt": [], "completion": [], "rewards": defaultdict(list), "advantages": [], "extra": {}},
        _pending_extra_logs={},
        _pending_metrics={},
        log_multimodal=False,
    )
    output = RLOOTrainer._generate_and_score_completions(trainer, [{"prompt": "p"}] * rows)
    return output, {name: values[0] for name, values in trainer._metrics["train"].items()}


def _completion_mask(case: dict[str, Any]) -> torch.Tensor:
    """The completions' mask as dsbuild's rollout lays it out (right-padded; a completion cut before EOS masked out
    with ``mask_truncated_completions``)."""
    completions = case["completions"]
    width = max(len(c) for c in completions)
    mask = torch.tensor([[1] * len(c) + [0] * (width - len(c)) for c in completions])
    if case["mask_truncated_completions"]:
        truncated = torch.tensor([c[-1] != EOS for c in completions])
        mask = mask * (~truncated).unsqueeze(1).long()
    return mask


@given(generation_cases())
@settings(max_examples=EXAMPLES, deadline=None)
def test_rloo_advantages_are_trls(case: dict[str, Any]) -> None:
    """The reward weighted and summed (NaN where no function scored), clipped, less β times the first-order KL of
    each sequence, then the leave-one-out baseline over the scorable siblings (optionally normalised): TRL's
    advantages, its ``kl`` and ``frac_reward_zero_std``, and the old log-probs summed as TRL keeps them."""
    output, metrics = _trl_generation(case)
    mask = _completion_mask(case)
    scores = case["rewards_per_func"]
    rewards = (scores * case["weights"].unsqueeze(0)).nansum(dim=1)
    rewards[torch.isnan(scores).all(dim=1)] = torch.nan
    kl = sequence_kl(case["old"], case["ref"], mask) if case["beta"] else None
    rewards = penalized_rewards(rewards, reward_clip_range=case["reward_clip_range"], beta=case["beta"], kl=kl)
    advantages, std = rloo_advantages(rewards, case["num_generations"],
                                      normalize_advantages=case["normalize_advantages"])  # fmt: skip
    _close(advantages, output["advantages"])
    _close(output["completion_mask"], mask)
    _close(torch.isclose(std, torch.zeros_like(std)).float().mean().item(), metrics["frac_reward_zero_std"])
    if kl is not None:
        _close(float(kl.sum() / mask.sum().clamp(min=1.0)), metrics["kl"])
    else:
        assert "kl" not in metrics


def test_rloo_advantages_refuse_a_broken_group_and_a_missing_kl() -> None:
    """Rewards that are not whole groups, and a KL penalty without the KL, are named by the key to fix."""
    with pytest.raises(InvalidValueError, match=r"^rloo.num_generations: got 4 for \(6,\) rewards"):
        rloo_advantages(torch.zeros(6), 4)
    with pytest.raises(InvalidValueError, match=r"^rloo.beta: got 0.05: the KL penalty needs the reference"):
        penalized_rewards(torch.zeros(2), beta=0.05)


def test_a_group_of_one_scorable_completion_learns_nothing() -> None:
    """A completion whose siblings no function scored has no baseline: advantage 0, as the unscored ones (TRL's
    nan_to_num of 0/0)."""
    rewards = torch.tensor([1.0, math.nan, math.nan, 2.0, 4.0, math.nan])
    advantages, _ = rloo_advantages(rewards, 3)
    _close(advantages, torch.tensor([0.0, 0.0, 0.0, -2.0, 2.0, 0.0]))
    assert float(nanstd(advantages)) > 0


@st.composite
def loss_cases(draw: st.DrawFn) -> dict[str, Any]:
    """A micro-batch: ragged completion masks, the policy's log-probs now and the sums when it generated (near
    enough to clip either way), per-sequence advantages, and the clipping bounds."""
    rows, width = draw(st.integers(1, 5)), draw(st.integers(1, 6))
    mask = torch.zeros(rows, width, dtype=torch.long)
    for row in range(rows):
        mask[row, : draw(st.integers(0, width))] = 1
    logps = _floats(draw, (rows, width), -3.0, 0.0)
    shift = _floats(draw, (rows,), -0.5, 0.5)
    low = draw(st.floats(0.05, 0.5))
    return {
        "mask": mask,
        "logps": logps,
        "old_logps": (logps * mask).sum(1) + shift,
        "advantages": _floats(draw, (rows,), -3.0, 3.0),
        "epsilon_low": low,
        "epsilon_high": draw(st.none() | st.floats(0.05, 0.5)) or low,
    }


def _trl_loss(case: dict[str, Any], logps: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
    """TRL's ``_compute_loss`` of the drawn micro-batch (its forward gives ``logps``) and the metrics it logged."""
    rows, width = case["mask"].shape
    trainer = SimpleNamespace(
        _get_per_token_logps_and_entropies=lambda *_, **__: (logps, torch.zeros(rows, width), None),
        accelerator=SimpleNamespace(reduce=lambda t, reduction: t, gather=lambda t: t),
        model=SimpleNamespace(training=True),
        aux_loss_enabled=False,
        epsilon_low=case["epsilon_low"],
        epsilon_high=case["epsilon_high"],
        _metrics={"train": defaultdict(list)},
    )
    inputs = {
        "prompt_ids": torch.ones(rows, 1, dtype=torch.long),
        "prompt_mask": torch.ones(rows, 1, dtype=torch.long),
        "completion_ids": torch.ones(rows, width, dtype=torch.long),
        "completion_mask": case["mask"],
        "old_logps": case["old_logps"],
        "advantages": case["advantages"],
    }
    loss = RLOOTrainer._compute_loss(trainer, None, inputs)
    return loss, {name: values[0] for name, values in trainer._metrics["train"].items() if name != "entropy"}


@given(loss_cases())
@settings(max_examples=EXAMPLES, deadline=None)
def test_rloo_loss_is_trls(case: dict[str, Any]) -> None:
    """The sequence ratio clipped to [1 - ε_low, 1 + ε_high], the loss the mean over sequences: TRL's loss, its
    gradient to the log-probs, and its clip ratios (mean, min, max over the sequences)."""
    ours_logps = case["logps"].clone().requires_grad_(True)
    theirs_logps = case["logps"].clone().requires_grad_(True)
    out = rloo_loss(ours_logps, case["old_logps"], case["advantages"], case["mask"],
                    epsilon_low=case["epsilon_low"], epsilon_high=case["epsilon_high"])  # fmt: skip
    loss, metrics = _trl_loss(case, theirs_logps)
    _close(out.loss, loss)
    out.loss.backward()
    loss.backward()
    _close(ours_logps.grad, theirs_logps.grad)
    ours = out.metrics()
    assert set(ours) == set(metrics)
    for name, value in metrics.items():
        _close(ours[name], value)
