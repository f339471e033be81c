"""Every check that depends on the world size runs on the world size the run will have — ``--nproc-per-node``,
``--nnodes``, ``launch.*``, Slurm's node count, Ray's workers — before anything starts: exit 1, no output folder, so
the same command corrected runs without ``--overwrite``."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from dsbuild.cli import main

pytestmark = pytest.mark.train

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

GROUPS = "grpo.num_generations: generation_batch_size (6) must be divisible by num_generations (4)."
"""TRL's refusal of the job's generation batch at 3 processes: 2 prompts' completions per process, groups of 4."""


@pytest.fixture(autouse=True)
def _outside_slurm(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in [k for k in os.environ if k.startswith("SLURM_")]:
        monkeypatch.delenv(key)


@pytest.fixture
def grpo_job(tmp_path: Path) -> Path:
    """The GRPO example on 2 processes with 2 completions per process: a generation batch of 4, one group of 4 at 2
    processes (and 4), not at 1, 3 or 6."""
    shutil.copytree(EXAMPLES / "data", tmp_path / "data")
    shutil.copy(EXAMPLES / "grpo_rewards.py", tmp_path)
    text = (EXAMPLES / "job_grpo.toml").read_text(encoding="utf-8")
    text = text.replace("per_device_train_batch_size = 8", "per_device_train_batch_size = 2")
    job = tmp_path / "job.toml"
    job.write_text(text + "\n[launch]\nnproc_per_node = 2\n", encoding="utf-8")
    return job


@pytest.mark.parametrize(
    ("flags", "slurm"),
    [
        (["--nproc-per-node", "3"], {}),
        (["--set", "launch.nproc_per_node=3"], {}),
        (["--nproc-per-node", "1", "--nnodes", "3", "--node-rank", "0", "--master-addr", "127.0.0.1"], {}),
        (["--nproc-per-node", "1"], {"SLURM_JOB_ID": "7", "SLURM_NNODES": "3", "SLURM_NODEID": "0",
                                     "SLURM_JOB_NODELIST": "n[1-3]", "SLURM_STEP_NODELIST": "n[1-3]"}),
        (["--nproc-per-node", "3", "--backend", "ray"], {}),
    ],
    ids=["--nproc-per-node", "launch.nproc_per_node", "--nnodes", "slurm", "ray"],
)  # fmt: skip
def test_a_grpo_batch_that_no_longer_holds_whole_groups_at_the_runs_world_size_is_refused_before_anything_starts(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    grpo_job: Path,
    flags: list[str],
    slurm: dict[str, str],
) -> None:
    """A job that validates at its own 2 processes, run on 3 by each way a world size is given: TRL's refusal of the
    generation batch by its dotted key, exit 1, and no output folder left behind."""
    for key, value in slurm.items():
        monkeypatch.setenv(key, value)
    assert main(["validate", str(grpo_job)]) == 0
    capsys.readouterr()
    code = main(["train", str(grpo_job), *flags])
    err = capsys.readouterr().err
    assert code == 1, err
    assert err.startswith(f"dsbuild: error: {grpo_job}: {GROUPS}"), err
    assert "Traceback" not in err
    assert not (grpo_job.parent / "out").exists()


def test_a_config_check_runs_at_the_world_size_of_the_nodes(
    capsys: pytest.CaptureFixture[str], tiny_job: object
) -> None:
    """DeepSpeed's batch triangle (``train_batch_size = 4`` with 2 per device, no accumulation: 2 processes) holds at
    the job's 2 processes and is refused at 2 nodes of 2 (4 processes) before anything starts."""
    assert callable(tiny_job)
    job = tiny_job(training={"per_device_train_batch_size": 2},
                   extra="\n[strategy.overrides]\ntrain_batch_size = 4\n\n[launch]\nnproc_per_node = 2\n")  # fmt: skip
    code = main(["train", str(job), "--nnodes", "2", "--node-rank", "0", "--master-addr", "127.0.0.1"])
    err = capsys.readouterr().err
    assert code == 1, err
    assert "train_batch_size" in err and "not started: " in err, err
    assert not (job.parent / "out").exists()
