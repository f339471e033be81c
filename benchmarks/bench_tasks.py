"""A reward, RLOO or KTO job by `dsbuild train` against TRL's own trainer on DeepSpeed: whole-process wall time and
peak memory (issue 44: each task ≤ 0.8× TRL's time, ≤ 1.0× its peak memory).

Both runs start from the same tiny Llama (built from its config with seed 0 and saved once: both load it from that
folder, and TRL builds its reference or score head from it as it does for a user's model), the same data and the
same ds_config (ZeRO-3; the job's, exported with `dsbuild export JOB --for hf`), 6 optimizer steps on one process,
a checkpoint at the end. TRL is launched the usual way, `torchrun --nproc_per_node 1`. Runs alternate (dsbuild,
TRL, dsbuild, ...); the figures are medians; the ratios dsbuild / TRL are taken within the same session. Peak memory
is the largest process of each run's tree (`ru_maxrss`).

- ``reward``: TRL's ``RewardTrainer``, the 48 preference pairs of ``bench_dpo.py``, 4 pairs × accumulation 2.
- ``rloo``: TRL's ``RLOOTrainer`` with its defaults (a reference, ``beta`` 0.05), the 48 prompts of
  ``bench_grpo.py``, 8 completions × accumulation 2, 4 per prompt. The completions are fixed (``bench_grpo.py``'s
  function of the prompts: dsbuild's ``rollout.backend = "function"``; TRL's ``RLOOTrainer`` takes no
  ``rollout_func``, so its sampling, ``_generate_single_turn``, is replaced by the same function, everything after it
  TRL's own), so both do the same work.
- ``kto``: TRL's ``KTOTrainer`` (a reference, the KL estimate), the pairs of ``bench_dpo.py`` as 96 labelled
  completions, 4 × accumulation 2.

    .venv/bin/python benchmarks/bench_tasks.py --task reward --rounds 5 [--json benchmarks/results/reward.json]
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

from bench_dpo import PAIRS
from bench_grpo import FUNCTIONS, PROMPTS
from bench_startup import MODEL, alternate

os.environ.setdefault("DS_ACCELERATOR", "cpu")

STEPS = 6

COMMON = """\
[training]
per_device_train_batch_size = {micro}
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

TABLES = {
    "reward": """\
task = "reward"
[model]
name_or_path = "base"
tokenizer = "byte"
[data]
path = "pairs.jsonl"
format = "preference"
[reward]
max_length = 128
""",
    "rloo": """\
task = "rloo"
[model]
name_or_path = "base"
tokenizer = "byte"
[reference]
[data]
path = "prompts.jsonl"
format = "prompt"
[rollout]
backend = "function"
function = "bench_functions:complete"
[rewards]
functions = ["bench_functions:reward"]
[rloo]
num_generations = 4
max_completion_length = 32
""",
    "kto": """\
task = "kto"
[model]
name_or_path = "base"
tokenizer = "byte"
[data]
path = "unpaired.jsonl"
format = "unpaired"
[kto]
max_length = 128
""",
}

MICRO = {"reward": 4, "rloo": 8, "kto": 4}
DATA = {"reward": "pairs.jsonl", "rloo": "prompts.jsonl", "kto": "unpaired.jsonl"}

TRL_SCRIPT = """\
import json, os, sys
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
import torch
from datasets import Dataset
from transformers import ByT5Tokenizer

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, here)
base = os.path.join(here, "base")
with open(os.path.join(here, {data!r})) as f:
    records = [json.loads(line) for line in f if line.strip()]
common = dict(output_dir=sys.argv[1], deepspeed=os.path.join(here, "ds_config.json"), per_device_train_batch_size={micro},
              gradient_accumulation_steps=2, learning_rate=1e-4, lr_scheduler_type="constant", max_steps={steps},
              logging_steps=1, save_strategy="steps", save_steps={steps}, report_to=[], seed=0,
              use_cpu=not torch.cuda.is_available())
tokenizer = ByT5Tokenizer()
dataset = Dataset.from_list(records)
{body}
"""

