"""TRL's side of test_rloo_trl.py's differential, in a process of its own:

    python _rloo_worker.py BASE OUT --ds-config C [--micro M --accumulation A] [--option KEY=JSON ...]

TRL 1.16's ``RLOOTrainer`` on DeepSpeed with dsbuild's resolved config, the model loaded from ``BASE``, the prompts of
``_grpo_worker.PROMPTS`` and ``_grpo_functions.reward``: 3 steps, 4 completions per prompt, fp32 (the reference too), lr 1e-5, each
generation batch cut into its micro-batches in order, as dsbuild cuts it (TRL shuffles it first with the global RNG,
which the two sides do not share). ``RLOOTrainer`` takes no ``rollout_func``: ``FixedCompletions`` replaces only its
sampling (``_generate_single_turn``) by ``_grpo_functions.complete`` of the decoded prompts, the completions dsbuild's
``rollout.backend = "function"`` gets; everything after (lengths, log-probs, rewards, KL, advantages, loss, logging)
is TRL's own. Writes ``OUT/result.json`` (the step records) and ``OUT/weights.pt`` (every weight after the last step).
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
import _grpo_worker

STEPS, LR, GENERATIONS, MAX_COMPLETION = 3, 1e-5, 4, 16
NAMES = ("loss", "grad_norm", "kl", "entropy", "reward", "reward_std", "frac_reward_zero_std", "clip_ratio/low_mean",
         "clip_ratio/low_min", "clip_ratio/high_mean", "clip_ratio/high_max", "clip_ratio/region_mean",
         "completions/mean_length", "completions/min_length", "completions/max_length", "completions/clipped_ratio",
         "completions/mean_terminated_length", "completions/min_terminated_length",
         "completions/max_terminated_length", "num_tokens", "rewards/reward/mean", "rewards/reward/std")  # fmt: skip


def run_trl(base: Path, out: Path, ds_config: Path, micro: int, accumulation: int, options: dict[str, Any]) -> None:
    import trl.trainer.rloo_trainer
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, ByT5Tokenizer
    from trl import RLOOConfig, RLOOTrainer

    class FixedCompletions(RLOOTrainer):  # type: ignore[misc]
        """TRL's RLOOTrainer sampling nothing: the completions of ``_grpo_functions.complete``."""

        def _generate_single_turn(self, prompt_ids: list[list[int]], *_: Any) -> list[list[int]]:
            prompts = self.processing_class.batch_decode(prompt_ids, skip_special_tokens=True)
            return _grpo_functions.complete(prompts)

    trl.trainer.rloo_trainer.shuffle_sequence_dict = lambda batch: batch  # in order, as dsbuild cuts it
    for key, value in {"MASTER_ADDR": "127.0.0.1", "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1"}.items():
        os.environ.setdefault(key, value)
    os.environ.setdefault("MASTER_PORT", str(free_port()))
    args = RLOOConfig(
        output_dir=str(out / "trl"), deepspeed=str(ds_config), per_device_train_batch_size=micro,
        gradient_accumulation_steps=accumulation, learning_rate=LR, weight_decay=0.0, lr_scheduler_type="constant",
        max_steps=STEPS, logging_steps=1, save_strategy="no", report_to=[], use_cpu=True, seed=0,
        bf16=False, **{"num_generations": GENERATIONS, "max_completion_length": MAX_COMPLETION, **options},
    )  # fmt: skip
    # bf16=False: TRL's configs default to bf16, which leaves the policy in fp32 (the config's explicit precision)
    # but builds the reference in bf16 (prepare_deepspeed), its log-probs up to 2.7e-3 off the policy's at step 0:
    # RLOO's first-order KL shows it (2e-5 a token at step 1); GRPO's k3 squares it away.
    trainer = FixedCompletions(
        model=AutoModelForCausalLM.from_pretrained(base), reward_funcs=[_grpo_functions.reward], args=args,
        train_dataset=Dataset.from_list(_grpo_worker.PROMPTS), processing_class=ByT5Tokenizer(),
    )  # fmt: skip
    trainer.train()
    records = [h for h in trainer.state.log_history if "loss" in h]
    out.mkdir(parents=True, exist_ok=True)
    torch.save(_grpo_worker._gathered(trainer.model), out / "weights.pt")
    kept = [{name: float(r[name]) for name in NAMES if r.get(name) is not None} for r in records]
    (out / "result.json").write_text(json.dumps({"records": kept}))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("base", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--ds-config", type=Path, required=True)
    parser.add_argument("--micro", type=int, default=4)
    parser.add_argument("--accumulation", type=int, default=2)
    parser.add_argument("--option", action="append", default=[], help="an RLOOConfig argument: KEY=JSON")
    args = parser.parse_args()
    options = {k: json.loads(v) for k, v in (o.split("=", 1) for o in args.option)}
    run_trl(args.base, args.out, args.ds_config, args.micro, args.accumulation, options)
    _grpo_worker._leave()


if __name__ == "__main__":
    main()
