"""Ulysses sequence parallelism trains the model it would train without it: ``sequence_parallel_size = 2`` on 2
processes against 1 process without it, the same samples, through ``Session.fit`` and through ``dsbuild train``."""

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
WORKER = HERE / "_sequence_worker.py"


def _run(sp: int, stage: int, out: Path) -> dict[str, Any]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
    }
    env["DS_ACCELERATOR"] = "cpu"
    argv = [str(WORKER), str(sp), str(stage), str(out)]
    if sp > 1:
        argv = ["-m", "torch.distributed.run", f"--nproc-per-node={sp}", "--master-port=29611", *argv]
    out.mkdir(parents=True)
    done = subprocess.run([sys.executable, *argv], capture_output=True, text=True, env=env, timeout=600, cwd=HERE)
    assert done.returncode == 0, done.stderr[-4000:]
    result: dict[str, Any] = json.loads((out / "result.json").read_text())
    result["weights"] = safetensors.load_file(str(out / "model" / "model.safetensors"))
    return result


@pytest.mark.parametrize("stage", [2, 3])
def test_two_way_sequence_parallelism_trains_as_one_process(stage: int, tmp_path: Path) -> None:
    """3 optimizer steps of variable-length SFT samples (prompts untrained, accumulation 2): the logged losses, the
    evaluation loss and every weight of the saved model equal the 1-process run's."""
    one = _run(1, stage, tmp_path / "one")
    two = _run(2, stage, tmp_path / "two")
    assert len(one["losses"]) == len(two["losses"]) == 3
    for a, b in zip(one["losses"], two["losses"], strict=True):
        assert abs(a - b) <= 1e-5 * abs(a), (one["losses"], two["losses"])
    assert abs(one["eval_loss"] - two["eval_loss"]) <= 1e-5 * abs(one["eval_loss"])
    assert one["weights"].keys() == two["weights"].keys()
    worst = max(float((one["weights"][k].float() - two["weights"][k].float()).abs().max()) for k in one["weights"])
    assert worst <= 1e-5, worst


def _train(job: Path, out: Path, *argv: str) -> list[float]:
    env = {**os.environ, "DS_ACCELERATOR": "cpu"}
    command = [sys.executable, "-m", "dsbuild", "train", str(job), f"--set=training.output_dir={out}", *argv]
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600, cwd=job.parent)
    assert done.returncode == 0, done.stderr[-4000:]
    records = [json.loads(line) for line in (out / "history.jsonl").read_text().splitlines()]
    return [r["loss"] for r in records if "loss" in r]


def test_dsbuild_train_with_sequence_parallelism_trains_and_resumes_as_one_process(
    tiny_job: Any, tmp_path: Path
) -> None:
    """``[strategy.overrides] sequence_parallel_size = 2`` on 2 processes logs the 1-process run's losses for the demo
    data (alpaca, prompts untrained, accumulation 2), and a resume from its step-2 checkpoint the same steps 3-4."""
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
    sp = ["--nproc-per-node=2", "--set=strategy.overrides.sequence_parallel_size=2"]
    two = _train(job, tmp_path / "two", *sp)
    assert len(one) == len(two) == 4
    for a, b in zip(one, two, strict=True):
        assert abs(a - b) <= 1e-5 * abs(a), (one, two)
    resumed = _train(job, tmp_path / "two", *sp, "--resume-from=global_step2")
    for a, b in zip(two, resumed, strict=True):
        assert abs(a - b) <= 1e-5 * abs(a), (two, resumed)
