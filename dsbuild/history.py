"""A run's history file, ``history.jsonl``: one JSON record per optimizer step and per evaluation.

Rank 0 appends records at every logging step, evaluation and checkpoint, flushed to disk, so a
killed run keeps what it logged (``History`` in ``dsbuild.session``). A resumed run first cuts the
file back to the checkpoint's step (``cut_after``): the steps after it are trained again, so the
whole run's history holds every step once. Reading skips a line a crash cut short.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from .atomic import write_atomic

__all__ = ["HISTORY", "append", "cut_after", "read"]

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
