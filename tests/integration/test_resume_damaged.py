"""A damaged shard on any rank never hangs a multi-process resume: every process checks its own share of the newest
checkpoint and all agree before any enters DeepSpeed's load, so ``dsbuild train --resume`` on 2 processes at
ZeRO-3 with one flipped byte in either rank's shard falls back to the previous checkpoint and continues with the
uninterrupted run's losses (before, the damaged rank stopped while the other waited in DeepSpeed's collectives
until the process group's timeout)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _runs import DEMO_ON_TWO, stopped_after

from dsbuild.outputs.history import read as read_history

pytestmark = [pytest.mark.slow, pytest.mark.train, pytest.mark.procs]  # 2-process runs


def _train(out: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "DS_ACCELERATOR": "cpu"}
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    command = [sys.executable, "-m", "dsbuild", "train", *DEMO_ON_TWO, *args]  # the uninterrupted run's job
    command.append(f"--set=training.output_dir={json.dumps(str(out))}")
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=900)


def _losses(out: Path) -> dict[int, float]:
    return {int(h["step"]): float(h["loss"]) for h in read_history(out / "history.jsonl") if h.get("loss") is not None}


@pytest.fixture(scope="module")
def uninterrupted(demo_on_two: tuple[Path, str]) -> Path:
    """The session's uninterrupted 2-process run (checkpoints global_step2 to 8), which the tests copy."""
    run, said = demo_on_two
    # torchrun's lines of rank 0 name its node and global rank (launch.LOG_PREFIX), not [default0]:
    assert "[node0 rank0]:" in said and "[default0]" not in said
    return run


@pytest.mark.parametrize("rank", [0, 1])
def test_a_flipped_byte_in_one_ranks_shard_falls_back_without_a_hang(
    tmp_path: Path, uninterrupted: Path, rank: int
) -> None:
    """One byte flipped in rank R's optimizer shard of global_step4: --resume names it, resumes from global_step2 on
    both ranks, and steps 3-6 have the uninterrupted run's losses; the whole command ends long before the process
    group's 600 s timeout would."""
    reference = _losses(uninterrupted)
    out = stopped_after(uninterrupted, tmp_path / "out", 4)
    shard = out / "checkpoints" / "global_step4" / f"zero_pp_rank_{rank}_mp_rank_00_optim_states.pt"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))

    started = time.monotonic()
    done = _train(out, "--resume", "--set=training.max_steps=6")
    took = time.monotonic() - started
    assert done.returncode == 0, done.stderr[-3000:]
    assert took < 300, took  # a hang waits for ddp_timeout (600 s) and fails
    said = done.stdout + done.stderr
    assert f"skipped a damaged checkpoint: {shard}: its contents differ" in said, said[-3000:]
    assert f"resumed from {out / 'checkpoints' / 'global_step2'} at step 2" in said
    losses = _losses(out)
    assert sorted(losses) == [1, 2, 3, 4, 5, 6]
    for step in (3, 4, 5, 6):
        assert abs(losses[step] - reference[step]) <= 1e-6 * abs(reference[step]), (step, losses[step])
