"""``Session.fit``: the training loop (read it top to bottom), its schedule of logging, evaluation and saving."""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Final, Protocol

from ..errors import NonFiniteLossError, RunStopped, SessionError
from ..outputs import manifest
from ..outputs.history import History
from ..outputs.run_folder import RunFolder
from ..resolve.training import Training, optimizer_steps, steps_between
from . import distributed
from .batches import DataPosition, counts
from .parallel import SequenceShards

__all__ = ["Trainable", "fit"]

logger = logging.getLogger("dsbuild")


class Trainable(Protocol):
    """What the loop uses of a ``Session`` (the loop sits below the class, so it names these, not the class)."""

    training: Training | None
    output_dir: Path | None
    total_steps: int | None
    terminate_on_nan: bool
    position: DataPosition
    last_saved: str | None
    save_requested: Callable[[], bool] | None

    @property
    def micro_batch_size(self) -> int: ...
    @property
    def gradient_accumulation_steps(self) -> int: ...
    @property
    def is_main_process(self) -> bool: ...
    @property
    def history_path(self) -> Path | None: ...
    @property
    def global_step(self) -> int: ...
    def engine_for(self, total_steps: int | None) -> Any: ...
    def data_loader(
        self, data: Any, batch_size: int, *, shuffle: bool, collate_fn: Callable[[list[Any]], Any] | None = None
    ) -> Any: ...
    @property
    def weights_by_tokens(self) -> bool: ...
    @property
    def sequence_parallel_size(self) -> int: ...
    @property
    def tensor_parallel_size(self) -> int: ...
    @property
    def world_size(self) -> int: ...
    def items_in_step(self, micro_batches: Any) -> int | None: ...
    def _step(self, batch: Any, loss_fn: Any, num_items: int | None, boundary: bool | None) -> Any: ...
    def evaluate(
        self,
        data: Any,
        *,
        batch_size: int | None = None,
        collate_fn: Callable[[list[Any]], Any] | None = None,
        loss_fn: Callable[[Any, Any], Any] | None = None,
    ) -> dict[str, float]: ...
    def write_events(self, prefix: str, record: Mapping[str, Any]) -> None: ...
    def save_checkpoint(self, path: Any = None, tag: str | None = None) -> str: ...


