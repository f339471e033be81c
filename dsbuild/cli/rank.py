"""One rank of ``dsbuild train``: ``python -m dsbuild.cli.rank JOB [--set KEY=VALUE ...] [--resume]``.

``dsbuild train`` starts it on every rank through torchrun (``dsbuild.run.launch``) for runs of several
processes or nodes. Errors in the job are one line each, name the rank, and exit 2; torchrun's
error summary names the rank too.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .._util.atomic import write_atomic
from .._util.frames import full_traceback, user_frames
from .._util.overrides import parse_set
from ..errors import ConfigError, DsbuildError, RunStopped
from ..job import load_job
from ..run.failures import FAILURE_FILE, STOPPED_MARK
from ..run.worker import run
from ..session.loop import LAUNCHER_PID
from .output import end_process, error, escape, escape_lines, exit_code, show_logs

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m dsbuild.cli.rank",
        description="One process of `dsbuild train` (started on every rank by torchrun).",
    )
    p.add_argument("job", nargs="?", type=Path, help="the job file (default: the built-in demo job)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a job value")
    p.add_argument("--resume", action="store_true", help="continue from the newest checkpoint that verifies")
    p.add_argument("--resume-from", metavar="TAG", help="continue from this checkpoint")
    p.add_argument("--no-terminate-on-nan", action="store_true", help="train on past a NaN or infinite loss")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Run one rank: read the job, train it; errors in the job are one line each and exit 2."""
    from torch.distributed.elastic.multiprocessing.errors import record

    # record: an exception is written where torchrun's error summary finds it (which rank, and its traceback).
    code = record(_main)(argv)
    return int(code or 0)


def _main(argv: Sequence[str] | None) -> int:
    # torchrun's agent, noted before anything slow (tokenizing, a conversion): a worker whose agent is gone stops
    # at its next step (dsbuild.session.loop), also when the agent died while this one was starting.
    os.environ.setdefault(LAUNCHER_PID, str(os.getppid()))
    _mark_sigterm()
    args = _parser().parse_args(argv)
    rank = int(os.environ.get("RANK", "0"))
    show_logs()
    try:
        job = load_job(args.job, dict(parse_set(text) for text in args.set))
        # Started again by torchrun after a failure (--max-restarts, an elastic run): go on from the newest verified
        # checkpoint, on whatever number of processes the restart has (another world size: a universal checkpoint).
        restarted = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0) > 0
        run(
            job,
            resume=args.resume or restarted,
            resume_from=None if restarted else args.resume_from,
            terminate_on_nan=not args.no_terminate_on_nan,
        )
    except DsbuildError as e:
        from torch.distributed.elastic.multiprocessing.errors import get_error_handler

        where = f"{e.source}: " if isinstance(e, ConfigError) and e.source else ""
        problems = e.problems if isinstance(e, ConfigError) else [str(e)]
        if isinstance(e, RunStopped):  # an agreed stop, not an error (dsbuild train says it too, with its outcome)
            print(f"dsbuild: rank {rank}: {escape_lines(str(e))}", file=sys.stderr)
        for problem in problems if not isinstance(e, RunStopped) else ():
            error(f"rank {rank}: {escape(where)}{escape_lines(str(problem))}")
        get_error_handler().record_exception(e)  # torchrun's summary names this rank and the error
        if isinstance(e, RunStopped):
            return RunStopped.EXIT_CODE
        _record_failure(e, [f"{where}{problem}" for problem in problems])
        return exit_code(e)
    finally:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
    return 0


def _record_failure(e: BaseException, said: list[str]) -> None:
    """What this rank's log keeps of a failure (the whole traceback, causes included: a user's reward function's own
    frames), and what ``dsbuild train`` shows of it (``FAILURE_FILE`` beside torchrun's error file: what was said and
    the frames in the user's own files), so the terminal gets one account of the failure instead of every rank's."""
    print(full_traceback(e), file=sys.stderr, end="", flush=True)
    error_file = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not error_file:
        return
    account = {"said": said, "frames": user_frames(e)}
    with contextlib.suppress(OSError):
        write_atomic(Path(error_file).parent / FAILURE_FILE, json.dumps(account), durable=False)


def _mark_sigterm() -> None:
    """A SIGTERM that ends this rank outside ``fit``'s agreed stop (torchrun stopping the ranks left once one has
    ended, maybe while this one is still recording its own error) leaves a mark beside its error file, so the failure
    report does not take it for the rank that was lost; then the signal ends the process as it would have. ``fit``
    handles SIGTERM itself while it trains, and puts this handler back after."""
    error_file = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not error_file:
        return
    mark = Path(error_file).parent / STOPPED_MARK
    owner = os.getpid()

    def note(number: int, frame: Any) -> None:
        if os.getpid() == owner:  # not a forked child (a data-loading worker)
            with contextlib.suppress(OSError):
                mark.write_text("SIGTERM\n", encoding="utf-8")
        signal.signal(number, signal.SIG_DFL)
        os.kill(os.getpid(), number)

    signal.signal(signal.SIGTERM, note)


def ray_worker(config: dict[str, Any]) -> None:
    """One rank of ``dsbuild train --backend ray``, on a Ray Train worker: the job's run (``run.run``, as ``main``
    runs it under torchrun) with Ray's hooks (``dsbuild.run.ray_train.run_worker``). An error propagates to Ray, which
    restarts the group (``launch.max_failures``) or gives the run up and shows it."""
    from ..run.ray_train import run_worker

    show_logs()
    run_worker(config)


if __name__ == "__main__":
    # Without the interpreter's finalization, where C++ threads left by gloo or DeepSpeed's ops can abort it ("terminate
    # called without an active exception", seen once after a model was saved), which torchrun would report as a failure.
    end_process(main(), wait_for_threads=True)
