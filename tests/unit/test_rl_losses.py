"""``dsbuild.rl.losses`` against TRL 1.16 itself, on tensors nobody chose.

Each property runs TRL's own code path (``DPOTrainer._compute_loss``, ``GRPOTrainer._compute_loss``,
``GRPOTrainer._generate_and_score_completions``) called unbound, with a ``SimpleNamespace`` for ``self`` that holds
the config attributes the method reads and hands it the drawn tensors where a model would (its forward's log-probs,
the rollout, the reward functions' scores). Hypothesis draws the shapes, ragged masks, log-probs, rewards and every
option TRL's configs list; the loss, its gradient and TRL's logged metrics must agree to 1e-6.
"""

from __future__ import annotations

import math
from collections import defaultdict
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays
from trl.trainer.dpo_trainer import DPOTrainer
from trl.trainer.grpo_trainer import GRPOTrainer

from dsbuild.errors import InvalidValueError, Problem
from dsbuild.job.rl import DPO_LOSS_TYPES, F_DIVERGENCE_LOSS_TYPES, F_DIVERGENCE_TYPES, GRPO_LOSS_TYPES
from dsbuild.rl.grpo import approx_kl, group_advantages, grpo_loss
from dsbuild.rl.losses import dpo_loss, pair_logps, sequence_logps

pytestmark = pytest.mark.train

EXAMPLES = 50
"""Examples per property: each builds a few small tensors and runs TRL's method once."""

PER_LOSS_TYPE = 20
"""Examples per loss type, for the properties run once for each (every type drawn, not only the likely ones)."""


def _close(ours: Any, theirs: Any) -> None:
    torch.testing.assert_close(ours, theirs, rtol=1e-6, atol=1e-6, equal_nan=True, check_dtype=False)


def _tensor(draw: st.DrawFn, shape: tuple[int, ...], low: float, high: float, dtype: torch.dtype) -> torch.Tensor:
    values = draw(arrays(np.float64, shape, elements=st.floats(low, high, allow_nan=False)))
    return torch.tensor(values, dtype=dtype)


def _ragged_mask(draw: st.DrawFn, rows: int, length: int, *, prompt: bool) -> torch.Tensor:
    """Rows of ``[0] * prompt + [1] * completion + [0] * padding`` (a prompt of one token or more when ``prompt``)."""
    mask = torch.zeros(rows, length, dtype=torch.long)
    for row in range(rows):
        start = draw(st.integers(1, length - 1)) if prompt else 0
        size = draw(st.integers(0, length - start))
        mask[row, start : start + size] = 1
    return mask


# -- DPO ----------------------------------------------------------------------------------------------------------------


@st.composite
def dpo_cases(draw: st.DrawFn, loss_type: str) -> dict[str, Any]:
    """A batch of pairs as TRL's collator stacks it (``[chosen; rejected]``), and DPOConfig's loss options:
    ``loss_type`` alone or mixed with up to two others."""
    pairs, length = draw(st.integers(1, 4)), draw(st.integers(2, 8))
    others = draw(st.lists(st.sampled_from([t for t in DPO_LOSS_TYPES if t != loss_type]), max_size=2, unique=True))
    loss_types = draw(st.permutations([loss_type, *others]))
    f_types = F_DIVERGENCE_TYPES if set(loss_types) <= set(F_DIVERGENCE_LOSS_TYPES) else ("reverse_kl",)
    f_divergence_type = draw(st.sampled_from(f_types))
    # TRL's alpha-divergence knows fp16, bf16 and fp32 only (it looks the dtype up in a table)
    dtype = torch.float32 if f_divergence_type == "alpha_divergence" else torch.float64
    smoothing = st.floats(1e-3, 0.45) if "exo_pair" in loss_types else st.just(0.0) | st.floats(0.0, 0.45)
    count = len(loss_types)
    return {
        "completion_mask": _ragged_mask(draw, 2 * pairs, length, prompt=True),
        "per_token_logps": _tensor(draw, (2 * pairs, length - 1), -3.0, 0.0, dtype),
        "ref_chosen_logps": _tensor(draw, (pairs,), -12.0, 0.0, dtype),
        "ref_rejected_logps": _tensor(draw, (pairs,), -12.0, 0.0, dtype),
        "beta": draw(st.floats(0.01, 1.0)),
        "loss_types": loss_types,
        "loss_weights": draw(st.none() | st.lists(st.floats(0.1, 2.0), min_size=count, max_size=count)),
        "label_smoothing": draw(smoothing),
        "f_divergence_type": f_divergence_type,
        "f_alpha_divergence_coef": draw(st.sampled_from([0.5, 1.0, 1.5, -0.5])),
        "discopop_tau": draw(st.floats(0.05, 0.5)),
        "ld_alpha": draw(st.none() | st.floats(0.0, 1.0)),
    }


