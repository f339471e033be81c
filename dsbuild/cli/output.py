"""What the command prints: results on stdout, one ``dsbuild: error: ...`` line per problem on stderr."""

from __future__ import annotations

import logging
import sys

from ..errors import ConfigError, DsbuildError

__all__ = ["counts", "error", "out", "plural", "report", "show_logs", "warning"]


def show_logs() -> None:
    """Print what the library logs (``logging.getLogger("dsbuild")``, info and up) as ``dsbuild: ...`` lines on stderr."""
    logger = logging.getLogger("dsbuild")
    if any(getattr(h, "dsbuild_cli", False) for h in logger.handlers):
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("dsbuild: %(message)s"))
    handler.dsbuild_cli = True  # type: ignore[attr-defined]
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False


def out(text: str, *, end: str = "\n") -> None:
    print(text, end=end)


def error(text: str) -> None:
    print(f"dsbuild: error: {text}", file=sys.stderr)


def warning(text: str) -> None:
    print(f"dsbuild: warning: {text}", file=sys.stderr)


def report(exc: DsbuildError) -> None:
    """One ``dsbuild: error:`` line per problem, each naming the file."""
    if isinstance(exc, ConfigError):
        where = f"{exc.source}: " if exc.source else ""
        for problem in exc.problems:
            error(f"{where}{problem}")
    else:
        error(str(exc))


def counts(errors: int, warnings: int) -> str:
    return f"{plural(errors, 'error')}, {plural(warnings, 'warning')}"


def plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"
