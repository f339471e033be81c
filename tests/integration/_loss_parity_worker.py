"""One side of the loss-parity differential (tests/integration/test_loss_parity.py), run in a process of its own.

    python _loss_parity_worker.py {hf|dsbuild|hand} DATA OUT --accumulation N [--processes P]

``hf``: the HF Trainer on DeepSpeed (1 process); ``dsbuild``: ``Session.fit`` (under torchrun for several
processes, each reading its own contiguous share); ``hand``: the same optimizer steps computed with plain torch,
no DeepSpeed: every trained token of the step over every process weighs the same, then AdamW after clipping.
Each writes ``OUT/result.json`` (the logged losses) and ``OUT/weights.pt`` (every weight after the last step).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

os.environ.setdefault("DS_ACCELERATOR", "cpu")

import torch

MICRO = 2
STEPS = 3
LR = 1e-3
CLIP = 1.0


def ds_config(accumulation: int, processes: int) -> dict[str, Any]:
    return {
        "train_micro_batch_size_per_gpu": MICRO,
        "gradient_accumulation_steps": accumulation,
        "train_batch_size": MICRO * accumulation * processes,
        "gradient_clipping": CLIP,
        "optimizer": {"type": "AdamW", "params": {"lr": LR, "weight_decay": 0.0, "torch_adam": True}},
        "zero_optimization": {"stage": 2},
        "steps_per_print": 1000,
    }


def model() -> Any:
    from transformers import AutoModelForCausalLM, LlamaConfig

    torch.manual_seed(0)
    config = LlamaConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        vocab_size=384,
        max_position_embeddings=256,
    )
    return AutoModelForCausalLM.from_config(config, attn_implementation="eager")


def samples(data: Path) -> list[dict[str, list[int]]]:
    return json.loads(data.read_text())


def collate(batch: list[dict[str, list[int]]]) -> dict[str, Any]:
    from dsbuild.data import collate as pad

    return pad(batch, pad_token_id=0)


def save(out: Path, losses: list[float], weights: dict[str, Any]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    torch.save({k: v.detach().float().cpu().clone() for k, v in weights.items()}, out / "weights.pt")
    (out / "result.json").write_text(json.dumps({"losses": losses}))


def run_hf(data: Path, out: Path, accumulation: int) -> None:
    from transformers import Trainer, TrainingArguments

    from dsbuild.session.distributed import free_port

    for key, value in {"MASTER_ADDR": "127.0.0.1", "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1"}.items():
        os.environ.setdefault(key, value)
    os.environ.setdefault("MASTER_PORT", str(free_port()))  # a port of its own: another test may run beside it
    config_path = out / "ds_config.json"
    out.mkdir(parents=True, exist_ok=True)
    config_path.write_text(json.dumps(ds_config(accumulation, 1)))
    args = TrainingArguments(
        output_dir=str(out / "hf"),
        deepspeed=str(config_path),
        per_device_train_batch_size=MICRO,
        gradient_accumulation_steps=accumulation,
        learning_rate=LR,
        weight_decay=0.0,
        max_grad_norm=CLIP,
        lr_scheduler_type="constant",
        max_steps=STEPS,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        seed=0,
        train_sampling_strategy="sequential",
    )
    trainer = Trainer(model=model(), args=args, train_dataset=samples(data), data_collator=collate)
    trainer.train()
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    save(out, losses, dict(trainer.model.named_parameters()))


def run_dsbuild(data: Path, out: Path, accumulation: int, processes: int) -> None:
    from torch.utils.data import DataLoader

    from dsbuild import Session, Training

    rank = int(os.environ.get("RANK", "0"))
    every = samples(data)
    share = len(every) // processes
    mine = every[rank * share : (rank + 1) * share]  # contiguous shares: the hand computation reads the same
    training = Training(
        per_device_train_batch_size=MICRO,
        gradient_accumulation_steps=accumulation,
        learning_rate=LR,
        weight_decay=0.0,
        max_grad_norm=CLIP,
        lr_scheduler_type="constant",
        max_steps=STEPS,
        seed=0,
    )
    session = Session(model(), ds_config(accumulation, processes), training=training)
    history = session.fit(DataLoader(mine, batch_size=MICRO, shuffle=False, collate_fn=collate))
    losses = [r["loss"] for r in history if "loss" in r]
    if rank == 0:
        save(out, losses, dict(session.model.named_parameters()))


def run_hand(data: Path, out: Path, accumulation: int, processes: int) -> None:
    """The optimizer steps by hand: each process's share in micro-batches of MICRO, ``accumulation`` of them per
    step on every process; the step's loss is every trained token's loss over all of them, averaged."""
    net = model()
    net.train()
    optimizer = torch.optim.AdamW(net.parameters(), lr=LR, weight_decay=0.0)
    every = samples(data)
    share = len(every) // processes
    shares = [every[r * share : (r + 1) * share] for r in range(processes)]
    losses = []
    for step in range(STEPS):
        batches = [
            collate(part[(step * accumulation + i) * MICRO : (step * accumulation + i + 1) * MICRO])
            for part in shares
            for i in range(accumulation)
        ]
        tokens = sum(int(b["labels"][..., 1:].ne(-100).sum()) for b in batches)
        optimizer.zero_grad()
        total = 0.0
        for b in batches:
            logits = net(input_ids=b["input_ids"], attention_mask=b["attention_mask"]).logits
            summed = torch.nn.functional.cross_entropy(
                logits[:, :-1].reshape(-1, logits.shape[-1]).float(),
                b["labels"][:, 1:].reshape(-1),
                ignore_index=-100,
                reduction="sum",
            )
            (summed / tokens).backward()
            total += float(summed.detach()) / tokens
        torch.nn.utils.clip_grad_norm_(net.parameters(), CLIP)
        optimizer.step()
        losses.append(total)
    save(out, losses, dict(net.named_parameters()))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("side", choices=["hf", "dsbuild", "hand"])
    parser.add_argument("data", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--accumulation", type=int, required=True)
    parser.add_argument("--processes", type=int, default=1)
    args = parser.parse_args()
    if args.side == "hf":
        run_hf(args.data, args.out, args.accumulation)
    elif args.side == "dsbuild":
        run_dsbuild(args.data, args.out, args.accumulation, args.processes)
    else:
        run_hand(args.data, args.out, args.accumulation, args.processes)


if __name__ == "__main__":
    main()
    from dsbuild.session.distributed import close_gloo

    close_gloo()  # the group the HF Trainer made, before the interpreter's finalization (where gloo can abort)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # and no finalization at all: the result is written; an abort there would fail the test
