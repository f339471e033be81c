"""A run of a job, as ``dsbuild train`` (and the Python API) starts it: ``LaunchPlan.of(job, options)`` makes every
decision before anything starts — the backend (here, torchrun or Ray), this node's place among the nodes (flags, then
Slurm, then the job), an elastic run, the device mapping, what the ranks are handed, and every problem the job has
(``launch_checks``: what ``dsbuild validate`` checks) — and ``start(plan)`` runs it: the output folder made, locked and
guarded (an earlier run is never written over without ``resume`` or ``overwrite``), then one process here, torchrun's
processes or Ray's workers.

Nothing here prints: what is worth telling goes to the ``dsbuild`` logger (the CLI shows it) or comes back in an
``Outcome``. Options that cannot be used together are a ``ConfigError`` (usage: exit 2); a job that fails its checks
is a plan with ``problems`` (exit 1); an output folder that cannot be used, an ``OutputDirError``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final

import attrs

from .._util.overrides import parse_set
from ..env.extras import require
from ..errors import ConfigError, OutputDirError, Problem, RunStopped
from ..job import Job, demo_job_path, load_job
from ..outputs import run_folder
from ..validate import Diagnostic
from . import launch, slurm

__all__ = ["LaunchOptions", "LaunchPlan", "Outcome", "options_of", "requeue", "start"]

logger = logging.getLogger("dsbuild")


@attrs.frozen
class LaunchOptions:
    """What the command line (or a caller) asks of a run, beside the job file; ``dsbuild train``'s flags."""

    sets: tuple[str, ...] = ()
    """``--set KEY=VALUE`` overrides of the job, in TOML syntax, in order."""
    nproc_per_node: int | None = None
    nnodes: tuple[int, int] | None = None
    """``(min, max)`` nodes: an elastic run when they differ."""
    max_restarts: int | None = None
    node_rank: int | None = None
    master_addr: str | None = None
    master_port: int | None = None
    resume: bool = False
    resume_from: str | None = None
    overwrite: bool = False
    terminate_on_nan: bool = True
    requeue: bool = False
    backend: str | None = None
    """``"torchrun"`` or ``"ray"``; default the job's ``launch.backend``."""
    ray_address: str | None = None

    @property
    def elastic(self) -> bool:
        return self.nnodes is not None and self.nnodes[0] != self.nnodes[1]

    @property
    def resuming(self) -> bool:
        return self.resume or self.resume_from is not None


