"""DeepSpeed's checkpoint files read with torch's weights-only unpickler, and verified as they are read and written.

Every file DeepSpeed reads or writes for a checkpoint goes through its engine's checkpoint engine
(``DeepSpeedEngine.checkpoint_engine``); ``install`` wraps DeepSpeed's default one in
``VerifyingCheckpointEngine``: ``save`` hashes what it writes (for the manifest), ``load`` uses
``torch.load(weights_only=True)`` with an allowlist of the few DeepSpeed classes its checkpoints
hold (``safe_globals()``) and checks the bytes against the manifest. A pickle planted in a
checkpoint is refused, naming the file and the global it asked for, and runs nothing. dsbuild's own
state (RNG states, data position) is JSON (``rng_state``).
"""

from __future__ import annotations

import atexit
import base64
import contextlib
import errno
import os
import pickle
import random
import re
import shutil
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, BinaryIO, Final

import numpy as np
import torch

from ..errors import CheckpointError
from ..outputs.manifest import DIGEST, file_digest, hasher

__all__ = [
    "VerifyingCheckpointEngine",
    "decode_tensor",
    "encode_tensor",
    "install",
    "rng_state",
    "routed",
    "safe_globals",
    "set_rng_state",
    "write_file",
]


def safe_globals() -> list[Any]:
    """The globals DeepSpeed 0.19's own checkpoints need beyond tensors (ZeRO 0-3, offload, LoRA, fp16/bf16/fp32)."""
    from deepspeed.runtime.fp16.loss_scaler import DynamicLossScaler, LossScaler
    from deepspeed.runtime.zero.config import ZeroStageEnum
    from deepspeed.utils.tensor_fragment import fragment_address

    return [LossScaler, DynamicLossScaler, ZeroStageEnum, fragment_address]


class _HashingWriter:
    """A binary file that hashes what is written through it (``torch.save`` writes sequentially).

    A large chunk (a tensor's storage) is hashed while a second thread writes it: both release the GIL, so
    on a machine with a core to spare the hash costs little more than the write.
    """

    _LARGE: Final = 2**20

    def __init__(self, f: BinaryIO, algorithm: str) -> None:
        self.f = f
        self.size = 0
        self.digest = hasher(algorithm)

    def write(self, data: bytes) -> int:
        self.size += len(data)
        if len(data) < self._LARGE:
            self.digest.update(data)
            return self.f.write(data)
        written: list[int] = []
        errors: list[BaseException] = []

        def write() -> None:
            try:
                written.append(self.f.write(data))
            except BaseException as e:  # re-raised below, in the caller's thread
                errors.append(e)

        writer = threading.Thread(target=write)
        writer.start()
        self.digest.update(data)
        writer.join()
        if errors:
            raise errors[0]
        return written[0]

    def flush(self) -> None:
        self.f.flush()

    def finish(self) -> str:
        """The digest of everything written."""
        return str(self.digest.hexdigest())


