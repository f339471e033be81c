"""What verified checkpoints cost: Session.save_checkpoint + load_checkpoint (hashes written, manifest, weights-only
load verified against it) against DeepSpeed's plain engine.save_checkpoint + engine.load_checkpoint.

Same model (a Llama of ~140 MB of fp32 weights, built from its config with a fixed seed), same ZeRO-2 config
(a checkpoint of ~560 MB: weights plus Adam states), one process on the CPU accelerator. Each round saves and
loads once with each contender into fresh folders; rounds alternate; medians of save, load and save + load.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_checkpoint.py --rounds 5 [--json benchmarks/results/checkpoint.json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("DS_ACCELERATOR", "cpu")


def build() -> tuple[Any, Any]:
    import torch
    from transformers import LlamaConfig

    from dsbuild import Config
    from dsbuild.resolve.training import Training
    from dsbuild.session import Session

    model_config = LlamaConfig(
        hidden_size=512, intermediate_size=1376, num_hidden_layers=8, num_attention_heads=8,
        num_key_value_heads=8, vocab_size=32000, max_position_embeddings=128,
    )  # fmt: skip
    config = Config.zero(2).adamw(lr=1e-4).batch(micro=1)
    session = Session.from_pretrained(model_config, config, training=Training(learning_rate=1e-4), total_steps=10)
    engine = session.engine
    ids = torch.randint(0, 32000, (1, 16))
    session.step({"input_ids": ids, "labels": ids})  # the optimizer holds its states
    size = sum(p.numel() * p.element_size() for p in engine.module.parameters())
    print(f"model: {size / 2**20:.0f} MiB of weights")
    return session, engine


def timed(fn: Any) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", type=Path)
    parser.add_argument(
        "--dir",
        type=Path,
        default=Path("/dev/shm") if Path("/dev/shm").is_dir() else None,
        help="where to save (default /dev/shm: memory, so the disk's write-back does not drown the difference)",
    )
    args = parser.parse_args()
    session, engine = build()
    verifying = engine.checkpoint_engine  # dsbuild's (installed when the engine was built)
    plain = verifying.inner  # DeepSpeed's own TorchCheckpointEngine
    root = Path(tempfile.mkdtemp(prefix="bench_ckpt_", dir=args.dir))
    samples: dict[str, list[dict[str, float]]] = {
        "DeepSpeed plain": [],
        "dsbuild verified": [],  # XXH3-128, the default
        "dsbuild sha256": [],  # Session(checkpoint_digest="sha256")
    }
    try:
        for i in range(args.rounds + 1):  # the first round warms up and is not counted
            for name in samples:
                where = root / f"{name.split()[0]}{i}"
                if name == "DeepSpeed plain":
                    engine.checkpoint_engine = plain
                    save = timed(lambda: engine.save_checkpoint(str(where), tag="t"))  # noqa: B023
                    load = timed(lambda: engine.load_checkpoint(str(where), tag="t"))  # noqa: B023
                    engine.checkpoint_engine = verifying
                else:
                    verifying.digest = "sha256" if name == "dsbuild sha256" else "xxh3_128"
                    save = timed(lambda: session.save_checkpoint(where, tag="t"))  # noqa: B023
                    load = timed(lambda: session.load_checkpoint(where, tag="t"))  # noqa: B023
                size = sum(p.stat().st_size for p in (where / "t").rglob("*") if p.is_file())
                shutil.rmtree(where)
                if i:
                    samples[name].append({"save": save, "load": load, "total": save + load, "bytes": size})
                    print(f"round {i}: {name}: save {save:.2f} s, load {load:.2f} s ({size / 2**20:.0f} MiB)")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    medians = {
        n: {k: statistics.median(s[k] for s in runs) for k in ("save", "load", "total")} for n, runs in samples.items()
    }
    ds = medians["DeepSpeed plain"]
    print()
    for name, m in medians.items():
        print(f"{name:<18} save {m['save']:.3f} s  load {m['load']:.3f} s  save+load {m['total']:.3f} s")
    for name in ("dsbuild verified", "dsbuild sha256"):
        ours = medians[name]
        print(f"ratio {name} / DeepSpeed: save {ours['save'] / ds['save']:.2f}, load {ours['load'] / ds['load']:.2f}, "
              f"save+load {ours['total'] / ds['total']:.2f}")  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps({"rounds": args.rounds, "samples": samples, "medians": medians}, indent=1))


if __name__ == "__main__":
    main()