@attrs.frozen
class LaunchPlan:
    """A run decided: the job, where and how it runs, what its ranks are handed, and the problems that stop it."""

    job: Job
    path: Path
    """The job file (the packaged demo's without one)."""
    options: LaunchOptions
    backend: str
    """``"here"`` (one process, this one), ``"torchrun"`` or ``"ray"``."""
    nodes: launch.Nodes
    rank_sets: tuple[str, ...]
    """The ``--set`` values the ranks get: the command's, and the output folder as this process resolved it."""
    warnings: tuple[str, ...] = ()
    problems: tuple[Diagnostic, ...] = ()
    """What fails the job's checks (``launch_checks``): the run does not start (exit 1)."""
    data: Any = None
    """The job's data, tokenized by the checks (``run.worker.Datasets``), for a run in this process."""

    @classmethod
    def of(cls, job: str | Path | None, options: LaunchOptions) -> LaunchPlan:
        """The plan for the job file ``job`` (``None``: the packaged demo) with ``options``; ``ConfigError`` for options
        that cannot be used together (usage: exit 2) and for a job that cannot be read."""
        path = Path(job) if job is not None else demo_job_path()
        if "pyarrow" not in sys.modules:
            # The data a run tokenizes is allocated with the C library's malloc, in this process and the ranks (they
            # inherit it), unless the variable is set: pyarrow's own pool (jemalloc) keeps the pages it once used for
            # the whole run, about 4 MiB of a tiny job's peak (benchmarks/README.md, start-up).
            os.environ.setdefault("ARROW_DEFAULT_MEMORY_POOL", "system")
        if options.backend == "ray":  # before the job is read: the install to fix first
            require("dsbuild train --backend ray", "ray", extra="ray")
        loaded = load_job(job, dict(parse_set(text) for text in options.sets))
        backend = options.backend or loaded.launch.backend
        _refuse_usage(loaded, path, options, backend)
        nodes, warnings = _nodes(loaded, options, backend)
        nproc, total = nodes.nproc, nodes.nproc * nodes.nnodes
        mapping = loaded.launch.device_mapping
        if mapping is not None and len(mapping) != total:
            if options.nproc_per_node is None:
                message = f"lists {len(mapping)} devices for {nodes.nnodes} node(s) x {nproc} process(es)"
                raise ConfigError(Problem("launch.device_mapping", message), source=str(path))
            # The option overrides the job's mapping (docs/jobs.md): each node uses its first devices.
            warnings.append(
                f"--nproc-per-node {nproc} overrides launch.device_mapping ({len(mapping)} devices): each node uses "
                f"its first {nproc} device(s)"
            )
            launched = attrs.evolve(loaded.launch, device_mapping=None, nproc_per_node=nproc)
            loaded = attrs.evolve(loaded, launch=launched)
        from .checks import launch_checks

        found, data = launch_checks(loaded, world_size=total)  # what validate checks, before any process starts
        warnings += [f"{path}: {d}" for d in found if d.severity == "warning"]
        if backend != "ray":
            backend = "here" if total == 1 and nodes.master_port is None else "torchrun"
        # The ranks write where this job resolved its output folder, whatever folder they start in.
        ranked = (*options.sets, f"training.output_dir={json.dumps(str(loaded.output_dir))}")
        return cls(
            job=loaded, path=path, options=options, backend=backend, nodes=nodes, rank_sets=ranked,
            warnings=tuple(warnings), problems=tuple(d for d in found if d.severity == "error"), data=data,
        )  # fmt: skip

    @property
    def owner(self) -> bool:
        """Whether this launcher owns the output folder: node 0's, or every node's of an elastic run."""
        return self.nodes.node_rank == 0 or self.options.elastic


@attrs.frozen
class Outcome:
    """How a run ended: the exit code, and what the launcher said (a line starting with a space continues the one
    before it)."""

    code: int
    lines: tuple[str, ...] = ()
    requeue: bool = False
    """Whether the Slurm job is to be requeued (``requeue()``): stopped by a signal, with ``--requeue``."""


def start(plan: LaunchPlan, *, ray_worker: Callable[[dict[str, Any]], None] | None = None) -> Outcome:
    """Run ``plan``: the output folder made, locked for the run and guarded against writing over an earlier run, then
    the ranks started. ``OutputDirError`` when the folder cannot be used; a run that a signal stops in this process
    raises ``RunStopped``. With ``requeue``, the caller requeues a stopped run's Slurm job (``requeue``) once it has
    said how the run stopped: ``Outcome.requeue`` says whether it is due. ``ray_worker``: what each Ray worker runs
    (default ``ray_train.run_worker``; the CLI's sets up its log lines first)."""
    job, options = plan.job, plan.options
    if plan.backend == "ray" and job.launch.storage_path is not None and not options.resuming:
        from . import ray_train

        ray_train.refuse_earlier_run(job)  # before anything is written (the default storage is guarded below)
    if plan.owner:
        _make_folder(job, plan.path)
    holding = run_folder.lock(job.output_dir, elastic=plan.nodes.run_id if options.elastic else None)
    with holding if plan.owner else contextlib.nullcontext(enter_result=False) as first:
        if first:
            _guard(job.output_dir, resume=options.resuming, overwrite=options.overwrite)
        if plan.nodes.origin:
            logger.info("%s", plan.nodes.origin)
        outcome = _run(plan, ray_worker)
    return attrs.evolve(outcome, requeue=outcome.code == RunStopped.EXIT_CODE and options.requeue and bool(first))