class VerifyingCheckpointEngine:
    """Wraps DeepSpeed's ``TorchCheckpointEngine``: records what ``save`` writes, loads weights-only and verified.

    Every file DeepSpeed reads or writes for a checkpoint goes through its engine's ``save`` and
    ``load`` (``DeepSpeedEngine.checkpoint_engine``); everything else is passed through.
    """

    def __init__(self, inner: Any, digest: str = DIGEST) -> None:
        self.inner = inner
        self.digest = digest
        """What ``save`` hashes the files with (``manifest.DIGESTS``)."""
        self.written: dict[str, tuple[int, str]] = {}
        """Absolute path -> (size, digest) of each file ``save`` wrote since ``begin``."""
        self.expected: dict[str, tuple[int, str, str]] | None = None
        """Absolute path -> (size, algorithm, digest) the files ``load`` may read; ``None``: outside a verified load."""
        self.verified: set[str] = set()
        """Absolute paths of files this process hashed against the manifest just before the load: not hashed again."""
        self.scratch: str | None = None
        """An absolute folder whose files this process is writing now (a conversion's output): read weights-only,
        though in no manifest yet."""
        self.delegated = type(inner).__name__ != "TorchCheckpointEngine"
        """DeepSpeed's writer engines (``checkpoint.writer``: the fast engine, its decoupled process): they write the
        files themselves, in another process or through their own file objects, so ``commit`` hashes them after."""
        self.pending: list[str] = []
        """The files a delegated ``save`` handed to DeepSpeed's writer since ``begin``: hashed by ``commit``."""
        self.staging: Any = None
        """While an asynchronous save stages (``async_save``): called with each ``(state_dict, path)`` in place of the
        write (it keeps a CPU copy, written in the background)."""

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def begin(self) -> None:
        self.written = {}
        self.pending = []

    def is_decoupled(self) -> bool:
        """``False`` for every engine: DeepSpeed then commits a decoupled writer's save at the end of
        ``save_checkpoint`` (``commit`` below), not at the next optimizer step, because dsbuild's manifest, written
        right after, needs every file complete and hashed."""
        return False

    def commit(self, info: Any) -> bool:
        """DeepSpeed's commit of a save: a decoupled writer's files written (it waits for its writer process; its first
        commit is collective), then every file a delegated ``save`` handed over hashed from the disk. A writer that
        failed, or a file it did not write, is an ``OSError`` naming it (a failed save: its folder is removed, the
        last complete checkpoint named), before any manifest names the file."""
        if not self.delegated:
            return bool(self.inner.commit(info))
        if self.inner.is_decoupled() and self.inner.get_commit_info() is not None:
            try:
                self.inner.commit(info)
            except RuntimeError as e:  # its writer process died or timed out
                raise OSError(errno.EIO, f"DeepSpeed's decoupled checkpoint writer failed: {e}") from None
        elif not self.inner.is_decoupled():
            self.inner.commit(info)
        for path in self.pending:
            target = Path(path)
            if not target.is_file():
                raise OSError(errno.EIO, "DeepSpeed's checkpoint writer did not write it", str(target))
            self.written[str(target.resolve())] = (target.stat().st_size, file_digest(target, self.digest))
        self.pending = []
        return True

    def save(self, state_dict: Any, path: str) -> None:
        if self.staging is not None:  # an asynchronous save (``async_save``): a copy in CPU memory, written later
            self.staging(state_dict, path)
            return
        if self.delegated:
            self.inner.save(state_dict, path)  # DeepSpeed's writer: hashed from the disk once it has committed
            self.pending.append(path)
            return
        target = Path(path)
        self.written[str(target.resolve())] = write_file(
            state_dict, target, self.digest, self.inner.zipfile_serialization
        )

    def load(self, path: str, map_location: Any = None) -> Any:
        target = Path(path)
        key = str(target.resolve())
        expected = None if self.expected is None else self.expected.get(key)
        mine = self.scratch is not None and key.startswith(self.scratch + os.sep)
        if self.expected is not None and expected is None and not mine:
            raise CheckpointError(f"{target}: not in the checkpoint's manifest, so it is not loaded")
        if key in self.verified:
            expected = None  # hashed against the manifest just before this load (checkpoints.load)
        result: list[str] = []
        algorithm = expected[1] if expected is not None else self.digest
        hashing = threading.Thread(target=lambda: result.append(file_digest(target, algorithm)))
        if expected is not None:  # verified while torch reads it: the weights-only load runs nothing either way
            hashing.start()
        failure: CheckpointError | None = None
        try:
            with torch.serialization.safe_globals(safe_globals()):
                loaded = _torch_load(target, map_location=map_location, weights_only=True)
        except pickle.UnpicklingError as e:
            failure = CheckpointError(f"{target}: refused: {_unsafe_global(e)}")
        except (RuntimeError, EOFError, OSError, ValueError) as e:
            failure = CheckpointError(f"{target}: unreadable: {str(e).splitlines()[0]}")
        finally:
            if expected is not None:
                hashing.join()
        # A file that differs from its manifest is named so first: that, not how torch failed on it, is the news.
        if expected is not None and (not result or result[0] != expected[2]):
            raise CheckpointError(
                f"{target}: its contents differ from the manifest's {algorithm} digest (altered or damaged)"
            )
        if failure is not None:
            raise failure
        return loaded


def write_file(state_dict: Any, target: Path, digest: str, zipfile: bool = True) -> tuple[int, str]:
    """``torch.save`` of ``state_dict`` into ``target``, hashed as it is written: its size and digest. A failure is an
    ``OSError`` naming the file (a full disk as ``ENOSPC``)."""
    with open(target, "wb") as f:
        writer = _HashingWriter(f, digest)
        try:
            torch.save(state_dict, writer, _use_new_zipfile_serialization=zipfile)  # type: ignore[arg-type]
            # Not fsync'd (DeepSpeed does not either): the manifest, written last, holds each
            # file's digest, so a file a crash left short is found and the checkpoint skipped on resume.
        except (RuntimeError, OSError) as e:  # torch reports a full disk as "basic_ios::clear" / "failed writing"
            if isinstance(e, OSError) and e.errno is not None:
                raise OSError(e.errno, e.strerror, str(target)) from None
            if shutil.disk_usage(target.parent).free < 2**20:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(target)) from None
            raise OSError(errno.EIO, f"writing failed: {e}", str(target)) from None
        finally:
            hexdigest = writer.finish()
    return writer.size, hexdigest


