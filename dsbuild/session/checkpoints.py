"""Checkpoint bookkeeping around DeepSpeed's own files: a crash-safe ``latest``, RNG states, keep-last-N."""

from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

__all__ = [
    "LATEST",
    "load_rng",
    "prune",
    "read_latest",
    "rng_state",
    "save_rng",
    "set_rng_state",
    "write_latest",
    "write_marker",
]

LATEST = "latest"
"""DeepSpeed's pointer file: the tag ``load_checkpoint(path)`` loads when no tag is given."""
MARKER = "dsbuild_state.json"
"""Written by rank 0 in each tag dir: marks the checkpoint as ours (for pruning) and says how far it got."""


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # e.g. a platform where directories cannot be opened
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_latest(save_dir: str | Path, tag: str) -> None:
    """Point ``latest`` at ``tag`` atomically: a reader sees the old tag or the new one, never a torn file."""
    save_dir = Path(save_dir)
    tmp = save_dir / f".{LATEST}.tmp"
    with open(tmp, "w") as f:
        f.write(tag)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, save_dir / LATEST)
    _fsync_dir(save_dir)


def read_latest(save_dir: str | Path) -> str | None:
    path = Path(save_dir) / LATEST
    if not path.is_file():
        return None
    return path.read_text().strip() or None


def write_marker(save_dir: str | Path, tag: str, state: dict[str, Any]) -> None:
    path = Path(save_dir) / tag / MARKER
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(state, indent=1))
    os.replace(tmp, path)


def rng_state() -> dict[str, Any]:
    """The RNG states of this process: python, numpy, torch and the accelerator's (when it is not the CPU)."""
    from deepspeed.accelerator import get_accelerator

    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    accelerator = get_accelerator()
    if accelerator.device_name() != "cpu":
        state["accelerator"] = accelerator.get_rng_state()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    from deepspeed.accelerator import get_accelerator

    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "accelerator" in state:
        get_accelerator().set_rng_state(state["accelerator"])


def _rng_path(save_dir: str | Path, tag: str, rank: int) -> Path:
    return Path(save_dir) / tag / f"dsbuild_rng_{rank}.pt"


def save_rng(save_dir: str | Path, tag: str, rank: int) -> None:
    """Each process writes its own RNG states (DeepSpeed keeps ``client_state`` of rank 0 only)."""
    torch.save(rng_state(), _rng_path(save_dir, tag, rank))


def load_rng(save_dir: str | Path, tag: str, rank: int) -> bool:
    """Restore this process's RNG states; False when the checkpoint has none for this rank (another world size)."""
    path = _rng_path(save_dir, tag, rank)
    if not path.is_file():
        return False
    set_rng_state(torch.load(path, weights_only=False))
    return True


def prune(save_dir: str | Path, keep: int) -> list[str]:
    """Delete all but the ``keep`` newest dsbuild checkpoints (never the one ``latest`` names); return the deleted tags."""
    save_dir = Path(save_dir)
    latest = read_latest(save_dir)
    found: list[tuple[int, float, str]] = []
    for child in save_dir.iterdir():
        marker = child / MARKER
        if child.is_dir() and marker.is_file():
            try:
                step = int(json.loads(marker.read_text()).get("global_step", -1))
            except (ValueError, OSError):
                step = -1
            found.append((step, marker.stat().st_mtime, child.name))
    found.sort()
    old = [tag for _, _, tag in found[: max(len(found) - keep, 0)] if tag != latest]
    for tag in old:
        shutil.rmtree(save_dir / tag, ignore_errors=True)
    return old
