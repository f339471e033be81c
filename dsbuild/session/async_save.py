"""Checkpoints that do not stop training (``training.async_save``): each process's state copied into CPU memory at the
step that saves, written in the background while training goes on, and made a checkpoint only once every process has
written it.

The copy is taken where DeepSpeed hands each file to its checkpoint engine (``VerifyingCheckpointEngine.staging``):
``engine.save_checkpoint`` runs as for a synchronous save, but every ``save(state_dict, path)`` keeps a CPU copy of
``state_dict`` (its tensors' storages copied once each, views kept as views) instead of writing it. A thread then
writes the copies with ``torch.save``, hashed as they are written, into a hidden folder (``.TAG.partial``) that
``dsbuild checkpoints`` and ``--resume`` never look at (``manifest.candidates`` skips dot-folders). The save counts
(``commit``, collective) at a step boundary where every process has written its files: the folder takes its name,
the manifest is written, ``latest`` moves, ``keep_last`` prunes, in that order, as a synchronous save does. Until then
the previous checkpoint is the newest complete one, and the one ``latest`` names; a process killed mid-write leaves
only a hidden folder, removed by the next save (``remove_partials``).

At most one save is in flight: a save that finds the last one unwritten waits for it (and says so). The end of
``fit``, an agreed stop (a signal, Ctrl-C) and ``Session.close`` wait for it too (``AsyncSaves.finish``).
"""

from __future__ import annotations

import collections
import copy
import logging
import os
import shutil
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Final

import attrs
import torch

from ..errors import CheckpointError
from ..outputs import manifest
from . import distributed, weights_only

__all__ = ["PARTIAL", "AsyncSaves", "announce", "partial_dir", "remove_partials", "stage"]

logger = logging.getLogger("dsbuild")

PARTIAL: Final = ".{tag}.partial"
"""The hidden folder an asynchronous save writes into until every process has written (then renamed to ``TAG``)."""

WRITE_DELAY: Final = "DSBUILD_TEST_WRITE_DELAY"
"""Seconds the background writer waits before it writes a save's files: for tests of what a slow disk does (unset:
none)."""


def partial_dir(save_dir: Path, tag: str) -> Path:
    return save_dir / PARTIAL.format(tag=tag)


def remove_partials(save_dir: Path) -> list[str]:
    """Remove what an asynchronous save killed mid-write left in ``save_dir`` (its hidden folders); their names."""
    if not save_dir.is_dir():
        return []
    found = [p for p in save_dir.iterdir() if p.is_dir() and p.name.startswith(".") and p.name.endswith(".partial")]
    for folder in found:
        shutil.rmtree(folder, ignore_errors=True)
    return [p.name for p in found]


# -- the copy in CPU memory ---------------------------------------------------------------------------------------

_KEPT: Final = (str, bytes, int, float, bool, type(None), torch.dtype, torch.device, torch.Size)


def stage(
    value: Any, storages: dict[tuple[str, int, int], Any] | None = None, pool: dict[int, list[Any]] | None = None
) -> Any:
    """``value`` (what DeepSpeed hands its checkpoint engine) with every tensor copied into CPU memory: each storage
    once, so views of one storage stay views of one copy (``torch.save`` writes it once, as it would the original).
    Containers are rebuilt; DeepSpeed's few other objects (a loss scaler, fragment addresses) are deep-copied.
    ``pool``: CPU buffers of an earlier save, by size, copied into instead of new ones (``AsyncSaves.pool``)."""
    storages = {} if storages is None else storages
    if isinstance(value, torch.Tensor):
        return _stage_tensor(value, storages, pool)
    kind = type(value)
    if kind in (dict, collections.OrderedDict, collections.defaultdict):
        out: Any = kind() if kind is not collections.defaultdict else collections.defaultdict(value.default_factory)
        for key, item in value.items():
            out[key] = stage(item, storages, pool)
        return out
    if kind is list:
        return [stage(item, storages, pool) for item in value]
    if kind is tuple:
        return tuple(stage(item, storages, pool) for item in value)
    if isinstance(value, _KEPT):
        return value
    return copy.deepcopy(value)


