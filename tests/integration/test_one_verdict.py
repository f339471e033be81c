"""``validate``, ``explain`` and ``doctor`` judge a file alike, and ``validate --deepspeed`` asks DeepSpeed about the
file as written: over the shared corpus of real ds_configs and a set of misspelt, renamed and legacy keys, a key
``validate`` refuses is what ``explain`` and ``doctor`` refuse, a key it only warns about is explained and
doctored with the same warning, and DeepSpeed's line is there exactly when DeepSpeed refuses the file."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from dsbuild.cli import main
from dsbuild.validate.deepspeed_verdict import deepspeed_verdict

pytestmark = [pytest.mark.train, pytest.mark.procs]

CORPUS = Path(__file__).resolve().parents[2].parent / "shared" / "corpus"
NOT_DS_CONFIGS = {"ROLL/deepspeed_config.yaml", "ROLL/rlvr_lora_zero3.yaml", "accelerate/deepspeed.yaml"}
NOT_DS_CONFIGS |= {"trl/zero1.yaml", "trl/zero3.yaml"}

BASE: dict[str, Any] = {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 2}}
TWEAKS: dict[str, dict[str, Any]] = {
    "misspelt zero key": {"zero_optimization": {"stage": 3, "stage3_max_live_paramters": 10}},
    "misspelt top-level key": {"gradient_clippping": 1.0},
    "renamed aio key": {"aio": {"thread_count": 1}},
    "legacy cpu_offload": {"zero_optimization": {"stage": 2, "cpu_offload": True}},
    "bfloat16, bf16's old name": {"bfloat16": {"enabled": True}},
    "misspelt fp16 key": {"fp16": {"enabled": False, "loss_scale_windw": 100}},
    "a value of the wrong type": {"zero_optimization": {"stage": "three"}},
    "a comment": {"_comment": "DeepSpeed ignores it"},
}


def _cases() -> list[tuple[str, dict[str, Any]]]:
    cases = []
    if CORPUS.is_dir():
        for path in sorted(CORPUS.rglob("*")):
            name = path.relative_to(CORPUS).as_posix()
            if path.suffix == ".json":
                cases.append((name, json.loads(path.read_text())))
            elif path.suffix in (".yaml", ".yml") and name not in NOT_DS_CONFIGS:
                (inner,) = yaml.safe_load(path.read_text()).values()
                cases.append((name, inner))
    cases += [(name, {**BASE, **tweak}) for name, tweak in TWEAKS.items()]
    return cases


CASES = _cases()


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    return code, out, err


def _listed(out: str, heading: str) -> set[str]:
    """The keys ``validate`` lists under `` errors:`` or `` warnings:`` (its own findings, not DeepSpeed's)."""
    section = out.partition(f" {heading}:\n")[2]
    keys = set()
    for line in section.splitlines():
        if not line.startswith("  "):
            break
        key = line.strip().split(": ", 1)[0]
        if key != "deepspeed" and re.fullmatch(r"[\w.\[\]]+", key):
            keys.add(key)
    return keys


def _refused(err: str, where: Path) -> set[str]:
    """The keys a command refused the file for: its ``dsbuild: error: FILE: KEY: ...`` lines."""
    prefix = f"dsbuild: error: {where}: "
    return {line[len(prefix) :].split(": ", 1)[0] for line in err.splitlines() if line.startswith(prefix)}


def _warned(err: str, where: Path) -> set[str]:
    prefix = f"dsbuild: warning: {where}: "
    return {line[len(prefix) :].split(": ", 1)[0] for line in err.splitlines() if line.startswith(prefix)}


@pytest.mark.parametrize(("name", "data"), CASES, ids=[name for name, _ in CASES])
def test_validate_explain_and_doctor_agree(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, name: str, data: dict[str, Any]
) -> None:
    """explain and doctor refuse a file for exactly the keys validate calls errors (exit 1 all three), and a file
    validate only warns about they read, with its warnings on stderr; DeepSpeed's line shows exactly when DeepSpeed
    refuses the file as written."""
    path = tmp_path / "ds_config.json"
    path.write_text(json.dumps(data))
    code, out, _ = _run(capsys, "validate", "--deepspeed", str(path))
    errors, warnings = _listed(out, "errors"), _listed(out, "warnings")
    facts = ["--hidden-size", "4096", "--total-steps", "100", "--set", "training.per_device_train_batch_size=1"]
    for command in (["explain", str(path), *facts], ["doctor", str(path)]):
        status, _, err = _run(capsys, *command)
        assert _refused(err, path) == errors, (command[0], err, out)
        if errors:
            assert status == 1, (command[0], err)
        else:
            assert warnings <= _warned(err, path), (command[0], warnings, err)
    said = deepspeed_verdict(data, 1)
    assert bool(said) == ("deepspeed: DeepSpeedConfig refuses it" in out), (said, out)
    assert code == (1 if errors or said else 0)
