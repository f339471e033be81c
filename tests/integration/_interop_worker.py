"""A user's training script, run by the interop tests on a ds_config dsbuild exported.

    accelerate launch --config_file accel.yaml tests/integration/_interop_worker.py loop OUT TRAINING_JSON
    accelerate launch --config_file accel.yaml tests/integration/_interop_worker.py trainer OUT TRAINING_JSON
    python tests/integration/_interop_worker.py trainer OUT TRAINING_JSON --deepspeed ds_config.json

``loop`` is a plain Accelerate loop (``DummyOptim`` / ``DummyScheduler``: DeepSpeed builds the optimizer and
schedule from the ds_config); ``trainer`` is the HF Trainer with the same training arguments. Either trains a
tiny Llama built from its config for ``max_steps`` steps and writes ``OUT/result.json``: the losses, whether
the weights changed, and the ds_config the engine ran with (every ``"auto"`` filled by then).
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
from _session_common import TokenData, tiny_llama
from transformers import AutoModelForCausalLM


def loop(training: dict[str, Any]) -> dict[str, Any]:
    """The plain loop: the values the script decides (batch size, lr, steps) go where Accelerate reads them."""
    from accelerate import Accelerator
    from accelerate.utils import DummyOptim, DummyScheduler
    from torch.utils.data import DataLoader

    accelerator = Accelerator()
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(tiny_llama())
    before = [p.detach().clone() for p in model.parameters()]
    loader = DataLoader(TokenData(24), batch_size=training["per_device_train_batch_size"])
    optimizer = DummyOptim(model.parameters(), lr=training["learning_rate"])
    scheduler = DummyScheduler(
        optimizer, total_num_steps=training["max_steps"], warmup_num_steps=training["warmup_steps"]
    )
    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
    losses = []
    for step, batch in enumerate(loader):
        if step == training["max_steps"]:
            break
        loss = model(**batch).loss
        accelerator.backward(loss)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    after = list(accelerator.unwrap_model(model).parameters())
    return {"losses": losses, "changed": _changed(before, after), "engine": type(model).__name__,
            "config": model.config}  # fmt: skip


def trainer(training: dict[str, Any], deepspeed: str | None, out: Path) -> dict[str, Any]:
    """The HF Trainer: it fills what it fills from these arguments, and checks the rest against them."""
    from transformers import Trainer, TrainingArguments

    args = TrainingArguments(
        output_dir=str(out),
        deepspeed=deepspeed,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        seed=0,
        **training,
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(tiny_llama())
    before = [p.detach().clone() for p in model.parameters()]
    hf = Trainer(model=model, args=args, train_dataset=TokenData(24))
    result = hf.train()
    engine = hf.model_wrapped
    return {
        "losses": [h["loss"] for h in hf.state.log_history if "loss" in h],
        "steps": result.global_step,
        "changed": _changed(before, list(hf.model.parameters())),
        "engine": type(engine).__name__,
        "config": engine.config,
    }


def _changed(before: list[torch.Tensor], after: list[torch.nn.Parameter]) -> bool:
    """Every parameter tensor moved (ZeRO-2 keeps each whole in the one process)."""
    return all(not torch.equal(b, a.detach()) for b, a in zip(before, after, strict=True))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["loop", "trainer"])
    parser.add_argument("out", type=Path)
    parser.add_argument("training", type=json.loads, help="the training arguments, as JSON")
    parser.add_argument("--deepspeed", help="TrainingArguments(deepspeed=...) (trainer)")
    args = parser.parse_args()
    result = loop(args.training) if args.mode == "loop" else trainer(args.training, args.deepspeed, args.out)
    # DeepSpeed's steps_per_print is Accelerate's float("inf"): JSON writes it as Infinity, which json reads back.
    (args.out / "result.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main()
    from dsbuild.session.distributed import close_gloo

    close_gloo()  # the group the HF Trainer made, before the interpreter's finalization (where gloo can abort)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # and no finalization at all: the result is written; an abort there would fail the test
