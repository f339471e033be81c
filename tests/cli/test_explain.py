"""``dsbuild explain``: each value's origin named as the user wrote it (a preset, ``[strategy.overrides]``,
``--set``), hints that name the command's options, and ``--model`` for the hidden size."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dsbuild.cli import main

JOB = """\
[model]
tokenizer = "byte"
[model.config]
model_type = "llama"
hidden_size = 64
num_hidden_layers = 2
[data]
path = "train.jsonl"
format = "text"
[training]
max_steps = 2
[strategy]
config = "zero2"
[strategy.overrides]
steps_per_print = 7
"""


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    return code, out, err


def origin(out: str, key: str) -> str:
    line = next(line for line in out.splitlines() if line.split()[:1] == [key])
    return line.split(None, 2)[2]


def test_origins_name_the_overrides_table_and_the_flag(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """A job's [strategy.overrides] value and a --set value are labelled as such, not as the preset's."""
    (tmp_path / "train.jsonl").write_text('{"text": "hi"}\n', encoding="utf-8")
    job = tmp_path / "job.toml"
    job.write_text(JOB, encoding="utf-8")
    code, out, _ = run(capsys, "explain", str(job), "--set", "strategy.overrides.wall_clock_breakdown=true")
    assert code == 0
    assert origin(out, "steps_per_print") == f"[strategy.overrides] in {job}"
    assert origin(out, "wall_clock_breakdown") == "--set strategy.overrides.wall_clock_breakdown"
    assert origin(out, "zero_optimization.stage") == f"preset zero2 in {job}"
    code, out, _ = run(
        capsys, "explain", "zero2", "--set", "zero_optimization.overlap_comm=false", "--set",
        "train_micro_batch_size_per_gpu=2",
    )  # fmt: skip
    assert code == 0
    assert origin(out, "zero_optimization.overlap_comm") == "--set zero_optimization.overlap_comm"
    assert origin(out, "zero_optimization.stage") == "preset zero2"


def test_hints_name_the_options_and_model_gives_the_hidden_size(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """What resolve() needs is asked for as the command's options; --model DIR reads the hidden size."""
    argv = ["explain", "hf_zero3", "--set", "training.per_device_train_batch_size=2", "--total-steps", "10"]
    code, _, err = run(capsys, *argv)
    assert code == 2
    assert "(give --hidden-size H or --model DIR)" in err and "pass model=" not in err
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": 64}), encoding="utf-8")
    code, out, _ = run(capsys, *argv, "--model", str(tmp_path))
    assert code == 0
    assert origin(out, "zero_optimization.reduce_bucket_size") == "hidden_size argument 64 (hidden size²)"


def test_without_training_arguments_the_hf_defaults_fill_what_they_fill(capsys: pytest.CaptureFixture[str]) -> None:
    """An HF "auto" preset explained with no training arguments asks only for what HF's defaults cannot give (the
    steps and the hidden size), as the HF Trainer, which always has its TrainingArguments' defaults."""
    code, _, err = run(capsys, "explain", "hf_zero3")
    assert code == 2
    asked = [line.split(":")[2].strip() for line in err.splitlines() if line.startswith("dsbuild: error:")]
    assert asked == [
        "scheduler.params.total_num_steps",
        "zero_optimization.reduce_bucket_size",
        "zero_optimization.stage3_prefetch_bucket_size",
        "zero_optimization.stage3_param_persistence_threshold",
    ]
    code, out, err = run(capsys, "explain", "hf_zero3", "--hidden-size", "64", "--total-steps", "10")
    assert code == 0 and "the HF Trainer's defaults" in err
    assert origin(out, "optimizer.params.lr") == "training argument learning_rate"
    assert out.split("\n", 1)[0].split()[1] == "8"  # train_batch_size: HF's per_device_train_batch_size 8
