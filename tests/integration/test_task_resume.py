"""Reward, RLOO and KTO jobs resume (issue 44: checkpoints and ``--resume`` as every job's): each stopped after 2
steps and resumed to 4 in a new process logs step 3 exactly as the uninterrupted 4-step run (the same weights, data
position, RNG and rollout), step 4 to DeepSpeed's CPU Adam's rounding after a resume (it recomputes its bias
correction: ~1e-7, as test_checkpoints.py says), and saves the same weights to that rounding."""

from __future__ import annotations

import json
import os
import subprocess
import sys
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


def _train(folder: Path, task: str, out: str, *options: str) -> list[dict[str, Any]]:
    job = folder / f"{task}.toml"
    micro = 8 if task == "rloo" else 2
    job.write_text(JOB.format(task=task, base=folder / "base", tables=TABLES[task], micro=micro))
    path = os.pathsep.join(p for p in (str(HERE), os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1", "PYTHONPATH": path}
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    done = subprocess.run([sys.executable, "-m", "dsbuild", "train", str(job),
                           f"--set=training.output_dir={json.dumps(str(folder / out))}", *options],
                          capture_output=True, text=True, env=env, cwd=folder, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr[-5000:]
    history = [json.loads(line) for line in (folder / out / "history.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k not in TIMING} for r in history if "loss" in r]


def _weights(path: Path) -> dict[str, Any]:
    from safetensors.torch import load_file

    return load_file(next(path.glob("*.safetensors")))


@pytest.mark.parametrize("task", sorted(TABLES))
def test_a_job_of_each_new_task_resumes_as_the_uninterrupted_run(folder: Path, task: str) -> None:
    """Stopped after 2 of 4 steps and resumed in a new process: step 3 logs exactly what the uninterrupted run logs
    (loss, grad_norm, the task's metrics, num_tokens), step 4 the same to 1e-5, and the saved models agree to 1e-5.
    A reward job resumes at all: its model's pad id was set after the check that a checkpoint is this run's."""
    whole = _train(folder, task, f"{task}_whole")
    _train(folder, task, f"{task}_cut", "--set=training.max_steps=2")
    resumed = _train(folder, task, f"{task}_cut", "--resume")
    assert [r["step"] for r in whole] == [1, 2, 3, 4] and [r["step"] for r in resumed] == [1, 2, 3, 4]
    assert resumed[2] == whole[2]
    assert sorted(resumed[3]) == sorted(whole[3])
    for name, value in whole[3].items():
        assert resumed[3][name] == pytest.approx(value, rel=1e-5, abs=1e-6), (name, resumed[3], whole[3])
    ours, theirs = _weights(folder / f"{task}_cut" / "model"), _weights(folder / f"{task}_whole" / "model")
    assert sorted(ours) == sorted(theirs)
    assert max(float((ours[k] - theirs[k]).abs().max()) for k in theirs) <= 1e-5
