"""DeepSpeed op builds left locked: a build killed while compiling leaves its lock file behind, and every later
build of that op waits for it forever, without a word.

torch's ``cpp_extension`` (which DeepSpeed builds its ops with) guards each op's build folder,
``TORCH_EXTENSIONS_DIR`` or ``~/.cache/torch_extensions``, ``py311_cpu/<op>/``, with a file named
``lock`` created exclusively; a waiting process polls until the file is gone. A lock is stale when no
process is building in that folder (none has it as its working directory or on its command line)
and the lock does not go away after a short wait. ``dsbuild train`` checks before DeepSpeed starts,
``dsbuild doctor`` reports them.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

__all__ = ["extensions_root", "stale_locks"]


def extensions_root() -> Path:
    """Where torch keeps the ops it builds (``TORCH_EXTENSIONS_DIR``, else the user's cache)."""
    given = os.environ.get("TORCH_EXTENSIONS_DIR")
    if given:
        return Path(given)
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "torch_extensions"


def _building(folder: Path) -> bool:
    """Whether a process is building in ``folder``: it is the process's working directory or on its command line."""
    proc = Path("/proc")
    if not proc.is_dir():
        return True  # cannot tell: never call a lock stale
    target = str(folder.resolve())
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if os.readlink(entry / "cwd").startswith(target):
                return True
            if target.encode() in (entry / "cmdline").read_bytes():
                return True
        except OSError:
            continue
    return False


def stale_locks(root: Path | None = None, *, wait: float = 0.0, young: float = 10.0) -> list[Path]:
    """Lock files under ``root`` that no build is holding: no process builds in their folder, they are older than
    ``young`` seconds, and (with ``wait``) they are still there and still unused after ``wait`` seconds."""
    root = extensions_root() if root is None else root
    if not root.is_dir():
        return []

    def suspects() -> list[Path]:
        now = time.time()
        found = []
        for path in sorted(root.glob("*/*/lock")):
            try:
                if now - path.stat().st_mtime < young:
                    continue  # a build that is just starting
            except OSError:
                continue
            if not _building(path.parent):
                found.append(path)
        return found

    first = suspects()
    if not first or wait <= 0:
        return first
    time.sleep(wait)
    return [path for path in suspects() if path in first]
