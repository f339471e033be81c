"""``dsbuild train``'s exit codes are what docs/jobs.md's table and ``--help`` say: the table lists them, ``--help``
names each, and the codes a command reaches before any process starts are met here (the signal codes, 75, 130 and
128 + N, in tests/integration/test_preemption.py)."""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from pathlib import Path

import pytest

from dsbuild.cli import main

ROOT = Path(__file__).resolve().parents[2]


def _table() -> dict[str, str]:
    page = (ROOT / "docs" / "jobs.md").read_text(encoding="utf-8")
    block = page.split("- Exit codes", 1)[1].split("\n\n", 2)[1]
    return dict(re.findall(r"^\s*\| (\d+(?: \+ N)?) \| (.+?) \|$", block, re.M))


def test_the_table_and_the_help_name_the_same_codes(capsys: pytest.CaptureFixture[str]) -> None:
    """docs/jobs.md's table of exit codes and `dsbuild train --help` list the same codes."""
    codes = _table()
    assert list(codes) == ["0", "1", "2", "75", "130", "128 + N"]
    assert main(["train", "--help"]) == 0
    helped = " ".join(capsys.readouterr().out.split())
    for code in ("Exit 0:", "1:", "2:", "75:", "130:", "128+N:"):
        assert code in helped, code


@pytest.fixture(autouse=True)
def _outside_slurm(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in [k for k in os.environ if k.startswith("SLURM_")]:
        monkeypatch.delenv(key)


@pytest.mark.train
def test_codes_met_before_any_process_starts(
    capsys: pytest.CaptureFixture[str], tiny_job: Callable[..., Path], tmp_path: Path
) -> None:
    """1: a job that fails its checks (a value of the wrong type, a batch the world size cannot split); 2: a job
    that cannot be read, and an output folder holding an earlier run (nothing changed). Each says why, without a
    traceback."""
    bad = tiny_job(training={"learning_rate": "fast"}, name="bad.toml")
    assert main(["train", str(bad)]) == 1
    assert "training.learning_rate" in capsys.readouterr().err

    failing = tiny_job(extra="\n[strategy.overrides]\ntrain_batch_size = 6\n", name="failing.toml")
    assert main(["train", str(failing), "--nproc-per-node", "2"]) == 1
    assert "not started: " in capsys.readouterr().err

    assert main(["train", str(tmp_path / "missing.toml")]) == 2
    assert "missing.toml" in capsys.readouterr().err

    job = tiny_job(name="job.toml")
    earlier = tmp_path / "out" / "job"
    earlier.mkdir(parents=True)
    (earlier / "history.jsonl").write_text('{"step": 1, "loss": 1.0}\n')
    assert main(["train", str(job)]) == 2
    err = capsys.readouterr().err
    assert f"{earlier} holds an earlier run" in err and "Traceback" not in err
    assert (earlier / "history.jsonl").read_text() == '{"step": 1, "loss": 1.0}\n'
