"""``dsbuild train``: check a job, then run it here (one process) or through torchrun (several, or nodes)."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ..errors import ConfigError, DsbuildError, FunctionError, NonFiniteLossError, RunStopped
from .args import Commands, node_count, non_negative_int, port_number, positive_int
from .output import error, escape_lines, exit_code, frames, out, plural, report, said, warning

__all__ = ["add_train"]


def add_train(commands: Commands) -> None:
    p = commands.add_parser(
        "train",
        help="run a job file (without one: the built-in demo job)",
        description=(
            "Train the model of a job file with DeepSpeed: in this process for one process, through torchrun for "
            "several processes or nodes. Without JOB, runs the built-in demo (a tiny Llama learning arithmetic, "
            "a few minutes on a CPU). Every relative path in the job is relative to the job file. Exit 0: trained; "
            "1: the job fails its checks, a rank failed or the loss became NaN; 2: the job or its output folder "
            "cannot be used; 75: stopped by a signal after saving this stop's checkpoint (--resume continues); 130: "
            "interrupted by Ctrl-C before that checkpoint was saved (a second Ctrl-C stops at once); 128+N: stopped "
            "by signal N before it was saved."
        ),
    )
    p.add_argument("job", nargs="?", metavar="JOB", help="a job file (default: the built-in demo job)")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help='override a job value, in TOML syntax (training.max_steps=100, launch.device_mapping="0-3")',
    )
    _where_options(p)
    _again_options(p)
    p.set_defaults(handler=_train)


def _where_options(p: argparse.ArgumentParser) -> None:
    """Where the processes run: per node, nodes, this node's place, the backend."""
    p.add_argument("--nproc-per-node", type=positive_int, metavar="N", help="processes per node (default: the job's)")
    p.add_argument(
        "--nnodes",
        type=node_count,
        metavar="N|MIN:MAX",
        help="nodes (default: the Slurm job's, else the job's); MIN:MAX: an elastic run, whose nodes meet at "
        '--master-addr:--master-port and which goes on with as few as MIN (docs/jobs.md, "Elastic runs")',
    )
    p.add_argument(
        "--max-restarts",
        type=non_negative_int,
        metavar="N",
        help="torchrun's: start the workers again up to N times after a failure, each time resuming from the newest "
        "verified checkpoint (default 0; 3 with --nnodes MIN:MAX)",
    )
    p.add_argument(
        "--node-rank", type=non_negative_int, metavar="R", help="this node's rank, with --nnodes (Slurm: SLURM_NODEID)"
    )
    p.add_argument(
        "--master-addr", metavar="ADDR", help="the address of node 0, with --nnodes (Slurm: the node list's first host)"
    )
    p.add_argument(
        "--master-port",
        type=port_number,
        metavar="PORT",
        help="a free port on node 0 (default 29500; in a Slurm job MASTER_PORT, else one from SLURM_JOB_ID)",
    )
    p.add_argument(
        "--backend",
        choices=("torchrun", "ray"),
        help="what starts the processes: torchrun (default), or Ray Train's workers on a Ray cluster (docs/ray.md; "
        "default: the job's launch.backend)",
    )
    p.add_argument(
        "--ray-address",
        metavar="ADDR",
        help="with --backend ray: the Ray cluster to run on (default: RAY_ADDRESS, else a local cluster started here)",
    )


def _again_options(p: argparse.ArgumentParser) -> None:
    """An earlier run in the output folder, a stop, a NaN."""
    again = p.add_mutually_exclusive_group()
    again.add_argument(
        "--resume",
        action="store_true",
        help="continue the run in output_dir from its newest checkpoint that verifies (a damaged one is skipped)",
    )
    again.add_argument("--resume-from", metavar="TAG", help="continue from this checkpoint (see dsbuild checkpoints)")
    again.add_argument(
        "--overwrite",
        action="store_true",
        help="start over in an output_dir that holds an earlier run: its files are moved aside first, not deleted",
    )
    p.add_argument(
        "--no-terminate-on-nan",
        dest="terminate_on_nan",
        action="store_false",
        help="train on past a NaN or infinite loss (default: stop there)",
    )
    p.add_argument(
        "--requeue",
        action="store_true",
        help=(
            "in a Slurm job: when a signal stops the run (exit 75, a verified checkpoint saved), put the job back in "
            "the queue once (scontrol requeue; a job array's task by its ARRAYJOB_TASK id); with --resume the same "
            "sbatch script serves the first run and every requeue"
        ),
    )


