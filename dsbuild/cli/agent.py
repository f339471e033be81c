"""torchrun's agent on one node of ``dsbuild train``: ``python -m dsbuild.cli.agent TORCHRUN_ARGS``.

``dsbuild.run.launch`` starts it instead of ``python -m torch.distributed.run``: the same agent, with the same
arguments and output, whose process ends as soon as torchrun's ``main`` returns or raises. torchrun's own process can
outlive its run: once its launcher is killed, the agent stops its ranks (they save and stop) and returns, then waits at
the interpreter's exit for a thread that tails a rank's log and that nothing stopped (torchrun stops those threads
after the ranks, and writing to the dead launcher's pipe fails on the way). Its rendezvous keep-alive goes on meanwhile,
so the other nodes of an elastic run wait for it, forever, instead of going on without it.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Sequence

from .output import end_process

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    """torchrun's ``main`` with ``argv``: its exit code, and its error printed as Python prints an uncaught one."""
    from torch.distributed import run

    try:
        run.main(list(argv) if argv is not None else None)
    except SystemExit as e:
        if e.code is None or isinstance(e.code, int):
            return e.code or 0
        with contextlib.suppress(Exception):
            print(e.code, file=sys.stderr)
        return 1
    except BaseException:
        with contextlib.suppress(Exception):  # the launcher's pipe may be gone with the launcher
            sys.excepthook(*sys.exc_info())  # torchrun's report of a failed run, as ever
        return 1
    return 0


if __name__ == "__main__":
    code = 1
    try:
        code = main()
    finally:
        end_process(code)  # no thread waited for (see above)
