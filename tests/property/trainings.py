"""What the training properties against TRL share (test_dpo_training_differential.py,
test_task_training_differential.py): ``dsbuild train`` of a case's job and TRL's trainer on the same case, each in
processes of its own, and their logged steps."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import tomli_w

WORKERS = Path(__file__).resolve().parents[1] / "integration"


def env() -> dict[str, str]:
    """The processes' environment: DeepSpeed on the CPU, one thread, the workers importable; no torchrun variables
    of ours."""
    path = os.pathsep.join(p for p in (str(WORKERS), os.environ.get("PYTHONPATH", "")) if p)
    found = {**os.environ, "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1", "PYTHONPATH": path}
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        found.pop(key, None)
    return found


def train(job: dict[str, Any], records: list[dict[str, Any]], data: Path, tmp: Path) -> list[dict[str, Any]]:
    """``dsbuild train`` of ``job`` (a table; its output under ``tmp / "dsbuild"``) with ``records`` written to
    ``data``: each logged step's record."""
    data.write_text("".join(json.dumps(r) + "\n" for r in records))
    (tmp / "job.toml").write_text(tomli_w.dumps(job))
    done = subprocess.run([sys.executable, "-m", "dsbuild", "train", str(tmp / "job.toml")], capture_output=True,
                          text=True, env=env(), cwd=tmp, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr[-5000:]
    history = [json.loads(line) for line in (tmp / "dsbuild" / "history.jsonl").read_text().splitlines()]
    return [r for r in history if "loss" in r]


def trl(worker: Path, given: dict[str, Any], processes: int, tmp: Path) -> list[dict[str, Any]]:
    """TRL's side: ``worker`` on ``given`` (with the ds_config the dsbuild side resolved), under torchrun for several
    processes: each logged step's record."""
    from dsbuild.session.distributed import free_port

    given = {**given, "ds_config": json.loads((tmp / "dsbuild" / "ds_config.json").read_text())}
    (tmp / "case.json").write_text(json.dumps(given))
    launcher = [sys.executable]
    if processes > 1:
        launcher += ["-m", "torch.distributed.run", "--nproc_per_node", str(processes), "--master_port",
                     str(free_port())]  # fmt: skip
    done = subprocess.run([*launcher, str(worker), str(tmp / "case.json"), str(tmp / "trl")], capture_output=True,
                          text=True, env=env(), cwd=tmp, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr[-5000:]
    result: list[dict[str, Any]] = json.loads((tmp / "trl" / "result.json").read_text())
    return result
