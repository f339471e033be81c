"""Checkpoints that execute nothing and lose nothing, with real DeepSpeed on CPU: a planted pickle never runs, a
damaged checkpoint is named and the previous one resumes exactly, a changed run is refused, a NaN loss stops
training, a full disk says what is intact."""

from __future__ import annotations

import json
import math
import os
import pickle
import subprocess
from pathlib import Path
from typing import Any

import attrs
import pytest
import torch
from _session_common import TokenData, tiny_llama

from dsbuild import Config
from dsbuild.errors import CheckpointError, NonFiniteLossError
from dsbuild.outputs import manifest
from dsbuild.outputs.history import read as read_history
from dsbuild.resolve.training import Training
from dsbuild.session import Session, weights_only

pytestmark = [
    pytest.mark.train,
    pytest.mark.engine,
    pytest.mark.procs,
]  # the training extra; tests/conftest.py skips it without

# torch's own AdamW (torch_adam): a resumed run then matches the uninterrupted one bit for bit (DeepSpeed's CPU
# Adam keeps its bias correction in process-wide state and recomputes it after a resume, to ~1e-7).
CONFIG = Config.zero(2).adamw(lr=1e-2, torch_adam=True).batch(micro=2)


def session(out: Path, *, micro: int = 2, seed: int = 7, **kwargs: Any) -> Session:
    training = Training(
        per_device_train_batch_size=micro, learning_rate=1e-2, max_steps=6, save_steps=2, logging_steps=1, seed=seed
    )
    config = CONFIG.batch(micro=micro)
    return Session.from_pretrained(
        tiny_llama(attention_dropout=0.1), config, training=training, output_dir=out, **kwargs
    )


def losses(records: list[dict[str, Any]]) -> list[float]:
    return [r["loss"] for r in records if "loss" in r]


