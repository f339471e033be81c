"""GPU smoke test of what DeepSpeed runs only on GPUs: ZenFlow, SuperOffload, DeepCompile and Ulysses with flash
attention, 20 steps each on a tiny model through ``Session``, peak GPU memory beside the planner's figure; and the
RL pieces whose worth only a GPU shows (case ``rl``, ZeRO-3).

Each case trains a 4-layer Llama (hidden 1024, 16 heads, built from its config) on random tokens of ``--seq``
tokens for ``--steps`` optimizer steps in bf16, in a process of its own (``torchrun`` for the 2-GPU Ulysses case),
and reports: whether the loss stayed finite and changed, steps per second after the first, and
``torch.cuda.max_memory_allocated`` against the planner's model states + activations for the same row (no
headroom: the allocator's peak is what the planner's states and activations estimate). A case the machine cannot
run (Ulysses on one GPU, DeepCompile without a compiler) says why and the others go on. Exit 0 when every case
that could run trained; 1 when one failed; 2 without a CUDA GPU.

    python benchmarks/gpu_smoke.py [--cases zenflow,superoffload,deepcompile,ulysses] [--steps 20] [--seq 2048]
    python benchmarks/gpu_smoke.py --dry-run   # the plumbing, on the CPU: the baseline case, 2 steps, no GPU figures

Case ``rl`` also measures, after its steps: GPU memory allocated before ``session.offloaded()``, inside it and after
(expected: inside, about 12 bytes per parameter less — Adam's two states and the fp32 master weights, ~1.3 GiB for
this model — and after, back to before), and greedy generation of 64 tokens for 4 prompts, tokens per second with
DeepSpeed's hooks (a gather per layer per token) against inside ``session.gathered()`` (expected: gathered several
times faster; DeepSpeedExamples #718 reports 72 s against 0.8 s on a larger model). Unmeasured until run on a GPU.

Not run in CI: it needs a GPU. ``benchmarks/README.md`` says where results go.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

MODEL = {
    "model_type": "llama", "hidden_size": 1024, "intermediate_size": 2816, "num_hidden_layers": 4,
    "num_attention_heads": 16, "num_key_value_heads": 16, "vocab_size": 32000, "max_position_embeddings": 8192,
}  # fmt: skip

CASES: dict[str, dict[str, Any]] = {
    "baseline": {"zero_optimization": {"stage": 2}},
    "zenflow": {
        "zero_optimization": {
            "stage": 2,
            "offload_optimizer": {"device": "cpu", "pin_memory": True},
            "zenflow": {
                "topk_ratio": 0.1,
                "update_interval": 4,
                "select_strategy": "step",
                "select_interval": 4,
                "overlap_step": True,
            },
        },
    },
    "superoffload": {"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu", "super_offload": True}}},
    "deepcompile": {"zero_optimization": {"stage": 3}, "compile": {"deepcompile": True}},
    "ulysses": {"zero_optimization": {"stage": 2}, "sequence_parallel_size": 2},
    "rl": {"zero_optimization": {"stage": 3}},
}
"""Each case's ds_config sections (the batch, optimizer and precision are the same for all)."""

GPUS = {"ulysses": 2}
ATTENTION = {"ulysses": "flash_attention_2"}


def ds_config(case: str, world: int, cpu: bool) -> dict[str, Any]:
    sp = CASES[case].get("sequence_parallel_size", 1)
    return {
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 1,
        "train_batch_size": world // sp,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "weight_decay": 0.0}},
        **({} if cpu else {"bf16": {"enabled": True}}),
        "gradient_clipping": 1.0,
        "steps_per_print": 10**6,
        **CASES[case],
    }


def worker(case: str, steps: int, seq: int, out: Path, cpu: bool) -> None:
    """One process of a case: train, then its figures into ``out/rankN.json``."""
    import time

    import torch
    from transformers import LlamaConfig

    from dsbuild import Session
    from dsbuild.data import collate
    from dsbuild.session import distributed

    world = int(os.environ.get("WORLD_SIZE", "1"))
    fields = {k: v for k, v in MODEL.items() if k != "model_type"}
    config = LlamaConfig(**fields)
    session = Session.from_pretrained(
        config,
        ds_config(case, world, cpu),
        total_steps=steps,
        attn_implementation=ATTENTION.get(case, "sdpa"),
        dtype=None if cpu else "bf16",
    )
    g = torch.Generator().manual_seed(0)
    samples = [
        {"input_ids": (ids := torch.randint(3, MODEL["vocab_size"], (seq,), generator=g).tolist()), "labels": ids}
        for _ in range(steps * world)
    ]
    started = time.perf_counter()
    records = session.fit(samples, max_steps=steps, collate_fn=collate)
    elapsed = time.perf_counter() - started
    losses = [r["loss"] for r in records if "loss" in r]
    figures = {
        "losses": losses,
        "finite": all(math.isfinite(x) for x in losses),
        "changed": len(losses) > 1 and losses[-1] != losses[0],
        "steps_per_sec": (len(losses) - 1) / elapsed if len(losses) > 1 else None,
        "peak_gib": None if cpu else torch.cuda.max_memory_allocated() / 2**30,
    }
    if case == "rl":
        figures.update(rl_figures(session, cpu))
    (out / f"rank{distributed.rank()}.json").write_text(json.dumps(figures))
    distributed.close_gloo()
    os._exit(0)


