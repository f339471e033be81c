"""``dsbuild schema``: the JSON Schema printed or written, and what a bad output path gives."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dsbuild.cli import main
from dsbuild.io.schema import json_schema


def test_schema_prints_the_json_schema(capsys: pytest.CaptureFixture[str]) -> None:
    """Without -o the schema goes to stdout, as JSON an editor can load."""
    assert main(["schema"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out) == json_schema()
    assert err == ""


def test_schema_writes_the_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """-o writes the schema to the file and says where."""
    target = tmp_path / "ds_config.schema.json"
    assert main(["schema", "-o", str(target)]) == 0
    assert json.loads(target.read_text(encoding="utf-8")) == json_schema()
    assert capsys.readouterr().out == f"wrote {target}\n"


def test_schema_into_a_missing_folder_is_exit_2(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """An output path that cannot be written is unusable input: exit 2, one line naming the file, no traceback."""
    target = tmp_path / "no" / "schema.json"
    assert main(["schema", "-o", str(target)]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith(f"dsbuild: error: {target}: ")
    assert "Traceback" not in err
