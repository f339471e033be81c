"""The tasks ``dsbuild train`` runs, one module each, looked up by the job's ``task`` (``TASKS``): the run never
branches on a task's name.

A task says, of a job whose tables the job reader read (``dsbuild.job``: its table, its data format):

- ``check(job)``: what can be checked before any process starts, in the launcher (torch is not imported there: a
  GRPO job's functions are found);
- ``model(job, pad)``: what ``Session.from_pretrained`` builds beyond the job's ``[model]`` (``{}``: a causal LM; a
  reward model's ``model_class`` and ``model_kwargs``), and under ``"config"`` what is set on the model's config once
  it is built (a reward model's pad id, as TRL sets it);
- ``collate(job, pad, default)``: how its samples become a batch (``default``: the model's tokens, padded);
- ``parts(job, ready, say)``: what ``Session.fit`` trains on (``Parts``): its data, its ``loss_fn`` (``None``: the
  model's own loss) and its ``rollout`` (``None``: the samples are the batches), building what it needs beside the
  policy (a reference, reward models) on every rank.

Its loss and metrics live in ``dsbuild.rl``; these modules import it inside the functions that run, so importing
them stays light (the launcher does). A task's module here has the name of its ``dsbuild.job.tasks`` module, whose
``JOB_TASKS`` lists the tasks: adding a task is a module in each and one line there (docs/architecture.md walks
it).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any, Final, NamedTuple, Protocol

from ...job import Job
from ...job.tasks import JOB_TASKS

__all__ = ["TASKS", "Parts", "Task", "task_of"]


class Parts(NamedTuple):
    """What ``Session.fit`` trains on for a task."""

    ready: Any
    """The prepared run (``run.worker.Prepared``), its data possibly changed (a DPO job's precomputed reference)."""
    data: Any
    """The training samples, or a data loader of them."""
    loss_fn: Any
    """``loss_fn(engine, batch)``, or ``None``: the model's own loss."""
    rollout: Any
    """What makes an optimizer step's batches of its samples (GRPO's generation), or ``None``."""


class Task(Protocol):
    def check(self, job: Job) -> None: ...

    def model(self, job: Job, pad: int) -> dict[str, Any]: ...

    def collate(self, job: Job, pad: int, default: Callable[[list[Any]], Any]) -> Callable[[list[Any]], Any]: ...

    def parts(self, job: Job, ready: Any, say: Callable[[str], None]) -> Parts: ...


TASKS: Final[dict[str, Task]] = {name: importlib.import_module(f".{name}", __name__).TASK for name in JOB_TASKS}
"""Each task by the name a job's ``task`` gives: the ``TASK`` of this package's module of that name."""


def task_of(job: Job) -> Task:
    """The task ``job`` runs (the job reader accepted only names of ``dsbuild.job.TASKS``)."""
    return TASKS[job.task]
