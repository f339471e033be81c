"""DPO in your own loop: a policy Session, its frozen reference, per-token log-probs and TRL's DPO loss.

Run: python examples/dpo_loop.py [--steps 3] [--stage 3] [--out out/dpo_loop]
     torchrun --nproc_per_node 2 examples/dpo_loop.py      (the same loop, each process its share)

No GPU and no download needed: a tiny random Llama is written to ``OUT/base`` first (the starting point the policy
and the reference load), the byte-level ByT5 tokenizer needs no files. Preference pairs (TRL's ``prompt`` /
``chosen`` / ``rejected`` format) are tokenized and collated as TRL's ``DPOTrainer`` does; each micro-batch holds
the chosen rows then the rejected rows; the loss and the metrics it logs (``rewards/*``, ``logps/*``) are TRL's.
At step 0 the policy and the reference are the same model, so the first step's margin is 0 and its loss log 2.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, ByT5Tokenizer, LlamaConfig

from dsbuild import AUTO, Config, Session, Training
from dsbuild.data.preference import collate_pairs, tokenize_pairs
from dsbuild.rl import dpo_loss, pair_logps

PAIRS = [
    {"prompt": "2 + 2 =", "chosen": " 4", "rejected": " 5"},
    {"prompt": "The capital of France is", "chosen": " Paris.", "rejected": " Lyon, I think."},
    {"prompt": "Say hi", "chosen": " hi", "rejected": " no"},
    {"prompt": "Colour of the sky?", "chosen": " Blue on a clear day.", "rejected": " Green"},
    {"prompt": "3 * 3 =", "chosen": " 9", "rejected": " 6"},
    {"prompt": "Opposite of hot:", "chosen": " cold", "rejected": " warm-ish, maybe"},
    {"prompt": "Spell cat backwards:", "chosen": " tac", "rejected": " cat"},
    {"prompt": "Is water wet?", "chosen": " Yes.", "rejected": " Only on Tuesdays."},
    {"prompt": "10 - 7 =", "chosen": " 3", "rejected": " 4"},
    {"prompt": "First letter of the alphabet:", "chosen": " A", "rejected": " Z"},
    {"prompt": "A week has how many days?", "chosen": " Seven.", "rejected": " Five"},
    {"prompt": "Translate 'gracias':", "chosen": " thank you", "rejected": " hello"},
]

MODEL = LlamaConfig(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=4,
    vocab_size=384,
    max_position_embeddings=128,
)


def write_base(path: Path, seed: int = 0) -> Path:
    """A tiny random Llama saved as a model folder: what both the policy and its reference start from."""
    torch.manual_seed(seed)
    AutoModelForCausalLM.from_config(MODEL).save_pretrained(path)
    return path


def pairs(tokenizer: Any) -> list[dict[str, list[int]]]:
    """The pairs as TRL's DPOTrainer tokenizes them: prompt, chosen and rejected token ids (EOS after each answer)."""
    tokenized, dropped = tokenize_pairs(PAIRS, tokenizer, max_length=None)
    assert dropped == 0
    return tokenized


def dpo_loss_fn(policy: Session, reference: Any, beta: float) -> Any:
    """The ``loss_fn`` of one micro-batch ``[chosen rows; rejected rows]``: each completion's log-probability under
    the reference (no gradients) and the policy, then TRL's sigmoid DPO loss and the metrics TRL logs."""

    def loss_fn(_engine: Any, batch: dict[str, torch.Tensor]) -> dict[str, Any]:
        mask = batch["completion_mask"]
        ref_chosen, ref_rejected = pair_logps(reference.logprobs(batch, completion_mask=mask), mask)
        chosen, rejected = pair_logps(policy.logprobs(batch, completion_mask=mask), mask)
        out = dpo_loss(chosen, rejected, ref_chosen, ref_rejected, beta=beta, loss_type="sigmoid")
        return {"loss": out.loss, **out.metrics()}

    return loss_fn


def train(base: Path, *, stage: int, steps: int, micro: int = 2, accumulation: int = 2, lr: float = 1e-3,
          beta: float = 0.1, shuffle: bool = True, out: Path | None = None) -> tuple[Session, list[dict[str, Any]]]:  # fmt: skip
    """``steps`` optimizer steps of DPO from ``base``; returns the policy session and its step records."""
    config = Config.zero(stage).adamw(lr=AUTO, weight_decay=AUTO).batch(micro=AUTO, grad_accum=AUTO).clip_grad(AUTO)
    training = Training(
        learning_rate=lr, weight_decay=0.0, per_device_train_batch_size=micro, gradient_accumulation_steps=accumulation,
        lr_scheduler_type="constant", max_steps=steps, seed=0,
    )  # fmt: skip
    policy = Session.from_pretrained(base, config, training=training, tokenizer=ByT5Tokenizer(), output_dir=out)
    reference = policy.reference()  # the model the policy starts from, frozen; dropout off in both (TRL's default)
    pad = policy.tokenizer.pad_token_id

    def collate(examples: list[dict[str, list[int]]]) -> dict[str, torch.Tensor]:
        return collate_pairs(examples, pad_token_id=pad)  # TRL's DataCollatorForPreference

    data: Any = pairs(policy.tokenizer)
    if not shuffle:  # in file order (what a differential against TRL's "sequential" sampling needs)
        data = policy.data_loader(data, micro, shuffle=False, collate_fn=collate)
    records = policy.fit(data, collate_fn=collate, loss_fn=dpo_loss_fn(policy, reference, beta))
    return policy, [r for r in records if "loss" in r]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3, help="optimizer steps")
    parser.add_argument("--stage", type=int, default=3, choices=[0, 1, 2, 3], help="ZeRO stage of the policy")
    parser.add_argument("--out", type=Path, default=Path("out/dpo_loop"))
    args = parser.parse_args()

    base = args.out / "base"
    if not (base / "config.json").exists():
        write_base(base)
    policy, records = train(base, stage=args.stage, steps=args.steps, out=args.out)
    if policy.is_main_process:
        for r in records:
            print(f"  step {r['step']}: loss {r['loss']:.4f}  margin {r['rewards/margins']:+.4f}  "
                  f"accuracy {r['rewards/accuracies']:.2f}  logps/chosen {r['logps/chosen']:.2f}")  # fmt: skip
        first = records[0]
        print(f"step 1 starts at the reference: loss log 2 = {math.log(2):.4f}, got {first['loss']:.4f}")
        (args.out / "dpo_history.json").write_text(json.dumps(records, indent=1))
        if abs(first["loss"] - math.log(2)) > 1e-5:
            raise SystemExit(1)


if __name__ == "__main__":
    main()