class _Forward:
    """Stands for the model: TRL's fused head's outputs, the drawn log-probs among them (0 outside the completion)."""

    training = True

    def __init__(self, log_probs: torch.Tensor) -> None:
        zeros = torch.zeros_like(log_probs)
        self.outputs = SimpleNamespace(
            log_probs=log_probs, entropy=zeros, mean_logits=zeros, is_top1=torch.zeros_like(zeros, dtype=torch.bool)
        )

    def __call__(self, **_: Any) -> SimpleNamespace:
        return self.outputs


def _trl_dpo(case: dict[str, Any], leaf: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
    """TRL's ``DPOTrainer._compute_loss``, the reference log-probs given as precomputed (its ``self`` holds what it
    reads)."""
    mask = case["completion_mask"]
    model = _Forward(leaf * mask[:, 1:])
    trainer = SimpleNamespace(
        model=model,
        accelerator=SimpleNamespace(device=torch.device("cpu"), gather=lambda t: t, gather_for_metrics=lambda t: t),
        aux_loss_enabled=False,
        precompute_ref_logps=True,
        ld_alpha=case["ld_alpha"],
        f_divergence_type=case["f_divergence_type"],
        f_alpha_divergence_coef=case["f_alpha_divergence_coef"],
        loss_types=case["loss_types"],
        loss_weights=case["loss_weights"] or [1.0] * len(case["loss_types"]),
        beta=case["beta"],
        label_smoothing=case["label_smoothing"],
        use_weighting=False,
        args=SimpleNamespace(discopop_tau=case["discopop_tau"], gradient_checkpointing_kwargs=None),
        _metrics={"train": defaultdict(list)},
        _total_train_tokens=0,
        _tp_size=1,
    )
    inputs = {
        "input_ids": torch.zeros_like(mask),
        "attention_mask": torch.ones_like(mask),
        "completion_mask": mask,
        "ref_chosen_logps": case["ref_chosen_logps"],
        "ref_rejected_logps": case["ref_rejected_logps"],
    }
    loss = DPOTrainer._compute_loss(trainer, model, inputs, return_outputs=False)
    return loss, {name: values[0] for name, values in trainer._metrics["train"].items()}


def _ours_dpo(case: dict[str, Any], leaf: torch.Tensor) -> Any:
    mask = case["completion_mask"]
    chosen_logps, rejected_logps = pair_logps(leaf, mask[:, 1:], ld_alpha=case["ld_alpha"])
    chosen_lengths, rejected_lengths = mask.sum(dim=1).chunk(2)
    chosen_tokens, _ = leaf.chunk(2)
    chosen_token_mask, _ = mask[:, 1:].chunk(2)
    return dpo_loss(
        chosen_logps,
        rejected_logps,
        case["ref_chosen_logps"],
        case["ref_rejected_logps"],
        beta=case["beta"],
        loss_type=case["loss_types"],
        loss_weights=case["loss_weights"],
        label_smoothing=case["label_smoothing"],
        f_divergence_type=case["f_divergence_type"],
        f_alpha_divergence_coef=case["f_alpha_divergence_coef"],
        discopop_tau=case["discopop_tau"],
        chosen_lengths=chosen_lengths,
        rejected_lengths=rejected_lengths,
        chosen_token_logps=chosen_tokens,
        chosen_token_mask=chosen_token_mask,
    )


@pytest.mark.parametrize("loss_type", DPO_LOSS_TYPES)
@given(data=st.data())
@settings(max_examples=PER_LOSS_TYPE)
def test_dpo_loss_is_trls(loss_type: str, data: st.DataObject) -> None:
    """dpo_loss (with pair_logps) gives TRL's DPO loss, its gradient in the policy's log-probs and TRL's reward and
    log-prob metrics, for every loss type, their weighted mixes, the f-divergences and LD-DPO's weighting."""
    case = data.draw(dpo_cases(loss_type))
    theirs_leaf = case["per_token_logps"].clone().requires_grad_(True)
    ours_leaf = case["per_token_logps"].clone().requires_grad_(True)
    theirs, their_metrics = _trl_dpo(case, theirs_leaf)
    ours = _ours_dpo(case, ours_leaf)
    _close(ours.loss, theirs)
    (their_grad,) = torch.autograd.grad(theirs, theirs_leaf, allow_unused=True)
    (our_grad,) = torch.autograd.grad(ours.loss, ours_leaf, allow_unused=True)
    _close(our_grad, their_grad)
    _close(ours.losses.mean(), theirs)
    wanted = ["rewards/chosen", "rewards/rejected", "rewards/accuracies", "rewards/margins", "logps/chosen"]
    mine = ours.metrics()
    assert list(mine) == [*wanted, "logps/rejected"]
    _close(torch.tensor(list(mine.values())), torch.tensor([their_metrics[name] for name in mine]))


@given(
    arrays(np.float64, (3, 5), elements=st.floats(-5, 0, allow_nan=False)),
    arrays(np.bool_, (3, 5)),
)
@settings(max_examples=EXAMPLES)
def test_sequence_logps_sums_the_masked_tokens_only(values: np.ndarray, mask: np.ndarray) -> None:
    """sequence_logps is TRL's sum of a sequence's completion log-probs, whatever the padding holds (even -inf)."""
    logps, keep = torch.tensor(values), torch.tensor(mask)
    padded = logps.masked_fill(~keep, float("-inf"))
    _close(sequence_logps(padded, keep), (logps * keep).sum(dim=1))


def test_dpo_refuses_what_it_cannot_compute_as_trl() -> None:
    """An unknown loss type is named with TRL's list; ipo without lengths and sft without tokens say what to pass."""
    logps = torch.zeros(2)
    with pytest.raises(InvalidValueError) as raised:
        dpo_loss(logps, logps, logps, logps, loss_type="sigmod")
    assert raised.value.problems == (
        Problem("dpo.loss_type", "got 'sigmod', expected one of " + ", ".join(map(repr, DPO_LOSS_TYPES))),
    )
    with pytest.raises(InvalidValueError) as raised:
        dpo_loss(logps, logps, logps, logps, loss_type=["ipo", "sft", "exo_pair"], loss_weights=[1.0])
    assert [str(p) for p in raised.value.problems] == [
        "dpo.loss_weights: got 1 weights for 3 loss types (give one weight per loss_type)",
        "dpo.label_smoothing: must be > 0 with 'exo_pair' (the EXO paper uses 1e-3)",
        "dpo.loss_type: 'ipo' divides by the completions' lengths (pass chosen_lengths= and rejected_lengths=)",
        "dpo.loss_type: 'sft' takes the chosen completions' per-token log-probs (pass chosen_token_logps= and "
        "chosen_token_mask=)",
    ]


# -- GRPO ---------------------------------------------------------------------------------------------------------------


@st.composite
def grpo_cases(draw: st.DrawFn, loss_type: str) -> dict[str, Any]:
    """A micro-batch of completions (ragged, some empty), its old and reference log-probs, and GRPOConfig's options."""
    rows, length = draw(st.integers(1, 6)), draw(st.integers(1, 6))
    logps = _tensor(draw, (rows, length), -3.0, 0.0, torch.float64)
    old = draw(st.none() | st.just(True))
    beta = draw(st.just(0.0) | st.floats(1e-3, 0.5))
    token_advantages = draw(st.booleans())
    return {
        "mask": _ragged_mask(draw, rows, length, prompt=False),
        "logps": logps,
        "old": None if old is None else logps + _tensor(draw, (rows, length), -0.5, 0.5, torch.float64),
        "ref": logps + _tensor(draw, (rows, length), -1.0, 1.0, torch.float64) if beta else None,
        "advantages": _tensor(draw, (rows, length) if token_advantages else (rows,), -2.0, 2.0, torch.float64),
        "entropies": _tensor(draw, (rows, length), 0.0, 3.0, torch.float64),
        "beta": beta,
        "loss_type": loss_type,
        "importance_sampling_level": draw(st.sampled_from(["token", "sequence"])),
        "epsilon_low": draw(st.floats(0.05, 0.4)),
        "epsilon_high": draw(st.floats(0.05, 0.4)),
        "delta": draw(st.none() | st.floats(1.1, 3.0)),
        "use_bias_correction_kl": draw(st.booleans()),
        "max_completion_length": draw(st.integers(length, 16)),
        "gradient_accumulation_steps": draw(st.integers(1, 4)),
        "steps_per_generation": draw(st.integers(1, 4)),
        "num_processes": draw(st.integers(1, 3)),
        "num_items_in_batch": draw(st.integers(0, 4 * rows * length)),
    }


VESPO = {"k_pos": 2.0, "lambda_pos": 3.0, "k_neg": 3.0, "lambda_neg": 2.0}
"""GRPOConfig's VESPO defaults."""


def _trl_grpo(
    case: dict[str, Any], leaf: torch.Tensor, accelerator: Any = None
) -> tuple[torch.Tensor, dict[str, float]]:
    """TRL's ``GRPOTrainer._compute_loss`` (its ``self`` holds what it reads; the policy's forward gives ``leaf``;
    ``accelerator``: what reduces and gathers over the processes, one process's by default)."""
    rows, length = case["mask"].shape
    trainer = SimpleNamespace(
        _get_per_token_logps_and_entropies=lambda *_, **__: (leaf, case["entropies"], None),
        get_gamma_weights=GRPOTrainer.get_gamma_weights,
        top_entropy_quantile=1.0,
        off_policy_mask_threshold=None,
        importance_sampling_level=case["importance_sampling_level"],
        beta=case["beta"],
        loss_type=case["loss_type"],
        epsilon_low=case["epsilon_low"],
        epsilon_high=case["epsilon_high"],
        use_vllm=False,
        vllm_importance_sampling_correction=False,
        model=SimpleNamespace(training=True),
        current_gradient_accumulation_steps=case["gradient_accumulation_steps"],
        max_completion_length=case["max_completion_length"],
        accelerator=accelerator
        or SimpleNamespace(num_processes=case["num_processes"], reduce=lambda t, reduction: t, gather=lambda t: t),
        args=SimpleNamespace(
            use_bias_correction_kl=case["use_bias_correction_kl"],
            delta=case["delta"],
            steps_per_generation=case["steps_per_generation"],
            sapo_temperature_pos=1.0,
            sapo_temperature_neg=1.05,
            **{f"vespo_{name}": value for name, value in VESPO.items()},
        ),
        _entropy_bonus_enabled=False,
        aux_loss_enabled=False,
        _metrics={"train": defaultdict(list)},
    )
    inputs = {
        "prompt_ids": torch.zeros(rows, 1, dtype=torch.long),
        "prompt_mask": torch.ones(rows, 1, dtype=torch.long),
        "completion_ids": torch.zeros(rows, length, dtype=torch.long),
        "completion_mask": case["mask"],
        "advantages": case["advantages"],
        "num_items_in_batch": torch.tensor(case["num_items_in_batch"]),
    }
    if case["old"] is not None:
        inputs["old_per_token_logps"] = case["old"]
    if case["ref"] is not None:
        inputs["ref_per_token_logps"] = case["ref"]
    loss = GRPOTrainer._compute_loss(trainer, None, inputs)
    return loss, {name: values[0] for name, values in trainer._metrics["train"].items()}


@pytest.mark.parametrize("loss_type", GRPO_LOSS_TYPES)
@given(data=st.data())
@settings(max_examples=PER_LOSS_TYPE)
def test_grpo_loss_is_trls(loss_type: str, data: st.DataObject) -> None:
    """grpo_loss gives TRL's GRPO loss, its gradient in the policy's log-probs and TRL's logged metrics (kl,
    entropy, clip ratios) for every loss type, token and sequence ratios, two-sided clipping, the KL with and without
    its bias correction, and the accumulation and generation-batch normalisers."""
    case = data.draw(grpo_cases(loss_type))
    theirs_leaf = case["logps"].clone().requires_grad_(True)
    ours_leaf = case["logps"].clone().requires_grad_(True)
    theirs, their_metrics = _trl_grpo(case, theirs_leaf)
    ours = grpo_loss(
        ours_leaf,
        case["old"],
        case["advantages"],
        case["mask"],
        ref_per_token_logps=case["ref"],
        beta=case["beta"],
        epsilon_low=case["epsilon_low"],
        epsilon_high=case["epsilon_high"],
        delta=case["delta"],
        loss_type=case["loss_type"],
        importance_sampling_level=case["importance_sampling_level"],
        use_bias_correction_kl=case["use_bias_correction_kl"],
        max_completion_length=case["max_completion_length"],
        gradient_accumulation_steps=case["gradient_accumulation_steps"],
        num_items_in_batch=case["num_items_in_batch"],
        num_processes=case["num_processes"],
        steps_per_generation=case["steps_per_generation"],
        vespo=VESPO,
        entropies=case["entropies"],
    )
    _close(ours.loss, theirs)
    (their_grad,) = torch.autograd.grad(theirs, theirs_leaf, allow_unused=True)
    (our_grad,) = torch.autograd.grad(ours.loss, ours_leaf, allow_unused=True)
    _close(our_grad, their_grad)
    mine = ours.metrics()
    assert sorted(mine) == sorted(their_metrics)
    _close(torch.tensor([mine[name] for name in sorted(mine)]), torch.tensor([their_metrics[n] for n in sorted(mine)]))


def test_grpo_defaults_to_a_micro_batch_that_is_its_own_generation_batch() -> None:
    """Without num_items_in_batch, dapo divides by the micro-batch's tokens and the accumulation steps: summed over
    the window's micro-batches, the token mean (as TRL's default, where the generation batch is the window)."""
    logps = torch.tensor([[-1.0, -2.0, 0.0], [-0.5, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    advantages = torch.tensor([1.0, -1.0])
    default = grpo_loss(logps, None, advantages, mask, gradient_accumulation_steps=4).loss
    explicit = grpo_loss(logps, None, advantages, mask, gradient_accumulation_steps=4, num_items_in_batch=3,
                         steps_per_generation=1).loss  # fmt: skip
    assert default.item() == explicit.item() == pytest.approx((-1.0 - 1.0 + 1.0) / (3 * 4))


def test_grpo_refuses_what_it_cannot_compute_as_trl() -> None:
    """An unknown loss type is named with TRL's list; a KL without the reference and dr_grpo without its constant
    say what to pass."""
    logps, mask = torch.zeros(2, 3), torch.ones(2, 3)
    with pytest.raises(InvalidValueError) as raised:
        grpo_loss(logps, None, torch.zeros(2), mask, loss_type="ppo", beta=0.1)
    assert [str(p) for p in raised.value.problems] == [
        "grpo.loss_type: got 'ppo', expected one of " + ", ".join(map(repr, GRPO_LOSS_TYPES)),
        "grpo.beta: got 0.1: the KL needs the reference (pass ref_per_token_logps=)",
    ]
    with pytest.raises(InvalidValueError, match=r"grpo.max_completion_length: 'dr_grpo' divides by it"):
        grpo_loss(logps, None, torch.zeros(2), mask, loss_type="dr_grpo")


# -- advantages and KL ----------------------------------------------------------------------------------------------


@st.composite
def reward_cases(draw: st.DrawFn) -> dict[str, Any]:
    """A generation batch's rewards (some unscored: NaN), ``num_generations`` per prompt, and a ``scale_rewards``."""
    generations, prompts = draw(st.integers(1, 4)), draw(st.integers(1, 4))
    reward = st.floats(-5.0, 5.0, allow_nan=False, width=32) | st.just(math.nan)
    rewards = draw(st.lists(reward, min_size=generations * prompts, max_size=generations * prompts))
    return {
        "rewards": torch.tensor(rewards, dtype=torch.float32),
        "num_generations": generations,
        "scale_rewards": draw(st.sampled_from(["group", "batch", "none", True, False])),
    }


def _trl_advantages(case: dict[str, Any]) -> torch.Tensor:
    """TRL's ``GRPOTrainer._generate_and_score_completions`` (its ``self`` holds what it reads; the rollout and the
    reward functions give the drawn batch), with ``scale_rewards`` as ``GRPOConfig.__post_init__`` leaves it."""
    rewards, size = case["rewards"], len(case["rewards"])
    scale = {True: "group", False: "none"}.get(case["scale_rewards"], case["scale_rewards"])
    trainer = SimpleNamespace(
        accelerator=SimpleNamespace(device=torch.device("cpu"), gather=lambda t: t, process_index=0, num_processes=1),
        model=SimpleNamespace(training=True, is_gradient_checkpointing=False),
        environment_factories=None,
        environments=None,
        tools=None,
        _generate=lambda prompts: ([[1]] * size, [[2]] * size, None, ["c"] * size, None, {}, None, None),
        _calculate_rewards=lambda *_: rewards.unsqueeze(1),
        _tokenizer=SimpleNamespace(pad_token_id=0),
        pad_to_multiple_of=None,
        mask_truncated_completions=False,
        args=SimpleNamespace(
            per_device_train_batch_size=size,
            gradient_checkpointing_kwargs=None,
            steps_per_generation=1,
            gradient_accumulation_steps=1,
        ),
        num_iterations=1,
        use_vllm=False,
        vllm_importance_sampling_correction=False,
        beta=0.0,
        num_generations=case["num_generations"],
        multi_objective_aggregation="sum_then_normalize",
        reward_weights=torch.ones(1),
        reward_func_names=["reward"],
        scale_rewards=scale,
        _metrics={"train": defaultdict(list)},
        _logs={"prompt": [], "completion": [], "rewards": defaultdict(list), "advantages": [], "extra": {}},
        _pending_extra_logs={},
        _pending_metrics={},
        log_multimodal=False,
    )
    output = GRPOTrainer._generate_and_score_completions(trainer, [{"prompt": "p"}] * size)
    advantages: torch.Tensor = output["advantages"]
    return advantages


@given(reward_cases())
@settings(max_examples=EXAMPLES)
def test_group_advantages_are_trls(case: dict[str, Any]) -> None:
    """group_advantages gives TRL's advantages: group means, the group's or the batch's Bessel std (or none, and
    True / False read as TRL reads them), one completion per group, and 0 for a completion no reward scored."""
    ours = group_advantages(case["rewards"], case["num_generations"], scale_rewards=case["scale_rewards"])
    _close(ours, _trl_advantages(case))


def test_group_advantages_refuses_a_broken_group() -> None:
    """Rewards that are not whole groups and an unknown scaling are named by the key to fix."""
    with pytest.raises(InvalidValueError, match=r"^grpo.num_generations: got 4 for \(6,\) rewards"):
        group_advantages(torch.zeros(6), 4)
    with pytest.raises(InvalidValueError) as raised:
        group_advantages(torch.zeros(6), 3, scale_rewards="std")
    assert str(raised.value) == "grpo.scale_rewards: got 'std', expected one of 'group', 'batch', 'none'"


@given(arrays(np.float64, (2, 4), elements=st.floats(-8, 0, allow_nan=False)), st.floats(-2, 2))
@settings(max_examples=EXAMPLES)
def test_approx_kl_is_k3(logps: np.ndarray, shift: float) -> None:
    """approx_kl is Schulman's k3 (TRL's per-token KL): never negative (but for rounding), zero where policy and
    reference agree."""
    policy = torch.tensor(logps)
    kl = approx_kl(policy, policy + shift)
    assert bool((kl >= -1e-12).all())
    _close(approx_kl(policy, policy), torch.zeros_like(policy))
    _close(kl, torch.exp(torch.tensor(shift)) - shift - 1 + torch.zeros_like(policy))
