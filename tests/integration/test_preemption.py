"""A signal does not lose the run: SIGTERM or SIGUSR1 (Slurm's time limit or preemption, a Kubernetes pod's stop,
``kill``) makes every process save a verified checkpoint at the next optimizer step, and the run stops with exit 75
(``EX_TEMPFAIL``); ``dsbuild train --resume`` continues with the uninterrupted run's losses."""

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
import torch

from dsbuild import Config, Session, Training
from dsbuild.errors import RunStopped
from dsbuild.outputs import manifest
from dsbuild.outputs.history import read as read_history

pytestmark = [
    pytest.mark.train,
    pytest.mark.engine,
    pytest.mark.procs,
]  # the training extra; tests/conftest.py skips it without


def loss_fn(engine: Any, batch: Any) -> Any:
    x, y = batch
    return torch.nn.functional.mse_loss(engine(x), y)


def test_sigusr1_in_fit_saves_the_next_step_and_stops(tmp_path: Path) -> None:
    """A SIGUSR1 during step 2 of fit: checkpoint global_step2 is written and verifies, fit raises RunStopped."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    training = Training(max_steps=6, per_device_train_batch_size=2, save_steps=100, logging_steps=1)
    s = Session(model, Config.zero(1).adamw(lr=1e-3).batch(micro=2), training=training, output_dir=tmp_path)
    x = torch.randn(12, 4)
    data = [(x[i : i + 2], x[i : i + 2].sum(dim=1, keepdim=True)) for i in range(0, 12, 2)]
    calls = []

    def signalled(engine: Any, batch: Any) -> Any:
        calls.append(1)
        if len(calls) == 2:
            os.kill(os.getpid(), signal.SIGUSR1)  # what `scancel --signal=USR1` or Slurm's --signal sends
        return loss_fn(engine, batch)

    with pytest.raises(RunStopped) as info:
        s.fit(data, loss_fn=signalled)
    assert "stopped at step 2 by SIGUSR1 to rank 0 (this process)" in str(info.value)
    assert info.value.checkpoint == str(tmp_path / "checkpoints" / "global_step2")
    assert manifest.verify(tmp_path / "checkpoints" / "global_step2")["global_step"] == 2
    assert signal.getsignal(signal.SIGUSR1) is signal.SIG_DFL  # the handler in place before is back


def _env() -> dict[str, str]:
    env = {**os.environ, "DS_ACCELERATOR": "cpu"}
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    return env


def _losses(out: Path) -> dict[int, float]:
    return {int(h["step"]): float(h["loss"]) for h in read_history(out / "history.jsonl") if h.get("loss") is not None}


@pytest.mark.slow
def test_sigterm_to_dsbuild_train_saves_exits_75_and_resumes_exactly(tmp_path: Path) -> None:
    """The demo job, SIGTERM once step 3 is logged: exit 75, a verified checkpoint at the step it stopped, the
    Slurm job requeued once (--requeue, a fake scontrol), and --resume gives the uninterrupted run's losses for the
    remaining steps."""
    steps = ["--set=training.max_steps=10", "--set=training.save_steps=100", "--set=training.logging_steps=1",
             "--set=training.bf16=false"]  # fmt: skip  # fp32: bf16's rounding alone moves a resume by up to ~8e-5
    command = [sys.executable, "-m", "dsbuild", "train", *steps]
    reference = tmp_path / "reference"
    done = subprocess.run(
        [*command, f"--set=training.output_dir={json.dumps(str(reference))}"],
        capture_output=True, text=True, env=_env(), timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]

    out = tmp_path / "stopped"
    # A task of a Slurm job array, with --requeue: a fake scontrol on PATH records how it is called.
    bin_dir, calls = tmp_path / "bin", tmp_path / "scontrol.calls"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text(f'#!/bin/sh\necho "$@" >> {calls}\n')
    (bin_dir / "scontrol").chmod(0o755)
    slurm = {"SLURM_JOB_ID": "1234", "SLURM_ARRAY_JOB_ID": "1200", "SLURM_ARRAY_TASK_ID": "7"}
    env = {**_env(), **slurm, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    run = subprocess.Popen(
        [*command, "--requeue", f"--set=training.output_dir={json.dumps(str(out))}"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and len(_losses(out) if (out / "history.jsonl").exists() else {}) < 3:
        time.sleep(0.2)
    run.send_signal(signal.SIGTERM)
    _, err = run.communicate(timeout=300)
    assert run.returncode == RunStopped.EXIT_CODE, err[-3000:]
    stopped_at = max(_losses(out))
    assert stopped_at < 10 and f"stopped at step {stopped_at} by SIGTERM" in err
    assert manifest.verify(out / "checkpoints" / f"global_step{stopped_at}")["global_step"] == stopped_at
    assert calls.read_text().splitlines() == ["requeue 1200_7"]  # once, the array task's id
    assert "requeued Slurm job 1200_7" in err

    resumed = subprocess.run(
        [*command, "--resume", f"--set=training.output_dir={json.dumps(str(out))}"],
        capture_output=True, text=True, env=_env(), timeout=600,
    )  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    expected, got = _losses(reference), _losses(out)
    assert sorted(got) == list(range(1, 11))
    assert [got[s] for s in range(stopped_at + 1, 11)] == pytest.approx(
        [expected[s] for s in range(stopped_at + 1, 11)], rel=1e-5
    )


TWO = ["--nproc-per-node", "2", "--set=training.max_steps=8", "--set=training.save_steps=100",
       "--set=training.logging_steps=1", "--set=training.bf16=false"]  # fmt: skip
"""The demo job on 2 processes, in fp32 (a resume compared with an uninterrupted run to 1e-5): the steps of the
session's shared uninterrupted run (``demo_on_two``), which only saves more often."""


