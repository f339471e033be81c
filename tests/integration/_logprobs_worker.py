"""One rank of test_logprobs.py's ZeRO-3 run (torchrun, 2 processes): log-probs against the unsharded model, and the
reference (full and LoRA) against the policy; writes ``rank{N}.json`` into the folder given."""

from __future__ import annotations

import os

os.environ.setdefault("DS_ACCELERATOR", "cpu")

import json
import sys
from pathlib import Path
from typing import Any

import deepspeed
import torch
from _session_common import VOCAB, tiny_llama
from transformers import AutoModelForCausalLM

from dsbuild import Config, Training
from dsbuild.session import Session

LORA = {"r": 4, "lora_alpha": 8, "lora_dropout": 0.0, "target_modules": ["q_proj", "v_proj"]}
SEED = 7


def _policy(lora: Any = None) -> Session:
    return Session.from_pretrained(
        tiny_llama(), Config.zero(3).adamw(lr=1e-2).batch(micro=2), Training(seed=SEED), lora=lora
    )


def _ragged() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(5)
    ids = torch.randint(3, VOCAB, (3, 10), generator=g)
    attention = torch.tensor([[0, 0, 0, 1, 1, 1, 1, 1, 1, 1], [1] * 10, [0] * 6 + [1] * 4])
    return {"input_ids": ids.masked_fill(attention == 0, 0), "attention_mask": attention}


def _logprobs_error() -> float:
    """The largest difference between the ZeRO-3 policy's log-probs and the unsharded model's (its weights gathered
    into a plain model), over temperatures 1 and 0.7, one row per forward."""
    policy = _policy()
    policy.infer_batch_size = 1
    plain = AutoModelForCausalLM.from_config(tiny_llama()).eval()
    with deepspeed.zero.GatheredParameters(list(policy.model.parameters())):
        plain.load_state_dict({k: v.detach().clone() for k, v in policy.model.state_dict().items()})
    batch = _ragged()
    worst = 0.0
    for temperature in (1.0, 0.7):
        with torch.no_grad():
            ours = policy.logprobs(batch, temperature=temperature)
            logits = plain(**batch).logits[:, :-1].float() / temperature
        expected = torch.log_softmax(logits, -1).gather(-1, batch["input_ids"][:, 1:, None]).squeeze(-1)
        mask = batch["attention_mask"][:, 1:].bool()
        worst = max(worst, float((ours[:, 1:][mask] - expected[mask]).abs().max()))
    return worst


def _reference(lora: Any) -> dict[str, bool]:
    policy = _policy(lora)
    reference = policy.reference()
    batch = _ragged()
    with torch.no_grad():
        start = policy.logprobs(batch)
    before = reference.logprobs(batch)
    labelled = {**batch, "labels": batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100)}
    for _ in range(2):
        policy.step({k: v[:2] for k, v in labelled.items()})
    with torch.no_grad():
        moved = policy.logprobs(batch)
    return {
        "equal_at_start": torch.equal(before, start),
        "unchanged_after_steps": torch.equal(reference.logprobs(batch), before),
        "policy_moved": not torch.equal(moved, start),
    }


def main() -> None:
    out = Path(sys.argv[1])
    result = {"logprobs_error": _logprobs_error(), "full": _reference(None), "lora": _reference(LORA)}
    rank = int(os.environ["RANK"])
    (out / f"rank{rank}.json").write_text(json.dumps(result))
    from dsbuild.session import distributed

    distributed.close_gloo()  # before the interpreter's finalization, where gloo can abort ("terminate called ...")
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # and no finalization at all: the result is written; an abort there would fail the test


if __name__ == "__main__":
    main()
