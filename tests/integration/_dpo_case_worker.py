"""TRL 1.16's DPOTrainer on one case drawn by test_dpo_trl_property.py, in a process of its own (under torchrun for
2 processes):

    python _dpo_case_worker.py CASE.json OUT

``CASE.json`` holds the base model folder, the ds_config the dsbuild side ran with, the records, the chat template
(conversational records; dsbuild's fallback for the byte tokenizer), the batch shape, the LoRA fields (or none)
and the ``DPOConfig`` keys drawn. TRL runs them as a TRL user would: the HF Trainer's shuffled order, the reference a
copy of the base loaded beside the policy (with LoRA: the policy's adapters disabled). Rank 0 writes
``OUT/result.json``: every logged step's record.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("DS_ACCELERATOR", "cpu")

from dsbuild.session.distributed import free_port


def run(case: dict[str, Any], out: Path) -> list[dict[str, Any]]:
    from datasets import load_dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, ByT5Tokenizer, set_seed
    from trl import DPOConfig, DPOTrainer

    args = DPOConfig(
        output_dir=str(out / "trl"), deepspeed=case["ds_config"], per_device_train_batch_size=case["micro"],
        gradient_accumulation_steps=case["accumulation"], learning_rate=case["lr"], weight_decay=0.0,
        lr_scheduler_type="constant", max_steps=case["steps"], logging_steps=1, save_strategy="no", report_to=[],
        use_cpu=True, seed=case["seed"], train_sampling_strategy="random", **case["dpo"],
    )  # fmt: skip
    # Accelerate (use_cpu: MULTI_CPU) has made the process group; DeepSpeed's own view of it is made when the trainer
    # starts its engine, after the models below are loaded inside zero.Init, whose config would see 1 process.
    import deepspeed

    deepspeed.init_distributed(dist_backend="gloo")
    # As dsbuild builds its policy: seeded, loaded (inside zero.Init: the config above is DeepSpeed's), then LoRA's
    # adapters made from the same random state (TRL's get_peft_model, the first draw in DPOTrainer's __init__).
    set_seed(case["seed"])
    model = AutoModelForCausalLM.from_pretrained(case["base"])
    # The reference passed as the policy is (loaded before the trainer), as test_dpo_trl.py's worker explains.
    reference = None if case["lora"] else AutoModelForCausalLM.from_pretrained(case["base"])
    tokenizer = ByT5Tokenizer()
    if case["template"] is not None:
        tokenizer.chat_template = case["template"]
    # Read from a file, as TRL's scripts read: an in-memory dataset's cache lives in a temporary folder of each
    # process, and precompute_ref_log_probs on 2 processes reads rank 0's cache file by its path (FileNotFoundError).
    pairs = out / "pairs.jsonl"
    with args.main_process_first():
        if not pairs.exists():
            out.mkdir(parents=True, exist_ok=True)
            pairs.write_text("".join(json.dumps(r) + "\n" for r in case["records"]))
        dataset = load_dataset("json", data_files=str(pairs), split="train", cache_dir=str(out / "datasets"))
    trainer = DPOTrainer(
        model=model, ref_model=reference, args=args, processing_class=tokenizer, train_dataset=dataset,
        peft_config=LoraConfig(**case["lora"]) if case["lora"] else None,
    )  # fmt: skip
    trainer.train()
    return [
        {k: v for k, v in h.items() if isinstance(v, (int, float))} for h in trainer.state.log_history if "loss" in h
    ]


def main() -> None:
    serve(run)


def serve(train: Callable[[dict[str, Any], Path], list[dict[str, Any]]]) -> None:
    """``train(CASE, OUT)`` of the command line's ``CASE.json OUT`` as one process of a run (alone, or under
    torchrun), rank 0 writing its records to ``OUT/result.json``; the process ends without finalization."""
    case = json.loads(Path(sys.argv[1]).read_text())
    out = Path(sys.argv[2])
    for key, value in {"MASTER_ADDR": "127.0.0.1", "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1"}.items():
        os.environ.setdefault(key, value)
    os.environ.setdefault("MASTER_PORT", str(free_port()))
    records = train(case, out)
    if os.environ["RANK"] == "0":
        out.mkdir(parents=True, exist_ok=True)
        (out / "result.json").write_text(json.dumps(records))
    from dsbuild.session import distributed

    distributed.close_gloo()  # before the interpreter's finalization, where gloo can abort ("terminate called ...")
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # and no finalization at all: the result is written; an abort there would fail the test


if __name__ == "__main__":
    main()
