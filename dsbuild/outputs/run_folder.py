"""A run's output folder: the name of every path in it (``RunFolder``), what an earlier run left there, the lock that keeps a second run out, and moving an
earlier run aside when asked to start over.

``dsbuild train`` never writes over an earlier run without being told: a folder holding one is refused
unless ``--resume`` (continue it) or ``--overwrite`` (move it aside, then start; nothing is deleted). An
exclusive lock (``fcntl.flock`` on ``.dsbuild.lock``, which names the host, process and command) keeps a
second run out of the folder while the first is alive; the operating system drops the lock when its
process dies, so a lock file left by a dead run is taken over with a notice.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import socket
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Final

import attrs

from ..errors import OutputDirError
from .history import HISTORY
from .manifest import MANIFEST, candidates, read_json

__all__ = ["LOCK", "RUN_FILES", "RunFolder", "earlier_run", "lock", "move_aside"]

logger = logging.getLogger("dsbuild")

LOCK: Final = ".dsbuild.lock"
CHECKPOINTS: Final = "checkpoints"
LOGS: Final = "logs"
DS_CONFIG: Final = "ds_config.json"
MODEL: Final = "model"
LOSS_PLOT: Final = "loss.png"
COMPLETIONS: Final = "completions.jsonl"
OLD_HISTORY: Final = "history.json"
RAY: Final = "ray"
RAY_RESTORE: Final = "ray-restore"


@attrs.frozen
class RunFolder:
    """The one place that names the paths of a run's output folder (``training.output_dir``; docs/jobs.md)."""

    root: Path = attrs.field(converter=Path)

    @property
    def checkpoints(self) -> Path:
        """The checkpoints, one folder per tag, each with its manifest."""
        return self.root / CHECKPOINTS

    def checkpoint(self, tag: str) -> Path:
        """One checkpoint's folder."""
        return self.checkpoints / tag

    @property
    def logs(self) -> Path:
        """The monitors' output (TensorBoard, CSV, ...) and the launcher's per-rank logs."""
        return self.root / LOGS

    @property
    def failure_log(self) -> Path:
        """The whole traceback of each failure of a run in ``dsbuild train``'s own process (one rank; torchrun's ranks
        keep theirs in their ``stderr.log``), appended."""
        return self.logs / "failure.log"

    def torchrun_logs(self, node: str) -> Path:
        """torchrun's per-rank logs of one node's launcher."""
        return self.logs / "torchrun" / node

    @property
    def ds_config(self) -> Path:
        """The resolved config the engine ran with."""
        return self.root / DS_CONFIG

    @property
    def model(self) -> Path:
        """The exported model (and tokenizer) at the end of the run."""
        return self.root / MODEL

    @property
    def history(self) -> Path:
        """``history.jsonl``: one record per logging step and evaluation."""
        return self.root / HISTORY

    @property
    def loss_plot(self) -> Path:
        """The loss curve drawn at the end of the run."""
        return self.root / LOSS_PLOT

    @property
    def completions(self) -> Path:
        """``completions.jsonl``: a GRPO run's logged completions, one per line (``grpo.log_completions``)."""
        return self.root / COMPLETIONS

    @property
    def ray(self) -> Path:
        """Ray Train's checkpoint storage by default (``launch.storage_path``; docs/ray.md)."""
        return self.root / RAY

    def ray_restore(self, rank: int) -> Path:
        """Where a Ray worker downloads Ray's checkpoint for a restart."""
        return self.root / RAY_RESTORE / f"rank{rank}"

    @property
    def stop_request(self) -> Path:
        """Written by a launcher whose ranks it cannot signal (Ray's driver) to ask them to save at their next step and
        stop; it holds what asked (``SIGINT to dsbuild train``)."""
        return self.root / ".dsbuild.stop"

    @property
    def lock(self) -> Path:
        """The lock that keeps a second run out while one is alive."""
        return self.root / LOCK


EVIDENCE: Final = (HISTORY, OLD_HISTORY, CHECKPOINTS, MODEL, LOSS_PLOT)
"""What only a run that trained leaves in its output folder (``history.json`` is the older runs' history). The
launcher's logs are not evidence: other nodes start writing theirs before node 0 has looked; nor is the resolved
``ds_config.json``, written when the engine starts: a run that failed before its first step leaves nothing that
refuses the same command, corrected (the new run writes its own)."""
RUN_FILES: Final = (*EVIDENCE, DS_CONFIG, LOGS, RAY, RAY_RESTORE, COMPLETIONS)
"""What a run writes in its output folder, all moved aside by ``--overwrite`` (``ray``: Ray's checkpoint storage by
default, ``ray-restore``: Ray's checkpoints downloaded for a restart; docs/ray.md; ``completions.jsonl``: a GRPO run's
logged completions)."""


