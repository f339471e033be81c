"""Checkpoints that do not stop training (``training.async_save``): staged in CPU memory and written in the background,
they hold what a synchronous save holds and resume alike, at every ZeRO stage and with LoRA; a checkpoint counts only
once every file is written and hashed (a slow writer with ``keep_last = 1`` never leaves none complete, a process
killed mid-write leaves the one before verified and its partial folder is removed by the next run), and a stop waits
for the save in flight before its own."""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from _session_common import TokenData, tiny_llama
from test_train import dsbuild, fresh_env, ok, sets

from dsbuild import Config, Session, Training
from dsbuild.errors import RunStopped
from dsbuild.outputs import manifest
from dsbuild.session import async_save
from dsbuild.session.weights_only import safe_globals

pytestmark = [pytest.mark.train]

LORA = {"r": 4, "lora_alpha": 8, "lora_dropout": 0.0, "target_modules": ["q_proj", "v_proj"]}


def _session(out: Path, stage: int, lora: bool, *, background: bool, save_steps: int = 2, **more: Any) -> Session:
    training = Training(max_steps=4, per_device_train_batch_size=2, save_steps=save_steps, logging_steps=1,
                        async_save=background, **more)  # fmt: skip
    return Session.from_pretrained(
        tiny_llama(), Config.zero(stage).adamw(lr=1e-2).batch(micro=2), training=training,
        lora=LORA if lora else None, output_dir=out,
    )  # fmt: skip


def _same(a: Any, b: Any, where: str) -> None:
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b), where
    elif isinstance(a, dict):
        assert isinstance(b, dict) and set(a) == set(b), where
        for key in a:
            if key != "ds_config":  # the monitors' folders differ: the runs' output folders do
                _same(a[key], b[key], f"{where}.{key}")
    elif isinstance(a, (list, tuple)):
        assert type(a) is type(b) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _same(x, y, f"{where}[{i}]")
    elif isinstance(a, (int, float, str, bool, type(None))):
        assert a == b, where


def _loaded(tag_dir: Path) -> dict[str, Any]:
    files = manifest.verify(tag_dir)["files"]
    with torch.serialization.safe_globals(safe_globals()):
        return {name: torch.load(tag_dir / name, weights_only=True) for name in files if name.endswith(".pt")}


@pytest.mark.engine
@pytest.mark.parametrize(("stage", "lora"), [(0, False), (1, False), (2, False), (3, False), (3, True)],
                         ids=["zero0", "zero1", "zero2", "zero3", "zero3-lora"])  # fmt: skip