class Payload:
    """A pickle that would create ``marker`` when unpickled by the full (unsafe) unpickler."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (f"touch {self.marker}",))


def forge_manifest(tag_dir: Path) -> None:
    """What an attacker who hands you a folder can do too: make the manifest agree with the files."""
    found = json.loads((tag_dir / "manifest.json").read_text())
    for name in found["files"]:
        path = tag_dir / name
        algorithm, _ = manifest.entry_digest(found["files"][name])
        found["files"][name] = {"size": path.stat().st_size, algorithm: manifest.file_digest(path, algorithm)}
    (tag_dir / "manifest.json").write_text(json.dumps(found))


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[float]]:
    """A run to step 6 with checkpoints at 2, 4 and 6, and its losses (the reference)."""
    out = tmp_path_factory.mktemp("reference")
    records = session(out).fit(TokenData(12))
    return out, losses(records)


def test_checkpoints_carry_a_manifest_and_json_state(trained: tuple[Path, list[float]]) -> None:
    """Each checkpoint lists every file with size and XXH3-128 digest, the run's facts, and no pickle of dsbuild's own."""
    out, _ = trained
    tag_dir = out / "checkpoints" / "global_step6"
    found = manifest.verify(tag_dir)
    assert found["run"] | {"data": None} == {
        "world_size": 1, "zero_stage": 2, "micro_batch": 2, "gradient_accumulation": 1, "seed": 7,
        "data": None, "model": found["run"]["model"], "lora": None,
    }  # fmt: skip
    assert set(found["files"]) == {p.name for p in tag_dir.iterdir()} - {"manifest.json"}
    assert "dsbuild_rank0.json" in found["files"] and not list(tag_dir.glob("dsbuild_*.pt"))
    assert manifest.read_latest(out / "checkpoints") == "global_step6"
    assert [c.tag for c in manifest.list_checkpoints(out / "checkpoints")] == [
        "global_step6", "global_step4", "global_step2",
    ]  # fmt: skip


@pytest.mark.parametrize("stage", [2, 3])
def test_a_pickle_planted_in_any_file_is_refused_and_runs_nothing(tmp_path: Path, stage: int) -> None:
    """Every *.pt of a checkpoint replaced in turn by a code-running pickle (manifest forged to match): the load
    refuses it, names the file and the global, and the marker the payload would create never appears."""
    out = tmp_path / "run"
    config = Config.zero(stage).adamw(lr=1e-2).batch(micro=2)
    s = Session.from_pretrained(tiny_llama(), config, output_dir=out, total_steps=2)
    s.fit(TokenData(4), max_steps=1, save_every=1)
    tag_dir = out / "checkpoints" / "global_step1"
    pts = sorted(tag_dir.glob("*.pt"))
    assert pts
    for victim in pts:
        original = victim.read_bytes()
        marker = tmp_path / f"PWNED-{victim.name}"
        torch.save({"module": Payload(marker)}, victim)
        forge_manifest(tag_dir)
        fresh = Session.from_pretrained(tiny_llama(), config, output_dir=out, total_steps=2)
        with pytest.raises(CheckpointError) as info:
            fresh.load_checkpoint()
        assert victim.name in str(info.value) and "posix.system" in str(info.value), str(info.value)
        assert not marker.exists()
        victim.write_bytes(original)
        forge_manifest(tag_dir)


def test_deepspeeds_own_torch_load_calls_are_routed_through_the_weights_only_loader(tmp_path: Path) -> None:
    """DeepSpeed's universal-checkpoint code calls torch.load(weights_only=False) itself: inside routed, a planted
    pickle is refused naming the global and runs nothing, a file outside the manifest is not read, and torch.load
    is put back afterwards."""
    victim, marker = tmp_path / "fp32.pt", tmp_path / "PWNED"
    torch.save({"param": Payload(marker)}, victim)
    checker = weights_only.VerifyingCheckpointEngine(None)
    with weights_only.routed(checker), pytest.raises(CheckpointError) as info:
        torch.load(victim, weights_only=False)
    assert "posix.system" in str(info.value) and not marker.exists()
    checker.expected = {}
    with weights_only.routed(checker), pytest.raises(CheckpointError, match="not in the checkpoint's manifest"):
        torch.load(victim, weights_only=False)
    assert torch.load is weights_only._torch_load


def test_a_truncated_file_falls_back_to_the_previous_checkpoint_and_resumes_exactly(
    trained: tuple[Path, list[float]], tmp_path: Path
) -> None:
    """The newest checkpoint damaged: it is named, the one before it loads, and steps 5-6 repeat the losses."""
    _, reference = trained
    out = tmp_path / "run"
    session(out).fit(TokenData(12), max_steps=4)
    victim = next((out / "checkpoints" / "global_step4").glob("*optim_states.pt"))
    victim.write_bytes(victim.read_bytes()[:-100])
    resumed = session(out)
    position = resumed.load_checkpoint()
    assert position["tag"] == "global_step2" and position["global_step"] == 2
    assert len(position["skipped"]) == 1 and victim.name in position["skipped"][0]
    assert "truncated or altered" in position["skipped"][0]
    tail = losses(resumed.fit(TokenData(12)))
    assert tail == pytest.approx(reference[2:], rel=1e-6, abs=0)
    steps = [r["step"] for r in read_history(out / "history.jsonl") if "loss" in r]
    assert steps == [1, 2, 3, 4, 5, 6]  # the resumed history holds every step once


def test_an_altered_file_of_the_same_size_is_caught_as_it_loads(
    trained: tuple[Path, list[float]], tmp_path: Path
) -> None:
    """One flipped byte (the size unchanged): the digest read while loading catches it, and the older one loads."""
    out = tmp_path / "run"
    session(out).fit(TokenData(12), max_steps=4)
    victim = next((out / "checkpoints" / "global_step4").glob("*model_states.pt"))
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0xFF
    victim.write_bytes(bytes(data))
    position = session(out).load_checkpoint()
    assert position["tag"] == "global_step2"
    assert "differ from the manifest's xxh3_128 digest" in position["skipped"][0]
    listed = {c.tag: c.problem for c in manifest.list_checkpoints(out / "checkpoints")}
    assert listed["global_step2"] is None and "xxh3_128 digest" in str(listed["global_step4"])


def test_a_resume_with_more_steps_uses_the_new_schedule_from_its_first_step(tmp_path: Path) -> None:
    """The README's `--resume --set training.max_steps=<more>`: the first resumed step runs at the new schedule's
    rate, not at the one the old schedule left in the saved optimizer state."""
    out = tmp_path / "run"
    config = CONFIG.warmup_decay_lr(warmup_num_steps=1, warmup_max_lr=1e-2, total_num_steps="auto")
    training = Training(per_device_train_batch_size=2, learning_rate=1e-2, max_steps=4, save_steps=4, seed=7)
    Session.from_pretrained(tiny_llama(), config, training=training, output_dir=out).fit(TokenData(12))
    longer = attrs.evolve(training, max_steps=8)
    resumed = Session.from_pretrained(tiny_llama(), config, training=longer, output_dir=out)
    assert resumed.load_checkpoint()["global_step"] == 4
    scheduler = resumed.engine.lr_scheduler
    assert scheduler.total_num_steps == 8
    rate = resumed.engine.optimizer.param_groups[0]["lr"]
    assert rate == pytest.approx(scheduler.get_lr()[0]) and rate > 0  # the old schedule ended at 0 at step 4


@pytest.mark.parametrize(
    ("change", "fact"),
    [({"micro": 4}, "micro_batch"), ({"seed": 8}, "seed")],
)
def test_a_resume_that_changes_the_run_is_refused_with_what_changed(
    trained: tuple[Path, list[float]], change: dict[str, int], fact: str
) -> None:
    """A different micro batch (the saved data position would mean other samples) or seed: refused, side by side."""
    out, _ = trained
    with pytest.raises(CheckpointError) as info:
        session(out, **change).load_checkpoint()
    text = str(info.value)
    assert "saved by a different run" in text and fact in text and "checkpoint" in text and "this run" in text


def test_a_nan_loss_stops_training_with_the_step_and_the_last_good_checkpoint(tmp_path: Path) -> None:
    """The loss turns NaN at step 3: fit stops there, saying the last finite loss and the checkpoint to go back to."""
    calls = {"n": 0}

    def loss_fn(model: Any, batch: Any) -> Any:
        calls["n"] += 1
        loss = model(**batch).loss
        return loss * float("nan") if calls["n"] >= 3 else loss

    s = session(tmp_path / "run")
    with pytest.raises(NonFiniteLossError) as info:
        s.fit(TokenData(12), loss_fn=loss_fn)
    text = str(info.value)
    assert "at step 3" in text and "last finite loss" in text and "at step 2" in text
    assert str(tmp_path / "run" / "checkpoints" / "global_step2") in text
    records = read_history(tmp_path / "run" / "history.jsonl")
    assert [r["step"] for r in records] == [1, 2, 3] and math.isnan(records[-1]["loss"])


def test_a_full_disk_names_the_checkpoint_and_the_last_complete_one(tmp_path: Path) -> None:
    """On a small tmpfs that holds one checkpoint but not two: the second save fails with "no space left", its
    files are removed, and the first still verifies and loads."""
    probe = tmp_path / "probe"
    session(probe).fit(TokenData(12), max_steps=2)
    size = sum(p.stat().st_size for p in (probe / "checkpoints" / "global_step2").rglob("*") if p.is_file())
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={int(size * 1.6) // 4096 * 4096 + 65536}", "tmpfs", str(disk)],
        capture_output=True,
        check=False,
    )
    if mounted.returncode != 0:
        pytest.skip(f"mounting a small tmpfs to fill a disk for real needs permission: {mounted.stderr.decode()}")
    try:
        out = disk / "run"
        s = session(out)
        with pytest.raises(CheckpointError) as info:
            s.fit(TokenData(12), max_steps=4)
        text = str(info.value)
        assert "global_step4" in text and "no space left on device" in text
        assert "last complete checkpoint is" in text and "global_step2" in text
        assert not (out / "checkpoints" / "global_step4").exists()
        manifest.verify(out / "checkpoints" / "global_step2")
    finally:
        subprocess.run(["umount", str(disk)], check=False)


def test_a_pickle_cannot_stand_in_for_the_json_state(trained: tuple[Path, list[float]], tmp_path: Path) -> None:
    """dsbuild's own per-rank state is JSON: a pickle there is unreadable as JSON, never unpickled."""
    out, _ = trained
    tag_dir = out / "checkpoints" / "global_step2"
    marker = tmp_path / "PWNED"
    state = tag_dir / "dsbuild_rank0.json"
    original = state.read_bytes()
    try:
        state.write_bytes(pickle.dumps(Payload(marker)))
        forge_manifest(tag_dir)
        with pytest.raises(CheckpointError):
            session(out).load_checkpoint(tag="global_step2")
        assert not marker.exists()
    finally:
        state.write_bytes(original)
        forge_manifest(tag_dir)
