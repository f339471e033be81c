"""docs/jobs.md's table of options says what the code and both libraries do: a row for every ``[data]`` and
``[training]`` option, dsbuild's default as the code has it, the HF Trainer's and TRL's defaults as their own
dataclasses have them, and a reason wherever dsbuild's default differs."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

import attrs
import pytest
import transformers
import trl

from dsbuild.job import DataSpec
from dsbuild.resolve.training import Training

pytestmark = pytest.mark.train  # the training extra; tests/conftest.py skips it without

PAGE = Path(__file__).resolve().parents[2] / "docs" / "jobs.md"
SECTION = "## Every option beside the HF Trainer's and TRL's"


def _render(value: Any) -> str:
    """A default as the table writes it."""
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, tuple) and len(value) == 1:
        return _render(value[0])
    if isinstance(value, dict) and not value:
        return "{}"
    return repr(value)


def _rows() -> dict[str, list[str]]:
    text = PAGE.read_text(encoding="utf-8")
    section = text[text.index(SECTION) :].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if line.startswith("| `") and len(cells) == 5:
            rows[cells[0].strip("`")] = cells[1:]
    return rows


def _default(field: Any) -> Any:
    default = field.default
    return default.factory() if isinstance(default, attrs.Factory) else default  # type: ignore[misc]


def test_every_option_has_a_row() -> None:
    """No [data] or [training] option is missing from the table, and the table names none the code lacks."""
    options = {f"data.{f.name}" for f in attrs.fields(DataSpec)}
    options |= {f"training.{f.name}" for f in attrs.fields(Training) if f.name != "given"}
    assert set(_rows()) == options


def test_the_defaults_are_the_code_s_and_the_libraries() -> None:
    """Each default cell equals the dataclass default it names; a row whose defaults differ says why."""
    hf = {f.name: f.default for f in dataclasses.fields(transformers.TrainingArguments)}
    sft = {f.name: f.default for f in dataclasses.fields(trl.SFTConfig)}
    ours = {f"data.{f.name}": f for f in attrs.fields(DataSpec)}
    ours |= {f"training.{f.name}": f for f in attrs.fields(Training)}
    for option, (mine, theirs_hf, theirs_trl, why) in _rows().items():
        field = ours[option]
        if mine not in ("required", "unset") and option != "training.output_dir":
            assert mine == f"`{_render(_default(field))}`", option
        elif mine == "unset":
            assert _default(field) is None, option
            mine = "`unset`"
        values = {mine}
        if theirs_hf != "—":
            assert theirs_hf == f"`{_render(hf[field.name])}`", option
            values.add(theirs_hf)
        named = re.fullmatch(r"`(\w+) = (.+)`.*", theirs_trl)
        if named:
            assert f"`{_render(sft[named[1]])}`" == f"`{named[2]}`", option
            values.add(f"`{named[2]}`")
        elif theirs_trl.startswith("`"):
            assert theirs_trl == f"`{_render(sft[field.name])}`", option
            values.add(theirs_trl)
        if len(values) > 1:
            assert why, f"{option}: the defaults differ and the table does not say why"
