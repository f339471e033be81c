"""Config-building cost as a user feels it: dsbuild against `import deepspeed` and the HF Trainer's DeepSpeed config.

Each case runs in a fresh Python process (so import time counts, as it does for a
user), the cases alternate, and each is repeated; we report the median wall time
and the median peak RSS (from the child's rusage). dsbuild builds a config once per
launch, so the fresh-process figure is the one that matters (goal: <= 5 % of
`import deepspeed`); configs per second in a warm process are not measured.

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

CASES = {
    "dsbuild: import + build + to_dict": (
        "import dsbuild\nfrom dsbuild import Config\nConfig.zero(3).offload_cpu().bf16().adamw(lr=1e-5).to_dict()\n"
    ),
    "dsbuild presets (the CLI's entry point)": "import sys\nfrom dsbuild.cli import main\nsys.exit(main(['presets']))\n",
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
    # As installed: pip writes every package's bytecode at install time, so the children may write (and then
    # read) dsbuild's too; with PYTHONDONTWRITEBYTECODE set (as on the dev VM) an editable dsbuild was compiled
    # from source on every run while deepspeed and transformers read their installed bytecode.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["DS_ACCELERATOR"] = os.environ.get("DS_ACCELERATOR", "cpu")
    start = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    if status != 0:
        raise RuntimeError(f"case failed: {proc.stderr.read().decode() if proc.stderr else ''}")
    return wall, usage.ru_maxrss / 1024  # Linux reports KiB


def fresh_process(repeats: int) -> dict[str, dict[str, float]]:
    samples: dict[str, list[tuple[float, float]]] = {name: [] for name in CASES}
    for code in CASES.values():  # warm the page cache once, and write bytecode as an install would
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
    cli = fresh["dsbuild presets (the CLI's entry point)"]
    print(f"  dsbuild config / import deepspeed wall time: {ours['wall_s'] / ds['wall_s']:.3f} (goal <= 0.05)")
    print(f"  dsbuild presets / import deepspeed wall time: {cli['wall_s'] / ds['wall_s']:.3f} (goal <= 0.10)")
    print(f"  dsbuild peak RSS: {ours['peak_mib']:.1f} MiB (goal <= 30 MiB)")
    if args.json:
        args.json.write_text(json.dumps({"fresh_process": fresh}, indent=2) + "\n")


if __name__ == "__main__":
    main()