def fit(
    session: Trainable,
    train_data: Any,
    *,
    epochs: float | None,
    max_steps: int | None,
    eval_data: Any,
    eval_every: int | None,
    save_every: int | None,
    collate_fn: Callable[[list[Any]], Any] | None,
    loss_fn: Callable[[Any, Any], Any] | None,
) -> list[dict[str, Any]]:
    """Train ``session`` (see ``Session.fit``); the records of this call."""
    from tqdm import tqdm  # type: ignore[import-untyped,unused-ignore]

    loader = session.data_loader(train_data, session.micro_batch_size, shuffle=True, collate_fn=collate_fn)
    batches = len(loader)
    if batches == 0:
        raise SessionError("train_data is empty (no micro-batch for this process)")
    accumulation = session.gradient_accumulation_steps
    target = _target_steps(session, batches, accumulation, epochs, max_steps)
    engine = session.engine_for(target)

    strategy = session.training.save_strategy if session.training is not None else "steps"
    if save_every is None and session.output_dir is not None and strategy == "steps":
        save_every = _every(session, "save_steps", target)
    if save_every and session.output_dir is None:
        raise SessionError("save_every needs an output directory: pass output_dir= to the Session")
    save_at_end = session.output_dir is not None and (bool(save_every) or strategy == "epoch")
    training = session.training
    logging = training.logging_strategy if training is not None else "steps"
    log_every = (_every(session, "logging_steps", target) or 1) if logging == "steps" else None
    log_first = training is not None and training.logging_first_step
    evaluation = training.eval_strategy if training is not None else "no"
    if eval_every is None and evaluation == "steps" and training is not None:
        eval_every = _every(session, "eval_steps" if training.eval_steps is not None else "logging_steps", target)

    records: list[dict[str, Any]] = []
    last: dict[str, Any] | None = None  # the latest optimizer step's record
    kept = History(session.history_path if session.is_main_process else None)
    # A progress bar on a terminal; elsewhere (a cluster's log file) one plain line per logging step from rank 0.
    plain = not sys.stderr.isatty()
    bar = tqdm(
        total=target,
        initial=min(engine.global_steps, target),
        desc="train",
        unit="step",
        disable=plain or not session.is_main_process,
        dynamic_ncols=True,
    )
    run_started, first_step = time.perf_counter(), engine.global_steps
    stop = _StopSignals()  # SIGTERM / SIGUSR1: an agreed checkpoint at the next step, then RunStopped
    by_tokens = loss_fn is None and session.weights_by_tokens
    if session.sequence_parallel_size > 1 and not by_tokens:
        raise SessionError(
            "sequence parallelism trains with the token-weighted loss (each rank's shard weighs by its trained tokens): "
            "it needs a model whose forward takes num_items_in_batch (an HF causal LM) and no loss_fn"
        )
    average = training.average_tokens_across_devices if training is not None else True
    started = time.perf_counter()
    try:
        while engine.global_steps < target:
            iterator = session.position.iterator(loader)
            # One optimizer step per group of micro-batches, as the HF Trainer does: the group's trained tokens
            # (over every process) weight its loss, and an epoch's last group may be shorter.
            left = batches - session.position.batch_in_epoch
            while left > 0 and engine.global_steps < target:
                group = [next(iterator) for _ in range(min(accumulation, left))]
                left -= len(group)
                num_items = session.items_in_step(group) if by_tokens else None
                window = [0.0, 0.0, 0.0]  # loss, samples, tokens of the step on this process
                for i, batch in enumerate(group):
                    samples, tokens = counts(batch)
                    if isinstance(loader, SequenceShards):  # a group's shards are one micro-batch: count it once
                        samples = loader.samples if loader.first else 0
                    out = session._step(batch, loss_fn, num_items, i == len(group) - 1)
                    session.position.batch_in_epoch += 1
                    window = [window[0] + out.loss, window[1] + samples, window[2] + tokens]
                # One collective per step sums the step's numbers and whether any process was signalled.
                loss_sum, samples_sum, tokens_sum, signalled = distributed.all_sum(
                    [*window, float(stop.check() is not None)], engine.device
                )
                # A tensor-parallel group's ranks train on the same batch: its numbers count once.
                loss_sum, samples_sum, tokens_sum = (
                    x / session.tensor_parallel_size for x in (loss_sum, samples_sum, tokens_sum)
                )
                # The HF Trainer's logged loss: the token-weighted step loss, or the mean of the micro-batch means.
                shares = 1 if num_items is not None and average else session.world_size // session.tensor_parallel_size
                elapsed = max(time.perf_counter() - started, 1e-9)
                record = {
                    "step": out.global_step,
                    "epoch": session.position.epoch + session.position.batch_in_epoch / batches,
                    "loss": loss_sum / (shares if num_items is not None else shares * len(group)),
                    "lr": out.lr,
                    "grad_norm": out.grad_norm,
                    "samples_per_sec": samples_sum / elapsed,
                    "tokens_per_sec": tokens_sum / elapsed,
                }
                records.append(record)
                last = record
                if not kept.add(record) and session.terminate_on_nan:
                    kept.flush()
                    raise _non_finite(session, record, kept.last_finite)
                if (log_every and out.global_step % log_every == 0) or (log_first and out.global_step == 1):
                    session.write_events("Train", record)
                    kept.flush()
                    if plain and session.is_main_process:
                        logger.info(_progress_line(record, target, run_started, out.global_step - first_step))
                bar.update(1)
                bar.set_postfix(loss=f"{record['loss']:.4f}", lr=f"{out.lr or 0:.2e}")
                if eval_data is not None and eval_every and out.global_step % eval_every == 0:
                    kept.flush()
                    records.append(_evaluated(session, eval_data, collate_fn, loss_fn))
                if save_every and out.global_step % save_every == 0:
                    kept.flush()
                    session.save_checkpoint()
                if signalled:
                    kept.flush()
                    raise _stopped(session, stop.received, out.global_step)
                if session.save_requested is not None and session.save_requested():
                    kept.flush()
                    if session.last_saved != f"global_step{out.global_step}":
                        session.save_checkpoint()
                started = time.perf_counter()
            if left == 0:
                session.position.next_epoch()
                if logging == "epoch" and last is not None:
                    session.write_events("Train", last)
                if evaluation == "epoch" and eval_data is not None:
                    kept.flush()
                    records.append(_evaluated(session, eval_data, collate_fn, loss_fn))
                if strategy == "epoch" and session.output_dir is not None and save_every is None:
                    kept.flush()
                    session.save_checkpoint()
    finally:
        stop.restore()
        bar.close()
        kept.flush()
    evaluated_last = any(r.get("step") == engine.global_steps and "eval_loss" in r for r in records)
    if eval_data is not None and not eval_every and not (evaluation == "epoch" and evaluated_last):
        records.append(_evaluated(session, eval_data, collate_fn, loss_fn))  # the end of the last epoch, too
    if logging == "epoch" and last is not None and session.position.batch_in_epoch:
        session.write_events("Train", last)  # the last epoch ended with the run, before its end was seen
    if save_at_end and session.last_saved != f"global_step{engine.global_steps}":
        session.save_checkpoint()  # the end of training is always saved, as the HF Trainer does
    return records


