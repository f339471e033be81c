"""A GRPO run's logged completions (TRL's ``log_completions``): each generation batch's prompts, completions, every
reward function's reward and the advantage, gathered from every process, appended by rank 0 to the run folder's
``completions.jsonl`` (one JSON object a line, flushed to disk; a resumed run drops the lines after its checkpoint,
as ``history.jsonl``'s) and the first ``num_completions_to_print`` logged, as TRL prints its table.

TRL writes its table at each logging step (the last generation batch's rows) and prints a random sample of it
(Python's global RNG); dsbuild writes each generation batch once, with the step that made it, and logs the first rows:
what a run samples next does not depend on what was printed.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..outputs import history

__all__ = ["CompletionLog"]

logger = logging.getLogger("dsbuild")

_SHOWN = 120
"""Characters of a prompt or completion a logged line shows."""


def _text(value: Any) -> str:
    """A prompt or completion as one line: a conversation's last message's content."""
    if isinstance(value, list) and value and isinstance(value[-1], dict):
        value = value[-1].get("content", "")
    text = " ".join(str(value).split())
    return text if len(text) <= _SHOWN else text[: _SHOWN - 3] + "..."


def _number(value: float) -> float | None:
    """A reward or advantage for JSON: ``None`` for a completion no function scored (NaN)."""
    return None if math.isnan(value) else value


class CompletionLog:
    """Where rank 0 writes and logs the completions of each generation batch (``add``)."""

    def __init__(self, path: Path | None, names: Sequence[str], to_print: int | None) -> None:
        self.path, self.names, self.to_print = path, list(names), to_print

    def rows(
        self,
        step: int,
        prompts: Sequence[Any],
        completions: Sequence[Any],
        rewards: Sequence[Sequence[float]],
        advantages: Sequence[float],
    ) -> list[dict[str, Any]]:
        """One record per completion: ``step``, ``prompt``, ``completion``, ``rewards`` (by reward function, ``None``
        where it did not score) and ``advantage`` (TRL's table's columns)."""
        return [
            {
                "step": step,
                "prompt": prompt,
                "completion": completion,
                "rewards": {name: _number(float(r)) for name, r in zip(self.names, row, strict=True)},
                "advantage": _number(float(advantage)),
            }
            for prompt, completion, row, advantage in zip(prompts, completions, rewards, advantages, strict=True)
        ]

    def add(
        self,
        step: int,
        prompts: Sequence[Any],
        completions: Sequence[Any],
        rewards: Sequence[Sequence[float]],
        advantages: Sequence[float],
    ) -> None:
        """Append the generation batch made for ``step`` to the file and log its first rows."""
        rows = self.rows(step, prompts, completions, rewards, advantages)
        if self.path is not None:
            history.append(self.path, rows)
        shown = rows if self.to_print is None else rows[: self.to_print]
        if shown:
            where = f" ({len(rows)} in {self.path})" if self.path is not None else ""
            lines = [f"completions of step {step}{where}:"]
            for row in shown:
                scores = ", ".join(f"{k} {v:.3f}" if v is not None else f"{k} -" for k, v in row["rewards"].items())
                advantage = "-" if row["advantage"] is None else f"{row['advantage']:.3f}"
                lines.append(f"  {_text(row['prompt'])!r} -> {_text(row['completion'])!r}: {scores}; "
                             f"advantage {advantage}")  # fmt: skip
            logger.info("\n".join(lines))
