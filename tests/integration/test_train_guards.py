"""``dsbuild train`` loses nothing: an earlier run's folder is refused (every file left byte-identical), a second
run is kept out by the lock, --overwrite moves the earlier run aside, a NaN run fails, a stale op build lock is
reported instead of hanging, and `dsbuild checkpoints` lists and verifies. Real runs of the demo job, shortened."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.train, pytest.mark.procs]  # each starts DeepSpeed in a new process

SHORT = ["--set=training.max_steps=4", "--set=training.save_steps=2", "--set=training.eval_steps=2"]


def dsbuild(
    *argv: str, cwd: Path, env: dict[str, str] | None = None, timeout: int = 600
) -> subprocess.CompletedProcess[str]:
    """``dsbuild ARGV`` in a fresh process, outside any launcher's environment."""
    full = {**os.environ, "DS_ACCELERATOR": "cpu", **(env or {})}
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        full.pop(key, None)
    return subprocess.run(
        [sys.executable, "-m", "dsbuild", *argv], capture_output=True, text=True, cwd=cwd, env=full, timeout=timeout
    )


def out_dir(tmp_path: Path) -> list[str]:
    return [f"--set=training.output_dir='{tmp_path / 'run'}'"]


def snapshot(folder: Path) -> dict[str, str]:
    """Every file under ``folder`` (but the lock) and the SHA-256 of its bytes."""
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.name != ".dsbuild.lock"
    }


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished run of the shortened demo job."""
    tmp = tmp_path_factory.mktemp("finished")
    done = dsbuild("train", *SHORT, *out_dir(tmp), cwd=tmp)
    assert done.returncode == 0, done.stderr[-3000:]
    return tmp


def test_a_rerun_without_flags_changes_nothing(finished: Path) -> None:
    """The same command again (a shorter run, a smaller save_total_limit): refused, every earlier file intact."""
    before = snapshot(finished / "run")
    again = dsbuild(
        "train", *SHORT, *out_dir(finished), "--set=training.max_steps=2", "--set=training.save_total_limit=1",
        cwd=finished,
    )  # fmt: skip
    assert again.returncode == 2, again.stderr[-2000:]
    assert "holds an earlier run" in again.stderr and "--resume" in again.stderr and "--overwrite" in again.stderr
    assert "Traceback" not in again.stderr
    assert snapshot(finished / "run") == before


def test_checkpoints_lists_and_verifies(finished: Path) -> None:
    """`dsbuild checkpoints OUTPUT_DIR`: newest first, latest marked, each verified; a damaged one is named."""
    listed = dsbuild("checkpoints", str(finished / "run"), cwd=finished)
    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.splitlines()
    assert lines[2].split()[:3] == ["global_step4", "(latest)", "4"] and lines[2].endswith("ok")
    assert lines[3].split()[:2] == ["global_step2", "2"] and lines[3].endswith("ok")


def test_overwrite_moves_the_earlier_run_aside(finished: Path, tmp_path: Path) -> None:
    """--overwrite starts over after moving the earlier run's files to a sibling folder, and says where."""
    copy = tmp_path / "run"
    shutil.copytree(finished / "run", copy)
    before = snapshot(copy)
    done = dsbuild("train", *SHORT, *out_dir(tmp_path), "--overwrite", "--set=training.max_steps=2", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    (aside,) = [p for p in tmp_path.iterdir() if p.name.startswith("run.replaced-")]
    assert f"dsbuild: moved the earlier run in {copy} to {aside}" in done.stderr
    assert snapshot(aside) == before
    steps = [json.loads(line)["step"] for line in (copy / "history.jsonl").read_text().splitlines()]
    assert max(steps) == 2


def test_a_second_run_is_kept_out_while_the_first_runs(tmp_path: Path) -> None:
    """Two `dsbuild train` on one folder: the second exits non-zero naming the first; nothing of the first is touched."""
    env = {**os.environ, "DS_ACCELERATOR": "cpu"}
    log = open(tmp_path / "first.log", "w")
    first = subprocess.Popen(
        [sys.executable, "-m", "dsbuild", "train", *out_dir(tmp_path), "--set=training.max_steps=100000"],
        cwd=tmp_path,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        lock = tmp_path / "run" / ".dsbuild.lock"
        deadline = time.time() + 120
        while time.time() < deadline and not (lock.is_file() and lock.read_text().strip()):
            time.sleep(0.2)
        assert lock.read_text().strip(), "the first run never took its lock"
        second = dsbuild("train", *out_dir(tmp_path), "--resume", cwd=tmp_path)
        assert first.poll() is None, (tmp_path / "first.log").read_text()[-3000:]
        assert second.returncode == 2, second.stderr[-2000:]
        assert f"is in use by process {first.pid}" in second.stderr and "Traceback" not in second.stderr
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
        log.close()
    # The lock of a dead run is taken over, with a notice.
    resumed = dsbuild("train", *out_dir(tmp_path), "--overwrite", "--set=training.max_steps=1", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-2000:]


def test_a_nan_run_exits_non_zero(tmp_path: Path) -> None:
    """A learning rate that blows the weights up: the run stops at the first non-finite loss, exit 1, no model."""
    done = dsbuild(
        "train", *out_dir(tmp_path), "--set=training.learning_rate=1e12", "--set=training.bf16=false",
        "--set=training.max_steps=30", "--set=training.max_grad_norm=0.0", cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 1, done.stderr[-2000:]
    assert "training stopped" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "run" / "model").exists()


def test_data_without_a_trainable_token_is_refused_before_launch(tmp_path: Path) -> None:
    """All training texts empty: refused before any process starts, naming the file, exit 1 (the data fails its
    checks, as dsbuild validate says)."""
    data = tmp_path / "empty.jsonl"
    data.write_text("\n".join(json.dumps({"text": ""}) for _ in range(8)) + "\n")
    done = dsbuild(
        "train", *out_dir(tmp_path), f"--set=data.path='{data}'", "--set=data.format='text'",
        "--set=data.eval_path=''", cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 1, done.stderr[-2000:]
    assert f"data.path: {data}: none of its 8 samples has a token to train on" in done.stderr
    assert not (tmp_path / "run").exists()  # refused before anything started


def test_a_stale_op_build_lock_is_reported_not_waited_on(tmp_path: Path) -> None:
    """A build killed mid-compile left its lock: `dsbuild train` says which file to remove instead of hanging,
    and `dsbuild doctor` reports it."""
    from dsbuild.env.build_locks import extensions_root

    root = tmp_path / "torch_extensions"
    shutil.copytree(extensions_root(), root, ignore=shutil.ignore_patterns("lock"))
    lock = next(root.glob("*/deepspeed_shm_comm")) / "lock"
    lock.write_text("")
    old = time.time() - 3600
    os.utime(lock, (old, old))
    env = {"TORCH_EXTENSIONS_DIR": str(root)}
    done = dsbuild("train", *out_dir(tmp_path), "--set=training.max_steps=1", cwd=tmp_path, env=env, timeout=300)
    assert done.returncode != 0
    assert str(lock) in done.stderr and "rm " in done.stderr and "Traceback" not in done.stderr
    doctor = dsbuild("doctor", cwd=tmp_path, env=env)
    assert str(lock) in doctor.stdout
