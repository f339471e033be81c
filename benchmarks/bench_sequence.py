"""Peak memory per rank of one training step on a long sequence: Ulysses sequence parallelism 2 against 1.

Each run is a fresh process group (torchrun for 2 processes): a 2-layer sdpa Llama (hidden 256, 8 heads) built
from its config, one micro-batch of one ``--seq``-token sample, ZeRO-2 in fp32 on DeepSpeed's CPU accelerator,
through ``Session.fit`` for ``--steps`` optimizer steps. Measured in each rank: the resident set just before
``fit`` and its peak (``ru_maxrss``) after; the step's memory is the difference. Runs alternate (1, 2, 1, 2, ...);
reported are the medians per rank, their ratio, and the planner's activation figure for the same shapes
(``dsbuild.planner``'s ``activations`` with the scores recomputed, as sdpa does; 16-bit as it plans, the runs
are fp32, so compare the ratios).

Run: DS_ACCELERATOR=cpu .venv/bin/python benchmarks/bench_sequence.py [--rounds 3] [--seq 8192] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

HIDDEN, HEADS, LAYERS, VOCAB = 256, 8, 2, 384


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def worker(sp: int, seq: int, steps: int, out: Path) -> None:
    """One rank: the run, then its memory figures into ``out/rankN.json``."""
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    from dsbuild import Session
    from dsbuild.data import collate
    from dsbuild.session import distributed

    world = int(os.environ.get("WORLD_SIZE", "1"))
    config = {
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 1,
        "train_batch_size": world // sp,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "torch_adam": True}},
        "zero_optimization": {"stage": 2},
        "sequence_parallel_size": sp,
        "steps_per_print": 1000,
    }
    torch.manual_seed(0)
    llama = LlamaConfig(
        hidden_size=HIDDEN, intermediate_size=2 * HIDDEN, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
        num_key_value_heads=HEADS, vocab_size=VOCAB, max_position_embeddings=seq,
    )  # fmt: skip
    model = AutoModelForCausalLM.from_config(llama, attn_implementation="sdpa")
    session = Session(model, config, total_steps=steps)
    g = torch.Generator().manual_seed(1)
    samples = [{"input_ids": (ids := torch.randint(3, VOCAB, (seq,), generator=g).tolist()), "labels": ids}
               for _ in range(world // sp * steps)]  # fmt: skip
    _ = session.engine  # built before the measurement: the step's memory, not the engine's
    before = _rss()
    session.fit(samples, max_steps=steps, collate_fn=collate)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    (out / f"rank{distributed.rank()}.json").write_text(json.dumps({"before": before, "peak": peak}))
    distributed.close_gloo()
    os._exit(0)


def run(sp: int, seq: int, steps: int) -> float:
    """The median over ranks of (peak - before), MiB."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        argv = [__file__, "--worker", str(sp), "--seq", str(seq), "--steps", str(steps), "--out", str(out)]
        if sp > 1:
            argv = ["-m", "torch.distributed.run", f"--nproc-per-node={sp}", "--master-port=29671", *argv]
        env = {**os.environ, "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1"}
        done = subprocess.run([sys.executable, *argv], capture_output=True, text=True, env=env, timeout=1800)
        if done.returncode != 0:
            raise SystemExit(done.stderr[-3000:])
        ranks = [json.loads(p.read_text()) for p in sorted(out.glob("rank*.json"))]
    return statistics.median((r["peak"] - r["before"]) / 2**20 for r in ranks)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seq", type=int, default=8192)
    parser.add_argument("--steps", type=int, default=1)
    parser.add_argument("--json")
    parser.add_argument("--worker", type=int)
    parser.add_argument("--out")
    args = parser.parse_args()
    if args.worker is not None:
        worker(args.worker, args.seq, args.steps, Path(args.out))
        return
    from dsbuild.planner.memory import activations

    figures: dict[int, list[float]] = {1: [], 2: []}
    for _ in range(args.rounds):
        for sp in (1, 2):
            figures[sp].append(run(sp, args.seq, args.steps))
            print(f"sp={sp}: {figures[sp][-1]:.0f} MiB", flush=True)
    planned = {
        sp: activations(1, args.seq, HIDDEN, LAYERS, vocab_size=VOCAB, sequence_parallel=sp).total / 2**20
        for sp in (1, 2)
    }
    result: dict[str, Any] = {
        "seq": args.seq,
        "rounds": args.rounds,
        "step_peak_mib": {str(sp): statistics.median(v) for sp, v in figures.items()},
        "all_mib": {str(sp): v for sp, v in figures.items()},
        "planner_activations_mib_16bit": {str(sp): v for sp, v in planned.items()},
    }
    result["ratio_sp2_over_sp1"] = result["step_peak_mib"]["2"] / result["step_peak_mib"]["1"]
    print(json.dumps(result, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
