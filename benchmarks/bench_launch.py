"""The launcher's checks of a run in other processes: `dsbuild validate` of the tiny job, and the whole 2-process run
`dsbuild train --nproc-per-node 2`, each with dsbuild's cache folder empty (a `[model.config]` never seen) and with
the table remembered (a relaunch); the job and data of bench_startup.py.

`dsbuild train` checks the job before any process starts (what `dsbuild validate` checks); for a run in other
processes that check is the launcher's own cost, paid before torchrun starts. A `[model.config]` table its class
accepted is remembered under `~/.cache/dsbuild/model-config` (`dsbuild.run.model`), so the check of a relaunch does
not import torch. Runs alternate; the figures are medians.

    .venv/bin/python benchmarks/bench_launch.py --rounds 5 [--json benchmarks/results/launch.json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from bench_startup import alternate, setup


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", type=Path, help="write the samples and medians here")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="bench_launch_"))
    setup(root)
    python = sys.executable
    dsbuild = str(Path(python).with_name("dsbuild"))
    extensions = os.environ.get("TORCH_EXTENSIONS_DIR") or str(Path.home() / ".cache" / "torch_extensions")
    folder = root / "cache"

    def cache(kept: bool) -> list[str]:
        """``env`` with dsbuild's cache folder, its remembered model configs kept or deleted first (the CPU's features
        stay: DeepSpeed's op loads ask for them either way); torch's built ops stay where they are."""
        if not kept:
            shutil.rmtree(folder / "dsbuild" / "model-config", ignore_errors=True)  # a table never seen
        return ["env", f"XDG_CACHE_HOME={folder}", f"TORCH_EXTENSIONS_DIR={extensions}"]

    def train(i: int, kept: bool) -> list[str]:
        out = f"--set=training.output_dir='out/{'kept' if kept else 'empty'}{i}'"
        return [*cache(kept), dsbuild, "train", "job.toml", "--nproc-per-node", "2", out]

    commands = {
        "dsbuild validate, empty cache": lambda i: [*cache(False), dsbuild, "validate", "job.toml"],
        "dsbuild validate, table remembered": lambda i: [*cache(True), dsbuild, "validate", "job.toml"],
        "dsbuild train -n 2, empty cache": lambda i: train(i, False),
        "dsbuild train -n 2, table remembered": lambda i: train(i, True),
        "floor: python -c 'import torch'": lambda i: [python, "-c", "import torch"],
    }
    samples, medians = alternate(commands, root, args.rounds)
    print()
    for name, m in medians.items():
        print(f"{name:<40} median {m['wall']:.2f} s   peak {m['peak_mib']:.0f} MiB")
    for what in ("dsbuild validate", "dsbuild train -n 2"):
        kept, cold = medians[f"{what}, table remembered"], medians[f"{what}, empty cache"]
        print(f"{what}: remembered / empty cache: time {kept['wall'] / cold['wall']:.2f}x "
              f"({cold['wall'] - kept['wall']:.2f} s less)")  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps({"rounds": args.rounds, "samples": samples, "medians": medians}, indent=1))
    print(f"({time.strftime('%Y-%m-%d')}, {os.cpu_count()} CPUs, {args.rounds} alternating rounds, work dir {root})")


if __name__ == "__main__":
    main()
