"""TRL 1.16's ``RewardTrainer`` or ``KTOTrainer`` on one case drawn by tests/property/test_task_training_differential.py,
in a process of its own (under torchrun for 2 processes):

    python _task_case_worker.py CASE.json OUT

``CASE.json`` holds the task, the base model folder (a causal LM: TRL builds the reward model's score head, or the
KTO reference, from it), the ds_config the dsbuild side ran with, the records, the chat template (conversational
records; dsbuild's fallback for the byte tokenizer), the batch shape and the config keys drawn. TRL runs them as a TRL
user would (the HF Trainer's shuffled order for the reward model, KTO's sequential one). Rank 0 writes
``OUT/result.json``: every logged step's record.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

os.environ.setdefault("DS_ACCELERATOR", "cpu")


def run(case: dict[str, Any], out: Path) -> list[dict[str, Any]]:
    import deepspeed
    from datasets import load_dataset
    from transformers import ByT5Tokenizer
    from trl import KTOConfig, KTOTrainer, RewardConfig, RewardTrainer

    config, trainer_class = {"reward": (RewardConfig, RewardTrainer), "kto": (KTOConfig, KTOTrainer)}[case["task"]]
    args = config(
        output_dir=str(out / "trl"), deepspeed=case["ds_config"], per_device_train_batch_size=case["micro"],
        gradient_accumulation_steps=case["accumulation"], learning_rate=case["lr"], weight_decay=0.0,
        lr_scheduler_type="constant", max_steps=case["steps"], logging_steps=1, save_strategy="no", report_to=[],
        use_cpu=True, seed=case["seed"], bf16=False, gradient_checkpointing=False, **case["config"],
    )  # fmt: skip
    # Accelerate (use_cpu: MULTI_CPU) has made the process group; DeepSpeed's own view of it is made when the trainer
    # starts its engine, after the model is loaded inside zero.Init, whose config would otherwise see 1 process.
    deepspeed.init_distributed(dist_backend="gloo")
    tokenizer = ByT5Tokenizer()
    if case["template"] is not None:
        tokenizer.chat_template = case["template"]
    records = out / "records.jsonl"  # read from a file, as TRL's scripts read (one cache for every process)
    with args.main_process_first():
        if not records.exists():
            out.mkdir(parents=True, exist_ok=True)
            records.write_text("".join(json.dumps(r) + "\n" for r in case["records"]))
        dataset = load_dataset("json", data_files=str(records), split="train", cache_dir=str(out / "datasets"))
    trainer = trainer_class(model=case["base"], args=args, processing_class=tokenizer, train_dataset=dataset)
    trainer.train()
    return [
        {k: v for k, v in h.items() if isinstance(v, (int, float))} for h in trainer.state.log_history if "loss" in h
    ]


if __name__ == "__main__":
    from _dpo_case_worker import serve

    serve(run)