def earlier_run(out: Path) -> str | None:
    """What an earlier run left in ``out``, in a few words; ``None`` when it holds none of a run's files."""
    found = [name for name in EVIDENCE if (out / name).exists()]
    if not found:
        return None
    parts = []
    folder = RunFolder(out)
    tags = [t for t in candidates(folder.checkpoints) if (folder.checkpoint(t) / MANIFEST).is_file()]
    if tags:
        step = read_json(folder.checkpoint(tags[0]) / MANIFEST).get("global_step")
        parts.append(f"{len(tags)} checkpoint{'s' if len(tags) != 1 else ''}, the newest at step {step}")
    if folder.model.exists():
        parts.append("a saved model")
    if folder.history.exists() or (out / OLD_HISTORY).exists():
        parts.append("a training history")
    return ", ".join(parts) or ", ".join(found)


def move_aside(out: Path) -> Path:
    """Move an earlier run's files (only those, ``RUN_FILES``) into a new sibling folder; that folder."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    target = out.parent / f"{out.name}.replaced-{stamp}"
    n = 1
    while target.exists():
        n += 1
        target = out.parent / f"{out.name}.replaced-{stamp}-{n}"
    target.mkdir(parents=True)
    for name in RUN_FILES:
        if (out / name).exists():
            shutil.move(str(out / name), str(target / name))
    return target


def _holder(text: str) -> str:
    try:
        info = json.loads(text)
        return f"process {info['pid']} on {info['host']}, started {info['started']} ({info['command']})"
    except (ValueError, KeyError, TypeError):
        return "another run"


@contextmanager
def lock(out: Path, *, elastic: str | None = None) -> Iterator[bool]:
    """Hold the output folder's lock for the ``with`` block; ``OutputDirError`` naming the run that holds it.

    ``elastic``: the rendezvous id of an elastic run, whose launchers (one per node, none of them node 0) share the
    lock: the first takes the folder, the others of the same run join it, any other run is kept out. Yields whether
    this process took the folder (``False``: it joined an elastic run's launcher that had).
    """
    import fcntl

    out.mkdir(parents=True, exist_ok=True)
    path = RunFolder(out).lock
    handle: IO[str] = open(path, "a+", encoding="utf-8")
    try:
        first = True
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read()
            for _ in range(50 if elastic is not None else 0):  # the first launcher may not have written it yet
                if holder.strip():
                    break
                time.sleep(0.1)
                handle.seek(0)
                holder = handle.read()
            if elastic is None or _elastic_id(holder) != elastic:
                raise OutputDirError(
                    f"{out} is in use by {_holder(holder)}: wait for it to finish, or give this run another "
                    "training.output_dir"
                ) from None
            try:
                fcntl.flock(handle.fileno(), fcntl.LOCK_SH | fcntl.LOCK_NB)  # a launcher of the same elastic run
            except BlockingIOError:
                raise OutputDirError(f"{out} is in use by {_holder(holder)}: wait for it to finish") from None
            first = False
        if first:
            handle.seek(0)
            left = handle.read().strip()
            if left:
                logger.info("took over %s, left by %s, which is no longer running", path, _holder(left))
            handle.seek(0)
            handle.truncate()
            info = {
                "pid": os.getpid(),
                "host": socket.gethostname(),
                "started": time.strftime("%Y-%m-%d %H:%M:%S"),
                "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]])[:300],
                **({"elastic": elastic} if elastic is not None else {}),
            }
            handle.write(json.dumps(info) + "\n")
            handle.flush()
            if elastic is not None:
                fcntl.flock(handle.fileno(), fcntl.LOCK_SH)  # the run's other launchers join
        try:
            yield first
        finally:
            try:
                fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)  # the last one out
            except BlockingIOError:
                pass  # another launcher of the elastic run still holds it
            else:
                handle.seek(0)
                handle.truncate()  # a clean exit leaves an empty lock file: nothing to take over
                handle.flush()
    finally:
        handle.close()


def _elastic_id(text: str) -> str | None:
    try:
        found = json.loads(text).get("elastic")
    except (ValueError, AttributeError):
        return None
    return found if isinstance(found, str) else None
