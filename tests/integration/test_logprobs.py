"""Per-token log-probs and the reference model (issue 32) against TRL 1.16's own code and the unsharded model.

In-process tests share the pytest process's group (world size 1, ZeRO-0); ZeRO-3 on 2 processes runs in
``_logprobs_worker.py`` under torchrun.
"""

from __future__ import annotations

import os

os.environ.setdefault("DS_ACCELERATOR", "cpu")

import contextlib
import copy
import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from _session_common import VOCAB, tiny_llama
from hypothesis import example, given
from hypothesis import strategies as st
from trl.trainer.grpo_trainer import GRPOTrainer
from trl.trainer.utils import add_fused_lm_head

from dsbuild import Config, SessionError, Training
from dsbuild.session import Session

pytestmark = pytest.mark.train

ROOT = Path(__file__).resolve().parents[2]
LORA = {"r": 4, "lora_alpha": 8, "lora_dropout": 0.0, "target_modules": ["q_proj", "v_proj"]}
TEMPERATURES = (1.0, 0.7)


def _policy(lora: Any = None, seed: int = 7) -> Session:
    config = Config.zero(0).adamw(lr=1e-2).batch(micro=2)
    return Session.from_pretrained(tiny_llama(), config, Training(seed=seed), lora=lora)


@pytest.fixture(scope="module")
def policy_and_trl() -> tuple[Session, dict[float, Any]]:
    """A ZeRO-0 policy, and for each temperature a copy of its model with TRL's fused log-prob head."""
    policy = _policy()
    heads = {}
    for temperature in TEMPERATURES:
        model = copy.deepcopy(policy.model).eval()
        add_fused_lm_head(model, temperature=temperature)
        heads[temperature] = model
    return policy, heads


def _trl_logps(model: Any, ids: torch.Tensor, attention: torch.Tensor, keep: int, batch_size: int) -> torch.Tensor:
    """TRL's ``GRPOTrainer._get_per_token_logps_and_entropies`` itself (its ``self`` reads only the accelerator)."""
    trainer = SimpleNamespace(accelerator=SimpleNamespace(autocast=contextlib.nullcontext, is_main_process=True))
    with torch.no_grad():
        logps, _, _ = GRPOTrainer._get_per_token_logps_and_entropies(
            trainer, model, ids, attention, keep, batch_size=batch_size
        )
    return logps


@st.composite
def prompt_completion(draw: st.DrawFn) -> dict[str, Any]:
    """Ragged rows as GRPO builds them: prompts left-padded, completions right-padded, then concatenated."""
    rows = draw(st.integers(1, 4))
    prompts = [draw(st.integers(1, 6)) for _ in range(rows)]
    completions = [draw(st.integers(1, 6)) for _ in range(rows)]
    seed = draw(st.integers(0, 2**16))
    return {
        "prompts": prompts,
        "completions": completions,
        "seed": seed,
        "temperature": draw(st.sampled_from(TEMPERATURES)),
        "batch_size": draw(st.integers(1, rows)),
    }


