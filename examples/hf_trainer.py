"""The HF Trainer on DeepSpeed with a config exported by dsbuild (the openMind / HF flow).

Run: python examples/hf_trainer.py [--steps 6] [--stage 3] [--out out/hf_trainer]

The ds_config is written the way you would on the command line:

    dsbuild export zero3 --for hf -o ds_config.json

``--for hf`` sets every value the Trainer fills from its ``TrainingArguments`` to
``"auto"`` (batch sizes, clipping, optimizer and scheduler values, precision, the
stage-3 buckets), so the file and the arguments cannot disagree. The Trainer then
trains a tiny Llama built from its config on dsbuild's bundled arithmetic data,
with the byte-level tokenizer: no download, no GPU needed (DeepSpeed runs on
its CPU accelerator there). One process is launched as is; under torchrun the
same script runs on every rank, and the Trainer shards the data over them:

    torchrun --nproc_per_node 2 examples/hf_trainer.py

On CPU that needs one line more than on GPUs: DeepSpeed's process group started
(gloo) before the model is built (see below).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import subprocess
import sys
from pathlib import Path

import deepspeed
import torch
from transformers import AutoModelForCausalLM, ByT5Tokenizer, LlamaConfig, Trainer, TrainingArguments

from dsbuild.data import collate, read_records, tokenize
from dsbuild.job import demo_job_path

ONE_PROCESS = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29517", "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1"}
"""Without a launcher, DeepSpeed still needs a (one-process) distributed environment; a launcher's wins."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=6, help="optimizer steps")
    parser.add_argument("--stage", type=int, default=3, choices=[0, 1, 2, 3], help="ZeRO stage (a packaged preset)")
    parser.add_argument("--out", type=Path, default=Path("out/hf_trainer"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for key, value in ONE_PROCESS.items():
        os.environ.setdefault(key, value)

    # 1. The ds_config, exported for the HF Trainer (the same command you would type).
    ds_config = args.out / "ds_config.json"
    command = [sys.executable, "-m", "dsbuild", "export", f"zero{args.stage}", "--for", "hf", "-o", str(ds_config)]
    subprocess.run(command, check=True)

    # 2. TrainingArguments(deepspeed=...) before the model: at ZeRO-3, from_config / from_pretrained then build
    #    it partitioned (inside deepspeed.zero.Init), never whole in one process.
    training_args = TrainingArguments(
        output_dir=str(args.out),
        deepspeed=str(ds_config),
        per_device_train_batch_size=8,
        gradient_accumulation_steps=1,
        learning_rate=3e-3,
        warmup_steps=2,
        max_steps=args.steps,
        bf16=True,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        use_cpu=not torch.cuda.is_available(),
        seed=0,
    )
    if not torch.cuda.is_available():
        # On CPU the Trainer's process group comes up only when it first asks for its device, after the model is
        # built; at ZeRO-3, zero.Init (inside from_config) would meanwhile read DeepSpeed's world size as 1 and
        # refuse the batch the Trainer filled for 2 processes ("16 != 8 * 1 * 1"). Starting DeepSpeed's process
        # group first (gloo, from torchrun's variables) lets both see every process. On GPUs the Trainer does this.
        deepspeed.init_distributed(dist_backend="gloo")
    model = AutoModelForCausalLM.from_config(
        LlamaConfig(
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=4,
            vocab_size=384,
            max_position_embeddings=64,
        )
    )
    partitioned = all(hasattr(p, "ds_id") for p in model.parameters())

    # 3. Data: the demo job's arithmetic questions, with the loss on the answers only.
    tokenizer = ByT5Tokenizer()
    records = read_records(demo_job_path().parent / "arith_train.jsonl", "alpaca")
    samples = tokenize(records, tokenizer, "alpaca", max_length=64, template="plain").samples

    trainer = Trainer(
        model=model,
        args=training_args,
        train_dataset=samples,
        data_collator=functools.partial(collate, pad_token_id=tokenizer.pad_token_id),
    )
    result = trainer.train()

    engine = trainer.model_wrapped
    used = engine.config if isinstance(engine.config, dict) else {}
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    if trainer.is_world_process_zero():
        print(
            f"{type(engine).__name__}, ZeRO stage {engine.zero_optimization_stage()}, bf16 {engine.bfloat16_enabled()}, "
            f"built partitioned: {partitioned}"
        )
        print(f"processes: {training_args.world_size}, DeepSpeed's data-parallel size: {engine.dp_world_size}")
        print(f"trained {result.global_step} steps: loss {losses[0]:.3f} -> {losses[-1]:.3f}")
        print(f'the Trainer filled every "auto": {"auto" not in json.dumps(used)}')


if __name__ == "__main__":
    main()