_torch_load: Final = torch.load
"""torch's own ``load``, which ``routed`` puts back."""


@contextlib.contextmanager
def routed(engine: VerifyingCheckpointEngine) -> Iterator[None]:
    """Every ``torch.load`` of a file goes through ``engine.load`` (weights-only, checked against ``engine.expected``)
    while inside: DeepSpeed's universal-checkpoint code (``ds_to_universal``, its ZeRO optimizers' universal loads)
    calls ``torch.load(..., weights_only=False)`` itself, past the checkpoint engine."""

    def load(f: Any, map_location: Any = None, *args: Any, **kwargs: Any) -> Any:
        if not isinstance(f, (str, os.PathLike)):
            raise CheckpointError(f"a checkpoint load from {type(f).__name__}, not a file: refused (not verifiable)")
        return engine.load(os.fspath(f), map_location)

    torch.load = load
    try:
        yield
    finally:
        torch.load = _torch_load


_GLOBAL = re.compile(r"GLOBAL ([\w.]+)")


def _unsafe_global(error: Exception) -> str:
    """What torch's weights-only unpickler refused, in one line."""
    found = _GLOBAL.search(str(error))
    if found:
        return f"it needs the global {found.group(1)}, which is not among the classes DeepSpeed's checkpoints hold"
    return str(error).splitlines()[0]


def install(engine: Any, digest: str = DIGEST) -> VerifyingCheckpointEngine:
    """Put ``VerifyingCheckpointEngine`` around the engine's checkpoint engine: DeepSpeed's default one, or its fast
    or decoupled writer engine (``checkpoint.writer``), whose files it hashes once written."""
    from deepspeed.runtime.checkpoint_engine import (
        DecoupledCheckpointEngine,
        FastCheckpointEngine,
        TorchCheckpointEngine,
    )

    current = engine.checkpoint_engine
    if isinstance(current, VerifyingCheckpointEngine):
        return current
    if type(current) not in (TorchCheckpointEngine, FastCheckpointEngine, DecoupledCheckpointEngine):
        raise CheckpointError(
            f"the config selects DeepSpeed's {type(current).__name__} checkpoint engine; dsbuild verifies and loads "
            "checkpoints through DeepSpeed's torch, fast and decoupled engines only (remove its settings)"
        )
    if isinstance(current, DecoupledCheckpointEngine):
        # Its writer is a process that waits on a queue until told to end; multiprocessing joins such a process at
        # the interpreter's exit, so a run that ends without DeepSpeed's engine being destroyed would wait forever.
        atexit.register(current.cleanup)
    engine.checkpoint_engine = VerifyingCheckpointEngine(current, digest)
    return engine.checkpoint_engine  # type: ignore[no-any-return]


def _b64(tensor: torch.Tensor) -> str:
    return base64.b64encode(tensor.detach().cpu().contiguous().numpy().tobytes()).decode("ascii")


def _tensor(text: str) -> torch.Tensor:
    return torch.frombuffer(bytearray(base64.b64decode(text)), dtype=torch.uint8).clone()


def rng_state() -> dict[str, Any]:
    """This process's RNG states (python, numpy, torch, the accelerator's when it is not the CPU), as JSON values."""
    from deepspeed.accelerator import get_accelerator

    version, internal, gauss = random.getstate()
    kind, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)
    state: dict[str, Any] = {
        "python": [version, list(internal), gauss],
        "numpy": [kind, [int(k) for k in keys], int(pos), int(has_gauss), float(cached)],
        "torch": _b64(torch.get_rng_state()),
    }
    accelerator = get_accelerator()
    if accelerator.device_name() != "cpu":
        state["accelerator"] = _b64(accelerator.get_rng_state())
    return state


def set_rng_state(state: Mapping[str, Any]) -> None:
    from deepspeed.accelerator import get_accelerator

    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, np.array(keys, dtype=np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(_tensor(state["torch"]))
    if "accelerator" in state:
        get_accelerator().set_rng_state(_tensor(state["accelerator"]))


def encode_tensor(tensor: torch.Tensor | None) -> str | None:
    """A uint8 state tensor (an RNG state) as text; ``None`` stays ``None``."""
    return None if tensor is None else _b64(tensor)


def decode_tensor(text: str | None) -> torch.Tensor | None:
    return None if text is None else _tensor(text)