def _stage_tensor(
    tensor: torch.Tensor, storages: dict[tuple[str, int, int], Any], pool: dict[int, list[Any]] | None
) -> torch.Tensor:
    if type(tensor) not in (torch.Tensor, torch.nn.Parameter) or tensor.is_sparse or tensor.is_quantized:
        return tensor.detach().to("cpu", copy=True)
    storage = tensor.untyped_storage()
    key = (str(tensor.device), storage.data_ptr(), storage.nbytes())
    copied = storages.get(key)
    if copied is None:
        # A buffer of the save before, of the same size (each save's files hold the same tensors), is copied into: a
        # new one costs the kernel's zeroing of every page on first touch, several times the copy itself.
        spare = pool.get(storage.nbytes()) if pool is not None else None
        if spare:
            copied = spare.pop()
        else:
            copied = torch.empty(storage.nbytes(), dtype=torch.uint8, pin_memory=tensor.device.type == "cuda")
            copied = copied.untyped_storage()
        copied.copy_(storage)
        storages[key] = copied
    out = torch.empty(0, dtype=tensor.dtype).set_(copied, tensor.storage_offset(), tensor.size(), tensor.stride())
    if isinstance(tensor, torch.nn.Parameter):
        return torch.nn.Parameter(out, requires_grad=tensor.requires_grad)
    return out.requires_grad_(tensor.requires_grad) if tensor.is_floating_point() else out


def staged_bytes(staged: list[tuple[str, Any]]) -> int:
    """The CPU memory the staged copies hold (each storage once)."""
    seen: dict[int, int] = {}

    def walk(value: Any) -> None:
        if isinstance(value, torch.Tensor):
            storage = value.untyped_storage()
            seen[storage.data_ptr()] = storage.nbytes()
        elif isinstance(value, Mapping):
            for item in value.values():
                walk(item)
        elif isinstance(value, (list, tuple)):
            for item in value:
                walk(item)

    for _, value in staged:
        walk(value)
    return sum(seen.values())


# -- one save in flight -------------------------------------------------------------------------------------------


@attrs.define
class Flight:
    """One asynchronous save: staged, then written by ``thread``; ``share`` (this process's ``rank_entry``) or
    ``error`` once written."""

    save_dir: Path
    tag: str
    step: int
    facts: manifest.RunFacts
    keep_last: int | None
    digest: str
    main: bool
    """Whether this process writes the manifest (rank 0; with node-local storage each node's first process)."""
    node_local: bool
    staged_at: float
    size: int
    buffers: list[Any] = attrs.Factory(list)
    """The CPU buffers the staged tensors are views of: given back to ``AsyncSaves.pool`` once written."""
    thread: threading.Thread | None = None
    share: dict[str, Any] | None = None
    error: BaseException | None = None
    done: threading.Event = attrs.Factory(threading.Event)

    @property
    def folder(self) -> Path:
        return partial_dir(self.save_dir, self.tag)


def _write(flight: Flight, staged: list[tuple[str, Any]], state: dict[str, Any], zipfile: bool) -> None:
    """The background writer: every staged file, hashed as written, then this process's state file."""
    try:
        delay = float(os.environ.get(WRITE_DELAY) or 0)
        root = str(flight.folder.resolve())
        files = {}
        time.sleep(delay)
        while staged:
            path, value = staged.pop(0)  # dropped once written: the CPU memory is given back file by file
            size, digest = weights_only.write_file(value, Path(path), flight.digest, zipfile)
            del value
            files[Path(path).resolve().relative_to(root).as_posix()] = {"size": size, flight.digest: digest}
        rank = int(state["rank"])
        state = {**state, "files": files}
        manifest.write_rank_state(flight.folder, rank, state)
        flight.share = manifest.rank_entry(flight.folder, rank, state, flight.digest)
    except BaseException as e:  # said by the commit, on every process
        flight.error = e
    finally:
        flight.done.set()


