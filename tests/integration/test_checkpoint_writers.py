"""DeepSpeed's checkpoint writers (``checkpoint.writer``, its decoupled writer process) under every launcher dsbuild
runs: the one-process demo, torchrun on 2 processes, 2 nodes of a simulated Slurm job; each combination this
machine cannot run is refused before launch by its key. Their checkpoints verify and resume like any other: the
manifest holds the files DeepSpeed's writer wrote, hashed once written."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _runs import stopped_after
from test_train import dsbuild, fresh_env, ok, sets, train_on_two_nodes, train_records

from dsbuild.cli import main
from dsbuild.outputs import manifest
from dsbuild.outputs.history import read as read_history
from dsbuild.session.distributed import free_port

pytestmark = [pytest.mark.train]

DECOUPLED = (
    "--set=strategy.overrides.checkpoint.writer.decoupled=true",
    '--set=strategy.overrides.checkpoint.writer.type="python"',
)
"""The issue's keys: DeepSpeed's decoupled engine with its python writer."""


def _losses(out: Path) -> dict[int, float]:
    return {int(h["step"]): float(h["loss"]) for h in train_records(read_history(out / "history.jsonl"))}  # type: ignore[arg-type]


def _verified(out: Path, *tags: str) -> None:
    listed = ok(dsbuild("checkpoints", str(out), cwd=out.parent))
    for tag in tags:
        assert any(line.split()[0] == tag and line.rstrip().endswith("ok") for line in listed.stdout.splitlines()), (
            listed.stdout
        )


@pytest.mark.procs
@pytest.mark.slow
def test_the_decoupled_writer_saves_verified_checkpoints_that_resume_exactly(tmp_path: Path) -> None:
    """The one-process demo (ZeRO-3) with the decoupled python writer: KeyError 'CROSS_SIZE' before; now every
    checkpoint verifies, its manifest lists DeepSpeed's files, and a resume from step 2 gives the losses of the
    uninterrupted run (fp32, <= 1e-6)."""
    out = tmp_path / "run"
    run = [*DECOUPLED, *sets(max_steps=4, save_steps=2, logging_steps=1, bf16=False, save_total_limit=5)]
    ok(dsbuild("train", *run, *sets(output_dir=str(out)), cwd=tmp_path))
    _verified(out, "global_step2", "global_step4")
    listed = json.loads((out / "checkpoints" / "global_step4" / manifest.MANIFEST).read_text())
    assert "zero_pp_rank_0_mp_rank_00_model_states.pt" in json.dumps(listed)
    again = stopped_after(out, tmp_path / "again", 2)
    ok(dsbuild("train", *run, *sets(output_dir=str(again)), "--resume", cwd=tmp_path))
    whole, resumed = _losses(out), _losses(again)
    assert sorted(resumed) == sorted(whole) == [1, 2, 3, 4]
    for step in (3, 4):
        assert abs(resumed[step] - whole[step]) <= 1e-6 * abs(whole[step]), (step, resumed[step], whole[step])


@pytest.mark.procs
@pytest.mark.parametrize("decoupled", [True, False], ids=["decoupled", "fast-engine"])
def test_the_python_writer_on_two_processes(tmp_path: Path, decoupled: bool) -> None:
    """torchrun, 2 processes at ZeRO-3: each rank's files written by DeepSpeed's writer (in its own process when
    decoupled), every one in the verified manifest."""
    out = tmp_path / "run"
    writer = DECOUPLED if decoupled else DECOUPLED[1:]
    ok(dsbuild("train", "--nproc-per-node", "2", *writer, *sets(max_steps=2, save_steps=2, output_dir=str(out)),
               cwd=tmp_path))  # fmt: skip
    _verified(out, "global_step2")
    held = {p.name for p in (out / "checkpoints" / "global_step2").iterdir()}
    assert {"zero_pp_rank_1_mp_rank_00_model_states.pt", "bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt"} <= held


@pytest.mark.procs
@pytest.mark.slow
def test_the_decoupled_writer_on_two_nodes_of_a_slurm_job(tmp_path: Path) -> None:
    """Two simulated nodes of a Slurm job (one process each, a shared folder): CROSS_SIZE 2, CROSS_RANK 0 and 1 in
    the ranks; the run's checkpoint verifies with rank 1's files, written on node 1."""
    out = tmp_path / "slurm"
    port = str(free_port())
    hosts = "127.0.0.[1-2]"

    def task(rank: int) -> tuple[list[str], dict[str, str]]:
        slurm = {"SLURM_JOB_ID": "1", "SLURM_NNODES": "2", "SLURM_NODEID": str(rank), "SLURM_JOB_NODELIST": hosts}
        step = {"SLURM_STEP_NODELIST": hosts, "SLURM_STEP_NUM_NODES": "2", "SLURM_STEP_NUM_TASKS": "2"}
        return [], {**slurm, **step, "SLURM_PROCID": str(rank), "SLURM_LOCALID": "0", "MASTER_PORT": port}

    train_on_two_nodes(tmp_path, [*DECOUPLED, *sets(max_steps=2, save_steps=2, output_dir=str(out))], task)
    _verified(out, "global_step2")
    assert (out / "checkpoints" / "global_step2" / "zero_pp_rank_1_mp_rank_00_model_states.pt").is_file()


@pytest.mark.parametrize(
    ("writer", "key", "says"),
    [
        (["--set=strategy.overrides.zero_optimization.stage=2", *DECOUPLED], "checkpoint.writer",
         "at ZeRO stage 2: DeepSpeed 0.19's writer engines fail at engine start below stage 3"),
        (['--set=strategy.overrides.checkpoint.writer.type="mock"'], "checkpoint.writer.type",
         "MOCK: DeepSpeed's mock writer writes no files"),
        (["--set=strategy.overrides.checkpoint.writer.decoupled=true"], "checkpoint.writer.type",
         "DeepSpeed's fast writer (the default type of a checkpoint.writer section) needs its async_io op"),
    ],
    ids=["below-zero-3", "mock", "fast-without-async-io"],
)  # fmt: skip
def test_what_this_machine_cannot_run_is_refused_before_launch(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], writer: list[str], key: str, says: str
) -> None:
    """dsbuild train refuses each by its key and the reason, exit 1, before any folder is made (validate runs the
    same checks)."""
    if key == "checkpoint.writer.type" and "async_io" in says:
        from deepspeed.ops.op_builder import AsyncIOBuilder

        if AsyncIOBuilder().is_compatible(verbose=False):
            pytest.skip("the async_io op builds on this machine: the fast writer is not refused here")
    out = tmp_path / "out"
    code = main(["train", *writer, *sets(output_dir=str(out))])
    err = capsys.readouterr().err
    assert code == 1, err
    assert f"{key}: {says}" in err and "dsbuild: error: not started: 1 error" in err
    assert not out.exists()


@pytest.mark.procs
@pytest.mark.parametrize("nproc", [1, 2])
def test_ctrl_c_to_the_whole_process_group_saves_through_the_decoupled_writer(tmp_path: Path, nproc: int) -> None:
    """A terminal's Ctrl-C reaches every process of its group, the decoupled writer's too: the writer lives on to
    write the stop's agreed checkpoint (exit 75, verified), instead of dying with a KeyboardInterrupt first."""
    out = tmp_path / "run"
    command = [sys.executable, "-m", "dsbuild", "train", "--nproc-per-node", str(nproc), *DECOUPLED,
               *sets(max_steps=5000, save_steps=5000, logging_steps=1, output_dir=str(out))]  # fmt: skip
    child = subprocess.Popen(command, cwd=tmp_path, env=fresh_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, start_new_session=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and child.poll() is None:
            history = out / "history.jsonl"
            if history.is_file() and len(train_records(read_history(history))) >= 3:
                break
            time.sleep(0.2)
        os.killpg(child.pid, signal.SIGINT)  # what a terminal sends on Ctrl-C: every process of its group
        stdout, stderr = child.communicate(timeout=300)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.pid, signal.SIGKILL)
    assert child.returncode == 75, stdout[-2000:] + stderr[-4000:]
    tags = [p.name for p in (out / "checkpoints").glob("global_step*")]
    assert len(tags) == 1, tags
    _verified(out, tags[0])