def _train(args: argparse.Namespace) -> int:
    """Parse, plan, start, print: every decision is the plan's (``dsbuild.run.start``)."""
    from ..env.extras import require
    from ..run import start
    from ..run.worker import summary_lines

    require("dsbuild train")  # before anything is read: a config-only install says which pip install trains
    options = start.options_of(vars(args), args.set)
    plan = start.LaunchPlan.of(args.job, options)
    for text in plan.warnings:
        warning(text)
    if plan.problems:
        for d in plan.problems:
            error(f"{plan.path}: {said(d)}")
        error(f"not started: {plural(len(plan.problems), 'error')}")
        return 1
    try:
        outcome = start.start(plan, ray_worker=_ray_worker() if plan.backend == "ray" else None)
    except KeyboardInterrupt:  # a second Ctrl-C in this process: stopped at once, wherever it was
        print(f"dsbuild: {escape_lines(_interrupted(plan.job.output_dir))}", file=sys.stderr)
        return 130
    except RunStopped as e:  # in this process: how it stopped, then the requeue (the order a reader expects)
        print(f"dsbuild: {escape_lines(str(e))}", file=sys.stderr)
        if options.requeue:
            start.requeue()
        return RunStopped.EXIT_CODE
    except (FunctionError, NonFiniteLossError, ConfigError) as e:  # the run failed in this process (one rank)
        _failed_here(e, plan.job.output_dir)
        return exit_code(e)
    _report(outcome.code, outcome.lines)
    if outcome.requeue:
        start.requeue()
    if outcome.code != 0:
        return outcome.code
    if plan.owner:
        for line in summary_lines(plan.job):
            out(line)
    else:
        out(f"node {plan.nodes.node_rank}: done; node 0 has the outputs in {plan.job.output_dir}")
    return 0


def _failed_here(e: DsbuildError, output_dir: Path) -> None:
    """A run of this process that failed, said as a torchrun run's is: the error, the frames of the user's code
    (a reward function's line), and where the whole traceback is (appended to the run's ``logs/failure.log``)."""
    from .._util.frames import full_traceback
    from ..outputs.run_folder import RunFolder

    report(e)
    frames(e)
    log = RunFolder(output_dir).failure_log
    if not output_dir.is_dir():
        return  # refused before the run made its folder: nothing ran, and no folder is made for a log
    try:
        log.parent.mkdir(exist_ok=True)
        with log.open("a", encoding="utf-8") as f:
            f.write(f"== {time.strftime('%Y-%m-%d %H:%M:%S')}\n{full_traceback(e)}")
    except OSError:
        return  # the error was said; a log that cannot be written is not a second failure
    print(f"  the whole traceback: {escape_lines(str(log))}", file=sys.stderr)


def _ray_worker() -> Callable[[dict[str, Any]], None]:
    """What each Ray worker runs; its module imports the Session (torch), which only a Ray run's launcher needs."""
    from .rank import ray_worker

    return ray_worker


def _interrupted(output_dir: Path) -> str:
    """What a second Ctrl-C left: the last verified checkpoint, or none."""
    from ..outputs.manifest import last_complete
    from ..outputs.run_folder import RunFolder

    checkpoints = RunFolder(output_dir).checkpoints
    saved = last_complete(checkpoints)
    if saved is None:
        return "interrupted: a second Ctrl-C stopped the run at once; no checkpoint was saved"
    return (
        f"interrupted: a second Ctrl-C stopped the run at once; checkpoint {checkpoints / saved} is the last verified "
        "one: --resume continues from it"
    )


def _report(code: int, lines: Sequence[str]) -> None:
    """What the launcher said, on stderr: an error unless the run trained or was stopped by a signal (75, or 128 +
    the signal); a line that starts with a space continues the one before it."""
    say = "" if code in (0, RunStopped.EXIT_CODE) or code > 128 else "error: "
    for line in lines:
        print(escape_lines(line) if line.startswith(" ") else f"dsbuild: {say}{escape_lines(line)}", file=sys.stderr)
