"""Reward, RLOO and KTO jobs are preempted and resume (issue 44: checkpoints, preemption and ``--resume`` as every
job's): each stopped by SIGTERM (Slurm's or Kubernetes' stop) once its first step is logged saves at the next step
and exits 75; resumed to 4 steps in a new process it logs the first step after the stop exactly as the
uninterrupted run (the same weights, data position, RNG and rollout), the later ones to DeepSpeed's CPU Adam's
rounding after a resume (it recomputes its bias correction: ~1e-7, as test_checkpoints.py says), and saves the same
weights to that rounding. And KTO and RLOO jobs train under Ray as under torchrun."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.train, pytest.mark.procs]

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]

TABLES = {
    "reward": '[data]\npath = "pairs.jsonl"\nformat = "preference"\n[reward]\nmax_length = 128\n',
    "kto": '[data]\npath = "unpaired.jsonl"\nformat = "unpaired"\n[kto]\nmax_length = 128\nbeta = 0.2\n',
    "rloo": '[data]\npath = "prompts.jsonl"\nformat = "prompt"\n[rollout]\nbackend = "function"\n'
    'function = "_grpo_functions:complete"\n[rewards]\nfunctions = ["_grpo_functions:reward"]\n'
    "[rloo]\nnum_generations = 4\nmax_completion_length = 16\n",
}
"""Each task's tables: the pairs of examples/data/pairs.jsonl, those pairs' two sides as labelled completions, the
prompts and fixed completions of test_grpo_trl.py's functions."""

JOB = """task = "{task}"
[model]
name_or_path = "{base}"
tokenizer = "byte"
{tables}[training]
per_device_train_batch_size = {micro}
gradient_accumulation_steps = 2
learning_rate = 1e-3
lr_scheduler_type = "constant"
max_steps = 4
logging_steps = 1
save_steps = 2
seed = 0
[strategy]
name = "deepspeed_train"
config = "zero3"
"""

