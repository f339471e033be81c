"""GRPO in your own loop: generation from the policy under ZeRO-3, rewards, group advantages and TRL's GRPO loss.

Run: python examples/grpo_loop.py [--iterations 3] [--out out/grpo_loop]
     torchrun --nproc_per_node 2 examples/grpo_loop.py      (ZeRO-3 over 2 processes; each generates alone, gathered)

No GPU and no download needed: a tiny random Llama built from its config, the byte-level ByT5 tokenizer. Each
iteration samples ``G`` completions per prompt inside ``session.gathered()`` (ZeRO-3's weights whole, no gather per
token), scores them with a reward function (here: how close a completion's length is to 8 characters), turns the
rewards into advantages within each prompt's group (``group_advantages``, TRL's ``scale_rewards="group"``), scores
the completions under the policy as it generated them (the "old" log-probs) and under the frozen reference, and
takes optimizer steps on TRL's loss (``grpo_loss``: ``loss_type="dapo"``, ``beta`` > 0 for the KL term). The numbers
TRL logs (``reward``, ``kl``, ``clip_ratio/region_mean``, ...) come back from each step.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import Any

import torch
from transformers import ByT5Tokenizer, LlamaConfig

from dsbuild import Config, Session, Training
from dsbuild.rl import group_advantages, grpo_loss

PROMPTS = ["Name a colour:", "Say a number:", "One word for happy:", "A fruit:"]
G = 4  # completions per prompt (TRL's num_generations)
NEW_TOKENS = 12
BETA = 0.04

MODEL = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=4, vocab_size=384, max_position_embeddings=128)  # fmt: skip


def reward(completion: str) -> float:
    """The reward of one completion: 1 at 8 characters, less the further its length is from 8."""
    return -abs(len(completion.strip()) - 8) / 8


def prompt_batch(tokenizer: Any, prompts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    """The prompts, each repeated G times, left-padded (a decoder continues from the last position)."""
    tokenizer.padding_side = "left"
    enc = tokenizer([p for p in prompts for _ in range(G)], padding=True, return_tensors="pt")
    return enc["input_ids"], enc["attention_mask"]


def rollout(policy: Session, reference: Any, ids: torch.Tensor, mask: torch.Tensor) -> dict[str, torch.Tensor]:
    """Sample completions, score them, and everything the loss needs of them."""
    torch.manual_seed(policy.global_step)  # the same samples on a rerun
    with policy.gathered():
        out = policy.generate(ids, mask, max_new_tokens=NEW_TOKENS, do_sample=True, temperature=1.0, top_k=0,
                              pad_token_id=0, eos_token_id=policy.tokenizer.eos_token_id)  # fmt: skip
    completion = out[:, ids.shape[1] :]
    eos = (completion == policy.tokenizer.eos_token_id).int()
    ended = eos.cumsum(dim=1) - eos > 0  # tokens after the first EOS are not part of the completion
    completion_mask = (~ended).int()
    texts = policy.tokenizer.batch_decode(completion.masked_fill(ended, 0), skip_special_tokens=True)
    rewards = torch.tensor([reward(t) for t in texts])
    batch = {
        "input_ids": out,
        "attention_mask": torch.cat([mask, completion_mask], dim=1),
        "completion_mask": torch.cat([torch.zeros_like(mask), completion_mask], dim=1),
    }
    with torch.no_grad():
        batch["old_logps"] = policy.logprobs(batch, completion_mask=batch["completion_mask"])
        batch["ref_logps"] = reference.logprobs(batch, completion_mask=batch["completion_mask"])
    batch["advantages"] = group_advantages(rewards, G, scale_rewards="group")
    batch["rewards"] = rewards
    return batch


def grpo_step(policy: Session) -> Any:
    """The ``loss_fn`` of one batch of completions: TRL's GRPO loss, with TRL's metrics beside it."""

    def loss_fn(_engine: Any, batch: dict[str, torch.Tensor]) -> dict[str, Any]:
        mask = batch["completion_mask"]
        logps = policy.logprobs(batch, completion_mask=mask)
        out = grpo_loss(logps, batch["old_logps"], batch["advantages"], mask.float(),
                        ref_per_token_logps=batch["ref_logps"], beta=BETA, loss_type="dapo")  # fmt: skip
        return {"loss": out.loss, **out.metrics(), "reward": batch["rewards"].mean()}

    return loss_fn


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=3, help="generation batches, one optimizer step each")
    parser.add_argument("--out", type=Path, default=Path("out/grpo_loop"))
    args = parser.parse_args()

    config = Config.zero(3).adamw(lr=1e-3, weight_decay=0.0).batch(micro=len(PROMPTS) * G, grad_accum=1)
    policy = Session.from_pretrained(MODEL, config, training=Training(seed=0), tokenizer=ByT5Tokenizer(),
                                     output_dir=args.out)  # fmt: skip
    reference = policy.reference()  # the starting weights, frozen (only needed because beta > 0)
    ids, mask = prompt_batch(policy.tokenizer, PROMPTS)
    first_kl = None
    for _ in range(args.iterations):
        batch = rollout(policy, reference, ids, mask)
        out = policy.step(batch, loss_fn=grpo_step(policy))
        m = out.metrics
        first_kl = m["kl"] if first_kl is None else first_kl
        if policy.is_main_process:
            print(f"  step {out.global_step}: loss {out.loss:+.4f}  reward {m['reward']:+.3f}  kl {m['kl']:.2e}  "
                  f"clip {m['clip_ratio/region_mean']:.3f}")  # fmt: skip
    if policy.is_main_process:
        print(f"kl to the reference at step 1 (policy = reference): {first_kl:.1e}")
        if first_kl is None or not math.isfinite(first_kl) or abs(first_kl) > 1e-6:
            raise SystemExit(1)


if __name__ == "__main__":
    main()
