"""A resume at another world size: `dsbuild train --resume` with 1 process continues a 2-process ZeRO-3 run, and with
2 processes a 1-process ZeRO-2 run, through DeepSpeed's universal checkpoint, made and verified by dsbuild; the
resumed weights are the saved ones and the losses those of the run that was never interrupted."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest
from _runs import stopped_after

from dsbuild.outputs.history import read as read_history
from dsbuild.outputs.manifest import verify

pytestmark = [
    pytest.mark.slow,
    pytest.mark.train,
    pytest.mark.procs,
]  # 2-process runs, a conversion and a load, each in a new process

FEW_STEPS = ["--set=training.save_steps=2", "--set=training.logging_steps=1", "--set=training.bf16=false"]
"""The demo job in fp32 (bf16's rounding alone differs by 4e-5 two steps on), a checkpoint every 2 steps. The global
batch is the same on both sides of each resume (16 x 2 processes, or 16 x 2 accumulation steps on 1): each step trains
on the same samples, so the losses can be compared with the uninterrupted run's."""

WEIGHTS = textwrap.dedent(
    """
    import json, sys
    from pathlib import Path
    import torch, deepspeed
    from safetensors.torch import load_file
    from dsbuild.job import demo_job_path, load_job
    from dsbuild.run.worker import prepare
    run, overrides = Path(sys.argv[1]), json.loads(sys.argv[2])
    session = prepare(load_job(demo_job_path(), overrides)).session
    position = session.load_checkpoint(tag="global_step8")
    saved = load_file(run / "model" / "model.safetensors")  # what the 2-process run exported at its end, step 8
    worst, compared = 0.0, 0
    for name, p in session.engine.module.named_parameters():
        with deepspeed.zero.GatheredParameters([p]):
            if name in saved:
                worst = max(worst, (p.detach().float() - saved[name].float()).abs().max().item())
                compared += 1
    print(json.dumps({"step": position["global_step"], "batch": position["batch_in_epoch"], "compared": compared,
                      "worst": worst}))
    """
)


def _train(out: Path, nproc: int, steps: int, *args: str, resume: bool = False) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "DS_ACCELERATOR": "cpu"}
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    command = [sys.executable, "-m", "dsbuild", "train", "--nproc-per-node", str(nproc), *FEW_STEPS,
               f"--set=training.output_dir='{out}'", f"--set=training.max_steps={steps}", *args]  # fmt: skip
    if resume:
        command.append("--resume")
    return subprocess.run(command, capture_output=True, text=True, cwd=out.parent, env=env, timeout=600)


def _losses(out: Path) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in read_history(out / "history.jsonl") if "loss" in r}


def _assert_continues(resumed: dict[int, float], uninterrupted: dict[int, float]) -> None:
    for step in (5, 6, 7, 8):
        assert resumed[step] == pytest.approx(uninterrupted[step], rel=1e-5, abs=1e-6), (step, resumed, uninterrupted)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory, demo_on_two: tuple[Path, str]) -> Callable[[str], Path]:
    """The folder of 8 uninterrupted steps on 2 processes at a ZeRO stage (``"zero2"``, ``"zero3"``), every checkpoint
    kept: one run per stage for the whole module (ZeRO-3, the demo's own stage: the session's ``demo_on_two``), which
    the tests copy and never change."""
    made: dict[str, Path] = {"zero3": demo_on_two[0]}

    def run(stage: str) -> Path:
        if stage not in made:
            out = tmp_path_factory.mktemp(stage) / "uninterrupted"
            done = _train(out, 2, 8, f"--set=strategy.config='{stage}'", "--set=training.save_total_limit=10")
            assert done.returncode == 0, done.stderr[-3000:]
            made[stage] = out
        return made[stage]

    return run