LAUNCHER_PID: Final = "DSBUILD_LAUNCHER_PID"
"""The environment variable where a torchrun worker notes its agent's pid when it starts (``dsbuild.cli.rank``)."""
LAUNCHER_LOST: Final = "LAUNCHER_LOST"
"""What ``_StopSignals.check`` gives when the process that started this one (torchrun's agent) is gone."""


class _StopSignals:
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


def _stopped(session: Trainable, received: str | None, step: int) -> RunStopped:
    """The agreed stop: every process saves the checkpoint of ``step`` (verified, with its manifest), then stops."""
    if received == LAUNCHER_LOST:
        why = "the end of this process's launcher (torchrun's agent)"
    else:
        why = f"{received} to this process" if received else "a signal to another process"
    if session.output_dir is None:
        return RunStopped(f"stopped at step {step} by {why}: no output directory, so no checkpoint was saved", None)
    tag = f"global_step{step}"
    if session.last_saved != tag:
        session.save_checkpoint()
    where = RunFolder(session.output_dir).checkpoint(tag)
    return RunStopped(
        f"stopped at step {step} by {why}; checkpoint {where} saved and verified: dsbuild train --resume continues",
        str(where),
    )


def _progress_line(record: Mapping[str, Any], target: int, started: float, done: int) -> str:
    """``step 40/240  loss 1.2433  lr 2.65e-03  tokens/s 1830  eta 3m20s``: what a log file shows of a step."""
    per_step = (time.perf_counter() - started) / max(done, 1)
    eta = int(per_step * (target - record["step"]))
    lr = f"{record['lr']:.2e}" if record.get("lr") is not None else "-"
    return (
        f"step {record['step']}/{target}  loss {record['loss']:.4f}  lr {lr}  "
        f"tokens/s {record['tokens_per_sec']:.0f}  eta {eta // 60}m{eta % 60:02d}s"
    )


def _evaluated(session: Trainable, data: Any, collate_fn: Any, loss_fn: Any) -> dict[str, Any]:
    return {"step": session.global_step, **session.evaluate(data, collate_fn=collate_fn, loss_fn=loss_fn)}


def _target_steps(
    session: Trainable, batches: int, accumulation: int, epochs: float | None, max_steps: int | None
) -> int:
    """The run's optimizer steps: ``max_steps``, else ``epochs``, else the session's ``total_steps`` /
    ``training.max_steps``, else ``training.num_train_epochs`` (1 epoch without training arguments)."""
    if max_steps is not None:
        return int(max_steps)
    if epochs is not None:
        return optimizer_steps(batches, accumulation, epochs=epochs)
    if session.total_steps is not None:
        return int(session.total_steps)
    training = session.training
    if training is None:
        return optimizer_steps(batches, accumulation)
    return optimizer_steps(batches, accumulation, max_steps=training.max_steps, epochs=training.num_train_epochs)


def _every(session: Trainable, name: str, target: int) -> int | None:
    """An interval in optimizer steps from a training argument (below 1: a fraction of the run); ``None`` without."""
    if session.training is None:
        return None
    return steps_between(float(getattr(session.training, name)), target)


def _non_finite(session: Trainable, record: Mapping[str, Any], last: tuple[int, float] | None) -> NonFiniteLossError:
    where = RunFolder(session.output_dir).checkpoints if session.output_dir is not None else None
    good = manifest.last_complete(where) if where is not None else None
    before = f"the last finite loss was {last[1]:.4f} at step {last[0]}" if last else "no step had a finite loss"
    saved = f"the last good checkpoint is {where / good}" if where is not None and good else "no checkpoint was saved"
    return NonFiniteLossError(
        f"the loss is {record['loss']} at step {record['step']}: training stopped ({before}; {saved}). "
        "Look for samples without a trainable token, a learning rate too high, or fp16 overflow; "
        "terminate_on_nan=False (dsbuild train --no-terminate-on-nan) trains on regardless"
    )
