"""Starting the processes of a run: torchrun for several processes or nodes, and reading how a rank failed.

This module prints nothing: it returns exit codes and the lines worth showing, and the CLI prints them.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final

import attrs

from ..errors import ConfigError, RunStopped
from ..job import Job
from ..outputs.manifest import last_complete
from ..outputs.run_folder import RunFolder
from . import slurm
from .failures import failure_account, failure_report, recorded_error, stopped_by_a_signal

__all__ = [
    "DEFAULT_MASTER_PORT",
    "LOG_PREFIX",
    "Nodes",
    "device_env",
    "nodes",
    "torchrun",
    "torchrun_command",
    "torchrun_env",
]

DEFAULT_MASTER_PORT = 29500
"""Node 0's port when no flag, ``MASTER_PORT`` or Slurm job gives one (torchrun's own default)."""


def device_env(job: Job, node_rank: int, nnodes: int) -> dict[str, str]:
    """``CUDA_VISIBLE_DEVICES`` for this node from ``launch.device_mapping`` (nothing without one)."""
    gpus_per_node = None
    if job.launch.device_mapping is None:
        return {}
    if nnodes > 1 and job.launch.gpus_per_node is None:
        import torch

        gpus_per_node = torch.cuda.device_count() or None
    devices = job.launch.local_devices(node_rank, gpus_per_node)
    return {"CUDA_VISIBLE_DEVICES": ",".join(map(str, devices or ()))}


@attrs.frozen
class Nodes:
    """Where this node's processes join the run."""

    nproc: int
    nnodes: int = 1
    node_rank: int = 0
    master_addr: str | None = None
    master_port: int | None = None
    origin: str = ""
    """Where the node values came from, one line for the run's log (empty for one node)."""
    warnings: tuple[str, ...] = ()
    """What may not be what the user meant: a job's ``launch.nnodes`` that Slurm overrides, a Slurm job of
    several nodes seen from outside its tasks, a process count that differs from the node's GPUs."""
    min_nodes: int | None = None
    """An elastic run (``--nnodes MIN:MAX``): the fewest nodes it trains on (``nnodes`` the most). The nodes meet at
    torchrun's c10d rendezvous on ``master_addr:master_port``, which numbers them (``node_rank`` is not theirs to
    give); ``None``: a fixed set of nodes."""
    max_restarts: int = 0
    """torchrun's ``--max-restarts``: how often the workers are started again after a failure (each resumes)."""
    run_id: str = "dsbuild"
    """The rendezvous id of an elastic run: the same on every node of one run, another for another run."""

    @property
    def elastic(self) -> bool:
        return self.min_nodes is not None

    @property
    def log_name(self) -> str:
        """This node's folder under ``logs/torchrun``: its rank, or, elastic, its host and launcher process."""
        return f"{socket.gethostname()}-{os.getpid()}" if self.elastic else f"node{self.node_rank}"