def _run(plan: LaunchPlan, ray_worker: Callable[[dict[str, Any]], None] | None) -> Outcome:
    job, options = plan.job, plan.options
    env = launch.device_env(job, plan.nodes.node_rank, plan.nodes.nnodes)
    if plan.backend == "ray":
        from . import ray_train

        code, lines = ray_train.train(
            job, plan.path, ray_worker or ray_train.run_worker, workers=plan.nodes.nproc * plan.nodes.nnodes, address=options.ray_address,
            sets=dict(parse_set(text) for text in plan.rank_sets), resume=options.resume,
            terminate_on_nan=options.terminate_on_nan,
        )  # fmt: skip
        return Outcome(code, tuple(lines))
    if plan.backend == "here":
        from .worker import run

        os.environ.update(env)
        run(job, resume=options.resume, resume_from=options.resume_from,
            terminate_on_nan=options.terminate_on_nan, data=plan.data)  # fmt: skip
        return Outcome(0)
    run_args = [f"--set={text}" for text in plan.rank_sets]
    # An elastic run's workers start again whenever a node leaves or joins (torchrun counts only failures as
    # restarts): every start resumes, from step 0 when there is no checkpoint yet (the folder was guarded).
    run_args += ["--resume"] if options.resume or options.elastic else []
    run_args += [f"--resume-from={options.resume_from}"] if options.resume_from else []
    run_args += ["--no-terminate-on-nan"] if not options.terminate_on_nan else []
    code, lines = launch.torchrun(job, plan.path, plan.nodes, run_args, env)
    return Outcome(code, tuple(lines))


def _refuse_usage(job: Job, path: Path, options: LaunchOptions, backend: str) -> None:
    """``ConfigError`` for options the backend or each other rule out, all at once."""
    problems = []
    if backend == "ray":  # launch.backend = "ray" in the job
        require("dsbuild train --backend ray", "ray", extra="ray")
        if options.resume_from is not None:
            problems.append(
                "--resume-from: not with the Ray backend, which resumes from Ray's latest checkpoint: pass --resume"
            )
        checkpoint = job.config.checkpoint
        if job.training.save_on_each_node or (checkpoint is not None and checkpoint.use_node_local_storage is True):
            problems.append(
                f"{path}: training.save_on_each_node: not with the Ray backend yet (each node's manifest would meet "
                "the others' in Ray's merged checkpoint): put output_dir on a shared filesystem (docs/ray.md)"
            )
        # Ray places the workers: one driver for the whole run, no node of its own to name.
        placed = [flag for flag, given in (("--node-rank", options.node_rank), ("--master-addr", options.master_addr),
                                           ("--master-port", options.master_port)) if given is not None]  # fmt: skip
        if placed:
            problems.append(
                f"{', '.join(placed)}: not with the Ray backend, which places the workers on the cluster itself"
            )
        if options.elastic or options.max_restarts is not None:
            flag = "--nnodes MIN:MAX" if options.elastic else "--max-restarts"
            problems.append(
                f"{flag}: not with the Ray backend, which restarts its workers itself (launch.max_failures, docs/ray.md)"
            )
    elif options.ray_address is not None:
        problems.append('--ray-address: only with --backend ray (or launch.backend = "ray" in the job)')
    if options.elastic:
        refused = _elastic_refusal(job, options)
        if refused and options.nnodes is not None:
            problems.append(f"--nnodes {options.nnodes[0]}:{options.nnodes[1]}: {refused}")
    if problems:  # usage, not the job's values: exit 2
        raise ConfigError([Problem("", text) for text in problems])


def _elastic_refusal(job: Job, options: LaunchOptions) -> str | None:
    """Why an elastic run (``--nnodes MIN:MAX``) cannot run as asked, or ``None``."""
    checkpoint = job.config.checkpoint
    if options.node_rank is not None:
        return "the rendezvous numbers the nodes: leave out --node-rank"
    if options.master_addr is None:
        return "give --master-addr (and --master-port): the host of the rendezvous, on a node that stays up"
    if options.resume_from is not None:
        return "--resume-from: not with an elastic run, whose every start resumes from the newest verified checkpoint"
    if job.launch.device_mapping is not None:
        return "launch.device_mapping names devices by node rank, which the rendezvous gives: use --nproc-per-node"
    if job.training.save_on_each_node or (checkpoint is not None and checkpoint.use_node_local_storage is True):
        return (
            "training.save_on_each_node: a restart resumes on whichever nodes are left, so the checkpoints must be on "
            "a filesystem every node shares"
        )
    return None


