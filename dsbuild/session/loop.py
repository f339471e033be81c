"""The pieces of ``Session.fit``'s loop: one optimizer step (``optimizer_step``), what it records of each step
(``Recorder``: the returned records, ``history.jsonl``, DeepSpeed's monitors, the progress), what it listens for
(``StopSignals``) and the stops it makes (``stopped``, ``non_finite``). The run's length and its ``Schedule`` come
from ``dsbuild.resolve.schedule``."""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Final

import attrs

from ..errors import NonFiniteLossError
from ..outputs import manifest
from ..outputs.run_folder import RunFolder

__all__ = [
    "FORWARDED",
    "LAUNCHER_LOST",
    "LAUNCHER_PID",
    "Hooks",
    "Progress",
    "StopSignals",
    "non_finite",
    "stop_code",
    "stop_name",
    "stop_reason",
]

logger = logging.getLogger("dsbuild")


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
FORWARDED: Final = "DSBUILD_FORWARDED_SIGNAL"
"""The environment variable naming the file where ``dsbuild train`` notes the signal it received (``SIGTERM to dsbuild
train``) before it passes it on to its ranks through torchrun (``dsbuild.run.launch``): a rank's stop then says where
the signal went, the launcher, not the rank it reached."""


_STOP_CODES: Final = {
    LAUNCHER_LOST: 1000,
    **{f"{s.name} to dsbuild train": 1000 + int(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)},
}


def stop_code(received: str | None) -> int:
    """What a process tells the others at a step of what stops it (0: nothing; a signal's number; or
    ``LAUNCHER_LOST``'s), summed in one vector with the step's numbers; ``stop_name`` reads it back."""
    if received is None:
        return 0
    return _STOP_CODES.get(received) or int(signal.Signals[received])


def stop_name(code: int) -> str:
    for name, known in _STOP_CODES.items():
        if known == code:
            return name
    return signal.Signals(code).name


def stop_reason(rank: int, received: str, this_rank: int) -> str:
    """What stopped a run, in its stop message: ``received`` (``stop_name``'s) by ``rank``, the first process that
    was told to stop, as this process (``this_rank``) says it: ``SIGTERM to dsbuild train`` (the launcher, which
    passed it on to every rank), ``SIGUSR1 to rank 1`` (a signal to a rank itself), or the launcher's end."""
    who = f"rank {rank}" + (" (this process)" if rank == this_rank else "")
    if received == LAUNCHER_LOST:
        return f"the end of {who}'s launcher (torchrun's agent)"
    if " to " in received:  # the launcher's signal, or a stop asked through Hooks.stop_requested: it says to whom
        return received
    return f"{received} to {who}"


def forwarded(received: str, note: str | None) -> str:
    """``received`` (a signal's name), or what ``dsbuild train`` noted in the file ``note`` (``FORWARDED``) when it
    passed a signal on: the signal went to the launcher, and reached this rank through torchrun."""
    if note is None:
        return received
    try:
        said = Path(note).read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError):
        return received
    return said if said in _STOP_CODES and said != LAUNCHER_LOST else received


class StopSignals:
    """SIGTERM and SIGUSR1 (with ``interrupt``, the first SIGINT too) noted while ``fit`` runs (in the main thread),
    for the loop to act on at the next step; a second SIGINT raises ``KeyboardInterrupt`` at once. The handlers in
    place before are put back when it ends."""

    SIGNALS = (signal.SIGTERM, signal.SIGUSR1)
    NAMES = frozenset(s.name for s in (*SIGNALS, signal.SIGINT))
    """What ``_note`` records: a signal to this process, which may have come from the launcher."""

    def __init__(self, *, interrupt: bool = False) -> None:
        self.received: str | None = None
        self.before: dict[int, Any] = {}
        if threading.current_thread() is threading.main_thread():
            for number in (*self.SIGNALS, *((signal.SIGINT,) if interrupt else ())):
                self.before[number] = signal.signal(number, self._note)

        # Under torchrun, its agent: a worker whose agent is gone (killed, its node lost) is an orphan that would train
        # on unseen; it stops at the next step as if signalled (the others save with it, and a restart resumes).
        noted = os.environ.get(LAUNCHER_PID, "")
        under_torchrun = "TORCHELASTIC_RUN_ID" in os.environ
        self.launcher = (int(noted) if noted.isdigit() else os.getppid()) if under_torchrun else None

    def _note(self, number: int, frame: Any) -> None:
        if number == signal.SIGINT and self.received is not None:
            signal.signal(signal.SIGINT, signal.default_int_handler)
            raise KeyboardInterrupt  # Ctrl-C again: no waiting for the step and its save
        self.received = self.received or signal.Signals(number).name

    def check(self) -> str | None:
        """What stops the run at this step: a signal's name (``SIGTERM to dsbuild train`` when the launcher passed it
        on: ``FORWARDED``), ``LAUNCHER_LOST``, or ``None``."""
        if self.received is None and self.launcher is not None and os.getppid() != self.launcher:
            self.received = LAUNCHER_LOST
        elif self.received in self.NAMES:
            self.received = forwarded(self.received, os.environ.get(FORWARDED))
        return self.received

    def restore(self) -> None:
        for number, handler in self.before.items():
            signal.signal(number, handler)

    def __enter__(self) -> StopSignals:
        return self

    def __exit__(self, *exc: object) -> None:
        self.restore()


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


# -- what fit does at each step -----------------------------------------------------------------------------------


@attrs.define
class Hooks:
    """What a launcher adds to a session's ``fit`` (``Session.hooks``; Ray's backend: ``dsbuild.run.ray_train``)."""

    after_save: Callable[[Path], None] | None = None
    """Called on every process with a checkpoint's folder once it is saved and verified (collective when it is)."""
    save_requested: Callable[[], bool] | None = None
    """Asked on every process after each optimizer step; ``True`` saves a checkpoint now and trains on."""
    stop_requested: Callable[[], str | None] | None = None
    """Asked on every process at each optimizer step: a reason (``"SIGINT to dsbuild train"``) stops ``fit`` there as a
    signal does, with a checkpoint (Ray's backend: its driver's request, which no signal carries)."""
    stop_on_interrupt: bool = False
    """A first Ctrl-C stops ``fit`` as SIGTERM does, with a checkpoint at the next step; a second raises
    ``KeyboardInterrupt`` at once. Off: Ctrl-C is Python's ``KeyboardInterrupt`` (``dsbuild train`` turns it on)."""
