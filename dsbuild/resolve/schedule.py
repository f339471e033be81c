"""A run's step arithmetic and its schedule, as the HF Trainer counts them: one process's micro-batches in an epoch,
the run's optimizer steps, intervals given as counts or fractions of the run, and the ``Schedule`` of when a run logs,
evaluates and saves. The one home of these rules: ``Job.total_steps``, ``dsbuild train`` and ``Session.fit`` ask it (a job's step count is
``job_steps``, whether the records were counted in the data file or tokenized)."""

from __future__ import annotations

import math
from typing import Any

import attrs

from ..errors import ConfigError, Problem, SessionError
from .batch import degrees
from .training import Training

__all__ = ["Schedule", "job_steps", "micro_batches", "optimizer_steps", "run_steps", "steps_between"]


def micro_batches(
    samples: int,
    world_size: int,
    micro_batch: int,
    *,
    drop_last: bool,
    sequence_parallel: int = 1,
    tensor_parallel: int = 1,
) -> int:
    """One process's micro-batches in an epoch of ``samples``, as the HF Trainer's loader under Accelerate deals
    them (``session.batches.Shards``): the epoch's micro-batches in turn to the processes, the last round filled from
    the epoch's start (``ceil(ceil(samples / micro_batch) / replicas)``), or with ``dataloader_drop_last`` only the
    rounds of full micro-batches (``floor(floor(samples / micro_batch) / replicas)``).

    A tensor- or sequence-parallel group's ranks read the same micro-batches (the loader has ``world_size /
    (tensor_parallel x sequence_parallel)`` replicas; each rank of a sequence-parallel group takes its shard of each),
    so the run steps through the data as the same run without them does.
    """
    replicas = max(world_size // (tensor_parallel * sequence_parallel), 1)  # a degree that does not divide: validate's
    if drop_last:
        return samples // micro_batch // replicas
    return math.ceil(math.ceil(samples / micro_batch) / replicas)


def optimizer_steps(micro_batches: int, accumulation: int, *, max_steps: int = -1, epochs: float = 1.0) -> int:
    """The run's optimizer steps as the HF Trainer counts them: ``max_steps`` when above 0, else ``epochs`` of
    ``ceil(micro_batches / accumulation)`` steps (an epoch's last step takes what is left), at least 1.

    The one step count: ``Job.total_steps`` (from the data file), ``dsbuild train`` (from the tokenized data) and
    ``Session.fit`` (from its data loader) all ask it.
    """
    if max_steps > 0:
        return max_steps
    per_epoch = max(math.ceil(micro_batches / accumulation), 1)
    return max(math.ceil(epochs * per_epoch), 1)


def job_steps(samples: int, training: Training, config: Any, *, world_size: int) -> int:
    """A job's optimizer steps over ``samples`` records, as the HF Trainer counts them: ``max_steps`` when above 0,
    else ``num_train_epochs`` of each process's micro-batches (``micro_batches``: ``per_device_train_batch_size``,
    the config's ``dataloader_drop_last`` and its sequence- and tensor-parallel degrees), ``gradient_accumulation_steps``
    at a time. ``ConfigError`` (``data.path``) when the records make no micro-batch."""
    if training.max_steps > 0:
        return training.max_steps
    micro = training.per_device_train_batch_size
    sp, tp = degrees(config)
    drop_last = getattr(config, "dataloader_drop_last", None) is True
    batches = micro_batches(samples, world_size, micro, drop_last=drop_last, sequence_parallel=sp, tensor_parallel=tp)
    if batches == 0:
        message = f"{samples} samples make no micro-batch of {micro} for each of {world_size} processes"
        raise ConfigError(Problem("data.path", message, "use more records, or a smaller per_device_train_batch_size"))
    return optimizer_steps(batches, training.gradient_accumulation_steps, epochs=training.num_train_epochs)


def steps_between(value: float, total_steps: int) -> int:
    """Optimizer steps between two events from an HF interval argument (``save_steps``, ``eval_steps``,
    ``logging_steps``): a count, or below 1 a fraction of the run's ``total_steps`` (rounded up, at least 1)."""
    return max(math.ceil(value * total_steps), 1) if value < 1 else int(value)


def run_steps(
    batches: int,
    accumulation: int,
    *,
    epochs: float | None,
    max_steps: int | None,
    total_steps: int | None,
    training: Training | None,
) -> int:
    """The run's optimizer steps: ``max_steps``, else ``epochs``, else the session's ``total_steps`` /
    ``training.max_steps``, else ``training.num_train_epochs`` (1 epoch without training arguments)."""
    if max_steps is not None:
        return int(max_steps)
    if epochs is not None:
        return optimizer_steps(batches, accumulation, epochs=epochs)
    if total_steps is not None:
        return int(total_steps)
    if training is None:
        return optimizer_steps(batches, accumulation)
    return optimizer_steps(batches, accumulation, max_steps=training.max_steps, epochs=training.num_train_epochs)


def _every(training: Training | None, name: str, steps: int) -> int | None:
    """An interval in optimizer steps from a training argument (below 1: a fraction of the run); ``None`` without."""
    return steps_between(float(getattr(training, name)), steps) if training is not None else None


@attrs.frozen(kw_only=True)
class Schedule:
    """When one ``fit`` logs, evaluates and saves, as the HF Trainer does: its strategies and intervals worked out
    once for a run of ``steps`` optimizer steps. ``*_every``: every so many steps (``None``: not by steps);
    ``*_epochs``: at each epoch's end; ``*_at_end``: when training ends, unless that step was just evaluated or
    saved (HF's ``DefaultFlowCallback``: a run evaluated by steps is evaluated at its end too)."""

    steps: int
    log_every: int | None
    log_first: bool
    log_epochs: bool
    eval_every: int | None
    eval_epochs: bool
    eval_at_end: bool
    save_every: int | None
    save_epochs: bool
    save_at_end: bool

    @classmethod
    def of(
        cls,
        training: Training | None,
        steps: int,
        *,
        eval_every: int | None = None,
        save_every: int | None = None,
        evaluating: bool = False,
        saving: bool = False,
    ) -> Schedule:
        """The schedule from the training arguments (``logging_*``, ``eval_*``, ``save_*``; without them: log every
        step, evaluate at the end, save by ``save_every``) and ``fit``'s own ``eval_every`` / ``save_every``, which
        win. ``evaluating``: ``fit`` has evaluation data; ``saving``: the session has an output directory."""
        logging_strategy = training.logging_strategy if training is not None else "steps"
        evaluation = training.eval_strategy if training is not None else "no"
        saves = training.save_strategy if training is not None else "steps"
        if eval_every is None and evaluation == "steps" and training is not None:
            eval_every = _every(training, "eval_steps" if training.eval_steps is not None else "logging_steps", steps)
        if save_every and not saving:
            raise SessionError("save_every needs an output directory: pass output_dir= to the Session")
        by_steps = save_every
        if by_steps is None and saving and saves == "steps":
            by_steps = _every(training, "save_steps", steps)
        return cls(
            steps=steps,
            log_every=(_every(training, "logging_steps", steps) or 1) if logging_strategy == "steps" else None,
            log_first=training is not None and training.logging_first_step,
            log_epochs=logging_strategy == "epoch",
            eval_every=(eval_every or None) if evaluating else None,
            eval_epochs=evaluating and evaluation == "epoch",
            eval_at_end=evaluating,
            save_every=by_steps or None,
            save_epochs=saving and saves == "epoch" and save_every is None,
            save_at_end=saving and (bool(by_steps) or saves == "epoch"),
        )

    def logs(self, step: int) -> bool:
        """Whether optimizer step ``step`` is logged (to the monitors, and as a plain line off a terminal)."""
        return bool(self.log_every and step % self.log_every == 0) or (self.log_first and step == 1)

    def evaluates(self, step: int) -> bool:
        return bool(self.eval_every and step % self.eval_every == 0)

    def saves(self, step: int) -> bool:
        return bool(self.save_every and step % self.save_every == 0)