def nodes(
    nproc: int,
    env: Mapping[str, str],
    *,
    nnodes: int | None = None,
    node_rank: int | None = None,
    master_addr: str | None = None,
    master_port: int | None = None,
    job_nnodes: int = 1,
) -> Nodes:
    """This node's place in the run: each value from the first that gives it, of the command's flag (the
    keyword arguments), the Slurm job ``env`` shows (``dsbuild.run.slurm.allocation``), and the job file
    (``launch.nnodes``; one node). ``env`` is read only where a flag leaves a node value open, so the three
    flags together run the same inside a Slurm job as outside. Several nodes without a node rank and node
    0's address, or a node rank out of range, are a ``ConfigError``; a Slurm environment that contradicts
    itself an ``InvalidValueError`` naming the variable.
    """
    warnings = []
    slurm_job = None
    if nnodes is None or (nnodes > 1 and (node_rank is None or master_addr is None)):
        slurm_job = slurm.allocation(env)
        note = slurm.unplaced(env) if slurm_job is None else None
        warnings += [note] if note else []
    from_slurm = nnodes is None and slurm_job is not None
    count, count_from = _node_count(nnodes, slurm_job, job_nnodes, warnings)
    if slurm_job is not None and slurm_job.gpus_on_node and slurm_job.gpus_on_node != nproc:
        warnings.append(
            f"Slurm gave this node {slurm_job.gpus_on_node} GPU(s) (SLURM_GPUS_ON_NODE), and the run starts {nproc} "
            f"process(es) on it: pass --nproc-per-node {slurm_job.gpus_on_node} or set launch.nproc_per_node to use them all"
        )
    if count == 1:
        if node_rank:
            raise ConfigError(f"--node-rank {node_rank}: expected 0 to 0 for 1 nodes")
        return Nodes(nproc, 1, 0, master_addr, master_port, warnings=tuple(warnings))

    (rank, rank_from), (addr, addr_from), (port, port_from) = _place(node_rank, master_addr, master_port, slurm_job)
    first_host = f"the first host of {slurm_job.hosts_from}" if slurm_job is not None else ""
    if rank is None or addr is None:
        raise ConfigError(
            f"{count} nodes: give each node's launch --node-rank R and --master-addr of node 0 (and --master-port), "
            "or start it on every node with srun inside a Slurm job"
        )
    if rank >= count:
        raise ConfigError(f"{rank_from} {rank}: expected 0 to {count - 1} for {count} nodes")
    if from_slurm and slurm_job is not None and not slurm_job.in_step:
        warnings.append(
            f"the Slurm job has {count} nodes, but this runs outside an srun step (SLURM_STEP_NODELIST is not set), "
            "as a batch script does: only this node starts; start it on every node with `srun dsbuild train ...`"
        )

    # Say only where a value came from somewhere else than the node count did.
    usual = (
        ("SLURM_NODEID", first_host, "SLURM_JOB_ID")
        if from_slurm
        else ("--node-rank", "--master-addr", "--master-port", "default")
    )
    odd = [
        f"{what} from {source}"
        for what, source in (("node rank", rank_from), ("master address", addr_from), ("port", port_from))
        if source not in usual
    ]
    origin = f"{count} nodes from {count_from}, node rank {rank}, master {addr}:{port or DEFAULT_MASTER_PORT}"
    origin += f"; {', '.join(odd)}" if odd else ""
    return Nodes(nproc, count, rank, addr, port, origin, tuple(warnings))


def _node_count(nnodes: int | None, slurm_job: Any, job_nnodes: int, warnings: list[str]) -> tuple[int, str]:
    """The run's nodes and where that came from: the flag, else the Slurm job, else the job file."""
    if nnodes is not None:
        return nnodes, "--nnodes"
    if slurm_job is None:
        return job_nnodes, "the job's launch.nnodes"
    count = int(slurm_job.nnodes)
    if job_nnodes not in (1, count):
        warnings.append(
            f"the job's launch.nnodes is {job_nnodes}, but the Slurm job has {count} node(s): using {count}"
        )
    return count, f"Slurm ({slurm_job.hosts_from} {slurm_job.hosts.text})"


def _place(
    node_rank: int | None, master_addr: str | None, master_port: int | None, slurm_job: Any
) -> tuple[tuple[int | None, str], tuple[str | None, str], tuple[int | None, str]]:
    """This node's rank, node 0's address and port, each with where it came from: a flag, else the Slurm job."""
    if node_rank is not None or slurm_job is None:
        rank: tuple[int | None, str] = (node_rank, "--node-rank")
    else:
        rank = (slurm_job.node_rank, "SLURM_NODEID")
    if master_addr is not None or slurm_job is None:
        addr: tuple[str | None, str] = (master_addr, "--master-addr")
    else:
        first_host = f"the first host of {slurm_job.hosts_from}"
        same = slurm_job.master_addr_from == slurm_job.hosts_from
        addr = (slurm_job.master_addr, first_host if same else slurm_job.master_addr_from)
    if master_port is not None or slurm_job is None:
        port: tuple[int | None, str] = (master_port, "--master-port" if master_port is not None else "default")
    else:
        port = (slurm_job.master_port, slurm_job.master_port_from)
    return rank, addr, port


FORWARDED_SIGNAL: Final = "DSBUILD_FORWARDED_SIGNAL"
"""The environment variable naming the file where this process notes a signal it passes on to the ranks (``SIGTERM
to dsbuild train``), before it does: a rank's stop then says the signal went to ``dsbuild train``, not to the rank it
reached through torchrun (``dsbuild.session.loop.FORWARDED``, the same name: the launcher imports no torch)."""
SHUTDOWN_SECONDS: Final = 300
"""How long torchrun lets its workers save and stop after forwarding a signal before it kills them."""


