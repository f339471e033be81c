"""``[data]`` in a job file and ``DataSpec(...)`` in Python are one path (issue 43): every key the table takes (TRL's
names, dsbuild's and their other spellings) read from a job file gives the ``DataSpec`` its keyword gives, and the
data are read by ``DataSpec.names`` either way (``DataSpec(dataset_text_field="body")`` read ``text`` before)."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

import pytest

from dsbuild import ConfigError, load_job
from dsbuild.job.spec import DataSpec, job_keys, table_keys

JOB = """
    [model]
    name_or_path = "org/model"
    [training]
    per_device_train_batch_size = 2
    [strategy]
    config = "zero2"
    [data]
"""

CASES: dict[str, tuple[Any, str, dict[str, Any]]] = {
    # key: (value, format, other keys the value needs)
    "path": ("other.jsonl", "text", {}),
    "format": ("messages", "messages", {}),
    "max_length": (64, "text", {}),
    "eval_path": ("other.jsonl", "text", {}),
    "eval_split": (0.1, "text", {}),
    "split": ("test", "text", {}),
    "template": ("plain", "alpaca", {}),
    "chat_template": ("{{ messages }}", "messages", {}),
    "columns": ({"text": "body"}, "text", {}),
    "packing": (True, "text", {}),
    "train_on_prompt": (True, "prompt_completion", {}),
    "assistant_only_loss": (True, "messages", {}),
    "completion_only_loss": (False, "prompt_completion", {}),
    "packing_strategy": ("wrapped", "text", {"packing": True}),
    "padding_free": (True, "text", {}),
    "eos_token": ("<e>", "text", {}),
    "num_proc": (2, "text", {}),
    "dataset_text_field": ("body", "text", {}),
}
"""A value other than the default for every key of ``[data]``, with the format it applies to."""

SPELLINGS = {alias: name for name, key in job_keys(DataSpec).items() for alias in (name, *key.aliases)}
"""Every spelling the table takes (``text_field`` is ``dataset_text_field``), and the field it sets."""


def _toml(value: Any) -> str:
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k} = {_toml(v)}" for k, v in value.items()) + "}"
    return json.dumps(value)


def test_the_cases_cover_every_key_of_the_data_table() -> None:
    """A key added to ``DataSpec`` fails here until this walk holds it (and its other spellings are walked too)."""
    assert set(CASES) == set(job_keys(DataSpec))
    assert set(SPELLINGS) == set(table_keys(DataSpec))


@pytest.mark.parametrize("spelling", sorted(SPELLINGS))
def test_each_key_of_a_job_file_is_the_dataspec_keyword_of_its_name(tmp_path: Path, spelling: str) -> None:
    """Read from a job file, each key (and each other spelling of it) gives the ``DataSpec`` its keyword gives."""
    name = SPELLINGS[spelling]
    value, fmt, extra = CASES[name]
    for file in ("train.jsonl", "other.jsonl"):
        (tmp_path / file).write_text('{"text": "a"}\n')
    given = {"path": "train.jsonl", "format": fmt, **extra, spelling: value}
    lines = "".join(f"    {key} = {_toml(v)}\n" for key, v in given.items())
    path = tmp_path / "job.toml"
    path.write_text(textwrap.dedent(JOB) + textwrap.dedent(lines), encoding="utf-8")
    read = load_job(path).data
    paths = {key: tmp_path / given[key] for key in ("path", "eval_path") if key in given}
    python = DataSpec(**{**{SPELLINGS[k]: v for k, v in given.items()}, **paths})
    assert read == python
    assert read.names == python.names


def test_the_text_field_is_named_once() -> None:
    """``dataset_text_field`` and ``columns.text`` naming different fields are refused by key, in Python as in a job."""
    with pytest.raises(ConfigError, match=r"data\.dataset_text_field: 'body' and columns.text 'x' name the text"):
        DataSpec(path="a.jsonl", format="text", dataset_text_field="body", columns={"text": "x"})
    same = DataSpec(path="a.jsonl", format="text", dataset_text_field="body", columns={"text": "body"})
    assert same.names == {"text": "body"} and same.text_field == "body"


@pytest.mark.train
def test_dataspec_dataset_text_field_is_read_by_load(tmp_path: Path) -> None:
    """``DataSpec(dataset_text_field="body")`` loads the records' ``body``: the samples of ``columns.text``."""
    from transformers import ByT5Tokenizer

    from dsbuild.data import load

    (tmp_path / "body.jsonl").write_text('{"body": "hello"}\n{"body": "there"}\n')
    trl = DataSpec(path=tmp_path / "body.jsonl", format="text", dataset_text_field="body")
    columns = DataSpec(path=tmp_path / "body.jsonl", format="text", columns={"text": "body"})
    ours = [load(spec, ByT5Tokenizer(), cache_dir=str(tmp_path / "cache")).train for spec in (trl, columns)]
    assert len(ours[0]) == 2 and list(ours[0]) == list(ours[1])