@pytest.mark.parametrize(
    ("stage", "before", "after"),
    [
        ("zero3", (2, []), (1, ["--set=training.gradient_accumulation_steps=2"])),
        ("zero3", (1, ["--set=training.gradient_accumulation_steps=2"]), (2, [])),
        ("zero2", (2, []), (1, ["--set=training.gradient_accumulation_steps=2"])),
        ("zero2", (1, ["--set=training.gradient_accumulation_steps=2"]), (2, [])),
    ],
    ids=["zero3-2-to-1", "zero3-1-to-2", "zero2-2-to-1", "zero2-1-to-2"],
)
def test_a_resume_at_another_world_size_continues_the_run(
    tmp_path: Path,
    uninterrupted: Callable[[str], Path],
    stage: str,
    before: tuple[int, list[str]],
    after: tuple[int, list[str]],
) -> None:
    """4 steps on one world size, --resume to 8 on the other: converted once, verified, and the losses of steps 5-8
    equal (fp32) those of 8 uninterrupted steps on 2 processes (the run itself, when it started on 2)."""
    preset = f"--set=strategy.config='{stage}'"
    (nproc, args), (nproc_after, args_after) = before, after
    reference = uninterrupted(stage)
    run = tmp_path / "run"
    if nproc == 2:
        stopped_after(reference, run, 4)
    else:
        first = _train(run, nproc, 4, preset, *args)
        assert first.returncode == 0, first.stderr[-3000:]
    resumed = _train(run, nproc_after, 8, preset, *args_after, resume=True)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    said = resumed.stdout + resumed.stderr
    assert f"global_step4 was saved by {nproc} process(es)" in said and "universal checkpoint" in said, said[-3000:]
    assert "resumed 128 samples into its epoch" in said  # 4 steps x 32 samples: none trained twice, none skipped
    _assert_continues(_losses(run), _losses(reference))
    assert verify(run / "checkpoints" / "global_step8")["run"]["world_size"] == nproc_after


def test_the_resumed_weights_are_the_saved_ones(tmp_path: Path, uninterrupted: Callable[[str], Path]) -> None:
    """A 2-process ZeRO-3 checkpoint loaded by Session.load_checkpoint in 1 process: every weight equals what the run
    exported at that step, the data position is carried over in samples, and the universal form verifies."""
    run = tmp_path / "run"
    shutil.copytree(uninterrupted("zero3"), run)
    overrides = {"training.output_dir": str(run), "training.bf16": False, "training.gradient_accumulation_steps": 2}
    env = {**os.environ, "DS_ACCELERATOR": "cpu"}
    loaded = subprocess.run(
        [sys.executable, "-c", WEIGHTS, str(run), json.dumps(overrides)],
        capture_output=True, text=True, cwd=tmp_path, env=env, timeout=600,
    )  # fmt: skip
    assert loaded.returncode == 0, loaded.stderr[-3000:]
    result = json.loads(loaded.stdout.strip().splitlines()[-1])
    assert result["step"] == 8 and result["compared"] > 0 and result["worst"] == 0.0, result
    assert result["batch"] == 16  # 8 steps x 2 micro-batches of 16 on 1 process = 256 samples
    universal = verify(run / "checkpoints" / "global_step8" / "universal")  # every file hashed
    assert universal["run"]["world_size"] == 2 and any(name.startswith("zero/") for name in universal["files"])


def test_a_resume_that_also_changes_the_zero_stage_is_refused(
    tmp_path: Path, uninterrupted: Callable[[str], Path]
) -> None:
    """World size and ZeRO stage both changed: refused before training, naming both, with no conversion made."""
    run = tmp_path / "run"
    shutil.copytree(uninterrupted("zero3"), run)  # 2 processes, ZeRO-3
    refused = _train(run, 1, 8, "--set=strategy.config='zero2'", "--set=training.save_total_limit=10", resume=True)
    assert refused.returncode == 2, refused.stderr[-3000:]  # the checkpoint cannot be used: nothing trained
    assert "saved by a different run" in refused.stderr and "zero_stage" in refused.stderr
    assert "Traceback" not in refused.stderr
    assert not list(run.glob("checkpoints/*/universal"))