TRL_BODIES = {
    "reward": """\
from trl import RewardConfig, RewardTrainer
RewardTrainer(model=base, args=RewardConfig(max_length=128, **common), processing_class=tokenizer,
              train_dataset=dataset).train()
""",
    "rloo": """\
from trl import RLOOConfig, RLOOTrainer
import bench_functions

class FixedCompletions(RLOOTrainer):
    def _generate_single_turn(self, prompt_ids, *_):
        return bench_functions.complete(self.processing_class.batch_decode(prompt_ids, skip_special_tokens=True))

FixedCompletions(model=base, reward_funcs=[bench_functions.reward], processing_class=tokenizer, train_dataset=dataset,
                 args=RLOOConfig(num_generations=4, max_completion_length=32, **common)).train()
""",
    "kto": """\
from trl import KTOConfig, KTOTrainer
KTOTrainer(model=base, args=KTOConfig(max_length=128, **common), processing_class=tokenizer,
           train_dataset=dataset).train()
""",
}


def records(task: str) -> list[dict[str, Any]]:
    """The task's data: the pairs, the prompts, or each pair's two sides as labelled completions."""
    if task == "reward":
        return PAIRS
    if task == "rloo":
        return PROMPTS
    return [{"prompt": p["prompt"], "completion": p[side], "label": side == "chosen"}
            for p in PAIRS for side in ("chosen", "rejected")]  # fmt: skip


def save_base(path: Path) -> None:
    """The tiny Llama both runs start from, built from its config with seed 0."""
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    config = dict(MODEL)
    config.pop("model_type")
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(LlamaConfig(**config)).save_pretrained(path)


def setup(root: Path, task: str) -> None:
    micro = MICRO[task]
    (root / "job.toml").write_text(TABLES[task] + COMMON.format(micro=micro, steps=STEPS))
    (root / DATA[task]).write_text("".join(json.dumps(r) + "\n" for r in records(task)))
    (root / "bench_functions.py").write_text(FUNCTIONS)
    script = TRL_SCRIPT.format(data=DATA[task], micro=micro, steps=STEPS, body=TRL_BODIES[task])
    (root / "trl_train.py").write_text(script)
    save_base(root / "base")
    dsbuild = str(Path(sys.executable).with_name("dsbuild"))
    subprocess.run(
        [dsbuild, "export", str(root / "job.toml"), "--for", "hf", "-o", str(root / "ds_config.json")], check=True
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", choices=sorted(TABLES), required=True)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", type=Path, help="write the samples and medians here")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix=f"bench_{args.task}_"))
    setup(root, args.task)
    python = sys.executable
    dsbuild = str(Path(python).with_name("dsbuild"))
    trl = f"TRL {args.task} trainer (torchrun)"
    commands = {
        "dsbuild train": lambda i: [dsbuild, "train", "job.toml", f"--set=training.output_dir='out/ds{i}'"],
        trl: lambda i: [python, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "1",
                        "trl_train.py", f"out/trl{i}"],
    }  # fmt: skip
    samples, medians = alternate(commands, root, args.rounds)
    ours, theirs = medians["dsbuild train"], medians[trl]
    print()
    for name, m in medians.items():
        print(f"{name:<34} median {m['wall']:.2f} s   peak {m['peak_mib']:.0f} MiB")
    print(f"dsbuild / TRL: time {ours['wall'] / theirs['wall']:.2f}x, "
          f"peak memory {ours['peak_mib'] / theirs['peak_mib']:.2f}x")  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps({"task": args.task, "rounds": args.rounds, "samples": samples,
                                         "medians": medians}, indent=1))  # fmt: skip
    stamp = time.strftime("%Y-%m-%d")
    print(f"({stamp}, {os.cpu_count()} CPUs, {args.rounds} alternating rounds, work dir {root})")


if __name__ == "__main__":
    main()
