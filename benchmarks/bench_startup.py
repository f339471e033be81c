"""Whole-process wall time and peak memory of a 4-step tiny job: `dsbuild train` against the HF Trainer.

Both train the same tiny Llama (built from its config), on the same text data, with the same ds_config
(the job's, exported with `dsbuild export JOB --for hf`), for 4 optimizer steps on one process, and
save a checkpoint at the end. The HF Trainer is launched the usual way, `torchrun --nproc_per_node 1`;
`dsbuild train` runs a one-process job in its own process. Runs alternate (dsbuild, HF, dsbuild, ...);
the figures are medians, and the ratios dsbuild / HF are taken within the same session.

    .venv/bin/python benchmarks/bench_startup.py --rounds 5 [--json benchmarks/results/startup.json]

The floor: `python -c "import torch, deepspeed, transformers, peft"` is measured too.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

MODEL = {
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "vocab_size": 384,
    "max_position_embeddings": 128,
}
STEPS = 4
BATCH = 8

JOB = """\
[model]
tokenizer = "byte"
[model.config]
{model}
[data]
path = "data.jsonl"
format = "text"
max_length = 64
[training]
per_device_train_batch_size = {batch}
learning_rate = 3e-3
max_steps = {steps}
logging_steps = 1
save_steps = {steps}
seed = 0
[strategy]
name = "deepspeed_train"
config = "zero2"
"""

HF_SCRIPT = """\
import json, os, sys
import torch
from transformers import (AutoModelForCausalLM, ByT5Tokenizer, DataCollatorForLanguageModeling, LlamaConfig, Trainer,
                          TrainingArguments)

here = os.path.dirname(os.path.abspath(__file__))
out = sys.argv[1]
args = TrainingArguments(output_dir=out, deepspeed=os.path.join(here, "ds_config.json"),
                         per_device_train_batch_size={batch}, learning_rate=3e-3, max_steps={steps}, logging_steps=1,
                         save_strategy="steps", save_steps={steps}, report_to=[], seed=0,
                         use_cpu=not torch.cuda.is_available())
config = {model}
config.pop("model_type")
model = AutoModelForCausalLM.from_config(LlamaConfig(**config))
tokenizer = ByT5Tokenizer()
with open(os.path.join(here, "data.jsonl")) as f:
    texts = [json.loads(line)["text"] for line in f if line.strip()]
samples = [tokenizer(t, truncation=True, max_length=64) for t in texts]
collator = DataCollatorForLanguageModeling(tokenizer, mlm=False)
Trainer(model=model, args=args, train_dataset=samples, data_collator=collator).train()
"""

MEASURE = textwrap.dedent(
    """
    import json, resource, subprocess, sys, time
    started = time.perf_counter()
    code = subprocess.call(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wall = time.perf_counter() - started
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024  # KiB -> MiB, largest process of the tree
    print(json.dumps({"code": code, "wall": wall, "peak_mib": peak}))
    """
)


def setup(root: Path) -> None:
    model_toml = "\n".join(f"{k} = {json.dumps(v)}" for k, v in MODEL.items())
    (root / "job.toml").write_text(JOB.format(model=model_toml, batch=BATCH, steps=STEPS))
    lines = [json.dumps({"text": f"{a} plus {b} is {a + b}."}) for a in range(10) for b in range(10)]
    (root / "data.jsonl").write_text("\n".join(lines) + "\n")
    (root / "hf_train.py").write_text(HF_SCRIPT.format(model=repr(MODEL), batch=BATCH, steps=STEPS))
    dsbuild = str(Path(sys.executable).with_name("dsbuild"))
    subprocess.run(
        [dsbuild, "export", str(root / "job.toml"), "--for", "hf", "-o", str(root / "ds_config.json")], check=True
    )


def measure(cmd: list[str], cwd: Path) -> dict[str, float]:
    env = {**os.environ, "DS_ACCELERATOR": "cpu"}
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    done = subprocess.run(
        [sys.executable, "-c", MEASURE, *cmd], cwd=cwd, env=env, capture_output=True, text=True, check=True
    )
    result: dict[str, float] = json.loads(done.stdout)
    if result["code"] != 0:
        raise SystemExit(f"failed: {' '.join(cmd)} (run it by hand in {cwd} to see why)")
    return result


def alternate(
    commands: dict[str, Any], root: Path, rounds: int
) -> tuple[dict[str, list[dict[str, float]]], dict[str, dict[str, float]]]:
    """Each command once to warm up, then ``rounds`` rounds of all of them in turn; the samples and their medians."""
    for make in commands.values():  # warm the page cache and DeepSpeed's op builds once
        measure(make(-1), root)
    samples: dict[str, list[dict[str, float]]] = {name: [] for name in commands}
    for i in range(rounds):
        for name, make in commands.items():
            samples[name].append(measure(make(i), root))
            print(f"round {i + 1}: {name}: {samples[name][-1]['wall']:.2f} s, {samples[name][-1]['peak_mib']:.0f} MiB")
    medians = {
        name: {key: statistics.median(s[key] for s in runs) for key in ("wall", "peak_mib")}
        for name, runs in samples.items()
    }
    return samples, medians


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", type=Path, help="write the samples and medians here")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="bench_startup_"))
    setup(root)
    python = sys.executable
    dsbuild = str(Path(python).with_name("dsbuild"))
    commands = {
        "dsbuild train": lambda i: [dsbuild, "train", "job.toml", f"--set=training.output_dir='out/ds{i}'"],
        "HF Trainer (torchrun)": lambda i: [
            python,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node",
            "1",
            "hf_train.py",
            f"out/hf{i}",
        ],
        "floor: import torch, deepspeed, transformers, peft": lambda i: [
            python,
            "-c",
            "import torch, deepspeed, transformers, peft",
        ],
    }
    samples, medians = alternate(commands, root, args.rounds)
    ds, hf = medians["dsbuild train"], medians["HF Trainer (torchrun)"]
    print()
    for name, m in medians.items():
        print(f"{name:<52} median {m['wall']:.2f} s   peak {m['peak_mib']:.0f} MiB")
    print(f"dsbuild / HF: time {ds['wall'] / hf['wall']:.2f}x, peak memory {ds['peak_mib'] / hf['peak_mib']:.2f}x")
    if args.json:
        args.json.write_text(json.dumps({"rounds": args.rounds, "samples": samples, "medians": medians}, indent=1))
    stamp = time.strftime("%Y-%m-%d")
    print(f"({stamp}, {os.cpu_count()} CPUs, {args.rounds} alternating rounds, work dir {root})")


if __name__ == "__main__":
    main()