def test_a_background_save_holds_what_a_synchronous_one_does_and_resumes_exactly(
    tmp_path: Path, stage: int, lora: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same 4 steps saved every 2 synchronously and in the background (written 2 s late, so training has moved
    the live tensors on by then): every file of global_step2 and global_step4 loads to equal tensors and
    values, both verify, no partial folder is left; a resume from the background save's global_step2 trains steps 3
    and 4 to the synchronous run's losses."""
    monkeypatch.setenv(async_save.WRITE_DELAY, "2")
    sync_out, async_out = tmp_path / "sync", tmp_path / "async"
    data = TokenData(8)
    whole = {r["step"]: r["loss"] for r in _session(sync_out, stage, lora, background=False).fit(data) if "loss" in r}
    _session(async_out, stage, lora, background=True).fit(data)
    for tag in ("global_step2", "global_step4"):
        mine, theirs = _loaded(async_out / "checkpoints" / tag), _loaded(sync_out / "checkpoints" / tag)
        assert set(mine) == set(theirs) and mine, tag
        _same(mine, theirs, tag)
    assert manifest.read_latest(async_out / "checkpoints") == "global_step4"
    assert not [p for p in (async_out / "checkpoints").iterdir() if p.name.startswith(".")]
    resumed = _session(tmp_path / "resumed", stage, lora, background=True)
    assert resumed.load_checkpoint(async_out / "checkpoints", tag="global_step2")["global_step"] == 2
    again = {r["step"]: r["loss"] for r in resumed.fit(data) if "loss" in r}
    assert sorted(again) == [3, 4]
    assert [again[s] for s in (3, 4)] == pytest.approx([whole[s] for s in (3, 4)], rel=1e-6)


@pytest.mark.engine
def test_keep_last_1_with_a_slow_writer_never_leaves_no_complete_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A save every step, each written 3 s late, keep_last = 1: watched every few milliseconds, once the first
    checkpoint counts there is always one with its manifest and ``latest`` names one; each save waits for the one
    before (said in the log); the run ends with global_step4 alone, verified."""
    monkeypatch.setenv(async_save.WRITE_DELAY, "3")
    folder = tmp_path / "checkpoints"
    session = _session(tmp_path, 0, False, background=True, save_steps=1, save_total_limit=1)
    seen: list[tuple[int, bool]] = []
    in_flight = []  # the polls that saw a save being written beside a complete checkpoint
    running = True

    def look() -> tuple[int, bool]:
        complete = [p for p in folder.glob("global_step*") if (p / manifest.MANIFEST).is_file()]
        latest = manifest.read_latest(folder)
        return len(complete), latest is not None and (folder / latest / manifest.MANIFEST).is_file()

    def watch() -> None:
        while running:
            # A look lists the folder, then reads each manifest: one that straddles a rename and the prune after it
            # sees neither checkpoint (under load, in the suite). A state is what two looks in a row agree on.
            state = look()
            if state != look():
                continue
            seen.append(state)
            if state[0] and _partial(folder):
                in_flight.append(len(seen))
            time.sleep(0.002)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        with caplog.at_level(logging.WARNING, logger="dsbuild"):
            session.fit(TokenData(8))
    finally:
        running = False
        watcher.join()
    # The first checkpoint counts once ``latest`` names it (its manifest is written just before, a moment that a
    # loaded machine's looks can see); from then on there is always one complete and named.
    first = next(i for i, (count, named) in enumerate(seen) if count and named)
    broken = [(i, state) for i, state in enumerate(seen[first:]) if not (state[0] >= 1 and state[1])]
    assert not broken, (broken[:5], len(seen) - first)
    assert sorted(p.name for p in folder.iterdir()) == ["global_step4", "latest"]
    manifest.verify(folder / "global_step4")
    assert in_flight, "no save was seen in flight beside a complete checkpoint"
    assert re.search(r"checkpoint global_step\d waits for checkpoint global_step\d, still being written", caplog.text)


def _run(out: Path, *extra: str, delay: str) -> subprocess.Popen[str]:
    steps = sets(max_steps=5000, save_steps=3, logging_steps=1, bf16=False, output_dir=str(out))
    command = [sys.executable, "-m", "dsbuild", "train", "--set=training.async_save=true", *steps, *extra]
    return subprocess.Popen(command, cwd=out.parent, env=fresh_env(**{async_save.WRITE_DELAY: delay}),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip


def _until(child: subprocess.Popen[str], ready: Any, what: str) -> None:
    deadline = time.monotonic() + 300
    while not ready():
        assert child.poll() is None, f"ended before {what}: {child.communicate()[1][-3000:]}"
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def _partial(folder: Path) -> list[Path]:
    return list(folder.glob(".*.partial")) if folder.is_dir() else []


@pytest.mark.procs
def test_sigkill_mid_write_leaves_the_checkpoint_before_verified_and_the_next_run_cleans_up(tmp_path: Path) -> None:
    """dsbuild train on one process, a background save in flight (written 2 s late) once one has counted:
    SIGKILL. ``dsbuild checkpoints`` lists only complete checkpoints, each ok (the partial folder is not one); a
    ``--resume`` continues from the newest complete one and removes the partial folder."""
    out = tmp_path / "run"
    folder = out / "checkpoints"
    child = _run(out, delay="2")
    try:
        _until(child, lambda: manifest.last_complete(folder) is not None and _partial(folder), "a save in flight")
        child.kill()
        child.communicate(timeout=60)
    finally:
        if child.poll() is None:
            child.kill()
    partial = _partial(folder)
    assert partial, "no save was in flight"
    listed = ok(dsbuild("checkpoints", str(out), cwd=tmp_path)).stdout
    complete = manifest.last_complete(folder)
    assert complete is not None
    rows = [line.split() for line in listed.splitlines() if line.split() and line.split()[0].startswith("global_step")]
    assert rows and all(row[-1] == "ok" for row in rows), listed
    assert ".partial" not in listed
    step = int(complete.removeprefix("global_step"))
    ok(dsbuild("train", "--resume", "--set=training.async_save=true",
                         *sets(max_steps=step + 1, save_steps=3, logging_steps=1, bf16=False, output_dir=str(out)),
                         cwd=tmp_path))  # fmt: skip
    assert not _partial(folder)
    manifest.verify(folder / f"global_step{step + 1}")


@pytest.mark.procs
def test_sigterm_with_a_save_in_flight_exits_75_after_both_checkpoints_count(tmp_path: Path) -> None:
    """SIGTERM to dsbuild train while a background save is in flight (written 3 s late): exit 75, the save in
    flight counted and the stop's own checkpoint saved after it, both verified, ``latest`` the stop's."""
    out = tmp_path / "run"
    folder = out / "checkpoints"
    child = _run(out, delay="3")
    try:
        _until(child, lambda: bool(_partial(folder)), "a save in flight")
        flying = _partial(folder)[0].name.removeprefix(".").removesuffix(".partial")
        child.send_signal(signal.SIGTERM)
        _, err = child.communicate(timeout=300)
    finally:
        if child.poll() is None:
            child.kill()
    assert child.returncode == RunStopped.EXIT_CODE, err[-3000:]
    assert f"waits for checkpoint {flying}, still being written" in err  # the stop's save waited for it
    stopped = manifest.read_latest(folder)
    assert stopped is not None and f"checkpoint {folder / stopped} saved and verified" in err
    manifest.verify(folder / flying)
    manifest.verify(folder / stopped)
    assert int(stopped.removeprefix("global_step")) >= int(flying.removeprefix("global_step"))
    assert not _partial(folder)
    assert json.loads((folder / stopped / manifest.MANIFEST).read_text())["global_step"] > 0
    assert os.path.isdir(folder / flying)


@pytest.mark.procs
def test_two_processes_save_in_the_background(tmp_path: Path) -> None:
    """torchrun, 2 processes at ZeRO-3 (the demo job), a save every 2 steps in the background: each checkpoint counts
    once both ranks have written (rank 1's shards in its manifest), every one verifies, no partial folder is left, and
    the start-up line says the copy's size."""
    out = tmp_path / "run"
    done = ok(dsbuild("train", "--nproc-per-node", "2", "--set=training.async_save=true",
                      *sets(max_steps=4, save_steps=2, save_total_limit=5, output_dir=str(out)), cwd=tmp_path))  # fmt: skip
    assert "training.async_save: each checkpoint is copied into CPU memory and written in the background" in done.stderr
    folder = out / "checkpoints"
    for tag in ("global_step2", "global_step4"):
        files = manifest.verify(folder / tag)["files"]
        assert "zero_pp_rank_1_mp_rank_00_model_states.pt" in files and "dsbuild_rank1.json" in files
    assert manifest.read_latest(folder) == "global_step4" and not _partial(folder)
