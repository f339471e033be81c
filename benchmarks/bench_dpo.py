"""A DPO job by `dsbuild train` against TRL's `DPOTrainer` on DeepSpeed: whole-process wall time and peak memory;
and the per-token log-probs of one batch: `Session.logprobs` against TRL's `_get_per_token_logps_and_entropies`.

Both runs train the same tiny Llama (built from its config, seed 0) on the same preference pairs, with the same
ds_config (ZeRO-3; the job's, exported with `dsbuild export JOB --for hf`), for 6 optimizer steps on one process
(2 pairs × accumulation 2), a frozen reference scoring each batch, and save at the end. TRL is launched the usual
way, `torchrun --nproc_per_node 1`, given the reference as a second model from the same config and seed. Runs
alternate (dsbuild, TRL, dsbuild, ...); the figures are medians; the ratios dsbuild / TRL are taken within the same
session. Peak memory is the largest process of each run's tree (`ru_maxrss`).

The log-probs: 16 rows of 256 tokens, 4 rows per forward, no gradients, the same model in eval mode; tokens scored
per second, best of `--rounds` alternating timings of each.

    .venv/bin/python benchmarks/bench_dpo.py --rounds 5 [--json benchmarks/results/dpo.json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_startup import MODEL, alternate

os.environ.setdefault("DS_ACCELERATOR", "cpu")

STEPS = 6
PAIRS = [
    {"prompt": f"{a} + {b} =", "chosen": f" {a + b}", "rejected": f" {a + b + 1 + (a * b) % 3} maybe"}
    for a in range(6)
    for b in range(8)
]

JOB = """\
task = "dpo"
[model]
tokenizer = "byte"
[model.config]
{model}
[data]
path = "pairs.jsonl"
format = "preference"
[dpo]
beta = 0.1
max_length = 128
[training]
per_device_train_batch_size = 2
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
import torch
from datasets import Dataset
from transformers import AutoModelForCausalLM, ByT5Tokenizer, LlamaConfig
from trl import DPOConfig, DPOTrainer

here = os.path.dirname(os.path.abspath(__file__))
config = {model}
config.pop("model_type")


def model():
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(LlamaConfig(**config))


with open(os.path.join(here, "pairs.jsonl")) as f:
    pairs = [json.loads(line) for line in f if line.strip()]
args = DPOConfig(output_dir=sys.argv[1], deepspeed=os.path.join(here, "ds_config.json"), per_device_train_batch_size=2,
                 gradient_accumulation_steps=2, learning_rate=1e-4, lr_scheduler_type="constant", max_steps={steps},
                 logging_steps=1, save_strategy="steps", save_steps={steps}, report_to=[], seed=0, beta=0.1,
                 max_length=128, use_cpu=not torch.cuda.is_available())
DPOTrainer(model=model(), ref_model=model(), args=args, processing_class=ByT5Tokenizer(),
           train_dataset=Dataset.from_list(pairs)).train()
"""


def setup(root: Path) -> None:
    model_toml = "\n".join(f"{k} = {json.dumps(v)}" for k, v in MODEL.items())
    (root / "job.toml").write_text(JOB.format(model=model_toml, steps=STEPS))
    (root / "pairs.jsonl").write_text("".join(json.dumps(p) + "\n" for p in PAIRS))
    (root / "trl_train.py").write_text(TRL_SCRIPT.format(model=repr(MODEL), steps=STEPS))
    dsbuild = str(Path(sys.executable).with_name("dsbuild"))
    subprocess.run(
        [dsbuild, "export", str(root / "job.toml"), "--for", "hf", "-o", str(root / "ds_config.json")], check=True
    )


def whole_runs(root: Path, rounds: int) -> dict[str, Any]:
    python = sys.executable
    dsbuild = str(Path(python).with_name("dsbuild"))
    commands = {
        "dsbuild train": lambda i: [dsbuild, "train", "job.toml", f"--set=training.output_dir='out/ds{i}'"],
        "TRL DPOTrainer (torchrun)": lambda i: [
            python, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "1", "trl_train.py",
            f"out/trl{i}",
        ],
    }  # fmt: skip
    samples, medians = alternate(commands, root, rounds)
    return {"samples": samples, "medians": medians}


def logprobs_speed(rounds: int) -> dict[str, float]:
    """Tokens per second of one batch's log-probs: dsbuild's ``token_logps`` against TRL's own function, on the same
    model (the TRL side on a copy carrying its fused log-prob head), best of ``rounds`` alternating timings."""
    import copy

    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig
    from trl.trainer.grpo_trainer import GRPOTrainer
    from trl.trainer.utils import add_fused_lm_head

    from dsbuild.session.logprobs import token_logps

    config = dict(MODEL)
    config.pop("model_type")
    config["max_position_embeddings"] = 512
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(LlamaConfig(**config)).eval()
    trl_model = copy.deepcopy(model)
    add_fused_lm_head(trl_model)
    rows, length, keep, per_forward = 16, 256, 128, 4
    ids = torch.randint(3, 384, (rows, length), generator=torch.Generator().manual_seed(1))
    attention = torch.ones_like(ids)
    completion = torch.cat([torch.zeros(rows, length - keep), torch.ones(rows, keep)], dim=1).long()
    batch = {"input_ids": ids, "attention_mask": attention}
    trainer = SimpleNamespace(accelerator=SimpleNamespace(autocast=contextlib.nullcontext, is_main_process=True))

    def ours() -> None:
        token_logps(model, batch, completion_mask=completion, temperature=1.0, batch_size=per_forward, grad=False,
                    device=torch.device("cpu"))  # fmt: skip

    def theirs() -> None:
        with torch.no_grad():
            GRPOTrainer._get_per_token_logps_and_entropies(trainer, trl_model, ids, attention, keep,
                                                           batch_size=per_forward)  # fmt: skip

    best = {"dsbuild logprobs": float("inf"), "TRL _get_per_token_logps": float("inf")}
    for fn in (ours, theirs):
        fn()  # warm
    for _ in range(rounds):
        for name, fn in (("dsbuild logprobs", ours), ("TRL _get_per_token_logps", theirs)):
            started = time.perf_counter()
            fn()
            best[name] = min(best[name], time.perf_counter() - started)
    return {name: rows * length / seconds for name, seconds in best.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", type=Path, help="write the samples and medians here")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="bench_dpo_"))
    setup(root)
    runs = whole_runs(root, args.rounds)
    speed = logprobs_speed(args.rounds)
    medians = runs["medians"]
    ds, trl = medians["dsbuild train"], medians["TRL DPOTrainer (torchrun)"]
    print()
    for name, m in medians.items():
        print(f"{name:<30} median {m['wall']:.2f} s   peak {m['peak_mib']:.0f} MiB")
    print(f"dsbuild / TRL: time {ds['wall'] / trl['wall']:.2f}x, peak memory {ds['peak_mib'] / trl['peak_mib']:.2f}x")
    for name, tokens in speed.items():
        print(f"{name:<30} {tokens:,.0f} tokens/s")
    ratio = speed["dsbuild logprobs"] / speed["TRL _get_per_token_logps"]
    print(f"log-probs dsbuild / TRL: {ratio:.2f}x tokens/s")
    if args.json:
        args.json.write_text(json.dumps({"rounds": args.rounds, **runs, "logprobs_tokens_per_s": speed}, indent=1))
    stamp = time.strftime("%Y-%m-%d")
    print(f"({stamp}, {os.cpu_count()} CPUs, {args.rounds} alternating rounds, work dir {root})")


if __name__ == "__main__":
    main()
