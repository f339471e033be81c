"""A GRPO job by `dsbuild train` against TRL's `GRPOTrainer` on DeepSpeed: whole-process wall time and peak memory.

Both runs train the same tiny Llama (built from its config, seed 0) on the same prompts with the same ds_config
(ZeRO-3; the job's, exported with `dsbuild export JOB --for hf`), for 6 optimizer steps on one process (8
completions × accumulation 2, 4 per prompt, no KL term), and save at the end. The completions are fixed (a rollout
function of the prompts: `rollout.backend = "function"`, TRL's `rollout_func`) and the reward is deterministic, so
both trainers do the same work and differ only in how they do it. TRL is launched the usual way, `torchrun
--nproc_per_node 1`. Runs alternate (dsbuild, TRL, dsbuild, ...); the figures are medians; the ratios dsbuild / TRL
are taken within the same session. Peak memory is the largest process of each run's tree (`ru_maxrss`).

    .venv/bin/python benchmarks/bench_grpo.py --rounds 5 [--json benchmarks/results/grpo.json]

With ``--sampling`` both sample instead (issue 42): dsbuild's policy generates under ZeRO-3 (``rollout.backend =
"hf"``, the model gathered whole on the rank to generate, ``ds3_gather_for_generation``'s default), TRL's
``GRPOTrainer`` without a ``rollout_func`` (its own ``generate`` under DeepSpeed ZeRO-3, the same default); the same
``max_completion_length`` (32), temperature 1, top-p 1. The completions differ (each samples its own), but a tiny
random model almost never samples EOS (1 in 384 per token), so both generate nearly every completion to its full
length: the same work within a few tokens.

    .venv/bin/python benchmarks/bench_grpo.py --sampling --rounds 5 [--json benchmarks/results/grpo_sampling.json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_startup import MODEL, alternate

os.environ.setdefault("DS_ACCELERATOR", "cpu")

STEPS = 6
PROMPTS = [{"prompt": f"{a} + {b} =", "answer": str(a + b)} for a in range(6) for b in range(8)]

FUNCTIONS = '''\
import hashlib


def complete(prompts):
    """Each prompt's k-th completion in the call: 4 to 19 byte tokens, every other one ending with EOS."""
    seen, out = {}, []
    for prompt in prompts:
        seen[prompt] = seen.get(prompt, -1) + 1
        digest = hashlib.sha256(f"{prompt}/{seen[prompt]}".encode()).digest()
        ids = [35 + b % 96 for b in digest[1 : 5 + digest[0] % 16]]
        out.append(ids[:-1] + [1] if digest[-1] % 2 else ids)
    return out


def reward(completions, answer, **_):
    return [float(a in c) - abs(len(c) - 8) / 8 for c, a in zip(completions, answer)]


def trl_rollout(tokenizer):
    def rollout(prompts, _trainer):
        return {"prompt_ids": tokenizer(text=prompts)["input_ids"], "completion_ids": complete(prompts), "logprobs": None}

    return rollout
'''

JOB = """\
task = "grpo"
[model]
tokenizer = "byte"
[model.config]
{model}
[data]
path = "prompts.jsonl"
format = "prompt"
[rollout]
backend = "function"
function = "bench_functions:complete"
[rewards]
functions = ["bench_functions:reward"]
[grpo]
num_generations = 4
max_completion_length = 32
[training]
per_device_train_batch_size = 8
gradient_accumulation_steps = 2
learning_rate = 1e-4
lr_scheduler_type = "constant"
max_steps = {steps}
logging_steps = 1
save_steps = {steps}
seed = 0
[strategy]
name = "deepspeed_train"
config = "zero3"
"""

TRL_SCRIPT = """\
import json, os, sys
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
import torch
from datasets import Dataset
from transformers import AutoModelForCausalLM, ByT5Tokenizer, LlamaConfig
from trl import GRPOConfig, GRPOTrainer

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, here)
import bench_functions

config = {model}
config.pop("model_type")
torch.manual_seed(0)
model = AutoModelForCausalLM.from_config(LlamaConfig(**config))
with open(os.path.join(here, "prompts.jsonl")) as f:
    prompts = [json.loads(line) for line in f if line.strip()]
args = GRPOConfig(output_dir=sys.argv[1], deepspeed=os.path.join(here, "ds_config.json"), per_device_train_batch_size=8,
                  gradient_accumulation_steps=2, learning_rate=1e-4, lr_scheduler_type="constant", max_steps={steps},
                  logging_steps=1, save_strategy="steps", save_steps={steps}, report_to=[], seed=0,
                  num_generations=4, max_completion_length=32, use_cpu=not torch.cuda.is_available())
tokenizer = ByT5Tokenizer()
GRPOTrainer(model=model, reward_funcs=[bench_functions.reward], args=args, processing_class=tokenizer,
            train_dataset=Dataset.from_list(prompts), rollout_func=bench_functions.trl_rollout(tokenizer)).train()
"""


def setup(root: Path, *, sampling: bool = False) -> None:
    model_toml = "\n".join(f"{k} = {json.dumps(v)}" for k, v in MODEL.items())
    job, script = JOB.format(model=model_toml, steps=STEPS), TRL_SCRIPT.format(model=repr(MODEL), steps=STEPS)
    if sampling:  # each samples its own completions: the policy's generate, under ZeRO-3
        job = job.replace('backend = "function"\nfunction = "bench_functions:complete"', 'backend = "hf"')
        script = script.replace(", rollout_func=bench_functions.trl_rollout(tokenizer)", "")
    (root / "job.toml").write_text(job)
    (root / "prompts.jsonl").write_text("".join(json.dumps(p) + "\n" for p in PROMPTS))
    (root / "bench_functions.py").write_text(FUNCTIONS)
    (root / "trl_train.py").write_text(script)
    dsbuild = str(Path(sys.executable).with_name("dsbuild"))
    subprocess.run(
        [dsbuild, "export", str(root / "job.toml"), "--for", "hf", "-o", str(root / "ds_config.json")], check=True
    )


def whole_runs(root: Path, rounds: int) -> dict[str, Any]:
    python = sys.executable
    dsbuild = str(Path(python).with_name("dsbuild"))
    commands = {
        "dsbuild train": lambda i: [dsbuild, "train", "job.toml", f"--set=training.output_dir='out/ds{i}'"],
        "TRL GRPOTrainer (torchrun)": lambda i: [
            python, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "1", "trl_train.py",
            f"out/trl{i}",
        ],
    }  # fmt: skip
    samples, medians = alternate(commands, root, rounds)
    return {"samples": samples, "medians": medians}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", type=Path, help="write the samples and medians here")
    parser.add_argument("--sampling", action="store_true", help="both sample their completions (the policy's generate)")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="bench_grpo_"))
    setup(root, sampling=args.sampling)
    runs = whole_runs(root, args.rounds)
    medians = runs["medians"]
    ds, trl = medians["dsbuild train"], medians["TRL GRPOTrainer (torchrun)"]
    print()
    for name, m in medians.items():
        print(f"{name:<30} median {m['wall']:.2f} s   peak {m['peak_mib']:.0f} MiB")
    print(f"dsbuild / TRL: time {ds['wall'] / trl['wall']:.2f}x, peak memory {ds['peak_mib'] / trl['peak_mib']:.2f}x")
    if args.json:
        args.json.write_text(json.dumps({"rounds": args.rounds, **runs}, indent=1))
    stamp = time.strftime("%Y-%m-%d")
    print(f"({stamp}, {os.cpu_count()} CPUs, {args.rounds} alternating rounds, work dir {root})")


if __name__ == "__main__":
    main()
