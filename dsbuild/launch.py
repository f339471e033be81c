"""Starting the processes of a run: torchrun for several processes or nodes, and reading how a rank failed.

This module prints nothing: it returns exit codes and the lines worth showing, and the CLI prints them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import attrs

from .job import Job

__all__ = ["Nodes", "device_env", "failure_report", "torchrun", "torchrun_command"]


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


def torchrun_command(job_path: Path, nodes: Nodes, log_dir: Path, run_args: Sequence[str]) -> list[str]:
    """The torchrun command line that starts this node's ranks of ``python -m dsbuild.cli.rank JOB RUN_ARGS``."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nodes.nproc)]
    if nodes.nnodes == 1 and nodes.master_port is None:
        cmd.append("--standalone")  # a free port of its own
    else:
        cmd += ["--nnodes", str(nodes.nnodes), "--node-rank", str(nodes.node_rank)]
        cmd += ["--master-addr", nodes.master_addr or "127.0.0.1", "--master-port", str(nodes.master_port or 29500)]
    # Every rank's output goes to a file; rank 0 of the node is also shown here.
    cmd += ["--log-dir", str(log_dir), "--tee", "3", "--local-ranks-filter", "0"]
    return [*cmd, "-m", "dsbuild.cli.rank", str(job_path), *run_args]


def torchrun(
    job: Job, job_path: Path, nodes: Nodes, run_args: Sequence[str], env: dict[str, str]
) -> tuple[int, list[str]]:
    """Start this node's ranks with torchrun and wait; the exit code and, on failure, what the failing rank said."""
    log_dir = job.output_dir / "logs" / "torchrun" / f"node{nodes.node_rank}"
    log_dir.mkdir(parents=True, exist_ok=True)
    before = {p.name for p in log_dir.iterdir()}
    try:
        code = subprocess.call(torchrun_command(job_path, nodes, log_dir, run_args), env={**os.environ, **env})
    except KeyboardInterrupt:
        return 130, []
    if code == 0:
        return 0, []
    runs = [p for p in log_dir.iterdir() if p.is_dir() and p.name not in before]
    newest = max(runs, key=lambda p: p.stat().st_mtime) if runs else None
    return code, [f"training failed: torchrun exited with {code}", *failure_report(newest)]


def failure_report(run_dir: Path | None, tail: int = 15) -> list[str]:
    """The failed ranks of a torchrun run (those that wrote an error file, first failure first) and their last stderr
    lines; a line starting with a space continues the one before it."""
    if run_dir is None:
        return []
    ranks = sorted((p for p in run_dir.glob("attempt_*/*") if p.is_dir()), key=lambda p: p.name)
    failed: list[tuple[str, Path, str]] = []
    for rank_dir in ranks:
        error_file = rank_dir / "error.json"
        if error_file.is_file():
            try:
                info = json.loads(error_file.read_text(encoding="utf-8")).get("message", {})
                stamp = str(info.get("extraInfo", {}).get("timestamp", ""))
                said = str(info.get("message", "")).strip().splitlines()
            except (OSError, ValueError, AttributeError):
                stamp, said = "", []
            failed.append((stamp, rank_dir, said[-1] if said else ""))
    if not failed:  # killed, or died before Python could record anything: show every rank
        failed = [("", rank_dir, "") for rank_dir in ranks]
    lines = []
    shown: set[str] = set()
    for _, rank_dir, message in sorted(failed, key=lambda f: f[0]):
        if message and message in shown:
            lines.append(f"local rank {rank_dir.name} failed the same way")
            continue
        shown.add(message)
        stderr = rank_dir / "stderr.log"
        try:
            text = stderr.read_text(encoding="utf-8", errors="replace").splitlines()
        except OSError:
            text = []
        head = f"local rank {rank_dir.name} failed" + (f": {message}" if message else "")
        lines.append(head)
        if text:
            lines.append(f"  last lines of {stderr}:")
            lines.extend(f"    {line}" for line in text[-tail:])
    return lines
