"""The history a Session keeps while it trains: records for ``history.jsonl``, and the last finite loss."""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .. import history

__all__ = ["History"]


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
            history.append(self.path, self.pending)
        self.pending = []
