"""One side of test_dpo_trl.py's differential, in a process of its own:

    python _dpo_worker.py dsbuild BASE OUT --stage S     examples/dpo_loop.py's loop (Session, reference, dpo_loss)
    python _dpo_worker.py trl BASE OUT --ds-config C     TRL 1.16's DPOTrainer on DeepSpeed with dsbuild's config
                                                         (--sampling random: the HF Trainer's shuffled order;
                                                         --eval: the pairs evaluated after the last step)

Both read the pairs in file order (TRL: ``train_sampling_strategy="sequential"``), 3 steps of 2 pairs × 2
accumulation, fp32, sigmoid loss, beta 0.1. Each writes ``OUT/result.json`` (the step records: loss and every
metric TRL logs; with ``--eval`` the evaluation's records too) and ``OUT/weights.pt`` (every weight after the last step, gathered); the dsbuild side
also writes ``OUT/ds_config.json``, the resolved config the TRL side then runs with (the same DeepSpeed settings).
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

from dsbuild.session.distributed import free_port

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
sys.path.insert(0, str(EXAMPLES))

import dpo_loop  # noqa: E402 - examples/dpo_loop.py, the loop under test

STEPS, MICRO, ACCUMULATION, LR, BETA = 3, 2, 2, 1e-5, 0.1
NAMES = ("loss", "grad_norm", "rewards/chosen", "rewards/rejected", "rewards/accuracies", "rewards/margins", "logps/chosen",
         "logps/rejected", "entropy", "logits/chosen", "logits/rejected", "mean_token_accuracy", "num_tokens")  # fmt: skip


def _gathered(model: Any) -> dict[str, torch.Tensor]:
    import deepspeed

    params = dict(model.named_parameters())
    with deepspeed.zero.GatheredParameters(list(params.values())):
        return {k: v.detach().float().cpu().clone() for k, v in params.items()}


def _save(
    out: Path, records: list[dict[str, Any]], weights: dict[str, torch.Tensor], evaluation: list[dict[str, Any]] = ()
) -> None:
    out.mkdir(parents=True, exist_ok=True)
    torch.save(weights, out / "weights.pt")
    kept = [{name: float(r[name]) for name in NAMES if r.get(name) is not None} for r in records]
    evaluated = [{name: float(v) for name, v in r.items() if name.startswith("eval_")} for r in evaluation]
    (out / "result.json").write_text(json.dumps({"records": kept, "evaluation": evaluated}))


def run_dsbuild(base: Path, out: Path, stage: int) -> None:
    policy, records = dpo_loop.train(
        base, stage=stage, steps=STEPS, micro=MICRO, accumulation=ACCUMULATION, lr=LR, beta=BETA, shuffle=False
    )
    weights = _gathered(policy.model)
    if policy.is_main_process:
        _save(out, records, weights)
        (out / "ds_config.json").write_text(json.dumps(policy.config.to_dict()))


def run_trl(base: Path, out: Path, ds_config: Path, sampling: str = "sequential", evaluate: bool = False) -> None:
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, ByT5Tokenizer
    from trl import DPOConfig, DPOTrainer

    for key, value in {"MASTER_ADDR": "127.0.0.1", "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1"}.items():
        os.environ.setdefault(key, value)
    os.environ.setdefault("MASTER_PORT", str(free_port()))
    args = DPOConfig(
        output_dir=str(out / "trl"), deepspeed=str(ds_config), per_device_train_batch_size=MICRO,
        gradient_accumulation_steps=ACCUMULATION, learning_rate=LR, weight_decay=0.0, lr_scheduler_type="constant",
        max_steps=STEPS, logging_steps=1, save_strategy="no", report_to=[], use_cpu=True, seed=0,
        train_sampling_strategy=sampling, beta=BETA, loss_type=["sigmoid"], max_length=None,
        eval_strategy="steps" if evaluate else "no", eval_steps=STEPS, per_device_eval_batch_size=MICRO,
    )  # fmt: skip
    # The reference passed as the policy is (loaded before the trainer): left to TRL, it is loaded again inside
    # zero.Init and its step-0 log-probs differ from the policy's by ~1e-4 (ZeRO-3's partitioned load, fp32).
    trainer = DPOTrainer(
        model=AutoModelForCausalLM.from_pretrained(base), ref_model=AutoModelForCausalLM.from_pretrained(base),
        args=args, processing_class=ByT5Tokenizer(),
        train_dataset=Dataset.from_list(dpo_loop.PAIRS),
        eval_dataset=Dataset.from_list(dpo_loop.PAIRS) if evaluate else None,
    )  # fmt: skip
    trainer.train()
    records = [h for h in trainer.state.log_history if "loss" in h]
    evaluation = [h for h in trainer.state.log_history if "eval_loss" in h]
    _save(out, records, _gathered(trainer.model), evaluation)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("side", choices=["dsbuild", "trl"])
    parser.add_argument("base", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--stage", type=int, default=3)
    parser.add_argument("--ds-config", type=Path)
    parser.add_argument("--sampling", default="sequential", help="TRL's train_sampling_strategy")
    parser.add_argument("--eval", action="store_true", help="evaluate the pairs after the last step (TRL)")
    args = parser.parse_args()
    if args.side == "dsbuild":
        run_dsbuild(args.base, args.out, args.stage)
    else:
        run_trl(args.base, args.out, args.ds_config, args.sampling, args.eval)
    from dsbuild.session import distributed

    distributed.close_gloo()  # before the interpreter's finalization, where gloo can abort ("terminate called ...")
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # and no finalization at all: the result is written; an abort there would fail the test


if __name__ == "__main__":
    main()
