"""GRPO's logged numbers on several processes as TRL logs them: each mean over every process's tokens, each extreme
over every process's sequences (``GRPOOutput.metrics(over_processes=True)``, what ``dsbuild train`` logs)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.procs, pytest.mark.train]

WORKER = Path(__file__).resolve().parent / "_grpo_metrics_worker.py"


def test_grpo_metrics_over_two_processes_are_trls(tmp_path: Path) -> None:
    """On 2 gloo processes, each with its own ragged micro-batch, TRL's ``_compute_loss`` (its accelerator reducing
    and gathering over them) and ``metrics(over_processes=True)`` log the same kl, entropy and clip ratios for every
    loss type (to 1e-6: TRL divides the clip ratios in float32), where this process's numbers alone differ from TRL's."""
    from dsbuild.session.distributed import free_port

    out = tmp_path / "found.json"
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT")}
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", str(free_port()),
         str(WORKER), str(out)],
        capture_output=True, text=True, timeout=300, env={**env, "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    found = json.loads(out.read_text())
    assert found["cases"] >= 30
    assert found["worst"] <= 1e-6, found
    assert found["this_process_only"] > 1e-3, found  # the cases tell one process's numbers from TRL's
