"""DeepSpeed's checkpoint writers (``checkpoint.writer``): which of them this machine can run, and the process of the
decoupled one.

``checkpoint.writer`` selects DeepSpeed's fast engine (its writer ``type``: ``FAST``, through the ``async_io`` op;
``PYTHON``, plain file writes) and, with ``decoupled``, runs it in a writer process of its own fed through a queue.
dsbuild wraps either one in its verifying engine (``weights_only``): what they write is hashed into the manifest
once written. The refusals that need no machine are ``validate.feature_table.writer_refusals``.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import signal
import threading
from collections.abc import Iterator, Mapping
from typing import Any, Final

__all__ = ["fast_writer_refusal", "spawning", "writer_section"]


def writer_section(ds_config: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The config's ``checkpoint.writer`` section (DeepSpeed's writer engines are used whenever it is there)."""
    checkpoint = ds_config.get("checkpoint")
    writer = checkpoint.get("writer") if isinstance(checkpoint, Mapping) else None
    return writer if isinstance(writer, Mapping) else None


def fast_writer_refusal(ds_config: Mapping[str, Any]) -> str | None:
    """Why DeepSpeed's fast writer (``type = "FAST"``, the default of a ``checkpoint.writer`` section) cannot run on
    this machine, or ``None``: it needs the ``async_io`` op, which DeepSpeed builds only where libaio's headers and
    library are installed. Imports DeepSpeed's op builders (only for a config that selects the fast writer)."""
    writer = writer_section(ds_config)
    if writer is None or str(writer.get("type") or "FAST").upper() != "FAST":
        return None
    from deepspeed.ops.op_builder import AsyncIOBuilder

    if AsyncIOBuilder().is_compatible(verbose=False):
        return None
    return (
        "DeepSpeed's fast writer (the default type of a checkpoint.writer section) needs its async_io op, which "
        "cannot be built on this machine: libaio's headers and library are missing (apt install libaio-dev)"
    )


_STOPS: Final = ("SIGINT", "SIGTERM", "SIGUSR1", "SIGHUP", "SIGQUIT")
"""The signals that stop a run (``loop``): the writer process ignores them, and lives to write the stop's save."""


@contextlib.contextmanager
def spawning(ds_config: Mapping[str, Any]) -> Iterator[None]:
    """Inside, with ``checkpoint.writer.decoupled``: new processes are spawned, not forked, so that DeepSpeed's
    decoupled writer starts as its engine intends (it asks for ``spawn``, but only when no start method was chosen
    yet). A forked writer inherits the rank's threads (gloo's) and every pipe it holds open: a child process reading
    its input to the end then never saw it end, and the run hung at exit. The start method before is put back.

    The writer starts with the stop signals ignored (what is ignored stays so across ``exec``): a terminal's Ctrl-C
    or Slurm's SIGTERM reaches every process of the group, and a writer killed by it failed the agreed save of the
    very stop it announced. The rank ignores them only while the process is created, not during the engine's start.
    """
    writer = writer_section(ds_config)
    if writer is None or writer.get("decoupled") is not True:
        yield
        return
    from multiprocessing.context import SpawnProcess

    before = multiprocessing.get_start_method(allow_none=True)
    multiprocessing.set_start_method("spawn", force=True)
    popen = SpawnProcess.__dict__["_Popen"]

    def started(process_obj: Any) -> Any:
        if threading.current_thread() is not threading.main_thread():  # signals are the main thread's to set
            return popen.__func__(process_obj)
        kept = {name: signal.signal(getattr(signal, name), signal.SIG_IGN) for name in _STOPS}
        try:
            return popen.__func__(process_obj)
        finally:
            for name, handler in kept.items():
                signal.signal(getattr(signal, name), handler)

    SpawnProcess._Popen = staticmethod(started)  # type: ignore[method-assign]
    try:
        yield
    finally:
        SpawnProcess._Popen = popen  # type: ignore[method-assign]
        multiprocessing.set_start_method(before, force=True)
