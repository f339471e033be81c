"""Your own training loop on DeepSpeed: ZeRO-3 + LoRA through dsbuild's Session, checkpoint, resume, export.

Run: python examples/custom_loop.py [--steps 4] [--out out/custom_loop]

No GPU and no download needed: a tiny Llama is built from its config and the
byte-level ByT5 tokenizer needs no files (DeepSpeed falls back to its CPU
accelerator). The run trains ``--steps`` optimizer steps, saving a checkpoint
half-way; a second session resumes from that checkpoint and must reproduce the
second half's losses exactly; its LoRA adapters are exported and loaded back
with peft.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, ByT5Tokenizer, LlamaConfig

from dsbuild import AUTO, Config, Session, Training

TEXTS = [
    "DeepSpeed partitions parameters, gradients and optimizer states across ranks.",
    "ZeRO stage 3 builds the model already partitioned, inside zero.Init.",
    "LoRA trains two small matrices per projection and freezes the rest.",
    "A checkpoint holds the engine, the data position and every RNG state.",
    "Gradient accumulation sums micro-batches before one optimizer step.",
    "Resuming from a checkpoint must reproduce the uninterrupted losses.",
    "The adapters are gathered from their ZeRO-3 partitions before saving.",
    "bf16 keeps the exponent range of fp32 with half the bits.",
]


def batches(tokenizer: Any, micro: int) -> list[dict[str, torch.Tensor]]:
    """The micro-batches, in a fixed order, so micro-batch ``i`` is the same in every run."""
    enc = tokenizer(TEXTS, padding="max_length", max_length=48, truncation=True, return_tensors="pt")
    labels = enc["input_ids"].masked_fill(enc["attention_mask"] == 0, -100)  # no loss on padding
    return [
        {
            "input_ids": enc["input_ids"][i : i + micro],
            "attention_mask": enc["attention_mask"][i : i + micro],
            "labels": labels[i : i + micro],
        }
        for i in range(0, len(TEXTS), micro)
    ]


def train(
    s: Session, data: list[dict[str, torch.Tensor]], until: int, save_at: int | None = None, start: int = 0
) -> list[float]:
    """The custom loop: the step's micro-batches, their trained tokens counted (the HF Trainer's loss weighting),
    one micro-batch per ``s.step``; the engine steps the optimizer at the last one."""
    losses: list[float] = []
    accumulation = s.gradient_accumulation_steps
    micro = start  # where a resumed run picks up in the data: load_checkpoint()["micro_batches"]
    while s.global_step < until:
        group = [data[(micro + i) % len(data)] for i in range(accumulation)]
        micro += accumulation
        n = s.items_in_step(group)  # trained tokens of the step, over every process
        outs = [s.step(batch, num_items_in_batch=n) for batch in group]
        out = outs[-1]
        if out.boundary:  # an optimizer step happened
            losses.append(sum(o.loss for o in outs))  # each micro-batch's share of the step's token mean
            if s.is_main_process:
                print(
                    f"  step {out.global_step}: loss {losses[-1]:.4f}  lr {out.lr:.2e}  grad norm {out.grad_norm or 0:.3f}"
                )
            if out.global_step == save_at:
                tag = s.save_checkpoint()
                if s.is_main_process:
                    print(f"  saved checkpoint {tag}")
    return losses


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=4, help="optimizer steps in all (a checkpoint at half)")
    parser.add_argument("--out", type=Path, default=Path("out/custom_loop"))
    args = parser.parse_args()
    half = max(args.steps // 2, 1)

    model_config = LlamaConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        vocab_size=384,
    )
    # "auto" values are filled from the training arguments, the model's hidden size and the real world size.
    config = (
        Config.zero(3)
        .bf16(enabled=AUTO)
        .adamw(lr=AUTO, weight_decay=AUTO)
        .warmup_decay_lr(min_lr=AUTO, max_lr=AUTO, warmup_steps=AUTO, total_steps=AUTO)
        .batch(micro=AUTO, grad_accum=AUTO)
        .clip_grad(AUTO)
    )
    training = Training(
        learning_rate=3e-3,
        per_device_train_batch_size=2,
        gradient_accumulation_steps=2,
        max_steps=args.steps,
        warmup_steps=1,
        bf16=True,
        seed=0,
    )
    lora = {"r": 8, "lora_alpha": 16, "lora_dropout": 0.05, "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"]}

    def session() -> Session:
        return Session.from_pretrained(
            model_config, config, training=training, lora=lora, gradient_checkpointing=True,
            tokenizer=ByT5Tokenizer(), output_dir=args.out,
        )  # fmt: skip

    s = session()
    data = batches(s.tokenizer, s.micro_batch_size)
    if s.is_main_process:
        print(f"ZeRO-{s.engine.zero_optimization_stage()}, world size {s.world_size}, "
              f"batch {s.config.train_batch_size} = {s.micro_batch_size} x {s.gradient_accumulation_steps} x {s.world_size}")  # fmt: skip
        print(f"uninterrupted run, checkpoint at step {half}:")
    full = train(s, data, args.steps, save_at=half)

    resumed = session()
    position = resumed.load_checkpoint()  # output_dir/checkpoints, the tag in 'latest'
    if resumed.is_main_process:
        print(f"resumed at step {resumed.global_step}, micro-batch {position['micro_batches']}:")
    tail = train(resumed, data, args.steps, start=position["micro_batches"])
    # Equal up to float rounding: DeepSpeed's CPU Adam keeps its bias-correction powers in process-wide
    # state and recomputes them with pow() after a resume (bit-exact on GPUs' fused Adam).
    drift = max(abs(a - b) for a, b in zip(tail, full[half:], strict=True))
    same = len(tail) == len(full[half:]) and drift < 1e-4

    path = resumed.save_model()  # the LoRA adapters, gathered from ZeRO-3, + the tokenizer
    if resumed.is_main_process:
        from peft import PeftModel

        loaded = PeftModel.from_pretrained(AutoModelForCausalLM.from_config(model_config), path)
        trained = sum(int(p.abs().sum() > 0) for n, p in loaded.named_parameters() if "lora_B" in n)
        print(f"resumed losses equal to the uninterrupted run's: {same} (largest difference {drift:.1e})")
        print(f"adapters in {path}: {trained} trained LoRA B matrices loaded with peft")
        if not same or trained == 0:
            raise SystemExit(1)


if __name__ == "__main__":
    main()
