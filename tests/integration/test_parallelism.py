"""Sequence and tensor parallelism through ``dsbuild train``: ``sequence_parallel_size = 2`` (Ulysses) and
``tensor_parallel.autotp_size = 2`` (AutoTP) on 2 processes log the 1-process run's losses and resume as it does
(``Session.fit`` at generated run shapes: tests/integration/test_run_shapes.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.train, pytest.mark.procs]


def _train(job: Path, out: Path, *argv: str) -> list[float]:
    env = {**os.environ, "DS_ACCELERATOR": "cpu"}
    command = [sys.executable, "-m", "dsbuild", "train", str(job), f"--set=training.output_dir={out}", *argv]
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600, cwd=job.parent)
    assert done.returncode == 0, done.stderr[-4000:]
    records = [json.loads(line) for line in (out / "history.jsonl").read_text().splitlines()]
    return [r["loss"] for r in records if "loss" in r]


TRAINING = {
    "per_device_train_batch_size": 2,
    "gradient_accumulation_steps": 2,
    "max_steps": 4,
    "logging_steps": 1,
    "bf16": False,
    "save_strategy": "steps",
    "save_steps": 2,
}
"""The demo data (alpaca, prompts untrained), accumulation 2, fp32, a checkpoint every 2 steps."""


@pytest.fixture(scope="module")
def one_process(module_tiny_job: Any) -> list[float]:
    """The losses of the job on 1 process, the run both parallel runs are held to."""
    job = module_tiny_job(training=TRAINING)
    return _train(job, job.parent / "one")


@pytest.mark.parametrize(
    "parallel", ["sequence_parallel_size=2", "tensor_parallel.autotp_size=2"], ids=["sequence", "autotp"]
)
def test_dsbuild_train_with_parallelism_trains_and_resumes_as_one_process(
    tiny_job: Any, tmp_path: Path, one_process: list[float], parallel: str
) -> None:
    """A job with sequence parallelism 2 or AutoTP 2 in ``[strategy.overrides]``, on 2 processes, logs the 1-process
    run's losses for the demo data, and a resume from its step-2 checkpoint the same steps 3-4."""
    job = tiny_job(training=TRAINING)
    flags = ["--nproc-per-node=2", f"--set=strategy.overrides.{parallel}"]
    two = _train(job, tmp_path / "two", *flags)
    assert len(one_process) == len(two) == 4
    for a, b in zip(one_process, two, strict=True):
        assert abs(a - b) <= 1e-5 * abs(a), (one_process, two)
    resumed = _train(job, tmp_path / "two", *flags, "--resume-from=global_step2")
    for a, b in zip(two, resumed, strict=True):
        assert abs(a - b) <= 1e-5 * abs(a), (two, resumed)