def _nodes(job: Job, options: LaunchOptions, backend: str) -> tuple[launch.Nodes, list[str]]:
    """This node's place in the run, and the warnings that came with it."""
    nproc = options.nproc_per_node or job.launch.nproc_per_node
    least, most = options.nnodes if options.nnodes is not None else (None, None)
    if backend == "ray":
        return launch.Nodes(nproc, most or job.launch.nnodes), []
    # Flags first, then the Slurm job this runs in, then the job file (docs/jobs.md, "Slurm").
    nodes = launch.nodes(
        nproc, os.environ, nnodes=most, node_rank=0 if options.elastic else options.node_rank,  # elastic: the
        master_addr=options.master_addr, master_port=options.master_port, job_nnodes=job.launch.nnodes,  # rendezvous
    )  # fmt: skip
    restarts = options.max_restarts if options.max_restarts is not None else (3 if options.elastic else 0)
    nodes = attrs.evolve(nodes, max_restarts=restarts)
    if options.elastic:
        endpoint = f"{nodes.master_addr}:{nodes.master_port or launch.DEFAULT_MASTER_PORT}"
        nodes = attrs.evolve(
            nodes, min_nodes=least, run_id=_run_id(job.output_dir, endpoint),
            origin=f"elastic: {least} to {most} nodes, rendezvous at {endpoint}, up to {restarts} restart(s)",
        )  # fmt: skip
    return nodes, list(nodes.warnings)


def _run_id(folder: Path, endpoint: str) -> str:
    """An elastic run's rendezvous id: the same on every node of one run (its output folder and rendezvous), another
    for another (a second elastic run on the folder is kept out by the lock, not joined)."""
    return "dsbuild-" + hashlib.sha256(f"{folder.resolve()}\n{endpoint}".encode()).hexdigest()[:12]


def _make_folder(job: Job, path: Path) -> None:
    try:
        job.output_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        why = "it is a file, not a folder" if job.output_dir.is_file() else e.strerror or str(e)
        raise OutputDirError(f"{path}: training.output_dir: cannot use {str(job.output_dir)!r}: {why}") from None


def _guard(folder: Path, *, resume: bool, overwrite: bool) -> None:
    """Refuse to write over an earlier run without ``resume`` or ``overwrite``; with ``overwrite``, move it aside."""
    earlier = run_folder.earlier_run(folder)
    if earlier is None or resume:
        return
    if not overwrite:
        raise OutputDirError(
            f"{folder} holds an earlier run ({earlier}); nothing was changed. Pass --resume to continue it, "
            "--overwrite to start over (the earlier run is moved aside, not deleted), or set training.output_dir"
        )
    moved = run_folder.move_aside(folder)
    logger.info("moved the earlier run in %s to %s (delete it when you no longer need it)", folder, moved)


_REQUEUE_TIMEOUT: Final = 120


def requeue() -> None:
    """``scontrol requeue`` the Slurm job this runs in, once; what happened goes to the ``dsbuild`` logger."""
    target = slurm.requeue_target(os.environ)
    if target is None:
        logger.warning("--requeue: not in a Slurm job (no SLURM_JOB_ID): nothing requeued")
        return
    command = ["scontrol", "requeue", target]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=_REQUEUE_TIMEOUT, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        logger.error(
            "--requeue: %s failed: %s; requeue the job yourself (the checkpoint is saved)", " ".join(command), e
        )
        return
    if done.returncode != 0:
        why = done.stderr.strip() or f"exit {done.returncode}"
        logger.error(
            "--requeue: %s failed: %s; requeue the job yourself (the checkpoint is saved)", " ".join(command), why
        )
        return
    logger.info("requeued Slurm job %s (%s); it resumes with --resume", target, " ".join(command))


def options_of(values: Mapping[str, Any], sets: Sequence[str]) -> LaunchOptions:
    """``LaunchOptions`` from a mapping of their names (``vars(args)`` of ``dsbuild train``'s parser)."""
    names = {a.name for a in attrs.fields(LaunchOptions)} - {"sets"}
    return LaunchOptions(sets=tuple(sets), **{k: v for k, v in values.items() if k in names})
