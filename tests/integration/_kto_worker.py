"""TRL's side of test_kto_trl.py's differential, in a process of its own:

    python _kto_worker.py BASE RECORDS OUT --ds-config C [--loss-type L] [--beta B] [--desirable W] [--undesirable W]
        [--template T] [--micro M] [--accumulation A] [--evaluate]    (under torchrun for several processes)

TRL 1.16's ``KTOTrainer`` on DeepSpeed with the config a ``dsbuild train`` of the same job resolved (``C``), the model
and its reference given as the folder ``BASE``, the byte tokenizer (with the chat template ``T`` when given), the
unpaired records of ``RECORDS`` (JSON Lines): 3 steps of 2 records × 2 accumulation (or ``M`` × ``A`` a process) in
order (KTO's sequential sampling), fp32, lr 1e-3. Writes ``OUT/result.json`` (the step records as TRL logs them) and ``OUT/weights.pt``
(every weight after the last step, gathered); with ``--evaluate``, the records are also evaluated after the last
step (``M`` a batch) and ``result.json`` holds that evaluation's record.
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
    parser.add_argument("records", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--ds-config", type=Path, required=True)
    parser.add_argument("--loss-type", default="kto")
    parser.add_argument("--beta", type=float, default=0.1)
    parser.add_argument("--desirable", type=float, default=1.0)
    parser.add_argument("--undesirable", type=float, default=1.0)
    parser.add_argument("--template", default=None, help="the tokenizer's chat template")
    parser.add_argument("--micro", type=int, default=MICRO)
    parser.add_argument("--accumulation", type=int, default=ACCUMULATION)
    parser.add_argument("--evaluate", action="store_true", help="evaluate the records after the last step")
    args = parser.parse_args()

    import deepspeed
    from datasets import Dataset
    from transformers import ByT5Tokenizer
    from trl import KTOConfig, KTOTrainer

    for key, value in {"MASTER_ADDR": "127.0.0.1", "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1"}.items():
        os.environ.setdefault(key, value)
    os.environ.setdefault("MASTER_PORT", str(free_port()))
    config = KTOConfig(
        output_dir=str(args.out / "trl"), deepspeed=str(args.ds_config), per_device_train_batch_size=args.micro,
        gradient_accumulation_steps=args.accumulation, learning_rate=LR, weight_decay=0.0, lr_scheduler_type="constant",
        max_steps=STEPS, logging_steps=1, save_strategy="no", report_to=[], use_cpu=True, seed=0, bf16=False,
        gradient_checkpointing=False, loss_type=args.loss_type, beta=args.beta, desirable_weight=args.desirable,
        undesirable_weight=args.undesirable, per_device_eval_batch_size=args.micro,
        eval_strategy="steps" if args.evaluate else "no", eval_steps=STEPS,
    )  # fmt: skip
    # Accelerate (use_cpu: MULTI_CPU) has made the process group; DeepSpeed's own view of it is made when the trainer
    # starts its engine, after the model is loaded inside zero.Init, whose config would otherwise see 1 process.
    deepspeed.init_distributed(dist_backend="gloo")
    tokenizer = ByT5Tokenizer()
    if args.template is not None:
        tokenizer.chat_template = args.template
    records = [json.loads(line) for line in args.records.read_text().splitlines() if line.strip()]
    trainer = KTOTrainer(model=str(args.base), args=config, processing_class=tokenizer,
                         train_dataset=Dataset.from_list(records),
                         eval_dataset=Dataset.from_list(records) if args.evaluate else None)  # fmt: skip
    trainer.train()
    history = trainer.state.log_history
    params = dict(trainer.model.named_parameters())
    with deepspeed.zero.GatheredParameters(list(params.values())):
        weights = {k: v.detach().float().cpu().clone() for k, v in params.items()}
    if os.environ["RANK"] == "0":
        args.out.mkdir(parents=True, exist_ok=True)
        torch.save(weights, args.out / "weights.pt")
        result = {
            "records": [h for h in history if "loss" in h],
            "evaluation": [h for h in history if "eval_loss" in h],
        }
        (args.out / "result.json").write_text(json.dumps(result))

    from dsbuild.session import distributed

    distributed.close_gloo()  # before the interpreter's finalization, where gloo can abort ("terminate called ...")
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # the result is written; an abort in finalization would fail the test


if __name__ == "__main__":
    main()