TIMING = {"samples_per_sec", "tokens_per_sec"}
"""What a record holds that depends on the machine, not the run."""


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The base model and each task's data, written once."""
    sys.path.insert(0, str(ROOT / "examples"))
    sys.path.insert(0, str(HERE))
    import _grpo_worker
    import dpo_loop

    tmp = tmp_path_factory.mktemp("task_resume")
    dpo_loop.write_base(tmp / "base")
    pairs = [json.loads(line) for line in (ROOT / "examples" / "data" / "pairs.jsonl").read_text().splitlines()]
    unpaired = [{"prompt": p["prompt"], "completion": p[side], "label": side == "chosen"}
                for p in pairs for side in ("chosen", "rejected")]  # fmt: skip
    for name, records in (("pairs", pairs), ("unpaired", unpaired), ("prompts", _grpo_worker.PROMPTS)):
        (tmp / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return tmp


def _command(folder: Path, task: str, out: str, *options: str) -> tuple[list[str], dict[str, str]]:
    """``dsbuild train`` of ``task``'s job into ``folder / out``, and its environment."""
    job = folder / f"{task}.toml"
    micro = 8 if task == "rloo" else 2
    job.write_text(JOB.format(task=task, base=folder / "base", tables=TABLES[task], micro=micro))
    path = os.pathsep.join(p for p in (str(HERE), os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1", "PYTHONPATH": path}
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "RAY_ADDRESS"):
        env.pop(key, None)
    command = [sys.executable, "-m", "dsbuild", "train", str(job),
               f"--set=training.output_dir={json.dumps(str(folder / out))}", *options]  # fmt: skip
    return command, env


def _history(path: Path) -> list[dict[str, Any]]:
    lines = path.read_text().splitlines() if path.exists() else []
    return [{k: v for k, v in r.items() if k not in TIMING} for r in map(json.loads, lines) if "loss" in r]


def _train(folder: Path, task: str, out: str, *options: str, env: dict[str, str] | None = None) -> list[dict[str, Any]]:
    command, environment = _command(folder, task, out, *options)
    done = subprocess.run(command, capture_output=True, text=True, env={**environment, **(env or {})}, cwd=folder,
                          timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr[-5000:]
    return _history(folder / out / "history.jsonl")


def _preempted(folder: Path, task: str, out: str) -> int:
    """``dsbuild train`` of the job, SIGTERM once its first step is logged: exit 75 and the step it saved and stopped
    at (the next one, before the last)."""
    command, env = _command(folder, task, out)
    run = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=folder)
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and run.poll() is None and not _history(folder / out / "history.jsonl"):
        time.sleep(0.05)
    run.send_signal(signal.SIGTERM)
    _, err = run.communicate(timeout=600)
    assert run.returncode == 75, err[-5000:]
    stopped = max(r["step"] for r in _history(folder / out / "history.jsonl"))
    assert stopped < 4 and f"stopped at step {stopped} by SIGTERM" in err, err[-3000:]
    return stopped


def _weights(path: Path) -> dict[str, Any]:
    from safetensors.torch import load_file

    return load_file(next(path.glob("*.safetensors")))


@pytest.mark.parametrize("task", sorted(TABLES))
def test_a_job_of_each_new_task_is_preempted_and_resumes_as_the_uninterrupted_run(folder: Path, task: str) -> None:
    """SIGTERM after step 1 of 4, then ``--resume`` in a new process: the steps up to the stop and the first after it
    log exactly what the uninterrupted run logs (loss, grad_norm, the task's metrics, num_tokens), the later ones the
    same to 1e-5, and the saved models agree to 1e-5. A reward job resumes at all: its model's pad id was set after
    the check that a checkpoint is this run's."""
    whole = _train(folder, task, f"{task}_whole")
    stopped = _preempted(folder, task, f"{task}_cut")
    resumed = _train(folder, task, f"{task}_cut", "--resume")
    assert [r["step"] for r in whole] == [1, 2, 3, 4] and [r["step"] for r in resumed] == [1, 2, 3, 4]
    assert resumed[: stopped + 1] == whole[: stopped + 1]
    for mine, theirs in zip(resumed[stopped + 1 :], whole[stopped + 1 :], strict=True):
        assert sorted(mine) == sorted(theirs)
        for name, value in theirs.items():
            assert mine[name] == pytest.approx(value, rel=1e-5, abs=1e-6), (name, mine, theirs)
    ours, theirs = _weights(folder / f"{task}_cut" / "model"), _weights(folder / f"{task}_whole" / "model")
    assert sorted(ours) == sorted(theirs)
    assert max(float((ours[k] - theirs[k]).abs().max()) for k in theirs) <= 1e-5


@pytest.mark.parametrize("task", ["kto", "rloo"])
def test_a_job_under_ray_trains_as_under_torchrun(folder: Path, task: str) -> None:
    """A KTO job (its in-order chunks dealt to the ranks, the KL estimate over both) and an RLOO job (its rollout and
    reward functions imported in Ray's workers, the group's rewards gathered) on 2 processes as Ray Train workers
    (``--backend ray``) log every step as the same job under torchrun does, to 1e-6."""
    pytest.importorskip("ray")
    two = ("--nproc-per-node", "2")
    ours = _train(folder, task, f"{task}_torchrun", *two)
    ray = _train(folder, task, f"{task}_ray", *two, "--backend", "ray", env={"RAY_memory_monitor_refresh_ms": "0"})
    assert [r["step"] for r in ray] == [r["step"] for r in ours] == [1, 2, 3, 4]
    for mine, theirs in zip(ray, ours, strict=True):
        assert sorted(mine) == sorted(theirs)
        for name, value in theirs.items():
            assert mine[name] == pytest.approx(value, rel=1e-6, abs=1e-7), (name, mine, theirs)
