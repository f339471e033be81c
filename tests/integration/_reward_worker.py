"""TRL's side of test_reward_trl.py's differential, in a process of its own:

    python _reward_worker.py BASE PAIRS OUT --ds-config C [--center X] [--template T]

TRL 1.16's ``RewardTrainer`` on DeepSpeed with the config a ``dsbuild train`` of the same job resolved (``C``), the
model given as its folder (``BASE``, a causal LM: TRL builds the ``AutoModelForSequenceClassification`` with one
label itself), the byte tokenizer (with the chat template ``T`` when given), the pairs of ``PAIRS`` (JSON Lines) to
train on and to evaluate after the last step: 3 steps of 2 pairs × 2 accumulation, the HF Trainer's shuffled order,
fp32, lr 1e-3. Writes ``OUT/result.json`` (the step records and the evaluation's, as TRL logs them) and
``OUT/weights.pt`` (every weight after the last step, gathered).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("DS_ACCELERATOR", "cpu")

import torch

from dsbuild.session.distributed import free_port

STEPS, MICRO, ACCUMULATION, LR = 3, 2, 2, 1e-3


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("base", type=Path)
    parser.add_argument("pairs", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--ds-config", type=Path, required=True)
    parser.add_argument("--center", type=float, default=None, help="center_rewards_coefficient")
    parser.add_argument("--template", default=None, help="the tokenizer's chat template")
    args = parser.parse_args()

    import deepspeed
    from datasets import Dataset
    from transformers import ByT5Tokenizer
    from trl import RewardConfig, RewardTrainer

    for key, value in {"MASTER_ADDR": "127.0.0.1", "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1"}.items():
        os.environ.setdefault(key, value)
    os.environ.setdefault("MASTER_PORT", str(free_port()))
    config = RewardConfig(
        output_dir=str(args.out / "trl"), deepspeed=str(args.ds_config), per_device_train_batch_size=MICRO,
        gradient_accumulation_steps=ACCUMULATION, learning_rate=LR, weight_decay=0.0, lr_scheduler_type="constant",
        max_steps=STEPS, logging_steps=1, save_strategy="no", report_to=[], use_cpu=True, seed=0, bf16=False,
        gradient_checkpointing=False, center_rewards_coefficient=args.center, eval_strategy="steps",
        eval_steps=STEPS, per_device_eval_batch_size=MICRO,
    )  # fmt: skip
    tokenizer = ByT5Tokenizer()
    if args.template is not None:
        tokenizer.chat_template = args.template
    pairs = [json.loads(line) for line in args.pairs.read_text().splitlines() if line.strip()]
    trainer = RewardTrainer(model=str(args.base), args=config, processing_class=tokenizer,
                            train_dataset=Dataset.from_list(pairs), eval_dataset=Dataset.from_list(pairs))  # fmt: skip
    trainer.train()
    history = trainer.state.log_history
    params = dict(trainer.model.named_parameters())
    with deepspeed.zero.GatheredParameters(list(params.values())):
        weights = {k: v.detach().float().cpu().clone() for k, v in params.items()}
    args.out.mkdir(parents=True, exist_ok=True)
    torch.save(weights, args.out / "weights.pt")
    result = {"records": [h for h in history if "loss" in h], "evaluation": [h for h in history if "eval_loss" in h]}
    (args.out / "result.json").write_text(json.dumps(result))

    from dsbuild.session import distributed

    distributed.close_gloo()  # before the interpreter's finalization, where gloo can abort ("terminate called ...")
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # the result is written; an abort in finalization would fail the test


if __name__ == "__main__":
    main()
