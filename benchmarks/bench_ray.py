"""The same 2-worker job under Ray against torchrun: start-up and step time, as ratios.

`dsbuild train` runs the demo job (a tiny Llama, ZeRO-3, bf16) on 2 processes for --steps optimizer steps,
once with `--backend ray` (a local Ray cluster started by the run, 2 gloo workers) and once with torchrun (2
gloo processes), alternating (ray, torchrun, ray, ...). From each run's output, read line by line as it comes:

- start-up: from the command's start to rank 0's `step 1/N` line (Python, Ray or torchrun, the process group,
  the data, the model, DeepSpeed's engine, and the first step);
- step time: from the `step 1/N` line to the `step N/N` line, divided by N - 1;
- whole run: the command's wall time, to its exit (saving the model and the last checkpoint, stopping Ray).

The figures are medians over the rounds; the ratios Ray / torchrun are taken within the same session.

    DS_ACCELERATOR=cpu .venv/bin/python benchmarks/bench_ray.py --rounds 3 [--steps 20] [--json results/ray.json]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

STEP_LINE = re.compile(r"step (\d+)/(\d+)\s")


def one_run(backend: str, steps: int, folder: Path) -> dict[str, float]:
    out = folder / f"{backend}-{time.monotonic_ns()}"
    command = [
        sys.executable, "-m", "dsbuild", "train", "--backend", backend, "--nproc-per-node", "2",
        f"--set=training.max_steps={steps}", "--set=training.logging_steps=1", "--set=training.save_steps=100000",
        "--set=training.eval_steps=100000", f"--set=training.output_dir={json.dumps(str(out))}",
    ]  # fmt: skip
    env = {**os.environ, "DS_ACCELERATOR": os.environ.get("DS_ACCELERATOR", "cpu")}
    env.pop("RAY_ADDRESS", None)
    started = time.perf_counter()
    child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    assert child.stdout is not None
    seen: dict[int, float] = {}
    tail: list[str] = []
    for line in child.stdout:
        tail = [*tail[-40:], line]
        match = STEP_LINE.search(line)
        if match and int(match.group(1)) not in seen:
            seen[int(match.group(1))] = time.perf_counter()
    code = child.wait()
    whole = time.perf_counter() - started
    if code != 0 or 1 not in seen or steps not in seen:
        raise SystemExit(f"{backend}: exit {code}, steps seen {sorted(seen)}:\n{''.join(tail)}")
    return {
        "startup_s": seen[1] - started,
        "step_s": (seen[steps] - seen[1]) / (steps - 1),
        "whole_s": whole,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    runs: dict[str, list[dict[str, float]]] = {"ray": [], "torchrun": []}
    with tempfile.TemporaryDirectory() as tmp:
        for round_ in range(args.rounds):
            for backend in ("ray", "torchrun"):
                figures = one_run(backend, args.steps, Path(tmp))
                runs[backend].append(figures)
                shown = "  ".join(f"{k} {v:.3f}" for k, v in figures.items())
                print(f"round {round_ + 1} {backend:<8} {shown}", flush=True)
    medians = {
        backend: {key: statistics.median(r[key] for r in results) for key in results[0]}
        for backend, results in runs.items()
    }
    ratios = {key: medians["ray"][key] / medians["torchrun"][key] for key in medians["ray"]}
    print(f"\nmedians over {args.rounds} rounds, {args.steps} steps, 2 workers:")
    for backend, figures in medians.items():
        print(f"  {backend:<8} " + "  ".join(f"{k} {v:.3f}" for k, v in figures.items()))
    print("  ray / torchrun " + "  ".join(f"{k} {v:.2f}x" for k, v in ratios.items()))
    if args.json:
        args.json.write_text(json.dumps({"runs": runs, "medians": medians, "ratios": ratios}, indent=1) + "\n")


if __name__ == "__main__":
    main()
