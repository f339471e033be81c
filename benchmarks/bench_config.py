"""Config-building cost: dsbuild against `import deepspeed` and the HF Trainer's DeepSpeed config.

Each case runs in a fresh Python process (so import time counts, as it does for a
user), the cases alternate, and each is repeated; we report the median wall time
and the median peak RSS (from the child's rusage). Then in-process throughput of
the converter (and of resolve + validate when available).

Run: .venv/bin/python benchmarks/bench_config.py [--repeats N] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

CASES = {
    "dsbuild: import + build + to_dict": (
        "import dsbuild\nfrom dsbuild import Config\nConfig.zero(3).offload_cpu().bf16().adamw(lr=1e-5).to_dict()\n"
    ),
    "python -c 'import deepspeed'": "import deepspeed\n",
    "HF HfTrainerDeepSpeedConfig(same config)": (
        "from transformers.integrations.deepspeed import HfTrainerDeepSpeedConfig, unset_hf_deepspeed_config\n"
        "d = {'bf16': {'enabled': True}, 'optimizer': {'type': 'AdamW', 'params': {'lr': 1e-05}},\n"
        "     'zero_optimization': {'stage': 3, 'offload_optimizer': {'device': 'cpu', 'pin_memory': True},\n"
        "                           'offload_param': {'device': 'cpu', 'pin_memory': True}}}\n"
        "HfTrainerDeepSpeedConfig(d)\n"
    ),
    "python -c 'pass' (interpreter baseline)": "pass\n",
}


def run_once(code: str) -> tuple[float, float]:
    """Wall seconds and peak RSS (MiB) of one fresh interpreter running ``code``."""
    env = {**os.environ, "DS_ACCELERATOR": os.environ.get("DS_ACCELERATOR", "cpu")}
    start = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    if status != 0:
        raise RuntimeError(f"case failed: {proc.stderr.read().decode() if proc.stderr else ''}")
    return wall, usage.ru_maxrss / 1024  # Linux reports KiB


def fresh_process(repeats: int) -> dict[str, dict[str, float]]:
    samples: dict[str, list[tuple[float, float]]] = {name: [] for name in CASES}
    for code in CASES.values():  # warm the page cache once
        run_once(code)
    for _ in range(repeats):
        for name, code in CASES.items():
            samples[name].append(run_once(code))
    return {
        name: {
            "wall_s": statistics.median(w for w, _ in runs),
            "peak_mib": statistics.median(m for _, m in runs),
        }
        for name, runs in samples.items()
    }


def throughput(fn: Any, seconds: float = 2.0) -> float:
    """Calls per second of ``fn`` over about ``seconds``."""
    n, start = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - start) < seconds:
        for _ in range(200):
            fn()
        n += 200
    return n / elapsed


def in_process() -> dict[str, float]:
    from dsbuild import Config

    corpus = Path(__file__).resolve().parents[1].parent / "shared" / "corpus" / "transformers" / "ds_config_zero3.json"
    hf_style = json.loads(corpus.read_text()) if corpus.exists() else Config.preset("hf_zero3").to_dict()
    built = Config.zero(3).offload_cpu().bf16().adamw(lr=1e-5).batch(micro=2, grad_accum=4).to_dict()
    out = {
        "from_dict -> to_dict, HF-style ZeRO-3 (configs/s)": throughput(lambda: Config.from_dict(hf_style).to_dict()),
        "from_dict -> to_dict, built ZeRO-3 offload (configs/s)": throughput(lambda: Config.from_dict(built).to_dict()),
    }
    try:
        from dsbuild.training import Training
    except ImportError:
        return out
    training = Training(learning_rate=2e-5, per_device_train_batch_size=4, gradient_accumulation_steps=2, bf16=True)

    def full() -> None:
        cfg = Config.from_dict(hf_style).resolve(world_size=8, training=training, hidden_size=4096, total_steps=1000)
        cfg.validate()
        cfg.to_dict()

    out["from_dict -> resolve -> validate -> to_dict, HF-style ZeRO-3 (configs/s)"] = throughput(full)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()

    fresh = fresh_process(args.repeats)
    ds = fresh["python -c 'import deepspeed'"]
    ours = fresh["dsbuild: import + build + to_dict"]
    print(f"fresh process, median of {args.repeats} alternating runs:")
    print(f"  {'case':<44} {'wall (s)':>9} {'peak RSS (MiB)':>15}")
    for name, r in fresh.items():
        print(f"  {name:<44} {r['wall_s']:>9.3f} {r['peak_mib']:>15.1f}")
    print(f"  dsbuild / import deepspeed wall time: {100 * ours['wall_s'] / ds['wall_s']:.1f}% (goal <= 6%)")
    print(f"  dsbuild peak RSS: {ours['peak_mib']:.1f} MiB (goal <= 30 MiB)")
    rates = in_process()
    print("in process:")
    for name, rate in rates.items():
        print(f"  {name:<72} {rate:>10,.0f}")
    if args.json:
        args.json.write_text(json.dumps({"fresh_process": fresh, "in_process": rates}, indent=2) + "\n")


if __name__ == "__main__":
    main()
