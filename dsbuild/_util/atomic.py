"""Atomic file writes: a reader sees the old file or the new one, never half of one.

The one place dsbuild writes a file the user keeps (configs, job exports, checkpoint
manifests, ``latest``, histories): the bytes go to a temporary file beside the
target, are flushed to disk, and the temporary file is renamed over the target;
then the directory itself is synced so the rename survives a crash.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

__all__ = ["fsync_dir", "write_atomic"]


def write_atomic(path: str | os.PathLike[str], data: str | bytes, *, durable: bool = True) -> Path:
    """Write ``data`` (text is UTF-8) to ``path`` atomically; an ``OSError`` names ``path``, never the temp file.

    ``durable=False`` skips the flushes to disk (the rename stays atomic): for files whose contents are
    verified when read, such as a checkpoint's manifest, where waiting for the disk buys nothing.
    """
    path = Path(path)
    raw = data.encode("utf-8") if isinstance(data, str) else data
    while True:
        tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:12]}.tmp")
        try:
            # os.open with mode 0o666 lets the umask decide the permissions, as a plain open() would
            # (tempfile.mkstemp would leave the file readable by its owner only).
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666)
        except FileExistsError:  # pragma: no cover - a 48-bit random name collided
            continue
        except OSError as e:
            raise _about(e, path) from None
        break
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(raw)
            f.flush()
            if durable:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        tmp.unlink(missing_ok=True)
        if isinstance(e, OSError):
            raise _about(e, path) from None
        raise
    if durable:
        fsync_dir(path.parent)
    return path


def _about(error: OSError, path: Path) -> OSError:
    """The same OS error naming the file the user asked for, not our temp file."""
    return type(error)(error.errno, error.strerror, str(path))


def fsync_dir(directory: str | os.PathLike[str]) -> None:
    """Make a rename in ``directory`` durable (POSIX); best effort where directories cannot be opened."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:  # pragma: no cover - Windows
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover - some file systems refuse fsync on directories
        pass
    finally:
        os.close(fd)
