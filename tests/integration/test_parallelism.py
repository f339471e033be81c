"""Sequence and tensor parallelism train the model the run would train without them: ``sequence_parallel_size = 2``
(Ulysses) and ``tensor_parallel.autotp_size = 2`` (AutoTP) on 2 processes against 1 process without, the same
samples, through ``Session.fit`` and through ``dsbuild train``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("deepspeed")
torch = pytest.importorskip("torch")
safetensors = pytest.importorskip("safetensors.torch")

pytestmark = [pytest.mark.slow, pytest.mark.train]

HERE = Path(__file__).parent
WORKER = HERE / "_parallel_worker.py"


def run_worker(kind: str, degree: int, stage: int, out: Path) -> dict[str, Any]:
    """One side of a differential: ``_parallel_worker.py`` on ``degree`` processes; its losses and saved weights."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
    }
    env["DS_ACCELERATOR"] = "cpu"
    argv = [str(WORKER), kind, str(degree), str(stage), str(out)]
    if degree > 1:
        argv = ["-m", "torch.distributed.run", f"--nproc-per-node={degree}", "--master-port=29611", *argv]
    out.mkdir(parents=True)
    done = subprocess.run([sys.executable, *argv], capture_output=True, text=True, env=env, timeout=600, cwd=HERE)
    assert done.returncode == 0, done.stderr[-4000:]
    result: dict[str, Any] = json.loads((out / "result.json").read_text())
    result["weights"] = safetensors.load_file(str(out / "model" / "model.safetensors"))
    return result


def assert_same_run(one: dict[str, Any], two: dict[str, Any]) -> None:
    """Three logged losses, the evaluation loss (relative 1e-5) and every saved weight (1e-5) agree."""
    assert len(one["losses"]) == len(two["losses"]) == 3
    for a, b in zip(one["losses"], two["losses"], strict=True):
        assert abs(a - b) <= 1e-5 * abs(a), (one["losses"], two["losses"])
    assert abs(one["eval_loss"] - two["eval_loss"]) <= 1e-5 * abs(one["eval_loss"])
    assert one["weights"].keys() == two["weights"].keys()
    for k in one["weights"]:
        assert one["weights"][k].shape == two["weights"][k].shape, k
    worst = max(float((one["weights"][k].float() - two["weights"][k].float()).abs().max()) for k in one["weights"])
    assert worst <= 1e-5, worst


@pytest.mark.parametrize("stage", [2, 3])
def test_two_way_sequence_parallelism_trains_as_one_process(stage: int, tmp_path: Path) -> None:
    """3 optimizer steps of variable-length SFT samples (prompts untrained, accumulation 2): the logged losses, the
    evaluation loss and every weight of the saved model equal the 1-process run's."""
    one = run_worker("sequence", 1, stage, tmp_path / "one")
    two = run_worker("sequence", 2, stage, tmp_path / "two")
    assert_same_run(one, two)


def _train(job: Path, out: Path, *argv: str) -> list[float]:
    env = {**os.environ, "DS_ACCELERATOR": "cpu"}
    command = [sys.executable, "-m", "dsbuild", "train", str(job), f"--set=training.output_dir={out}", *argv]
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600, cwd=job.parent)
    assert done.returncode == 0, done.stderr[-4000:]
    records = [json.loads(line) for line in (out / "history.jsonl").read_text().splitlines()]
    return [r["loss"] for r in records if "loss" in r]


@pytest.mark.parametrize(
    "parallel", ["sequence_parallel_size=2", "tensor_parallel.autotp_size=2"], ids=["sequence", "autotp"]
)
def test_dsbuild_train_with_parallelism_trains_and_resumes_as_one_process(
    tiny_job: Any, tmp_path: Path, parallel: str
) -> None:
    """A job with sequence parallelism 2 or AutoTP 2 in ``[strategy.overrides]``, on 2 processes, logs the 1-process
    run's losses for the demo data (alpaca, prompts untrained, accumulation 2), and a resume from its step-2
    checkpoint the same steps 3-4."""
    job = tiny_job(
        training={
            "per_device_train_batch_size": 2,
            "gradient_accumulation_steps": 2,
            "max_steps": 4,
            "logging_steps": 1,
            "bf16": False,
            "save_strategy": "steps",
            "save_steps": 2,
        }
    )
    one = _train(job, tmp_path / "one")
    flags = ["--nproc-per-node=2", f"--set=strategy.overrides.{parallel}"]
    two = _train(job, tmp_path / "two", *flags)
    assert len(one) == len(two) == 4
    for a, b in zip(one, two, strict=True):
        assert abs(a - b) <= 1e-5 * abs(a), (one, two)
    resumed = _train(job, tmp_path / "two", *flags, "--resume-from=global_step2")
    for a, b in zip(two, resumed, strict=True):
        assert abs(a - b) <= 1e-5 * abs(a), (two, resumed)


@pytest.mark.parametrize("stage", [1, 2])
def test_two_way_autotp_trains_as_one_process(stage: int, tmp_path: Path) -> None:
    """AutoTP over 2 processes (one data-parallel replica; both read the same batches): the logged losses, the
    evaluation loss and every weight of the saved model, gathered whole from the two slices, equal the 1-process
    run's."""
    one = run_worker("tensor", 1, stage, tmp_path / "one")
    two = run_worker("tensor", 2, stage, tmp_path / "two")
    assert_same_run(one, two)