class AsyncSaves:
    """A session's asynchronous saves: at most one in flight (``flight``)."""

    def __init__(self) -> None:
        self.flight: Flight | None = None
        self.pool: dict[int, list[Any]] = {}
        """The buffers of the last save written, by size, for the next save to copy into (the copy's memory is held
        from the first save to the run's end, as torch DCP's cached staging buffers are)."""

    def written(self) -> bool:
        """Whether this process has written all of the save in flight (``False`` with none)."""
        return self.flight is not None and self.flight.done.is_set()

    def start(
        self,
        engine: Any,
        save_dir: Path,
        tag: str,
        *,
        position: dict[str, Any],
        facts: manifest.RunFacts,
        frozen_excluded: bool,
        keep_last: int | None,
    ) -> None:
        """Collective: stage checkpoint ``tag`` of ``engine`` into CPU memory and start writing it in the background
        (with none in flight: ``finish`` the one before first)."""
        assert self.flight is None, "finish the save in flight first"
        rank = distributed.rank()
        node_local = bool(engine.use_node_local_storage())
        main = distributed.local_rank() == 0 if node_local else rank == 0
        writer = weights_only.install(engine)
        if main:
            remove_partials(save_dir)  # what a save killed mid-write left
        distributed.barrier()
        staged: list[tuple[str, Any]] = []
        storages: dict[tuple[str, int, int], Any] = {}
        started = time.perf_counter()
        writer.staging = lambda state_dict, path: staged.append((path, stage(state_dict, storages, self.pool)))
        try:
            engine.save_checkpoint(
                str(save_dir),
                tag=PARTIAL.format(tag=tag),
                save_latest=False,
                exclude_frozen_parameters=frozen_excluded,
            )
        finally:
            writer.staging = None
        if any(t.device.type == "cuda" for t in _tensors(staged)):
            torch.cuda.synchronize()
        flight = Flight(save_dir, tag, int(engine.global_steps), facts, keep_last, writer.digest, main, node_local,
                        time.perf_counter(), staged_bytes(staged), list(storages.values()))  # fmt: skip
        if rank == 0:
            logger.info(
                "checkpoint %s: %.0f MiB per process copied to CPU memory in %.2f s; written in the background",
                tag, flight.size / 2**20, flight.staged_at - started,
            )  # fmt: skip
        state = {**position, "rank": rank}
        zipfile = bool(getattr(writer.inner, "zipfile_serialization", True))
        flight.thread = threading.Thread(target=_write, args=(flight, staged, state, zipfile), daemon=True,
                                         name=f"dsbuild-save-{tag}")  # fmt: skip
        self.flight = flight
        flight.thread.start()

    def finish(self, *, waiting: str | None = None, after_save: Callable[[Path], None] | None = None) -> str | None:
        """Collective: wait for the save in flight to be written on every process, then make it a checkpoint (its
        folder named, its manifest written, ``latest`` moved, the oldest pruned); its tag, or ``None`` with none.
        ``waiting``: the save that waits for it (said in the log when this process has not written it yet)."""
        flight = self.flight
        if flight is None:
            return None
        if not flight.done.is_set() and waiting is not None:  # saving faster than the disk writes: said
            logger.warning(
                "rank %d: checkpoint %s waits for checkpoint %s, still being written (one save at a time)",
                distributed.rank(), waiting, flight.tag,
            )  # fmt: skip
        flight.done.wait()
        self.flight = None
        for buffer in flight.buffers:  # written: the next save copies into them
            self.pool.setdefault(buffer.nbytes(), []).append(buffer)
        _commit(flight)
        if after_save is not None:
            after_save(flight.save_dir / flight.tag)
        return flight.tag


