"""What ``Session.fit`` works out before its loop and reports from it, as values: the run's length, its
``Schedule`` of logging, evaluation and saving, the progress shown, the stop signals, and the messages a stop
gives. Nothing here holds a session."""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

import attrs

from ..errors import NonFiniteLossError, SessionError
from ..outputs import manifest
from ..outputs.run_folder import RunFolder
from ..resolve.training import Training, optimizer_steps, steps_between

__all__ = ["LAUNCHER_LOST", "LAUNCHER_PID", "Progress", "Schedule", "StopSignals", "non_finite", "run_steps"]

logger = logging.getLogger("dsbuild")


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


class Progress:
    """A progress bar on a terminal; elsewhere (a cluster's log file) one plain line per logged step, from rank 0."""

    def __init__(self, steps: int, done: int, *, main: bool) -> None:
        from tqdm import tqdm  # type: ignore[import-untyped,unused-ignore]

        self.steps, self.first, self.started = steps, done, time.perf_counter()
        self.plain = not sys.stderr.isatty()
        self.main = main
        self.bar = tqdm(
            total=steps,
            initial=min(done, steps),
            desc="train",
            unit="step",
            disable=self.plain or not main,
            dynamic_ncols=True,
        )

    def logged(self, record: Mapping[str, Any]) -> None:
        if self.plain and self.main:
            logger.info(_progress_line(record, self.steps, self.started, record["step"] - self.first))

    def update(self, record: Mapping[str, Any]) -> None:
        self.bar.update(1)
        self.bar.set_postfix(loss=f"{record['loss']:.4f}", lr=f"{record['lr'] or 0:.2e}")

    def close(self) -> None:
        self.bar.close()


LAUNCHER_PID: Final = "DSBUILD_LAUNCHER_PID"
"""The environment variable where a torchrun worker notes its agent's pid when it starts (``dsbuild.cli.rank``)."""
LAUNCHER_LOST: Final = "LAUNCHER_LOST"
"""What ``StopSignals.check`` gives when the process that started this one (torchrun's agent) is gone."""


class StopSignals:
    """SIGTERM and SIGUSR1 noted while ``fit`` runs (in the main thread), for the loop to act on at the next step;
    the handlers in place before are put back when it ends."""

    SIGNALS = (signal.SIGTERM, signal.SIGUSR1)

    def __init__(self) -> None:
        self.received: str | None = None
        self.before: dict[int, Any] = {}
        if threading.current_thread() is threading.main_thread():
            for number in self.SIGNALS:
                self.before[number] = signal.signal(number, self._note)

        # Under torchrun, its agent: a worker whose agent is gone (killed, its node lost) is an orphan that would train
        # on unseen; it stops at the next step as if signalled (the others save with it, and a restart resumes).
        noted = os.environ.get(LAUNCHER_PID, "")
        under_torchrun = "TORCHELASTIC_RUN_ID" in os.environ
        self.launcher = (int(noted) if noted.isdigit() else os.getppid()) if under_torchrun else None

    def _note(self, number: int, frame: Any) -> None:
        self.received = signal.Signals(number).name

    def check(self) -> str | None:
        """What stops the run at this step: a signal's name, ``LAUNCHER_LOST``, or ``None``."""
        if self.received is None and self.launcher is not None and os.getppid() != self.launcher:
            self.received = LAUNCHER_LOST
        return self.received

    def restore(self) -> None:
        for number, handler in self.before.items():
            signal.signal(number, handler)


def _progress_line(record: Mapping[str, Any], target: int, started: float, done: int) -> str:
    """``step 40/240  loss 1.2433  lr 2.65e-03  tokens/s 1830  eta 3m20s``: what a log file shows of a step."""
    per_step = (time.perf_counter() - started) / max(done, 1)
    eta = int(per_step * (target - record["step"]))
    lr = f"{record['lr']:.2e}" if record.get("lr") is not None else "-"
    return (
        f"step {record['step']}/{target}  loss {record['loss']:.4f}  lr {lr}  "
        f"tokens/s {record['tokens_per_sec']:.0f}  eta {eta // 60}m{eta % 60:02d}s"
    )


def non_finite(
    record: Mapping[str, Any], last: tuple[int, float] | None, output_dir: Path | None
) -> NonFiniteLossError:
    """The stop at a NaN or infinite loss: the last finite loss, and the last good checkpoint in ``output_dir``."""
    where = RunFolder(output_dir).checkpoints if output_dir is not None else None
    good = manifest.last_complete(where) if where is not None else None
    before = f"the last finite loss was {last[1]:.4f} at step {last[0]}" if last else "no step had a finite loss"
    saved = f"the last good checkpoint is {where / good}" if where is not None and good else "no checkpoint was saved"
    return NonFiniteLossError(
        f"the loss is {record['loss']} at step {record['step']}: training stopped ({before}; {saved}). "
        "Look for samples without a trainable token, a learning rate too high, or fp16 overflow; "
        "terminate_on_nan=False (dsbuild train --no-terminate-on-nan) trains on regardless"
    )