def _rows(case: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``input_ids``, ``attention_mask`` and ``completion_mask`` of a drawn case."""
    g = torch.Generator().manual_seed(case["seed"])
    width_p, width_c = max(case["prompts"]), max(case["completions"])
    ids = torch.randint(3, VOCAB, (len(case["prompts"]), width_p + width_c), generator=g)
    prompt_mask = torch.tensor([[0] * (width_p - p) + [1] * p for p in case["prompts"]])
    completion_mask = torch.tensor([[1] * c + [0] * (width_c - c) for c in case["completions"]])
    attention = torch.cat([prompt_mask, completion_mask], dim=1)
    ids = ids.masked_fill(attention == 0, 0)
    return ids, attention, torch.cat([torch.zeros_like(prompt_mask), completion_mask], dim=1)


@pytest.mark.engine
@given(prompt_completion())
@example({"prompts": [6, 1], "completions": [1, 6], "seed": 0, "temperature": 0.7, "batch_size": 1})
def test_logprobs_equal_trls_on_ragged_prompts_and_completions(
    policy_and_trl: tuple[Session, dict[float, Any]], case: dict[str, Any]
) -> None:
    """Session.logprobs over the completion equals TRL's _get_per_token_logps_and_entropies to 1e-5, for ragged
    left-padded prompts and right-padded completions, temperature 1 and 0.7, any infer batch size."""
    policy, heads = policy_and_trl
    ids, attention, completion = _rows(case)
    keep = completion.shape[1] - max(case["prompts"])
    policy.infer_batch_size = case["batch_size"]
    with torch.no_grad():
        ours = policy.logprobs(
            {"input_ids": ids, "attention_mask": attention}, completion_mask=completion, temperature=case["temperature"]
        )
    theirs = _trl_logps(heads[case["temperature"]], ids, attention, keep, case["batch_size"])
    mask = completion[:, -keep:].bool()
    assert ours.dtype == torch.float32 and ours.shape == ids.shape
    assert torch.equal(ours[:, :-keep], torch.zeros_like(ours[:, :-keep]))  # the prompt is not scored
    torch.testing.assert_close(ours[:, -keep:][mask], theirs[mask], rtol=0, atol=1e-5)


@pytest.mark.engine
@given(st.lists(st.integers(2, 9), min_size=1, max_size=4), st.integers(0, 2**16))
@example([2, 9], 0)
def test_packed_rows_score_as_the_padded_batch(
    policy_and_trl: tuple[Session, dict[float, Any]], lengths: list[int], seed: int
) -> None:
    """Sequences packed into one row (position_ids restarting at 0, no attention mask) get the log-probs the
    right-padded batch of the same sequences gets, to 1e-5, and 0 at each sequence's first token."""
    policy, _ = policy_and_trl
    policy.infer_batch_size = 4
    g = torch.Generator().manual_seed(seed)
    sequences = [torch.randint(3, VOCAB, (n,), generator=g) for n in lengths]
    width = max(lengths)
    padded = torch.stack([torch.nn.functional.pad(s, (0, width - len(s))) for s in sequences])
    attention = torch.stack([torch.arange(width) < len(s) for s in sequences]).long()
    packed = torch.cat(sequences).unsqueeze(0)
    positions = torch.cat([torch.arange(n) for n in lengths]).unsqueeze(0)
    with torch.no_grad():
        by_rows = policy.logprobs({"input_ids": padded, "attention_mask": attention})
        by_pack = policy.logprobs({"input_ids": packed, "position_ids": positions})
    unpacked = torch.split(by_pack[0], lengths)
    for row, n, scored in zip(by_rows, lengths, unpacked, strict=True):
        assert scored[0] == 0
        torch.testing.assert_close(scored, row[:n], rtol=0, atol=1e-5)


@pytest.mark.engine
@pytest.mark.parametrize("lora", [None, LORA], ids=["full", "lora"])
def test_the_reference_scores_as_the_policy_at_step_0_and_never_moves(lora: Any) -> None:
    """ZeRO-0, full and LoRA: the reference's log-probs equal the policy's bitwise before training, and are bitwise
    the same after policy steps that change the policy's; the reference has no gradients and stays in eval mode."""
    policy = _policy(lora)
    reference = policy.reference()
    assert reference.adapters_off == (lora is not None)
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(3, VOCAB, (2, 12), generator=g)
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    with torch.no_grad():
        at_start = policy.logprobs(batch)
    before = reference.logprobs(batch)
    assert not before.requires_grad
    assert torch.equal(before, at_start)
    for _ in range(2):
        policy.step({**batch, "labels": ids})
    with torch.no_grad():
        moved = policy.logprobs(batch)
    assert not torch.equal(moved, at_start)
    assert torch.equal(reference.logprobs(batch), before)
    assert policy.model.training  # the policy's mode put back after an adapters-off scoring


@pytest.mark.engine
def test_the_policy_logprobs_carry_gradients() -> None:
    """The policy's log-probs backpropagate (a DPO or GRPO loss is built on them); under no_grad they do not."""
    policy = _policy()
    ids = torch.randint(3, VOCAB, (2, 8), generator=torch.Generator().manual_seed(1))
    scored = policy.logprobs({"input_ids": ids})
    assert scored.requires_grad
    with torch.no_grad():
        assert not policy.logprobs({"input_ids": ids}).requires_grad


@pytest.mark.engine
def test_bad_batches_and_references_are_refused_with_the_reason() -> None:
    """A batch without input_ids, a mask of another shape, a temperature of 0, offload of a LoRA reference, a
    reference of a session given a model object, and offload below ZeRO-3 each say what is wrong."""
    policy = _policy(LORA)
    ids = torch.ones(2, 5, dtype=torch.long)
    for batch, kwargs, said in [
        ({"ids": ids}, {}, "input_ids"),
        ({"input_ids": ids}, {"completion_mask": torch.ones(2, 4)}, "completion_mask has shape"),
        ({"input_ids": ids}, {"temperature": 0}, "temperature"),
    ]:
        with pytest.raises(SessionError, match=said):
            policy.logprobs(batch, **kwargs)
    with pytest.raises(SessionError, match="no second copy"):
        policy.reference(offload=True)
    plain = Session(copy.deepcopy(policy.model.get_base_model()), Config.zero(0).adamw(lr=1e-2).batch(micro=2))
    with pytest.raises(SessionError, match="path="):
        plain.reference()
    from dsbuild.errors import InvalidValueError

    with pytest.raises(InvalidValueError, match="offload_param"):
        _policy().reference(offload=True)


@pytest.mark.procs
@pytest.mark.slow
def test_zero3_on_two_processes_scores_as_one_unsharded_process(tmp_path: Path) -> None:
    """ZeRO-3 on 2 processes: the policy's log-probs equal the unsharded model's in one process to 1e-6 (temperature
    1 and 0.7, ragged rows, infer batch size 1), and the reference (full and LoRA) equals the policy at step 0 and is
    bitwise unchanged after 2 policy steps, on both ranks."""
    from dsbuild.session.distributed import free_port

    env = {**os.environ, "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1"}
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(free_port()),
        str(Path(__file__).parent / "_logprobs_worker.py"), str(tmp_path),
    ]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=900)
    assert done.returncode == 0, done.stderr[-5000:]
    for rank in (0, 1):
        result = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert result["logprobs_error"] <= 1e-6, result
        for kind in ("full", "lora"):
            assert result[kind] == {"equal_at_start": True, "unchanged_after_steps": True, "policy_moved": True}
