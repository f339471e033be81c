"""A run's history file, ``history.jsonl``: one JSON record per optimizer step and per evaluation.

Rank 0 appends records at every logging step, evaluation and checkpoint, flushed to disk, so a
killed run keeps what it logged (``History``, kept by the Session's loop). A resumed run first cuts the
file back to the checkpoint's step (``cut_after``): the steps after it are trained again, so the
whole run's history holds every step once. Reading skips a line a crash cut short.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from .._util.atomic import write_atomic

__all__ = ["HISTORY", "History", "append", "cut_after", "read"]

HISTORY = "history.jsonl"
"""The file's name in a run's output folder."""


def read(path: Path) -> list[dict[str, Any]]:
    """The records of a history file (JSON Lines; an older run's JSON list is read too)."""
    text = path.read_text(encoding="utf-8", errors="replace")
    if text.lstrip().startswith("["):
        try:
            records: list[Any] = json.loads(text)
        except ValueError:
            records = []
    else:
        records = []
        for line in text.splitlines():
            try:
                records.append(json.loads(line))
            except ValueError:  # a line a crash cut short
                continue
    return [r for r in records if isinstance(r, dict)]


def append(path: Path, records: Sequence[Mapping[str, Any]]) -> None:
    """Append ``records`` to the file, flushed to disk."""
    if not records:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as f:
        f.write("".join(json.dumps(dict(r)) + "\n" for r in records))
        f.flush()
        os.fsync(f.fileno())


def cut_after(path: Path, step: int) -> None:
    """Keep the records up to ``step`` (atomically); nothing to do without a file."""
    if not path.is_file():
        return
    kept = [r for r in read(path) if isinstance(r.get("step"), int) and r["step"] <= step]
    write_atomic(path, "".join(json.dumps(r) + "\n" for r in kept))


class History:
    """The records of one process's training, and the file rank 0 appends them to (``None``: no file)."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.pending: list[dict[str, Any]] = []
        self.last_finite: tuple[int, float] | None = None
        """``(step, loss)`` of the last optimizer step with a finite loss."""

    def add(self, record: Mapping[str, Any]) -> bool:
        """Keep ``record`` for the next ``flush``; ``False`` when its loss is NaN or infinite."""
        self.pending.append(dict(record))
        loss = record.get("loss")
        if isinstance(loss, float) and not math.isfinite(loss):
            return False
        if isinstance(loss, (int, float)):
            self.last_finite = (int(record["step"]), float(loss))
        return True

    def flush(self) -> None:
        """Append the pending records to the file (when there is one), flushed to disk."""
        if self.path is not None:
            append(self.path, self.pending)
        self.pending = []