def torchrun_command(job_path: Path, nodes: Nodes, log_dir: Path, run_args: Sequence[str]) -> list[str]:
    """The torchrun command line that starts this node's ranks of ``python -m dsbuild.cli.rank JOB RUN_ARGS``."""
    # torchrun's agent, whose process ends with its run (dsbuild.cli.agent says why).
    cmd = [sys.executable, "-m", "dsbuild.cli.agent", "--nproc-per-node", str(nodes.nproc)]
    if nodes.elastic:
        endpoint = f"{nodes.master_addr or '127.0.0.1'}:{nodes.master_port or DEFAULT_MASTER_PORT}"
        cmd += ["--nnodes", f"{nodes.min_nodes}:{nodes.nnodes}", "--rdzv-backend", "c10d"]
        cmd += ["--rdzv-endpoint", endpoint, "--rdzv-id", nodes.run_id]
    elif nodes.nnodes == 1 and nodes.master_port is None:
        cmd.append("--standalone")  # a free port of its own
    else:
        cmd += ["--nnodes", str(nodes.nnodes), "--node-rank", str(nodes.node_rank)]
        port = nodes.master_port or DEFAULT_MASTER_PORT
        cmd += ["--master-addr", nodes.master_addr or "127.0.0.1", "--master-port", str(port)]
    if nodes.max_restarts:
        cmd += ["--max-restarts", str(nodes.max_restarts)]  # each restart resumes (dsbuild.cli.rank)
    # Every rank's output goes to a file; rank 0 of the node is also shown here.
    cmd += ["--log-dir", str(log_dir), "--tee", "3", "--local-ranks-filter", "0"]
    # SIGTERM and SIGUSR1 (Slurm's --signal, a pod's stop) reach every worker, which save at the next step and
    # stop (exit 75); the workers get the time that takes before torchrun kills them.
    cmd += ["--signals-to-handle", "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1", "--shutdown-timeout", str(SHUTDOWN_SECONDS)]
    return [*cmd, "-m", "dsbuild.cli.rank", str(job_path), *run_args]


LOG_PREFIX: Final = "[node{node} rank${{rank}}]:"
"""What torchrun puts before each line of a rank's output: the node and the global rank (torchrun's own,
``[default0]:``, gives the local rank only, the same on every node)."""


def torchrun_env(nodes: Nodes, env: Mapping[str, str]) -> dict[str, str]:
    """The environment torchrun runs in: ``env``, with its log-line prefix naming the node and the rank (unless the
    user chose one: ``TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE``)."""
    prefix = "[rank${rank}]:" if nodes.elastic else LOG_PREFIX.format(node=nodes.node_rank)  # elastic: no node rank
    return {"TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE": prefix, **env}


HARD_STOP_SECONDS: Final = 10
"""How long a second Ctrl-C lets the ranks and torchrun go before they are killed."""
FAILURE_GRACE_SECONDS: Final = 15
"""How long the other ranks have to end once a rank failed, before they are killed (a frozen one never would)."""


def torchrun(
    job: Job, job_path: Path, nodes: Nodes, run_args: Sequence[str], env: dict[str, str]
) -> tuple[int, list[str]]:
    """Start this node's ranks with torchrun and wait: the exit code and the lines worth telling.

    torchrun runs in a session of its own, so a Ctrl-C in the terminal reaches this process only, which decides:
    the first SIGINT, and any SIGTERM or SIGUSR1, go on to torchrun as SIGTERM (SIGUSR1 as itself), which forwards
    it to the ranks: they save a checkpoint at the next step and stop (exit 75). A second SIGINT stops the ranks and
    torchrun at once (exit 130, or 75 when the checkpoint of this stop was written already). torchrun's own output
    (its tracebacks of a stop) goes to a log file, and is shown only when the run failed."""
    folder = RunFolder(job.output_dir)
    log_dir = folder.torchrun_logs(nodes.log_name)
    log_dir.mkdir(parents=True, exist_ok=True)
    before = {p.name for p in log_dir.iterdir()}
    command = torchrun_command(job_path, nodes, log_dir, run_args)
    own_log = log_dir / "torchrun.log"
    note = log_dir / "forwarded_signal"
    note.unlink(missing_ok=True)  # an earlier run's
    child = subprocess.Popen(
        command,
        env=torchrun_env(nodes, {**os.environ, **env, FORWARDED_SIGNAL: str(note)}),
        stderr=subprocess.PIPE,
        start_new_session=True,  # the terminal's Ctrl-C comes here, not to torchrun (see above)
        preexec_fn=_die_with_parent,
    )
    relay = _Relay(child, own_log, custom_prefix="TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE" in {**os.environ, **env})
    stop = _Stop(child, folder, log_dir, before, note)
    handlers = {number: signal.signal(number, stop.receive) for number in _FORWARDED}
    try:
        code = stop.wait()
    finally:
        for number, handler in handlers.items():
            signal.signal(number, handler)
        relay.join()
    if stop.first is None:
        if code in (0, 130):
            return code, []
    elif code == 0 and not stop.hard:
        return 0, []  # the run ended before the signal stopped it
    runs = [p for p in log_dir.iterdir() if p.is_dir() and p.name not in before]
    newest = max(runs, key=lambda p: p.stat().st_mtime) if runs else None
    if stop.first is not None:
        return stop.outcome(stopped_by_a_signal(newest))
    stopped = stopped_by_a_signal(newest)
    if stopped is not None:  # a signal to the workers themselves (Slurm signals every process of a step)
        return RunStopped.EXIT_CODE, [stopped]
    account = failure_account(newest)
    if account:  # dsbuild's own error on the ranks: its one account; torchrun's traceback of it stays in its log
        return code, account
    relay.show_held()  # a failure: torchrun's own account of it too
    return code, [f"training failed: torchrun exited with {code}", *failure_report(newest)]


