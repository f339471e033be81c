"""TRL's side of test_grpo_trl.py's differential, in a process of its own:

    python _grpo_worker.py BASE OUT --ds-config C --loss-types T [T ...] [--beta B] [--micro M --accumulation A]
                           [--num-iterations I] [--steps-per-generation S | --generation-batch-size N] [--in-order]
    python _grpo_worker.py jobs JOB [JOB ...]       dsbuild's side: each job as dsbuild train runs it, in turn

TRL 1.16's ``GRPOTrainer`` on DeepSpeed with dsbuild's resolved config, the model loaded from ``BASE``, the prompts
of ``PROMPTS``, the fixed completions of ``_grpo_functions.complete`` as its ``rollout_func`` and
``_grpo_functions.reward``: 3 steps of 4 completions × accumulation 2 (num_generations 4), fp32; one trainer per
loss type, one after another. ``--in-order`` cuts each generation batch into its micro-batches in order, as dsbuild
does (TRL shuffles it first with the global RNG, which the two sides do not share). Writes ``OUT/T/result.json`` (the step records) and ``OUT/T/weights.pt`` (every weight
after the last step, gathered).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

os.environ.setdefault("DS_ACCELERATOR", "cpu")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

import torch

from dsbuild.session.distributed import free_port

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _grpo_functions

STEPS, MICRO, ACCUMULATION, LR, GENERATIONS, MAX_COMPLETION = 3, 4, 2, 1e-5, 4, 16
PROMPTS = [{"prompt": p, "target": t} for p, t in (("Name a colour:", 4), ("Say a number:", 3), ("One word for happy:", 5),
           ("A fruit:", 5), ("A city:", 6), ("An animal:", 3), ("A planet:", 4), ("A tool:", 6))]  # fmt: skip
NAMES = ("loss", "grad_norm", "kl", "reward", "reward_std", "frac_reward_zero_std", "clip_ratio/low_mean",
         "clip_ratio/high_mean", "clip_ratio/region_mean", "clip_ratio/low_min", "clip_ratio/high_max",
         "completions/mean_length", "completions/min_length", "completions/max_length", "completions/clipped_ratio",
         "completions/mean_terminated_length", "completions/min_terminated_length",
         "completions/max_terminated_length", "num_tokens", "entropy", "rewards/reward/mean",
         "rewards/reward/std")  # fmt: skip


def _gathered(model: Any) -> dict[str, torch.Tensor]:
    import deepspeed

    params = dict(model.named_parameters())
    with deepspeed.zero.GatheredParameters(list(params.values())):
        return {k: v.detach().float().cpu().clone() for k, v in params.items()}


def run_trl(
    base: Path,
    out: Path,
    ds_config: Path,
    loss_type: str,
    beta: float,
    micro: int = MICRO,
    accumulation: int = ACCUMULATION,
    passes: dict[str, Any] | None = None,
) -> None:
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, ByT5Tokenizer
    from trl import GRPOConfig, GRPOTrainer

    for key, value in {"MASTER_ADDR": "127.0.0.1", "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1"}.items():
        os.environ.setdefault(key, value)
    os.environ.setdefault("MASTER_PORT", str(free_port()))
    more = {"num_generations": GENERATIONS, "max_completion_length": MAX_COMPLETION, **(passes or {})}
    args = GRPOConfig(
        output_dir=str(out / "trl"), deepspeed=str(ds_config), per_device_train_batch_size=micro,
        gradient_accumulation_steps=accumulation, learning_rate=LR, weight_decay=0.0, lr_scheduler_type="constant",
        max_steps=STEPS, logging_steps=1, save_strategy="no", report_to=[], use_cpu=True, seed=0,
        loss_type=loss_type, beta=beta, **more,
    )  # fmt: skip
    tokenizer = ByT5Tokenizer()
    trainer = GRPOTrainer(
        model=AutoModelForCausalLM.from_pretrained(base), reward_funcs=[_grpo_functions.reward], args=args,
        train_dataset=Dataset.from_list(PROMPTS), processing_class=tokenizer,
        rollout_func=_grpo_functions.trl_rollout(tokenizer),
    )  # fmt: skip
    trainer.train()
    records = [h for h in trainer.state.log_history if "loss" in h]
    out.mkdir(parents=True, exist_ok=True)
    torch.save(_gathered(trainer.model), out / "weights.pt")
    kept = [{name: float(r[name]) for name in NAMES if r.get(name) is not None} for r in records]
    (out / "result.json").write_text(json.dumps({"records": kept}))


def run_jobs(jobs: list[Path]) -> None:
    """dsbuild's side: each job as ``dsbuild train`` runs it on one process (``run.worker.run``), one after another."""
    from dsbuild.job import load_job
    from dsbuild.run.worker import run

    for path in jobs:
        run(load_job(path))


def main() -> None:
    if sys.argv[1] == "jobs":
        run_jobs([Path(p) for p in sys.argv[2:]])
        return _leave()
    parser = argparse.ArgumentParser()
    parser.add_argument("base", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--ds-config", type=Path, required=True)
    parser.add_argument("--loss-types", nargs="+", default=["dapo"])
    parser.add_argument("--beta", type=float, default=0.0)
    parser.add_argument("--micro", type=int, default=MICRO)
    parser.add_argument("--accumulation", type=int, default=ACCUMULATION)
    parser.add_argument("--num-iterations", type=int, default=1)
    parser.add_argument("--steps-per-generation", type=int)
    parser.add_argument("--generation-batch-size", type=int)
    parser.add_argument("--in-order", action="store_true", help="cut each generation batch in order, as dsbuild")
    parser.add_argument("--config", type=json.loads, default={}, help="more GRPOConfig keys, a JSON object")
    args = parser.parse_args()
    passes = {"num_iterations": args.num_iterations, "steps_per_generation": args.steps_per_generation,
              "generation_batch_size": args.generation_batch_size, **args.config}  # fmt: skip
    if args.in_order:
        import trl.trainer.grpo_trainer

        trl.trainer.grpo_trainer.shuffle_sequence_dict = lambda batch: batch  # type: ignore[attr-defined]
    for loss_type in args.loss_types:
        run_trl(args.base, args.out / loss_type, args.ds_config, loss_type, args.beta, args.micro, args.accumulation,
                passes)  # fmt: skip
    _leave()


def _leave() -> None:
    from dsbuild.session import distributed

    distributed.close_gloo()  # before the interpreter's finalization, where gloo can abort ("terminate called ...")
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # and no finalization at all: the result is written; an abort there would fail the test


if __name__ == "__main__":
    main()
