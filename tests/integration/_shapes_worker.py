"""One side of the run-shape differential (tests/integration/test_run_shapes.py), in a process of its own (under
torchrun for 2 processes):

    python _shapes_worker.py SHAPES.json OUT

For each shape of ``SHAPES.json`` (a list; ``test_run_shapes.Shape`` as a dict), ``Session.fit`` of a tiny sdpa
Llama for the shape's optimizer steps over its samples, with the shape's micro-batch, accumulation, ZeRO stage,
packing and LoRA, and on 2 processes its sequence-parallel or AutoTP degree. Rank 0 writes ``OUT/<i>/result.json``
(each step's loss and gradient norm) and the trained weights, whole, to ``OUT/<i>/weights.safetensors``.
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


def samples(lengths: list[int], seed: int, prompt: int) -> list[dict[str, list[int]]]:
    """One sample per length, its first ``prompt`` tokens untrained (a prompt), as SFT data is."""
    rng = random.Random(seed)
    out = []
    for n in lengths:
        ids = [rng.randrange(3, 380) for _ in range(n)]
        out.append({"input_ids": ids, "labels": [-100] * min(prompt, n - 1) + ids[min(prompt, n - 1) :]})
    return out


def run(shape: dict[str, Any], out: Path) -> None:
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, LlamaConfig

    from dsbuild import Session
    from dsbuild.data import collate, pack
    from dsbuild.session import distributed
    from dsbuild.session.export import full_state_dict, trainable_state_dict

    world = int(os.environ.get("WORLD_SIZE", "1"))
    degree = shape["degree"] if world > 1 else 1
    sequence = shape["kind"] == "sequence"
    config: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": shape["micro"],
        "gradient_accumulation_steps": shape["accumulation"],
        "gradient_clipping": 1.0,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "weight_decay": 0.0, "torch_adam": True}},
        "zero_optimization": {"stage": shape["stage"]},
        "steps_per_print": 1000,
    }
    if degree > 1:
        config.update({"sequence_parallel_size": degree} if sequence else {"tensor_parallel": {"autotp_size": degree}})
    torch.manual_seed(0)
    llama = LlamaConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=384,
        max_position_embeddings=256,
    )
    model = AutoModelForCausalLM.from_config(llama, attn_implementation="sdpa")
    if shape["lora"]:
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    session = Session(model, config, total_steps=shape["steps"])
    data = samples(shape["lengths"], shape["seed"], shape["prompt"])
    if shape["packed"]:
        data = pack(data, max_length=shape["pack_length"])

    def batch(rows: list[dict[str, list[int]]]) -> Any:
        return collate(rows, pad_token_id=0, pad_to_multiple_of=2)  # the same padding on both sides

    records = session.fit(data, max_steps=shape["steps"], collate_fn=batch)
    engine = session.engine
    weights = trainable_state_dict(engine) if shape["lora"] else full_state_dict(engine)
    if session.is_main_process:
        out.mkdir(parents=True, exist_ok=True)
        steps = [r for r in records if "loss" in r]
        result = {"losses": [r["loss"] for r in steps], "grad_norms": [r["grad_norm"] for r in steps]}
        (out / "result.json").write_text(json.dumps(result))
        assert weights is not None
        save_file({k: v.float().contiguous().clone() for k, v in weights.items()}, str(out / "weights.safetensors"))
    distributed.barrier()


def main(shapes: Path, out: Path) -> None:
    from dsbuild.session import distributed

    for i, shape in enumerate(json.loads(shapes.read_text())):
        run(shape, out / str(i))
    distributed.close_gloo()
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