_FORWARDED: Final = (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)


def _die_with_parent() -> None:
    """In torchrun's process before it starts: SIGTERM to it when ``dsbuild train`` dies (Linux), so that killing the
    launcher never leaves the ranks training (they then save and stop, as for any SIGTERM)."""
    import ctypes

    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


class _Stop:
    """The signals ``dsbuild train`` receives while torchrun runs, and what they make of the run."""

    def __init__(
        self, child: subprocess.Popen[bytes], folder: RunFolder, log_dir: Path, before: set[str], note: Path
    ) -> None:
        self.child, self.folder, self.note = child, folder, note
        self.first: signal.Signals | None = None
        self.saved_before: str | None = None
        """The newest verified checkpoint when the first signal came: a newer one is this stop's."""
        self.hard = False
        self.deadline: float | None = None
        self.log_dir, self.before = log_dir, before
        """torchrun's log folder, and the runs in it before this one: where a failed rank's error file appears."""
        self.failed = False

    def receive(self, number: int, _: object) -> None:
        received = signal.Signals(number)
        if self.first is None:
            self.first = received
            self.saved_before = last_complete(self.folder.checkpoints)
            # The ranks save at their next step; a save that never ends is cut short by torchrun, then here.
            self.deadline = time.monotonic() + SHUTDOWN_SECONDS + 30
            with contextlib.suppress(OSError):  # where the ranks' signal came from (FORWARDED_SIGNAL)
                self.note.write_text(f"{received.name} to dsbuild train\n", encoding="utf-8")
            self.child.send_signal(signal.SIGUSR1 if received == signal.SIGUSR1 else signal.SIGTERM)
        elif received == signal.SIGINT:  # Ctrl-C again: the user does not want to wait for the save
            self.hard = True
        else:
            self.child.send_signal(received)  # a SIGTERM after Slurm's SIGUSR1: the ranks are stopping already

    def wait(self) -> int:
        while True:
            try:
                code = self.child.wait(timeout=0.2)
                return int(code)
            except subprocess.TimeoutExpired:
                pass
            except KeyboardInterrupt:  # a handler above is in place; this is only the instant before it
                continue
            if not self.failed and self.first is None and self._a_rank_failed():
                # A rank failed (its collective timed out, say): torchrun stops the others with SIGTERM, and waits
                # for them up to its shutdown timeout; one that is frozen (SIGSTOP, a hang) never answers.
                self.failed = True
                self.deadline = time.monotonic() + FAILURE_GRACE_SECONDS
            if self.hard or (self.deadline is not None and time.monotonic() > self.deadline):
                self.hard = True
                _kill_tree(self.child)
                try:
                    return int(self.child.wait(timeout=HARD_STOP_SECONDS))
                except subprocess.TimeoutExpired:
                    return -int(signal.SIGKILL)

    def _a_rank_failed(self) -> bool:
        """Whether a rank of this run wrote an error file that is not an agreed stop's (``RunStopped``)."""
        for error in self.log_dir.glob("*/attempt_*/*/error.json"):
            if error.parents[2].name in self.before:
                continue
            _, message = recorded_error(error.parent)
            if message and not message.startswith(f"{RunStopped.__name__}: "):
                return True
        return False

    def outcome(self, ranks_said: str | None) -> tuple[int, list[str]]:
        """The exit code and line of a run a signal stopped: 75 when this stop's checkpoint exists, else 128 + the
        signal (130 for Ctrl-C), saying which checkpoint is the last verified one."""
        assert self.first is not None
        saved = last_complete(self.folder.checkpoints)
        ours = saved is not None and saved != self.saved_before
        if ranks_said is not None and not self.hard:
            # The ranks saw torchrun's SIGTERM; the signal was this process's.
            said = _SIGNALLED.sub(f"by {_named(self.first)} to dsbuild train", ranks_said, count=1)
            return RunStopped.EXIT_CODE, [said]
        where = f"checkpoint {self.folder.checkpoints / saved}" if saved else "no checkpoint"
        if ours:
            return RunStopped.EXIT_CODE, [
                f"stopped by {_named(self.first)}: {where} is this stop's, verified; --resume continues"
            ]
        how = "a second Ctrl-C stopped the ranks at once" if self.hard else f"stopped by {_named(self.first)}"
        if saved is None:
            return 128 + int(self.first), [f"{how}, before any checkpoint was saved: a new run starts from step 0"]
        return 128 + int(self.first), [
            f"{how}, before this stop's checkpoint was saved; {where} is the last verified one: --resume continues"
        ]


