"""Helpers for tests that resume a run folder made by another test's run."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

from dsbuild.outputs.history import cut_after


def stopped_after(finished: Path, run: Path, step: int) -> Path:
    """A copy of the run folder ``finished`` at ``run``, as if the run had stopped right after its checkpoint of
    ``step``: the later checkpoints and history records gone, so the later steps in the copy's history can only come
    from a resumed run. ``finished`` is not changed."""
    shutil.copytree(finished, run)
    checkpoints = run / "checkpoints"
    for saved in checkpoints.glob("global_step*"):
        found = re.fullmatch(r"global_step(\d+)", saved.name)
        if found and int(found.group(1)) > step:
            shutil.rmtree(saved)
    assert (checkpoints / f"global_step{step}").is_dir(), f"{finished} has no checkpoint of step {step}"
    (checkpoints / "latest").write_text(f"global_step{step}")
    cut_after(run / "history.jsonl", step)
    return run