@pytest.fixture(scope="module")
def two_process_reference(demo_on_two: tuple[Path, str]) -> dict[int, float]:
    return _losses(demo_on_two[0])


@pytest.mark.slow
@pytest.mark.parametrize(("target", "sent"), [("rank 1", signal.SIGUSR1), ("dsbuild train", signal.SIGTERM)])
def test_a_signal_to_one_rank_or_to_the_launcher_of_two_processes_saves_and_resumes(
    tmp_path: Path, two_process_reference: dict[int, float], target: str, sent: signal.Signals
) -> None:
    """SIGUSR1 to one rank, or SIGTERM to `dsbuild train`, of a 2-process run after step 3: exit 75, a verified
    checkpoint at the step it stopped, no worker outlives the launcher, a second run on the folder is refused while
    the first is still stopping, and --resume gives the uninterrupted run's losses."""
    from test_train import _rank_pid

    out = tmp_path / "run"
    where = f"--set=training.output_dir={json.dumps(str(out))}"
    run = subprocess.Popen(
        [sys.executable, "-m", "dsbuild", "train", *TWO, where],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(),
    )  # fmt: skip
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and len(_losses(out) if (out / "history.jsonl").exists() else {}) < 3:
        time.sleep(0.2)
    workers = [_rank_pid(rank, under=run.pid) for rank in (0, 1)]
    assert None not in workers and run.poll() is None
    os.kill(workers[1] if target == "rank 1" else run.pid, sent)  # type: ignore[arg-type]
    if target == "dsbuild train":  # while it saves and stops, the folder is still its own
        from dsbuild.errors import OutputDirError
        from dsbuild.outputs.run_folder import lock

        alive = run.poll() is None
        with pytest.raises(OutputDirError, match="is in use by"), lock(out):
            pass
        assert alive  # the refusal above was met while the first run was still stopping
    _, err = run.communicate(timeout=400)
    assert run.returncode == RunStopped.EXIT_CODE, err[-3000:]
    assert not [pid for pid in workers if pid is not None and Path(f"/proc/{pid}").exists()]  # none outlives it
    stopped_at = max(_losses(out))
    # Where the signal went: dsbuild train, which passed it on to the ranks through torchrun, or the rank itself.
    to = "SIGTERM to dsbuild train" if target == "dsbuild train" else "SIGUSR1 to rank 1"
    said = f"[node0 rank0]:dsbuild: rank 0: stopped at step {stopped_at} by {to}; checkpoint"
    assert stopped_at < 8 and said in err, err[-3000:]
    assert "(this process)" not in err and "to rank 0" not in err, err[-3000:]
    assert manifest.verify(out / "checkpoints" / f"global_step{stopped_at}")["global_step"] == stopped_at
    resumed = subprocess.run(
        [sys.executable, "-m", "dsbuild", "train", "--resume", *TWO, where],
        capture_output=True, text=True, env=_env(), timeout=600,
    )  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    got = _losses(out)
    assert sorted(got) == list(range(1, 9))
    assert [got[s] for s in range(stopped_at + 1, 9)] == pytest.approx(
        [two_process_reference[s] for s in range(stopped_at + 1, 9)], rel=1e-5
    )


