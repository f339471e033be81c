"""The CPU's features, asked once: DeepSpeed's op builders call py-cpuinfo each time an op loads.

``cpuinfo.get_cpu_info()`` starts a Python subprocess (about a second on a small machine), and
DeepSpeed calls it for every op it loads or builds (``cpu_arch``, ``simd_width``), so a run on the
CPU accelerator pays it two or three times before its first step. The answer describes the machine
and nothing else: dsbuild remembers it for the process, and on disk under
``~/.cache/dsbuild/cpuinfo/`` keyed by the contents of ``/proc/cpuinfo`` and py-cpuinfo's version,
so a different CPU (or a new py-cpuinfo) asks again. Any trouble reading or writing the cache falls
back to asking py-cpuinfo as DeepSpeed would.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
from pathlib import Path
from typing import Any

from .._util.atomic import write_atomic
from .._util.cache import user_cache

__all__ = ["install"]

logger = logging.getLogger("dsbuild")


def _machine_key(version: str) -> str | None:
    """A digest of this machine's CPU description, or ``None`` where there is no ``/proc/cpuinfo`` (no disk cache)."""
    try:
        text = Path("/proc/cpuinfo").read_bytes()
    except OSError:
        return None
    # Per-core lines that change from one reading to the next (clock speed, bogomips) are left out.
    stable = b"\n".join(
        line for line in text.splitlines() if not line.lower().startswith((b"cpu mhz", b"bogomips", b"processor"))
    )
    return hashlib.sha256(stable + version.encode()).hexdigest()[:32]


def install() -> None:
    """Make ``cpuinfo.get_cpu_info`` answer from the process's memory, then from the disk cache (once per process)."""
    try:
        import cpuinfo
    except ImportError:
        return
    if getattr(cpuinfo.get_cpu_info, "dsbuild_cached", False):
        return
    ask = cpuinfo.get_cpu_info

    @functools.cache
    def remembered() -> dict[str, Any]:
        key = _machine_key(str(getattr(cpuinfo, "CPUINFO_VERSION_STRING", "")))
        path = user_cache("cpuinfo") / f"{key}.json" if key else None
        if path is not None:
            try:
                found = json.loads(path.read_text(encoding="utf-8"))
                if isinstance(found, dict) and "arch" in found:
                    return found
            except (OSError, ValueError):
                pass
        info: dict[str, Any] = ask()
        if path is not None:
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                write_atomic(path, json.dumps(info))
            except (OSError, TypeError, ValueError) as e:
                logger.debug("cpuinfo cache not written: %s", e)
        return info

    def get_cpu_info() -> dict[str, Any]:
        return dict(remembered())  # a copy each time, as py-cpuinfo gives

    get_cpu_info.dsbuild_cached = True  # type: ignore[attr-defined]
    cpuinfo.get_cpu_info = get_cpu_info
