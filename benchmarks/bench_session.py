"""Session.step against a hand-written DeepSpeed loop: same model, same config, alternating runs.

Each round builds a fresh model (same seed) and a fresh engine for each contender,
then times ``--steps`` micro-batches after ``--warmup`` untimed ones. Rounds
alternate (hand, session, hand, session, ...) so drift on a shared machine hits
both. Reported: median micro-batches/s of each, their ratio (goal >= 0.98), and
the median time to first step (engine construction + first micro-batch).

Run: DS_ACCELERATOR=cpu .venv/bin/python benchmarks/bench_session.py [--rounds 5] [--steps 30] [--stage 2]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("DS_ACCELERATOR", "cpu")
# The hand-written loop needs what users set by hand for a single process (else DeepSpeed looks for MPI).
for key, value in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
                   "MASTER_PORT": "29561"}.items():  # fmt: skip
    os.environ.setdefault(key, value)

import torch  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

from dsbuild import Config, Session  # noqa: E402

MODEL = LlamaConfig(
    hidden_size=128, intermediate_size=256, num_hidden_layers=4, num_attention_heads=4,
    num_key_value_heads=4, vocab_size=384,
)  # fmt: skip


def make_model() -> Any:
    torch.manual_seed(0)
    return LlamaForCausalLM(MODEL)


def make_batches(n: int, micro: int, seq: int) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    out = []
    for _ in range(n):
        ids = torch.randint(0, MODEL.vocab_size, (micro, seq), generator=g)
        out.append({"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids.clone()})
    return out


def hand_written(config: dict[str, Any], batches: list[dict[str, torch.Tensor]], warmup: int) -> tuple[float, float]:
    """The loop users write by hand: deepspeed.initialize, then forward / backward / step."""
    import deepspeed

    start = time.perf_counter()
    model = make_model()
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    first = None
    for i, batch in enumerate(batches):
        if i == warmup:
            t0 = time.perf_counter()
        batch = {k: v.to(engine.device) for k, v in batch.items()}
        loss = engine(**batch).loss
        engine.backward(loss)
        engine.step()
        float(loss.detach())
        if first is None:
            first = time.perf_counter() - start
    elapsed = time.perf_counter() - t0
    engine.destroy()
    assert first is not None
    return (len(batches) - warmup) / elapsed, first


def with_session(config: Config, batches: list[dict[str, torch.Tensor]], warmup: int) -> tuple[float, float]:
    start = time.perf_counter()
    s = Session(make_model(), config)
    first = None
    for i, batch in enumerate(batches):
        if i == warmup:
            t0 = time.perf_counter()
        s.step(batch)
        if first is None:
            first = time.perf_counter() - start
    elapsed = time.perf_counter() - t0
    s.engine.destroy()
    assert first is not None
    return (len(batches) - warmup) / elapsed, first


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=30, help="timed micro-batches per run")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--stage", type=int, default=2)
    parser.add_argument("--micro", type=int, default=4)
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()

    config = Config.zero(args.stage).adamw(lr=1e-4).batch(micro=args.micro, grad_accum=2).clip_grad(1.0)
    ds_dict = config.to_dict()
    batches = make_batches(args.warmup + args.steps, args.micro, args.seq)
    results: dict[str, list[tuple[float, float]]] = {"hand-written loop": [], "Session.step": []}
    # An untimed round first: the first engine in a process pays for importing DeepSpeed, creating the
    # process group and loading its ops, whoever builds it.
    hand_written(ds_dict, batches[: args.warmup + 1], args.warmup)
    with_session(config, batches[: args.warmup + 1], args.warmup)
    for _ in range(args.rounds):
        results["hand-written loop"].append(hand_written(ds_dict, batches, args.warmup))
        results["Session.step"].append(with_session(config, batches, args.warmup))

    summary = {
        name: {
            "micro_batches_per_s": statistics.median(r for r, _ in runs),
            "time_to_first_step_s": statistics.median(f for _, f in runs),
        }
        for name, runs in results.items()
    }
    ratio = summary["Session.step"]["micro_batches_per_s"] / summary["hand-written loop"]["micro_batches_per_s"]
    print(f"ZeRO-{args.stage}, Llama {MODEL.num_hidden_layers}x{MODEL.hidden_size}, micro {args.micro} x seq {args.seq}, "
          f"{args.rounds} alternating rounds of {args.steps} timed micro-batches, {torch.get_num_threads()} threads")  # fmt: skip
    for name, r in summary.items():
        print(
            f"  {name:<18} {r['micro_batches_per_s']:8.2f} micro-batches/s   first step {r['time_to_first_step_s']:.2f} s"
        )
    print(f"  throughput ratio Session / hand-written: {ratio:.3f} (goal >= 0.98)")
    if args.json:
        args.json.write_text(
            json.dumps({"summary": summary, "ratio": ratio, "args": vars(args) | {"json": None}}, indent=2) + "\n"
        )


if __name__ == "__main__":
    main()
