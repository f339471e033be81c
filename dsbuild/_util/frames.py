"""Where user code failed: the frames of a traceback that are the user's own, not dsbuild's or a library's.

A reward function, a rollout function or a weight sink that raises is reported by dsbuild as one line naming it; the
lines a user needs next are the frames inside their module (file, line, the code there), not the thirty frames of
dsbuild, torch and torchrun around them. The whole traceback goes to the rank's log; these frames go to the terminal.
"""

from __future__ import annotations

import sysconfig
import traceback
from pathlib import Path

__all__ = ["full_traceback", "user_frames"]

_LIBRARY_ROOTS = tuple(
    {str(Path(p).resolve()) for key in ("stdlib", "platstdlib", "purelib", "platlib") if (p := sysconfig.get_path(key))}
)
_DSBUILD = str(Path(__file__).resolve().parents[1])


def _own(filename: str) -> bool:
    """Whether a frame's file is the user's: not dsbuild's, not the standard library's, not an installed package's."""
    if filename.startswith("<"):  # <frozen ...>, <string>: nobody's file
        return False
    path = str(Path(filename).resolve())
    roots = (_DSBUILD, *_LIBRARY_ROOTS)
    return not any(path == root or path.startswith(root + "/") for root in roots)


def _causes(exc: BaseException) -> list[BaseException]:
    """``exc`` and what it was raised from or during, innermost last (each once: a chain can loop)."""
    chain: list[BaseException] = []
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        chain.append(current)
        current = current.__cause__ or current.__context__
    return chain


def user_frames(exc: BaseException, limit: int = 6) -> list[str]:
    """The innermost exception's frames in the user's own files, outermost first, each ``FILE:LINE in FUNCTION:
    CODE``, then that exception (``Type: message``) unless ``exc``'s own message says it already; at most ``limit``
    frames (the innermost, with a line saying how many were left out). Empty when no frame of the chain is the
    user's."""
    for cause in reversed(_causes(exc)):
        frames: list[traceback.FrameSummary] = []
        for f in traceback.extract_tb(cause.__traceback__):
            inner = (
                frames and f.name.startswith("<") and (f.filename, f.lineno) == (frames[-1].filename, frames[-1].lineno)
            )
            if _own(f.filename) and not inner:  # a comprehension's frame repeats the line it is on
                frames.append(f)
        if not frames:
            continue
        lines = [f"{f.filename}:{f.lineno} in {f.name}" + (f": {f.line.strip()}" if f.line else "") for f in frames]
        if len(lines) > limit:
            lines = [f"({len(lines) - limit} frames before these are in the log)", *lines[-limit:]]
        raised = "".join(traceback.format_exception_only(cause)).strip()
        return lines if cause is not exc and raised in str(exc) else [*lines, raised]
    return []


def full_traceback(exc: BaseException) -> str:
    """Python's own account of ``exc``, its causes included: what a rank's log keeps."""
    return "".join(traceback.format_exception(exc))
