"""``dsbuild train``: check a job, then run it here (one process) or through torchrun (several, or nodes)."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import OutputDirError, RunStopped
from .args import Commands, node_count, non_negative_int, port_number, positive_int
from .output import error, escape_lines, out, plural, said, warning

if TYPE_CHECKING:
    pass

__all__ = ["add_train"]


def _guard(folder: Path, *, resume: bool, overwrite: bool) -> None:
    """Refuse to write over an earlier run without --resume or --overwrite; with --overwrite, move it aside."""
    from ..outputs import run_folder

    earlier = run_folder.earlier_run(folder)
    if earlier is None or resume:
        return
    if not overwrite:
        raise OutputDirError(
            f"{folder} holds an earlier run ({earlier}); nothing was changed. Pass --resume to continue it, "
            "--overwrite to start over (the earlier run is moved aside, not deleted), or set training.output_dir"
        )
    moved = run_folder.move_aside(folder)
    out(f"moved the earlier run in {folder} to {moved} (delete it when you no longer need it)")


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
        "--no-terminate-on-nan", action="store_true", help="train on past a NaN or infinite loss (default: stop there)"
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
    p.set_defaults(handler=_train)


def _train(args: argparse.Namespace) -> int:
    import attrs

    from ..env.extras import require
    from ..job import demo_job_path, load_job
    from ..outputs import run_folder
    from ..run import launch
    from ..run import worker as run
    from .common import job_sets

    require("dsbuild train")  # before anything is read: a config-only install says which pip install trains
    if args.backend == "ray":
        require("dsbuild train --backend ray", "ray", extra="ray")
    path = Path(args.job) if args.job is not None else demo_job_path()
    job = load_job(args.job, job_sets(args.set))
    # The ranks write where this job resolved its output folder, whatever folder they start in.
    worker_sets = [*args.set, f"training.output_dir={json.dumps(str(job.output_dir))}"]
    backend = args.backend or job.launch.backend
    min_nodes, most_nodes = args.nnodes if args.nnodes is not None else (None, None)
    elastic = min_nodes is not None and min_nodes != most_nodes
    if backend == "ray":
        require("dsbuild train --backend ray", "ray", extra="ray")
        if args.resume_from is not None:
            error("--resume-from: not with the Ray backend, which resumes from Ray's latest checkpoint: pass --resume")
            return 2
        checkpoint = job.config.checkpoint
        if job.training.save_on_each_node or (checkpoint is not None and checkpoint.use_node_local_storage is True):
            error(
                f"{path}: training.save_on_each_node: not with the Ray backend yet (each node's manifest would meet "
                "the others' in Ray's merged checkpoint): put output_dir on a shared filesystem (docs/ray.md)"
            )
            return 2
        # Ray places the workers: one driver for the whole run, no node of its own to name.
        placed = [f for f, given in (("--node-rank", args.node_rank), ("--master-addr", args.master_addr),
                                     ("--master-port", args.master_port)) if given is not None]  # fmt: skip
        if placed:
            error(f"{', '.join(placed)}: not with the Ray backend, which places the workers on the cluster itself")
            return 2
        if elastic or args.max_restarts is not None:
            error(
                f"{'--nnodes MIN:MAX' if elastic else '--max-restarts'}: not with the Ray backend, which restarts its "
                "workers itself (launch.max_failures, docs/ray.md)"
            )
            return 2
    elif args.ray_address is not None:
        error('--ray-address: only with --backend ray (or launch.backend = "ray" in the job)')
        return 2
    nproc = args.nproc_per_node or job.launch.nproc_per_node
    if elastic:
        refused = _elastic_refusals(args, job)
        if refused:
            error(f"--nnodes {min_nodes}:{most_nodes}: {refused}")
            return 2
    if backend == "ray":
        nodes = launch.Nodes(nproc, most_nodes or job.launch.nnodes)
    else:
        # Flags first, then the Slurm job this runs in, then the job file (docs/jobs.md, "Slurm").
        nodes = launch.nodes(
            nproc,
            os.environ,
            nnodes=most_nodes,
            node_rank=0 if elastic else args.node_rank,  # elastic: the rendezvous numbers the nodes
            master_addr=args.master_addr,
            master_port=args.master_port,
            job_nnodes=job.launch.nnodes,
        )
        restarts = args.max_restarts if args.max_restarts is not None else (3 if elastic else 0)
        nodes = attrs.evolve(nodes, max_restarts=restarts)
        if elastic:
            nodes = attrs.evolve(
                nodes,
                min_nodes=min_nodes,
                run_id=_run_id(
                    job.output_dir, f"{nodes.master_addr}:{nodes.master_port or launch.DEFAULT_MASTER_PORT}"
                ),
                origin=f"elastic: {min_nodes} to {most_nodes} nodes, rendezvous at {nodes.master_addr}:"
                f"{nodes.master_port or launch.DEFAULT_MASTER_PORT}, up to {restarts} restart(s)",
            )
    nnodes, node_rank = nodes.nnodes, nodes.node_rank
    for text in nodes.warnings:
        warning(text)
    if job.launch.device_mapping is not None and len(job.launch.device_mapping) != nproc * nnodes:
        if args.nproc_per_node is None:
            error(
                f"{path}: launch.device_mapping lists {len(job.launch.device_mapping)} devices for "
                f"{nnodes} node(s) x {nproc} process(es)"
            )
            return 2
        # The option overrides the job's mapping (docs/jobs.md): each node uses its first devices.
        warning(
            f"--nproc-per-node {nproc} overrides launch.device_mapping ({len(job.launch.device_mapping)} devices): "
            f"each node uses its first {nproc} device(s)"
        )
        job = attrs.evolve(job, launch=attrs.evolve(job.launch, device_mapping=None, nproc_per_node=nproc))

    # Everything validate checks, before any process starts; the data is tokenized on the way (and kept).
    from ..run.checks import launch_checks

    found, data = launch_checks(job, world_size=nproc * nnodes)
    errors = [d for d in found if d.severity == "error"]
    for d in found:
        if d.severity == "warning":
            warning(f"{path}: {said(d)}")
    if errors:
        for d in errors:
            error(f"{path}: {said(d)}")
        error(f"not started: {plural(len(errors), 'error')}")
        return 1
    resume = args.resume or args.resume_from is not None
    if backend == "ray" and job.launch.storage_path is not None and not resume:
        from ..run import ray_train

        ray_train.refuse_earlier_run(job)  # before anything is written (the default storage is guarded below)
    owner = node_rank == 0 or elastic  # elastic: every node's launcher (none is node 0 for sure)
    if owner:
        try:
            job.output_dir.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            why = "it is a file, not a folder" if job.output_dir.is_file() else e.strerror or str(e)
            error(f"{path}: training.output_dir: cannot use {str(job.output_dir)!r}: {why}")
            return 2
    # Node 0 owns the output folder: it holds the lock for the whole run and guards an earlier run's files. In an
    # elastic run every node's launcher shares the lock, and the first guards the folder.
    holding = run_folder.lock(job.output_dir, elastic=nodes.run_id if elastic else None)
    with holding if owner else contextlib.nullcontext(enter_result=False) as first:
        if first:
            _guard(job.output_dir, resume=resume, overwrite=args.overwrite)
        env = launch.device_env(job, node_rank, nnodes)
        if nodes.origin:
            print(f"dsbuild: {escape_lines(nodes.origin)}", file=sys.stderr)
        if backend == "ray":
            from ..run import ray_train
            from .rank import ray_worker

            code, report = ray_train.train(
                job,
                path,
                ray_worker,
                workers=nproc * nnodes,
                address=args.ray_address,
                sets=job_sets(worker_sets),
                resume=args.resume,
                terminate_on_nan=not args.no_terminate_on_nan,
            )
            _report(code, report)
            if code != 0:
                return code
        elif nproc * nnodes == 1 and nodes.master_port is None:
            os.environ.update(env)
            try:
                run.run(
                    job,
                    resume=args.resume,
                    resume_from=args.resume_from,
                    terminate_on_nan=not args.no_terminate_on_nan,
                    data=data,
                )
            except RunStopped:
                if args.requeue:
                    _requeue()
                raise
            except KeyboardInterrupt:  # a second Ctrl-C: stopped at once, wherever it was
                print(f"dsbuild: {escape_lines(_interrupted(job.output_dir))}", file=sys.stderr)
                return 130
        else:
            run_args = [f"--set={text}" for text in worker_sets]
            # An elastic run's workers start again whenever a node leaves or joins (torchrun counts only failures as
            # restarts): every start resumes, from step 0 when there is no checkpoint yet (the folder was guarded).
            run_args += ["--resume"] if args.resume or nodes.elastic else []
            run_args += [f"--resume-from={args.resume_from}"] if args.resume_from else []
            run_args += ["--no-terminate-on-nan"] if args.no_terminate_on_nan else []
            code, report = launch.torchrun(job, path, nodes, run_args, env)
            _report(code, report)
            if code == RunStopped.EXIT_CODE and args.requeue and first:
                _requeue()
            if code != 0:
                return code
    if owner:
        for line in run.summary_lines(job):
            out(line)
    else:
        out(f"node {node_rank}: done; node 0 has the outputs in {job.output_dir}")
    return 0


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


def _elastic_refusals(args: argparse.Namespace, job: Any) -> str | None:
    """Why an elastic run (``--nnodes MIN:MAX``) cannot run as asked, or ``None``."""
    checkpoint = job.config.checkpoint
    if args.node_rank is not None:
        return "the rendezvous numbers the nodes: leave out --node-rank"
    if args.master_addr is None:
        return "give --master-addr (and --master-port): the host of the rendezvous, on a node that stays up"
    if args.resume_from is not None:
        return "--resume-from: not with an elastic run, whose every start resumes from the newest verified checkpoint"
    if job.launch.device_mapping is not None:
        return "launch.device_mapping names devices by node rank, which the rendezvous gives: use --nproc-per-node"
    if job.training.save_on_each_node or (checkpoint is not None and checkpoint.use_node_local_storage is True):
        return (
            "training.save_on_each_node: a restart resumes on whichever nodes are left, so the checkpoints must be on "
            "a filesystem every node shares"
        )
    return None


def _run_id(folder: Path, endpoint: str) -> str:
    """An elastic run's rendezvous id: the same on every node of one run (its output folder and rendezvous), another
    for another (a second elastic run on the folder is kept out by the lock, not joined)."""
    import hashlib

    return "dsbuild-" + hashlib.sha256(f"{folder.resolve()}\n{endpoint}".encode()).hexdigest()[:12]


def _report(code: int, lines: list[str]) -> None:
    """What the launcher said, on stderr: an error unless the run trained or was stopped by a signal (75, or 128 +
    the signal); a line that starts with a space continues the one before it."""
    say = "" if code in (0, RunStopped.EXIT_CODE) or code > 128 else "error: "
    for line in lines:
        print(escape_lines(line) if line.startswith(" ") else f"dsbuild: {say}{escape_lines(line)}", file=sys.stderr)


def _requeue() -> None:
    """``scontrol requeue`` the Slurm job this runs in, once; what happened is said on stderr."""
    from ..run import slurm

    target = slurm.requeue_target(os.environ)
    if target is None:
        warning("--requeue: not in a Slurm job (no SLURM_JOB_ID): nothing requeued")
        return
    command = ["scontrol", "requeue", target]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        error(f"--requeue: {' '.join(command)} failed: {e}; requeue the job yourself (the checkpoint is saved)")
        return
    if done.returncode != 0:
        why = escape_lines(done.stderr.strip() or f"exit {done.returncode}")
        error(f"--requeue: {' '.join(command)} failed: {why}; requeue the job yourself (the checkpoint is saved)")
        return
    print(f"dsbuild: requeued Slurm job {target} ({' '.join(command)}); it resumes with --resume", file=sys.stderr)
