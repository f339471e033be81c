"""The ``dsbuild`` command: the only package that reads argv, prints or sets an exit code.

Exit codes: 0 success; 1 a well-formed config or job that fails validation; 2 bad
usage or an input that cannot be used (missing file, invalid JSON, unknown
preset...). Bad input never prints a traceback: every ``DsbuildError`` becomes
one ``dsbuild: error: ...`` line per problem on stderr.

Each command is an ``add_<name>(commands)`` function in one of the modules
(``configs``, ``tools``, ``train``) that registers its parser and sets ``handler``;
``COMMANDS`` lists them in ``--help`` order.
"""

from __future__ import annotations

import argparse
import errno
import io
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeAlias

from ..errors import DsbuildError, RunStopped
from ..version import VERSION
from .args import Commands
from .configs import add_explain, add_export, add_presets, add_schema, add_show, add_validate
from .imports import add_import
from .output import end_process, error, escape_lines, exit_code, report, show_logs
from .tools import add_checkpoints, add_doctor, add_plan
from .train import add_train

__all__ = ["entry", "main"]

Handler: TypeAlias = Callable[[argparse.Namespace], int]

COMMANDS: list[Callable[[Commands], None]] = [
    add_presets,
    add_show,
    add_export,
    add_import,
    add_validate,
    add_explain,
    add_plan,
    add_schema,
    add_doctor,
    add_train,
    add_checkpoints,
]
"""Subcommands in ``--help`` order."""


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``dsbuild`` command line; return the exit code."""
    for stream in (sys.stdout, sys.stderr):
        # A lone surrogate from a JSON file ("\\ud800") cannot be encoded: print it as an escape, never crash.
        if isinstance(stream, io.TextIOWrapper):
            stream.reconfigure(errors="backslashreplace")
    parser = _parser()
    try:
        args, extra = parser.parse_known_args(argv)
        # `dsbuild validate a.json --world-size 8 b.json`: argparse stops taking files after an
        # option; take the rest as files too when the command takes several.
        if extra and isinstance(getattr(args, "configs", None), list) and not any(x.startswith("-") for x in extra):
            args.configs.extend(extra)
        elif extra:
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
    except SystemExit as e:
        # argparse exits 2 on usage errors (after printing them) and 0 for --help / --version.
        return e.code if isinstance(e.code, int) else 2
    handler: Handler | None = getattr(args, "handler", None)
    if handler is None:
        parser.print_usage(sys.stderr)
        error("a command is required (see dsbuild --help)")
        return 2
    show_logs()
    try:
        return handler(args)
    except RunStopped as e:  # saved and stopped on a signal, as asked: not an error; --resume continues
        print(f"dsbuild: {escape_lines(str(e))}", file=sys.stderr)
        return RunStopped.EXIT_CODE
    except KeyboardInterrupt:  # a second Ctrl-C (the first stops at the next step where a command can)
        error("interrupted")
        return 130
    except DsbuildError as e:
        report(e)
        return exit_code(e)
    except BrokenPipeError:  # pragma: no cover - `dsbuild show x | head`
        # Python would complain again when flushing stdout at exit; point it at /dev/null.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except OSError as e:
        # Writing an output file: a missing directory, no permission, a full disk.
        where = f"{e.filename}: " if e.filename else ""
        folder = Path(str(e.filename)).parent if e.filename else None
        if e.errno == errno.ENOENT and folder is not None and not folder.exists():
            error(f"{where}the folder {str(folder)!r} does not exist (create it first); nothing was written")
        else:
            error(f"{where}{e.strerror or e}")
        return 2


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dsbuild",
        description="Build, check and export DeepSpeed configs.",
    )
    parser.add_argument("--version", action="version", version=f"dsbuild {VERSION}")
    commands = parser.add_subparsers(title="commands", metavar="COMMAND")
    for add in COMMANDS:
        add(commands)
    return parser


def entry() -> None:
    """The ``dsbuild`` executable (and ``python -m dsbuild``): ``main``, then the process ends with its code.

    After a command that imported torch (a run, a plan of a model), the interpreter's own teardown of torch's
    module graph takes a second or two on a small machine: the exit handlers run (temporary folders, logging), the
    streams are flushed, and the process ends without it. Other commands end as usual."""
    code = main()
    if "torch" not in sys.modules:
        raise SystemExit(code)
    end_process(code)