def test_ctrl_c_in_fit_saves_at_the_next_step_and_a_second_stops_at_once(tmp_path: Path) -> None:
    """With stop_on_interrupt (dsbuild train's), a first SIGINT during step 2 saves global_step2 and stops
    (RunStopped); a second SIGINT right after the first raises KeyboardInterrupt at once, saving nothing; the
    handler in place before is back either way."""
    before = signal.getsignal(signal.SIGINT)  # Python's default, or SIG_IGN in a job started with & (nohup)
    torch.manual_seed(0)
    x = torch.randn(12, 4)
    data = [(x[i : i + 2], x[i : i + 2].sum(dim=1, keepdim=True)) for i in range(0, 12, 2)]

    def session(out: Path) -> Session:
        model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
        training = Training(max_steps=6, per_device_train_batch_size=2, save_steps=100, logging_steps=1)
        s = Session(model, Config.zero(1).adamw(lr=1e-3).batch(micro=2), training=training, output_dir=out)
        s.hooks.stop_on_interrupt = True
        return s

    def interrupting(times: int) -> Any:
        calls = []

        def loss(engine: Any, batch: Any) -> Any:
            calls.append(1)
            if len(calls) == 2:
                for _ in range(times):
                    os.kill(os.getpid(), signal.SIGINT)  # what a terminal's Ctrl-C sends
            return loss_fn(engine, batch)

        return loss

    with pytest.raises(RunStopped, match="stopped at step 2 by SIGINT to rank 0"):
        session(tmp_path / "once").fit(data, loss_fn=interrupting(1))
    assert manifest.verify(tmp_path / "once" / "checkpoints" / "global_step2")["global_step"] == 2
    assert signal.getsignal(signal.SIGINT) == before
    with pytest.raises(KeyboardInterrupt):
        session(tmp_path / "twice").fit(data, loss_fn=interrupting(2))
    assert not (tmp_path / "twice" / "checkpoints").exists()
    assert signal.getsignal(signal.SIGINT) == before


@pytest.mark.slow
@pytest.mark.parametrize(("during", "gap"), [("a step", 0.1), ("a save", 0.3)])
def test_ctrl_c_twice_stops_two_processes_at_once_with_the_documented_code(
    tmp_path: Path, during: str, gap: float
) -> None:
    """Ctrl-C twice (SIGINT to the terminal's process group, twice, `gap` seconds apart) during a step or during a
    checkpoint's save of a 2-process run: `dsbuild train` ends within seconds, never waiting on torchrun, leaves no
    rank behind and frees the folder's lock; it exits 75 when the checkpoint of this stop was written before the
    second Ctrl-C, else 130, and its last line names the last verified checkpoint."""
    from test_train import _rank_pid

    from dsbuild.outputs.run_folder import lock

    out = tmp_path / "run"
    save_steps = 2 if during == "a save" else 100
    argv = [*TWO[:2], "--set=training.max_steps=40", f"--set=training.save_steps={save_steps}", *TWO[4:]]
    run = subprocess.Popen(
        [sys.executable, "-m", "dsbuild", "train", *argv, f"--set=training.output_dir={json.dumps(str(out))}"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(), start_new_session=True,
    )  # fmt: skip
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and run.poll() is None:
        if during == "a step" and len(_losses(out) if (out / "history.jsonl").exists() else {}) >= 3:
            break
        partial = [p for p in (out / "checkpoints").glob("global_step*") if not (p / manifest.MANIFEST).exists()]
        if during == "a save" and partial and _losses(out):
            break
        time.sleep(0.02)
    workers = [_rank_pid(rank, under=run.pid) for rank in (0, 1)]
    before = manifest.last_complete(out / "checkpoints")
    os.killpg(run.pid, signal.SIGINT)
    time.sleep(gap)
    os.killpg(run.pid, signal.SIGINT)
    sent = time.monotonic()
    _, err = run.communicate(timeout=120)
    assert time.monotonic() - sent < 30, "a second Ctrl-C stops the run within seconds"
    assert not [pid for pid in workers if pid is not None and _running(pid)]
    with lock(out):  # free again
        pass
    saved = manifest.last_complete(out / "checkpoints")
    last = err.strip().splitlines()[-1]
    if saved is not None and saved != before:
        assert run.returncode == RunStopped.EXIT_CODE, err[-3000:]
        assert f"checkpoint {out}/checkpoints/{saved}" in last and "--resume continues" in last, last
    else:
        assert run.returncode == 130, err[-3000:]
        where = f"checkpoint {out}/checkpoints/{saved} is the last verified one" if saved else "before any checkpoint"
        assert last.startswith("dsbuild: a second Ctrl-C stopped the ranks at once") and where in last, last
    assert "Traceback" not in err


def _running(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie, ended and waiting to be reaped, does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False