def _tensors(staged: list[tuple[str, Any]]) -> list[torch.Tensor]:
    out: list[torch.Tensor] = []

    def walk(value: Any) -> None:
        if isinstance(value, torch.Tensor):
            out.append(value)
        elif isinstance(value, Mapping):
            for item in value.values():
                walk(item)
        elif isinstance(value, (list, tuple)):
            for item in value:
                walk(item)

    for _, value in staged:
        walk(value)
    return out


def _commit(flight: Flight) -> None:
    """Collective: every process's share of ``flight`` (or its failure) gathered; the manifest's writer renames the
    folder, writes the manifest and ``latest`` and prunes. A failure on any process fails the save on every one."""
    failure = None if flight.error is None else _said(flight.error)
    shares = distributed.all_objects((distributed.node_rank(), flight.share, failure))
    failed = next((text for _, _, text in shares if text), None)
    tag_dir = flight.save_dir / flight.tag
    if failed is None and flight.main:
        node = distributed.node_rank()
        here = {r: s for r, (n, s, _) in enumerate(shares) if s is not None and (not flight.node_local or n == node)}
        try:
            if tag_dir.exists():  # saved before (a resumed run saving the step again): replaced, manifest first
                manifest.remove_failed(tag_dir)
            os.replace(flight.folder, tag_dir)
            manifest.write_manifest(tag_dir, tag=flight.tag, step=flight.step, world_size=distributed.world_size(),
                                    facts=flight.facts, digest=flight.digest, shares=here)  # fmt: skip
            manifest.write_latest(flight.save_dir, flight.tag)
        except OSError as e:
            failed = _said(e)
            manifest.remove_failed(tag_dir)
        if failed is None and flight.keep_last:
            manifest.prune(flight.save_dir, flight.keep_last)
    failed = next((text for text in distributed.all_texts(failed) if text), None)
    if failed is not None:
        if flight.main:
            shutil.rmtree(flight.folder, ignore_errors=True)
        last = manifest.last_complete(flight.save_dir, but=flight.tag)
        intact = f"the last complete checkpoint is {flight.save_dir / last}" if last else "no earlier one is complete"
        raise CheckpointError(
            f"saving checkpoint {flight.tag} in {flight.save_dir} in the background failed: {failed}; {intact}"
        )
    if distributed.rank() == 0:
        logger.info(
            "checkpoint %s saved and verified (written in the background in %.2f s)",
            tag_dir, time.perf_counter() - flight.staged_at,
        )  # fmt: skip


def _said(error: BaseException) -> str:
    if isinstance(error, OSError):
        where = f" ({error.filename})" if error.filename else ""
        return f"{error.strerror or error}{where}"
    return str(error).splitlines()[0] if str(error) else type(error).__name__


def announce(engine: Any, config: Any, stage: int) -> None:
    """At the engine's start, with ``training.async_save``: the run's line saying the copy each checkpoint takes in CPU
    memory (``planner.checkpoint_copy``, from the engine's trained parameters), or ``SessionError`` where this node
    has not that much available."""
    from ..errors import SessionError
    from ..planner import Precision, staging
    from ..planner.checkpoint_copy import REFUSAL_HINT, available_memory, refusal, size

    trained = sum(int(getattr(p, "ds_numel", p.numel())) for p in engine.module.parameters() if p.requires_grad)
    here = int(os.environ.get("LOCAL_WORLD_SIZE") or 1)
    copy = staging(stage, trained, distributed.world_size(), here, Precision.of(config))
    reason = refusal(copy, available_memory())
    if reason is not None:
        raise SessionError(f"training.async_save: {reason}: {REFUSAL_HINT}")
    if distributed.rank() == 0:
        logger.info(
            "training.async_save: each checkpoint is copied into CPU memory and written in the background: about %s "
            "on rank 0, %s on its node",
            size(copy.per_rank), size(copy.per_node),
        )  # fmt: skip
