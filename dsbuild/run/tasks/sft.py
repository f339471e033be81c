"""``task = "sft"`` (the default): the job's samples as TRL's ``SFTTrainer`` prepares them, trained on the model's
own loss, weighted by trained tokens as the HF Trainer weights it (``Session.fit``'s)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ...job import Job

if TYPE_CHECKING:
    from . import Parts

__all__ = ["TASK"]


class SFT:
    def check(self, job: Job) -> None:
        """Nothing more than every job's checks."""

    def model(self, job: Job, pad: int) -> dict[str, Any]:
        """A causal LM, as the job's ``[model]`` says."""
        return {}

    def collate(self, job: Job, pad: int, default: Callable[[list[Any]], Any]) -> Callable[[list[Any]], Any]:
        return default

    def parts(self, job: Job, ready: Any, say: Callable[[str], None]) -> Parts:
        from . import Parts

        return Parts(ready, ready.train, None, None)


TASK = SFT()
