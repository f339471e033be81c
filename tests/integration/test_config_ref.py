"""One rule for a string that names a config: Session, the CLI and a job read "zero3" as the packaged preset even
with a file called zero3 beside them, and "./zero3" as that file (dsbuild.io.config_files.config_ref)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

os.environ.setdefault("DS_ACCELERATOR", "cpu")

from dsbuild import Config
from dsbuild.cli import main
from dsbuild.session.setup import as_config

pytestmark = pytest.mark.train  # the training extra; tests/conftest.py skips it without


def test_session_and_the_cli_read_a_bare_preset_name_the_same_way(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Session(model, "zero3") took ./zero3 when one existed while dsbuild validate zero3 read the preset; now both
    read the preset, and both read ./zero3 as the file."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "zero3").write_text('{"zero_optimization": {"stage": 1}}')
    (tmp_path / "mine.json").write_text('{"zero_optimization": {"stage": 1}, "train_micro_batch_size_per_gpu": 1}')
    preset = Config.preset("zero3").to_dict()
    assert as_config("zero3").to_dict() == preset
    assert main(["show", "zero3"]) == 0
    assert json.loads(capsys.readouterr().out) == preset
    assert as_config("mine.json").to_dict() == main_show("mine.json", capsys)
    assert as_config("mine.json").to_dict()["zero_optimization"] == {"stage": 1}


def main_show(ref: str, capsys: pytest.CaptureFixture[str]) -> dict[str, object]:
    assert main(["show", ref]) == 0
    shown: dict[str, object] = json.loads(capsys.readouterr().out)
    return shown