_SIGNALLED: Final = re.compile(r"by \w+ to (rank \d+( \(this process\))?|dsbuild train)")
"""Who received the signal, in a rank's ``RunStopped`` message (``dsbuild.session.loop.stop_reason``)."""


def _named(number: signal.Signals) -> str:
    return "Ctrl-C (SIGINT)" if number == signal.SIGINT else number.name


def _kill_tree(child: subprocess.Popen[bytes]) -> None:
    """SIGKILL torchrun's ranks (each leads a process group of its own, with its data-loading workers) and torchrun,
    and wait (a few seconds at most) until the ranks are gone."""
    ranks = _children(child.pid)
    for pid in ranks:
        with contextlib.suppress(OSError):
            os.killpg(pid, signal.SIGKILL)
    with contextlib.suppress(OSError):
        os.killpg(child.pid, signal.SIGKILL)
    deadline = time.monotonic() + HARD_STOP_SECONDS
    while time.monotonic() < deadline and any(_alive(pid) for pid in ranks):
        time.sleep(0.05)


def _alive(pid: int) -> bool:
    """Whether process ``pid`` still runs (a zombie, dead but not yet reaped, does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (Linux's /proc; none elsewhere)."""
    found = []
    for entry in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = entry.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[1] == str(pid):
            found.append(int(entry.parent.name))
    return found


_RANK_LINE: Final = re.compile(rb"^\[(node\d+ )?rank\d+\]:")
"""The start of a line a rank printed, as torchrun prefixes it (``torchrun_env``)."""
_RANK_ERROR: Final = re.compile(rb"^\[(node\d+ )?rank\d+\]:dsbuild: error: ")
"""A rank's first line of a failure (``dsbuild.cli.rank``): it and the rank's lines after it (the traceback its log
keeps) are held back; ``dsbuild train``'s report of the failure says it once (``failure_account``)."""


class _Relay(threading.Thread):
    """Copies torchrun's stderr to ours as it comes: the ranks' lines at once, torchrun's own lines (its warnings,
    its tracebacks of a stop) to ``torchrun.log`` only, shown by ``show_held`` when the run failed. With a line
    prefix of the user's, every line is shown at once."""

    def __init__(self, child: subprocess.Popen[bytes], log: Path, *, custom_prefix: bool) -> None:
        super().__init__(daemon=True)
        self.stream, self.log, self.custom = child.stderr, log, custom_prefix
        self.held: list[bytes] = []
        self.start()

    def run(self) -> None:
        assert self.stream is not None
        out = sys.stderr.buffer if hasattr(sys.stderr, "buffer") else None
        with open(self.log, "ab") as log:
            failing = False
            for line in iter(self.stream.readline, b""):
                failing = failing or (not self.custom and bool(_RANK_ERROR.match(line)))
                if failing:
                    continue  # in the rank's own log; the report of the failure comes at the end
                if self.custom or _RANK_LINE.match(line):
                    self._show(out, line)
                else:
                    log.write(line)
                    log.flush()
                    self.held.append(line)
                    del self.held[:-200]  # the end of it is what a failure needs

    @staticmethod
    def _show(out: Any, line: bytes) -> None:
        if out is not None:
            out.write(line)
            out.flush()
        else:
            sys.stderr.write(line.decode(errors="replace"))

    def show_held(self) -> None:
        out = sys.stderr.buffer if hasattr(sys.stderr, "buffer") else None
        for line in self.held:
            self._show(out, line)
        self.held = []
