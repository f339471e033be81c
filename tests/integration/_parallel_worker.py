"""One side of the parallelism differentials (tests/integration/test_parallelism.py and
test_tensor_parallel.py), in a process of its own (under torchrun for 2 processes):

    python _parallel_worker.py {sequence|tensor} DEGREE STAGE OUT

``Session.fit`` on a tiny sdpa Llama for 3 optimizer steps (micro-batch 2, accumulation 2) over variable-length
samples, with ``sequence_parallel_size = DEGREE`` or ``tensor_parallel.autotp_size = DEGREE`` at ZeRO stage
``STAGE``; then ``evaluate`` and ``save_model``. Rank 0 writes ``OUT/result.json`` (the logged losses, the
evaluation loss) and the model to ``OUT/model``.
"""

from __future__ import annotations

import json
import os
import random
import sys
from pathlib import Path
from typing import Any

os.environ.setdefault("DS_ACCELERATOR", "cpu")

import torch

MICRO, ACCUMULATION, STEPS = 2, 2, 3


def samples(n: int, seed: int, length: int | None = None) -> list[dict[str, list[int]]]:
    """Samples of 5 to 40 tokens (or ``length``), the first 3 of each untrained (a prompt), as SFT data is."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        ids = [rng.randrange(3, 380) for _ in range(length or rng.randrange(5, 41))]
        out.append({"input_ids": ids, "labels": [-100] * 3 + ids[3:]})
    return out


def main(kind: str, degree: int, stage: int, out: Path) -> None:
    from transformers import AutoModelForCausalLM, LlamaConfig

    from dsbuild import Session
    from dsbuild.data import collate
    from dsbuild.session import distributed

    world = int(os.environ.get("WORLD_SIZE", "1"))
    config = {
        "train_micro_batch_size_per_gpu": MICRO,
        "gradient_accumulation_steps": ACCUMULATION,
        **({"train_batch_size": MICRO * ACCUMULATION * (world // degree)} if kind == "sequence" else {}),
        "gradient_clipping": 1.0,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "weight_decay": 0.0, "torch_adam": True}},
        "zero_optimization": {"stage": stage},
        **({"sequence_parallel_size": degree} if kind == "sequence" else {"tensor_parallel": {"autotp_size": degree}}),
        "steps_per_print": 1000,
    }
    torch.manual_seed(0)
    llama = LlamaConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=384,
        max_position_embeddings=64,
    )
    model = AutoModelForCausalLM.from_config(llama, attn_implementation="sdpa")
    session = Session(model, config, total_steps=STEPS)

    def pad(batch: list[dict[str, list[int]]]) -> Any:
        return collate(batch, pad_token_id=0, pad_to_multiple_of=2)  # the same padding on both sides

    records = session.fit(samples(48, 1), max_steps=STEPS, collate_fn=pad)
    # Samples of one length: the evaluation loss (each batch's mean, weighed by its samples) does not depend on how
    # the processes group them into batches.
    evaluation = session.evaluate(samples(6, 2, length=21), batch_size=2, collate_fn=pad)
    session.save_model(out / "model")
    if session.is_main_process:
        losses = [r["loss"] for r in records if "loss" in r]
        (out / "result.json").write_text(json.dumps({"losses": losses, "eval_loss": evaluation["eval_loss"]}))
    distributed.close_gloo()
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), Path(sys.argv[4]))
