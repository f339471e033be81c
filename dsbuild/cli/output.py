"""What the command prints: results on stdout, one ``dsbuild: error: ...`` line per problem on stderr.

Text from a user's file (keys, values, file names) is printed escaped: in a message, a character that is
not printable shows as its Python escape (``\\n``, ``\\x1b``, ``\\ud800``), so a key cannot forge a line
of output or colour the terminal; in a result on stdout, control characters but the tab and the line break
are escaped. ``main`` makes both streams write what they cannot encode (a lone surrogate) as a backslash
escape, never crash.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import re
import sys
import threading
from typing import TYPE_CHECKING, Any, Final

from .._util.frames import user_frames
from ..errors import ConfigError, DsbuildError, FunctionError, NonFiniteLossError, Problem

if TYPE_CHECKING:
    from ..validate import Diagnostic

__all__ = [
    "counts", "end_process", "error", "escape", "escape_lines", "out", "plural", "report", "show_logs", "warning",
]  # fmt: skip


def escape(text: str) -> str:
    """``text`` with each character that is not printable (a line break too) written as its Python escape."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else _escaped(c) for c in text)


def escape_lines(text: str) -> str:
    """``text`` escaped line by line: its own line breaks kept."""
    return "\n".join(escape(line) for line in text.split("\n"))


_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
"""Control characters but the tab and the line break: never in what stdout shows (JSON and TOML escape them)."""


def _escaped(c: str) -> str:
    return c.encode("unicode_escape").decode("ascii")


def show_logs() -> None:
    """Print what the library logs (``logging.getLogger("dsbuild")``, info and up) as ``dsbuild: ...`` lines on stderr."""
    logger = logging.getLogger("dsbuild")
    if any(getattr(h, "dsbuild_cli", False) for h in logger.handlers):
        return
    handler = _Stderr()
    handler.setFormatter(_Escaped("dsbuild: %(message)s"))
    handler.dsbuild_cli = True  # type: ignore[attr-defined]
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False


class _Stderr(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to ``sys.stderr`` as it is when a record comes (a test, or a caller, may have replaced it since)."""

    @property
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, value: Any) -> None:
        pass


class _Escaped(logging.Formatter):
    """``dsbuild: ...``; ``dsbuild: warning: ...`` and ``dsbuild: error: ...`` for those levels, as the CLI's own."""

    def format(self, record: logging.LogRecord) -> str:
        text = escape_lines(super().format(record))
        if record.levelno >= logging.WARNING:
            level = "error" if record.levelno >= logging.ERROR else "warning"
            return text.replace("dsbuild: ", f"dsbuild: {level}: ", 1)
        return text


def out(text: str, *, end: str = "\n") -> None:
    """Print a result on stdout (a document, a table); control characters but the tab and line break escaped."""
    print(_CONTROL.sub(lambda m: _escaped(m.group()), text), end=end)


OPTIONS: Final = {
    "hidden_size": "--hidden-size H",
    "model": "--model DIR",
    "total_steps": "--total-steps N",
    "training": "--training FILE or --set training.NAME=VALUE",
}
"""The command's options for what ``resolve()`` would be passed (``Problem.needs``), in the order they are offered."""


def said(item: Problem | Diagnostic) -> str:
    """A problem or finding as the command line says it: what is missing named as the command's options
    (``give --hidden-size H``) where the library names ``resolve()``'s arguments (``pass hidden_size=``)."""
    if item.needs and not item.hint:
        import attrs  # the parsers import this module: keep it light

        options = " or ".join(OPTIONS[name] for name in OPTIONS if name in item.needs)
        item = attrs.evolve(item, hint=f"give {options}")
    return str(item)


def error(text: str) -> None:
    print(f"dsbuild: error: {escape_lines(text)}", file=sys.stderr)


def warning(text: str) -> None:
    print(f"dsbuild: warning: {escape_lines(text)}", file=sys.stderr)


def report(exc: DsbuildError) -> None:
    """One ``dsbuild: error:`` line per problem, each naming the file (a line break in a key is escaped)."""
    if isinstance(exc, ConfigError):
        where = f"{escape(exc.source)}: " if exc.source else ""
        for problem in exc.problems:
            error(f"{where}{escape(said(problem))}")
    else:
        error(str(exc))


def exit_code(exc: DsbuildError) -> int:
    """What a command exits with for ``exc``: 1 for a run that failed or a config or job that fails its checks, 2 for
    input that cannot be read or a command used wrongly (DESIGN.md, docs/cli.md)."""
    if isinstance(exc, (NonFiniteLossError, FunctionError)) or (isinstance(exc, ConfigError) and exc.fails_checks):
        return 1
    return 2


def frames(exc: BaseException) -> None:
    """The frames of ``exc``'s causes in the user's own files (a reward function's line), under its error line."""
    for line in user_frames(exc):
        print(f"  {escape_lines(line)}", file=sys.stderr)


def counts(errors: int, warnings: int) -> str:
    return f"{plural(errors, 'error')}, {plural(warnings, 'warning')}"


def plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def end_process(code: int, *, wait_for_threads: bool = False) -> None:
    """End this process with ``code`` once what it wrote is out, without the interpreter's finalization: the exit
    handlers run (temporary folders, logging's flush, a W&B run's upload) and the streams are flushed (a stream whose
    reader is gone is passed over), then ``os._exit``. ``wait_for_threads`` first waits for the threads that are not
    daemons, as Python's exit does (a writer finishing a file); without it a thread left running ends with the process.

    Used where finalization costs or fails: the ``dsbuild`` executable after torch (its module graph takes seconds
    to tear down), each rank (C++ threads left by gloo or DeepSpeed's ops can abort it there: "terminate called
    without an active exception"), torchrun's agent (a log-tailing thread it leaves would keep it, and its rendezvous
    keep-alive, going: ``dsbuild.cli.agent``)."""
    if wait_for_threads:
        shutdown = getattr(threading, "_shutdown", None)
        if callable(shutdown):
            shutdown()
    with contextlib.suppress(Exception):
        atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)
