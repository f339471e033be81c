"""What verified checkpoints cost: Session.save_checkpoint + load_checkpoint (hashes written, manifest, weights-only
load verified against it) against DeepSpeed's plain engine.save_checkpoint + engine.load_checkpoint.

Same model (a Llama of ~140 MB of fp32 weights, built from its config with a fixed seed), same ZeRO-2 config
(a checkpoint of ~560 MB: weights plus Adam states), one process on the CPU accelerator. Each round saves and
loads once with each contender into fresh folders; rounds alternate; medians of save, load and save + load.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_checkpoint.py --rounds 5 [--json benchmarks/results/checkpoint.json]

``--stall`` measures what ``training.async_save`` is for instead: the stall, the extra wall time of the optimizer step
that saves over one that does not (a synchronous save against one staged into CPU memory and written in the
background), and the whole run, ``fit`` of ``--steps`` steps saving every ``--every`` in the background against no
saves (its final save, waited for, included). Contenders alternate in each round; medians and their ratios.

    .venv/bin/python benchmarks/bench_checkpoint.py --stall --rounds 5 --dir . [--json benchmarks/results/async_save.json]
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


def build(**training: Any) -> tuple[Any, Any]:
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
    session = Session.from_pretrained(model_config, config, training=Training(learning_rate=1e-4, **training),
                                      total_steps=training.get("max_steps", 10))  # fmt: skip
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


def _batch(seed: int) -> dict[str, Any]:
    import torch

    ids = torch.randint(0, 32000, (1, 16), generator=torch.Generator().manual_seed(seed))
    return {"input_ids": ids, "labels": ids}


def stall(root: Path, rounds: int, quiet: int = 3) -> dict[str, list[float]]:
    """Per round and contender: the saving step's wall time less the median of ``quiet`` steps before it (``sync``,
    ``async``), and the save call's own wall time (``sync save call``, ``async save call``: the same stall without the
    steps' own spread, which a loaded machine makes larger than the difference)."""
    import attrs

    session, _ = build(max_steps=10**6)
    samples: dict[str, list[float]] = {"sync": [], "async": [], "sync save call": [], "async save call": []}
    for i in range(rounds + 1):  # the first round warms up and is not counted
        for name in ("sync", "async"):
            session.training = attrs.evolve(session.training, async_save=name == "async")
            steps = [timed(lambda: session.step(_batch(i))) for _ in range(quiet)]  # noqa: B023
            where = root / f"{name}{i}"
            call: list[float] = []

            def saving_step() -> None:
                session.step(_batch(i))  # noqa: B023
                call.append(timed(lambda: session.save_checkpoint(where, tag="t")))  # noqa: B023

            extra = timed(saving_step) - statistics.median(steps)
            session.finish_saving()  # the background write ends before the next contender's quiet steps
            shutil.rmtree(where)
            if i:
                samples[name].append(extra)
                samples[f"{name} save call"].append(call[0])
                print(f"round {i}: {name}: stall {extra:.3f} s, the save call {call[0]:.3f} s "
                      f"(a quiet step {statistics.median(steps):.3f} s)")  # fmt: skip
    return samples


def whole_run(root: Path, rounds: int, steps: int, every: int) -> dict[str, list[float]]:
    """Per round and contender: ``fit`` of ``steps`` steps, a fresh session each, saving every ``every`` in the
    background, or not at all."""
    data = [_batch(seed) for seed in range(steps)]
    samples: dict[str, list[float]] = {"no saves": [], f"async save every {every}": [], f"sync save every {every}": []}
    for i in range(rounds + 1):
        for k, name in enumerate(samples):
            where = root / f"run{i}{k}"
            session, _ = build(max_steps=steps, async_save=name.startswith("async"), output_dir=str(where),
                               logging_steps=10**6, save_steps=every, save_strategy="no" if k == 0 else "steps")  # fmt: skip
            took = timed(lambda: session.fit(data))  # noqa: B023
            shutil.rmtree(where, ignore_errors=True)
            if i:
                samples[name].append(took)
                print(f"round {i}: {name}: {took:.2f} s")
    return samples


def main_stall(args: argparse.Namespace) -> None:
    root = Path(tempfile.mkdtemp(prefix="bench_async_", dir=args.dir))
    try:
        stalls = stall(root, args.rounds)
        runs = whole_run(root, args.run_rounds or args.rounds, args.steps, args.every)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    medians = {name: statistics.median(v) for name, v in {**stalls, **runs}.items()}
    print()
    for name, value in medians.items():
        print(f"{name:<22} {value:.3f} s")
    print(f"stall ratio async / sync: {medians['async'] / medians['sync']:.3f} (the save call alone: "
          f"{medians['async save call'] / medians['sync save call']:.3f})")  # fmt: skip
    quiet, *saving = list(runs)
    for name in saving:
        print(f"whole run ratio {name} / {quiet}: {medians[name] / medians[quiet]:.3f}")
    if args.json:
        args.json.write_text(json.dumps({"rounds": args.rounds, "samples": {**stalls, **runs}, "medians": medians},
                                        indent=1))  # fmt: skip


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
    parser.add_argument("--stall", action="store_true", help="measure training.async_save's stall and whole run")
    parser.add_argument("--steps", type=int, default=40, help="--stall: the whole run's steps")
    parser.add_argument("--every", type=int, default=10, help="--stall: the whole run saves every this many steps")
    parser.add_argument("--run-rounds", type=int, help="--stall: rounds of the whole run (default --rounds)")
    args = parser.parse_args()
    if args.stall:
        main_stall(args)
        return
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