def rl_figures(session: Any, cpu: bool) -> dict[str, Any]:
    """GPU memory around ``offloaded()`` and generation speed hooked against ``gathered()`` (the module docstring)."""
    import time

    import torch

    def allocated() -> float | None:
        return None if cpu else torch.cuda.memory_allocated() / 2**30

    before = allocated()
    with session.offloaded():
        inside = allocated()
    after = allocated()
    prompts = torch.randint(3, MODEL["vocab_size"], (4, 32), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(prompts)

    def tokens_per_sec() -> float:
        started = time.perf_counter()
        out = session.generate(prompts, mask, max_new_tokens=64, do_sample=False, eos_token_id=None, pad_token_id=0)
        return (out.shape[1] - prompts.shape[1]) * out.shape[0] / (time.perf_counter() - started)

    hooked = tokens_per_sec()
    with session.gathered():
        gathered = tokens_per_sec()
    return {"offload_gib": [before, inside, after], "generate_tokens_per_sec": {"hooked": hooked, "gathered": gathered}}


def planned_gib(case: str, seq: int) -> float:
    """The planner's model states + activations per GPU for the case's row (ZeRO stage and offload)."""
    from dsbuild import plan

    zero = CASES[case]["zero_optimization"]
    offload = zero.get("offload_optimizer", {}).get("device", "none")
    result = plan(model=MODEL, gpus_per_node=GPUS.get(case, 1), seq_len=seq, gradient_checkpointing=False,
                  flash_attention=True)  # fmt: skip
    row = next(r for r in result.rows if r.stage == zero["stage"] and r.offload_optimizer == offload)
    sp = CASES[case].get("sequence_parallel_size", 1)
    activations = result.activation_bytes / sp if result.activation_bytes else 0
    return (row.gpu_bytes_per_device + activations) / 2**30


def run_case(case: str, steps: int, seq: int, cpu: bool) -> dict[str, Any]:
    gpus = GPUS.get(case, 1)
    if not cpu:
        import torch

        if torch.cuda.device_count() < gpus:
            return {"case": case, "skipped": f"needs {gpus} GPUs, this machine has {torch.cuda.device_count()}"}
    with tempfile.TemporaryDirectory() as tmp:
        argv = [__file__, "--worker", case, "--steps", str(steps), "--seq", str(seq), "--out", tmp]
        argv += ["--dry-run"] if cpu else []
        if gpus > 1:
            argv = ["-m", "torch.distributed.run", f"--nproc-per-node={gpus}", *argv]
        env = {**os.environ, **({"DS_ACCELERATOR": "cpu"} if cpu else {})}
        done = subprocess.run([sys.executable, *argv], capture_output=True, text=True, env=env, timeout=1800)
        if done.returncode != 0:
            return {"case": case, "failed": done.stderr[-2000:]}
        ranks = [json.loads(p.read_text()) for p in sorted(Path(tmp).glob("rank*.json"))]
    first = ranks[0]
    return {
        "case": case,
        "trained": first["finite"] and first["changed"],
        "losses": [round(x, 4) for x in first["losses"][:3]] + ["..."] + [round(first["losses"][-1], 4)],
        "steps_per_sec": first["steps_per_sec"],
        "peak_gib": max((r["peak_gib"] or 0) for r in ranks) if not cpu else None,
        "planner_gib": None if cpu else planned_gib(case, seq),
        **{k: first[k] for k in ("offload_gib", "generate_tokens_per_sec") if k in first},
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default="zenflow,superoffload,deepcompile,ulysses,rl")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--dry-run", action="store_true", help="the baseline case on the CPU (2 steps), no GPU")
    parser.add_argument("--json")
    parser.add_argument("--worker")
    parser.add_argument("--out")
    args = parser.parse_args()
    if args.worker is not None:
        worker(args.worker, args.steps, args.seq, Path(args.out), args.dry_run)
        return 0
    if args.dry_run:
        cases, steps, seq = ["baseline", "rl"], 2, 64
    else:
        import torch

        if not torch.cuda.is_available():
            print("gpu_smoke: needs a CUDA GPU (run --dry-run to check the plumbing on the CPU)", file=sys.stderr)
            return 2
        cases, steps, seq = args.cases.split(","), args.steps, args.seq
        unknown = [c for c in cases if c not in CASES]
        if unknown:
            print(f"gpu_smoke: unknown case(s) {unknown}; known: {', '.join(CASES)}", file=sys.stderr)
            return 2
    results = [run_case(case, steps, seq, args.dry_run) for case in cases]
    for r in results:
        print(json.dumps(r))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
    return 1 if any("failed" in r or r.get("trained") is False for r in results) else 0


if __name__ == "__main__":
    raise SystemExit(main())
