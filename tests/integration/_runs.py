"""Helpers for tests that resume a run folder made by another test's run, and the runs the session shares."""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from dsbuild.outputs.history import cut_after


def stopped_after(finished: Path, run: Path, step: int) -> Path:
    """A copy of the run folder ``finished`` at ``run``, as if the run had stopped right after its checkpoint of
    ``step``: the later checkpoints and history records gone, so the later steps in the copy's history can only come
    from a resumed run. ``finished`` is not changed."""
    shutil.copytree(finished, run)
    checkpoints = run / "checkpoints"
    for saved in checkpoints.glob("global_step*"):
        found = re.fullmatch(r"global_step(\d+)", saved.name)
        if found and int(found.group(1)) > step:
            shutil.rmtree(saved)
    assert (checkpoints / f"global_step{step}").is_dir(), f"{finished} has no checkpoint of step {step}"
    (checkpoints / "latest").write_text(f"global_step{step}")
    cut_after(run / "history.jsonl", step)
    return run


DEMO_ON_TWO = (
    "--nproc-per-node", "2", "--set=training.max_steps=8", "--set=training.save_steps=2",
    "--set=training.save_total_limit=10", "--set=training.logging_steps=1", "--set=training.bf16=false",
)  # fmt: skip
"""The demo job (ZeRO-3) on 2 processes in fp32 (a resume equals the uninterrupted run to 1e-6; bf16's rounding
alone moves a resume by up to ~8e-5), 8 steps, every step logged, a checkpoint every 2 steps, all kept. The demo warms
up for 10 steps, so each of these steps has the learning rate of the same step in any run of up to 10 steps: their
losses are those of a shorter run too."""


def finished_once(root: Path, name: str, argv: Sequence[str]) -> tuple[Path, str]:
    """``dsbuild train ARGV`` run once in ``root / name / "run"`` for every test of the session, whichever xdist worker
    asks first (a lock beside it: the other waits and takes the same folder); the run folder, which tests copy and never
    change, and what the command printed. A run that failed fails every test that asks for it, with its output."""
    folder = root / name
    folder.mkdir(parents=True, exist_ok=True)
    with (root / f"{name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (folder / "returncode").is_file():
            env = {k: v for k, v in os.environ.items() if k not in _LAUNCHER_KEYS}
            done = subprocess.run(
                [sys.executable, "-m", "dsbuild", "train", *argv,
                 f"--set=training.output_dir={json.dumps(str(folder / 'run'))}"],
                capture_output=True, text=True, env={**env, "DS_ACCELERATOR": "cpu"}, timeout=900,
            )  # fmt: skip
            (folder / "said.txt").write_text(done.stdout + done.stderr, encoding="utf-8")
            (folder / "returncode").write_text(str(done.returncode))
    said = (folder / "said.txt").read_text(encoding="utf-8")
    assert (folder / "returncode").read_text() == "0", f"the shared run {name} failed:\n{said[-5000:]}"
    return folder / "run", said


_LAUNCHER_KEYS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
